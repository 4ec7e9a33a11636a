"""`partir daemon start|stop|status`: the daemon's command in the `partir` command line,
added through the `partir.commands` entry point."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from partir_daemon.client import DaemonError, daemon_status, start_daemon, stop_daemon
from partir_daemon.protocol import DaemonConfig


def add_command(commands: Any) -> None:
    daemon = commands.add_parser(
        "daemon", help="start, stop or show the compiler daemon of a workspace",
        description="The compiler daemon keeps traces and per-tactic results cached for "
                    "editors and tools (see partir_daemon).")
    daemon.add_argument("action", choices=["start", "stop", "status"])
    daemon.add_argument("--workspace", default=".", metavar="DIR",
                        help="the workspace the daemon serves (default: the current "
                             "directory)")
    daemon.add_argument("--idle-timeout", type=float, default=None, metavar="S",
                        help="with start: exit after S seconds without clients or jobs")
    daemon.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    try:
        if args.action == "status":
            status = daemon_status(args.workspace)
            if status is None:
                print(f"no partir daemon is running for {args.workspace}")
                return 1
            print(json.dumps(status, indent=2))
        elif args.action == "start":
            running = daemon_status(args.workspace)
            if running is not None:
                print(f"a partir daemon is already running for {running['workspace']}: "
                      f"pid {running['pid']}, socket {running['socket']}")
                return 0
            config = DaemonConfig()
            if args.idle_timeout is not None:
                config.idle_timeout_s = args.idle_timeout
            status = start_daemon(args.workspace, config)
            print(f"started the partir daemon for {status['workspace']}: pid "
                  f"{status['pid']}, socket {status['socket']}, log {status['log']}")
        else:
            if not stop_daemon(args.workspace):
                print(f"no partir daemon is running for {args.workspace}")
                return 1
            print(f"stopped the partir daemon for {args.workspace}")
    except (DaemonError, OSError) as e:
        print(f"partir: error: {e}", file=sys.stderr)
        return 2
    return 0
