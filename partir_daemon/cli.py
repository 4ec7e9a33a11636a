"""The daemon's commands in the `partir` command line, added through the `partir.commands`
entry point:

    partir daemon start|stop|status [--workspace DIR] [--json]
    partir jobs [list] [--json]         the workspace's jobs, oldest first
    partir jobs show ID [--json]        one job's record and metrics
    partir jobs cancel ID               stop a queued or running job
    partir jobs logs ID [--tail N]      the last N lines of its log (default 200)

`jobs` talks to the workspace's daemon, starting it when none runs (it lists the records
of the jobs earlier daemons ran).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from partir_daemon import protocol as P
from partir_daemon.client import (
    DaemonClient,
    DaemonError,
    daemon_status,
    start_daemon,
    stop_daemon,
)
from partir_daemon.paths import DaemonPaths


def add_command(commands: Any) -> None:
    """The `daemon` and `jobs` commands."""
    daemon = commands.add_parser(
        "daemon", help="start, stop or show the compiler daemon of a workspace",
        description="The compiler daemon keeps traces and per-tactic results cached for "
                    "editors and tools (see partir_daemon).")
    daemon.add_argument("action", choices=["start", "stop", "status"])
    _workspace_flag(daemon)
    daemon.add_argument("--idle-timeout", type=float, default=None, metavar="S",
                        help="with start: exit after S seconds without clients or jobs")
    daemon.add_argument("--json", action="store_true",
                        help="with status: the daemon's status file as JSON")
    daemon.set_defaults(run=run)
    jobs = commands.add_parser(
        "jobs", help="list, show, cancel the jobs of a workspace's daemon, or print a log",
        description="The jobs the workspace's daemon runs (`partir_daemon.jobs`), and those "
                    "earlier daemons ran. The daemon is started if none runs.")
    jobs.add_argument("action", nargs="?", default="list",
                      choices=["list", "show", "cancel", "logs"])
    jobs.add_argument("id", nargs="?", metavar="ID", help="the job (show, cancel, logs)")
    _workspace_flag(jobs)
    jobs.add_argument("--tail", type=int, default=200, metavar="N",
                      help="with logs: the last N lines (default 200)")
    jobs.add_argument("--json", action="store_true",
                      help="with list and show: the records as JSON")
    jobs.set_defaults(run=run_jobs)


def _workspace_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--workspace", default=".", metavar="DIR",
                        help="the workspace the daemon serves (default: the current "
                             "directory)")


def _error(e: Exception) -> int:
    print(f"partir: error: {e}", file=sys.stderr)
    return 2


def run(args: argparse.Namespace) -> int:
    workspace = DaemonPaths.of(args.workspace).workspace  # "." named as what it is
    try:
        if args.action == "status":
            status = daemon_status(workspace)
            if status is None:
                print(f"no partir daemon is running for {workspace}")
                return 1
            print(json.dumps(status, indent=2) if args.json else _status_text(status))
        elif args.action == "start":
            running = daemon_status(workspace)
            if running is not None:
                print(f"a partir daemon is already running for {running['workspace']}: "
                      f"pid {running['pid']}, socket {running['socket']}")
                return 0
            config = P.DaemonConfig()
            if args.idle_timeout is not None:
                config.idle_timeout_s = args.idle_timeout
            status = start_daemon(workspace, config)
            print(f"started the partir daemon for {status['workspace']}: pid "
                  f"{status['pid']}, socket {status['socket']}, log {status['log']}")
        else:
            if not stop_daemon(workspace):
                print(f"no partir daemon is running for {workspace}")
                return 1
            print(f"stopped the partir daemon for {workspace}")
    except (DaemonError, OSError) as e:
        return _error(e)
    return 0


def _status_text(status: dict[str, Any]) -> str:
    """The status file, and what the running daemon says of itself, for a person."""
    lines = [f"partir daemon for {status['workspace']}: running, pid {status['pid']}, "
             f"for {_duration(time.time() - float(status['started']))}",
             f"  version {status['version']} (protocol {status['protocol']})",
             f"  socket  {status['socket']}",
             f"  log     {status['log']}"]
    config = status.get("config") or {}
    if config:
        lines.append(f"  limits  idle {config['idle_timeout_s']:g} s, loading a schedule "
                     f"file {config['load_timeout_s']:g} s, a request "
                     f"{config['compile_timeout_s']:g} s; "
                     f"{config['compiler_processes']} compiler process(es), each lowering "
                     f"in {config.get('lowering_processes', 1)}")
    try:
        with DaemonClient.connect(status["workspace"], autostart=False, timeout=10,
                                  runtime_dir=_runtime_dir(status)) as client:
            live = client.status()
            stats = client.cache_stats()
            jobs = client.jobs()
    except DaemonError as e:  # e.g. it is shutting down: the file says enough
        lines.append(f"  (no answer to a status request: {e})")
        return "\n".join(lines)
    pids = ", ".join(map(str, stats.worker_pids)) or "none started yet"
    lines.append(f"  clients {live.clients - 1} (besides this command); compiler processes: {pids} "
                 f"({stats.worker_restarts} restart(s))")
    lines.append(f"  cache   {stats.traces} trace(s), {stats.states} tactic state(s)")
    counts: dict[str, int] = {}
    for job in jobs:
        counts[job.state] = counts.get(job.state, 0) + 1
    lines.append("  jobs    " + (", ".join(f"{n} {state}" for state, n in counts.items())
                                  or "none"))
    return "\n".join(lines)


def _runtime_dir(status: dict[str, Any]) -> Path | None:
    return Path(status["runtime_dir"]) if status.get("runtime_dir") else None


def _duration(seconds: float) -> str:
    seconds = max(0, int(seconds))
    parts = [(seconds // 86400, "d"), (seconds // 3600 % 24, "h"), (seconds // 60 % 60, "min"),
             (seconds % 60, "s")]
    shown = [f"{n} {unit}" for n, unit in parts if n]
    return " ".join(shown[:2]) or "0 s"


def run_jobs(args: argparse.Namespace) -> int:
    if args.action != "list" and args.id is None:
        return _error(ValueError(f"`partir jobs {args.action}` needs a job ID (`partir jobs` "
                                 f"lists them)"))
    workspace = DaemonPaths.of(args.workspace).workspace
    try:
        with DaemonClient.connect(workspace) as client:
            if args.action == "list":
                jobs = client.jobs()
                if args.json:
                    print(json.dumps(P.to_json(jobs), indent=2))
                else:
                    print(_jobs_table(jobs, str(workspace)))
            elif args.action == "show":
                job = client.job(args.id, log_tail=0).job
                print(json.dumps(P.to_json(job), indent=2) if args.json else _job_text(job))
            elif args.action == "cancel":
                result = client.cancel(args.id)
                print(f"cancelled job {args.id}" if result.cancelled else
                      f"job {args.id} had already finished: {result.job.state}")
            else:
                print(client.job(args.id, log_tail=args.tail).log)
    except DaemonError as e:
        return _error(e)
    return 0


def _when(t: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t)) if t else "-"


def _jobs_table(jobs: list[P.JobInfo], workspace: str) -> str:
    if not jobs:
        return f"no jobs in {workspace}"
    rows = [("ID", "STATE", "STEPS", "CREATED", "FILE", "ERROR")]
    for j in jobs:
        path = os.path.relpath(j.path, workspace) if j.path else "-"
        error = (j.error or "").splitlines()[0][:60] if j.error else ""
        rows.append((j.id, j.state, f"{j.steps_done}/{j.steps}", _when(j.created), path,
                     error))
    widths = [max(len(r[c]) for r in rows) for c in range(len(rows[0]))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True))
                     .rstrip() for r in rows)


def _job_text(job: P.JobInfo) -> str:
    lines = [f"job {job.id}: {job.state}", f"  file     {job.path or '-'}",
             f"  steps    {job.steps_done}/{job.steps}",
             f"  created  {_when(job.created)}, started {_when(job.started)}, finished "
             f"{_when(job.finished)}"]
    if job.pid is not None or job.exit_code is not None:
        lines.append(f"  process  pid {job.pid}, exit status {job.exit_code}")
    for p in job.processes:  # a multi-process job's runners
        lines.append(f"  process {p.process} of {len(job.processes)}: exit status "
                     f"{p.exit_code}, log {p.log_path}")
    if job.error:
        lines.append(f"  error    {job.error}")
    if job.metrics is not None:
        for name, value in dataclasses.asdict(job.metrics).items():
            lines.append(f"  {name.replace('_', ' ')}: {value}")
    lines += [f"  record   {job.record_path}", f"  log      {job.log_path}"]
    return "\n".join(lines)
