"""The compiler process: runs `Engine` requests one at a time for the daemon.

    python -m partir_daemon.worker --workspace W [--load-timeout S] [--max-entries N]
                                   [--max-ops N] [--lowering-processes N]

It speaks line-delimited JSON with the daemon on its stdin/stdout:
    daemon -> worker   {"id": n, "method": "partition"|"ir"|"explain"|"invalidate"|
                        "stats", "params": {...}}      a request
                       {"cancel": n}                   cancel request n: its token, checked
                                                       inside propagation and lowering
                                                       (within milliseconds), and its
                                                       schedule file if it is executing
    worker -> daemon   {"ready": pid}                  once, when it can take requests
                       {"id": n, "progress": {"message", "step", "total"}}
                       {"id": n, "partial": {...}}     a partition's partial result
                       {"id": n, "cancelling": true}   cancel n was read: the process is
                                                       not stuck in native code that holds
                                                       the interpreter (the daemon kills
                                                       one that does not say so in time)
                       {"id": n, "result": {...}} | {"id": n, "error": {code, message}}

Benchmarks: with `PARTIR_DAEMON_COARSE_CANCEL=1`, a cancelled request stops only at its
next progress message (between tactics, between states' lowerings), as before tokens
were checked inside propagation and lowering: `benchmarks/daemon_latency.py` compares.

Fault injection (tests): with `PARTIR_DAEMON_KILL_AT=<file>` in its environment, the
process SIGKILLs itself right after reporting a progress message that starts with the
file's content, and removes the file (so once): a compiler killed at a chosen stage.

The user's code runs here and may print: file descriptor 1 is pointed at stderr (the
daemon's log) and the protocol uses a private duplicate of the original stdout. The
process exits when its stdin closes, so it never outlives the daemon.
"""

from __future__ import annotations

import argparse
import logging
import os
import queue
import signal
import sys
import threading
import traceback
from typing import Any

from partir_daemon import protocol as P


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="partir_daemon.worker")
    parser.add_argument("--workspace", required=True)
    parser.add_argument("--load-timeout", type=float, default=30.0)
    parser.add_argument("--max-entries", type=int, default=256)
    parser.add_argument("--max-ops", type=int, default=4_000_000)
    parser.add_argument("--lowering-processes", type=int, default=1)
    args = parser.parse_args(argv)
    # The user's modules may be imported from the workspace, after the standard library
    # (started with -P: see `client.module_command`).
    if args.workspace not in sys.path:
        sys.path.append(args.workspace)
    out = P.child_stream()
    logging.basicConfig(stream=sys.stderr, level=logging.INFO,
                        format="%(asctime)s worker[%(process)d] %(levelname)s %(message)s")

    from partir.cancel import CancellationToken
    from partir_daemon.engine import INTERRUPT_SIGNAL, Cancelled, Engine, ignore_interrupts

    engine = Engine(args.workspace, load_timeout_s=args.load_timeout,
                    max_entries=args.max_entries, max_ops=args.max_ops,
                    lowering_processes=args.lowering_processes)
    requests: queue.Queue = queue.Queue()
    cancelled: set[Any] = set()
    tokens: dict[Any, CancellationToken] = {}  # request id -> its token, while it runs
    lock = threading.Lock()
    # The request whose schedule file is executing: cancelling it interrupts the file
    # (which may loop) rather than waiting for the next check between tactics.
    loading: list[Any] = [None]
    ignore_interrupts()

    def send(message: dict[str, Any]) -> None:
        data = P.encode(message)
        with lock:
            out.write(data)

    def read() -> None:
        for line in sys.stdin.buffer:
            message = P.child_message(line)
            if message is None:
                continue
            if "cancel" in message:
                cancelled.add(message["cancel"])
                token = tokens.get(message["cancel"])
                if token is not None and not coarse:
                    token.cancel("superseded by a newer revision, or on request")
                if loading[0] == message["cancel"]:
                    os.kill(os.getpid(), INTERRUPT_SIGNAL)
                send({"id": message["cancel"], "cancelling": True})
            else:
                requests.put(message)
        os._exit(0)  # the daemon is gone: so are we, whatever is running

    threading.Thread(target=read, name="worker-stdin", daemon=True).start()
    send({"ready": os.getpid()})
    kill_at = os.environ.get("PARTIR_DAEMON_KILL_AT")
    coarse = os.environ.get("PARTIR_DAEMON_COARSE_CANCEL") == "1"
    while True:
        if requests.empty():
            engine.release()
        message = requests.get()
        request_id = message.get("id")
        method = message.get("method")

        def progress(text: str, step: int | None, total: int | None,
                     request_id: Any = request_id) -> None:
            if text == "loading the schedule file":
                loading[0] = request_id
            elif text == "loaded":
                loading[0] = None
            send({"id": request_id, "progress": {"message": text, "step": step,
                                                  "total": total}})
            if coarse and request_id in cancelled:
                tokens[request_id].cancel()
            if kill_at:
                _kill_at(kill_at, text)

        token = tokens[request_id] = CancellationToken()
        try:
            if request_id in cancelled:
                engine.session.cancelled += 1
                raise Cancelled
            spec = P.METHODS.get(method)
            if spec is None or spec.process != "compiler":
                raise ValueError(f"unknown worker method {method!r}")
            params = P.from_json(spec.params, message.get("params"))
            if method == "partition":
                result = engine.partition(
                    params, progress, token,
                    lambda partial, request_id=request_id: send(
                        {"id": request_id, "partial": partial}))
            elif spec.document:
                result = getattr(engine, method)(params, progress, token)
            else:
                result = getattr(engine, method)(params)
            send({"id": request_id, "result": result})
        except Cancelled:
            send({"id": request_id, "error": {"code": P.REQUEST_CANCELLED,
                                              "message": "cancelled: superseded by a newer "
                                                         "revision, or on request"}})
        except Exception as e:
            logging.error("request %s (%s) failed:\n%s", request_id, method,
                          "".join(traceback.format_exception(e)))
            code = P.INVALID_PARAMS if isinstance(e, P.ProtocolError | ValueError) \
                else P.INTERNAL_ERROR
            send({"id": request_id, "error": {"code": code,
                                              "message": f"{type(e).__name__}: {e}"}})
        finally:
            loading[0] = None
            tokens.pop(request_id, None)
            cancelled.discard(request_id)


def _kill_at(path: str, text: str) -> None:
    """Fault injection: SIGKILL this process if `text` starts with the content of the
    file `path` (removed first, so that it happens once)."""
    try:
        with open(path) as f:
            stage = f.read().strip()
        if not stage or not text.startswith(stage):
            return
        os.unlink(path)
    except OSError:
        return
    os.kill(os.getpid(), signal.SIGKILL)


if __name__ == "__main__":
    main()
