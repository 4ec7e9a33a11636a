"""The daemon process: one per workspace, serving JSON-RPC 2.0 on a Unix domain socket.

    python -m partir_daemon.server --workspace W [--runtime-dir D] [--detach]
        [--idle-timeout-s S]
        [--load-timeout-s S] [--compile-timeout-s S] [--max-cache-entries N]
        [--max-cache-ops N] [--log-level L] [--compiler-processes N]
        [--lowering-processes N]

(`partir daemon start` and `DaemonClient.connect` start it detached.) The process:
- takes the workspace's exclusive lock, `<workspace>/.partir/daemon.lock`: a second
  daemon, whatever its runtime directory, refuses to start and names the first one's pid
  and socket (exit status 3); writes its identity (pid, process start time, socket,
  version, config hash) to `<workspace>/.partir/daemon.json`;
- listens on `<runtime dir>/<workspace key>.sock` (mode 0600, private directory: the
  runtime directory holds only the socket) and serves only peers of its own uid; logs to
  `<workspace>/.partir/daemon.log`, never to stdout;
- runs schedule files and compiles in a pool of worker processes
  (`partir_daemon.worker`, `--compiler-processes`), each one request at a time, killed
  and restarted when it hangs past its deadline or crashes, each lowering an edit's
  states in `--lowering-processes` (itself and forks of it); a document goes to the
  worker that has its path in hand, else to the one that served it last when idle, else
  to an idle one, so a schedule file that loops delays no other file; document requests
  for an older `version` of a path are cancelled by newer ones;
- runs jobs in processes of their own (`partir_daemon.jobs`);
- watches the workspace's `.py` files (`watchfiles`) and drops traces whose files changed;
- exits after `idle-timeout` without clients or jobs, on SIGTERM/SIGINT, or on `shutdown`.

Every connection has a single writer task: responses and notifications are queued to it,
so messages never interleave, whatever order concurrent requests finish in.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import dataclasses
import fcntl
import itertools
import json
import logging
import math
import os
import signal
import socket
import stat
import struct
import sys
import threading
import time
from pathlib import Path
from typing import Any

from partir.user_modules import local_imports
from partir_daemon import __version__
from partir_daemon import protocol as P
from partir_daemon.client import child_env, module_command
from partir_daemon.jobs import JobManager, JobStorageError
from partir_daemon.paths import (
    DaemonPaths,
    SocketPathTooLong,
    check_socket_path,
    daemon_alive,
    ensure_private_dir,
    process_start_ticks,
    read_status,
)
from partir_daemon.processes import die_with_parent

log = logging.getLogger("partir_daemon")

ALREADY_RUNNING = 3
STARTUP_FAILED = 4
# Extra time the daemon gives the worker past the load timeout it enforces itself (the
# worker interrupts Python code; this catches code that cannot be interrupted).
LOAD_GRACE_S = 5.0
WORKER_START_TIMEOUT_S = 120.0
# How long the compiler process has to say that it read a request's cancellation: one
# that does not is stuck in native code holding the interpreter (its stdin reader cannot
# run), and would hold the next revision of its file until its deadline: it is killed.
CANCEL_GRACE_S = 5.0
# How long a daemon refused the workspace's lock waits for the holder's identity file.
HOLDER_WAIT_S = 2.0


class CompilerExited(Exception):
    """The compiler process exited while a request was pending: it crashed (e.g. a
    segfault in a native extension the user's code loaded) or was killed."""

    def __init__(self, status: int) -> None:
        how = f"exited with status {status}"
        with contextlib.suppress(ValueError):
            how += f" ({signal.Signals(-status).name})" if status < 0 else ""
        super().__init__(f"the compiler process {how}")
        self.status = status


class RpcError(Exception):
    def __init__(self, code: int, message: str, data: Any = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.data = data


# --- connections ----------------------------------------------------------------------------


class Connection:
    _ids = itertools.count(1)

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.id = next(self._ids)
        self.reader = reader
        self.writer = writer
        self._queue: asyncio.Queue[bytes | None] = asyncio.Queue()
        self._writer_task = asyncio.create_task(self._write_loop())
        self.closed = False

    def send(self, message: dict[str, Any]) -> None:
        if not self.closed:
            self._queue.put_nowait(P.encode(message))

    async def _write_loop(self) -> None:
        while True:
            data = await self._queue.get()
            if data is None:
                break
            try:
                self.writer.write(data)
                await self.writer.drain()
            except (ConnectionError, OSError):
                break
        self.closed = True

    async def close(self) -> None:
        """Flush what is queued, then close."""
        self._queue.put_nowait(None)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._writer_task, timeout=5)
        self.closed = True
        self.writer.close()
        with contextlib.suppress(Exception):
            await self.writer.wait_closed()


# --- the compiler worker --------------------------------------------------------------------


@dataclasses.dataclass(eq=False)
class WorkItem:
    method: str
    params: dict[str, Any]
    path: str | None = None  # absolute path of the document, for revision cancellation
    version: int | None = None
    conn: Connection | None = None
    request_id: int | str | None = None
    future: asyncio.Future | None = None
    worker_id: int = 0
    loaded: bool = False
    cancelled_at: float | None = None  # the loop's time when it was cancelled
    cancel_seen: bool = False  # the compiler process said it read the cancellation

    def progress(self, message: str, step: int | None, total: int | None) -> None:
        if self.conn is not None and self.request_id is not None:
            self.conn.send(P.notification(P.PROGRESS, P.ProgressParams(
                self.request_id, "partition", message, step, total, self.params.get("path"),
                self.version)))

    def partial(self, result: dict[str, Any]) -> None:
        if self.conn is not None and self.request_id is not None:
            self.conn.send(P.notification(P.PARTIAL, P.PartialResultParams(
                self.request_id, result)))  # type: ignore[arg-type]  # as the worker sent it


class WorkerSupervisor:
    """One compiler process: its queue, (re)start, deadlines and cancellation. A process
    that is killed (past its deadline) or crashes is replaced at once, so the next request
    (often the user's fix) does not wait for JAX's import.

    `unloaded` (shared by the pool's workers): schedule files whose last load never
    finished (it timed out or crashed the process) -> the files their source imports: the
    process recorded no imports, so these are what the watcher reports when they change
    (`CompilerPool.invalidate`), for the editor to analyse the schedule file again."""

    def __init__(self, config: P.DaemonConfig, paths: DaemonPaths,
                 unloaded: dict[str, list[str]]) -> None:
        self.config = config
        self.paths = paths
        self.unloaded = unloaded
        self.proc: asyncio.subprocess.Process | None = None
        self.restarts = 0
        self.cancelled = 0  # cancelled before reaching the worker
        self._queue: collections.deque[WorkItem] = collections.deque()
        self._wake = asyncio.Event()
        self._current: WorkItem | None = None
        self._worker_ids = itertools.count(1)
        self._responses: dict[int, asyncio.Future] = {}
        self._loop_task = asyncio.create_task(self._run())
        self._reader_task: asyncio.Task | None = None
        self._start_lock = asyncio.Lock()
        self._starting: asyncio.Task | None = None

    @property
    def load(self) -> int:
        """Requests running or queued."""
        return len(self._queue) + (self._current is not None)

    @property
    def busy(self) -> bool:
        return self.load > 0

    def holds(self, path: str) -> bool:
        """Whether a request for `path` is running or queued here."""
        return any(item.path == path for item in self._items())

    @property
    def analysing(self) -> bool:
        """Whether a document request is running or queued here. Other work (the watcher's
        invalidations, cache statistics) is short: a path need not leave its home, and
        its caches, to avoid waiting for it."""
        return any(item.path is not None for item in self._items())

    def _items(self) -> list[WorkItem]:
        return [*self._queue, *([self._current] if self._current else [])]

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None and self.proc.returncode is None \
            else None

    async def call(self, item: WorkItem) -> Any:
        item.future = asyncio.get_running_loop().create_future()
        if item.version is not None and item.path is not None:
            self._cancel_stale(item.path, item.version)
        self._queue.append(item)
        self._wake.set()
        return await item.future

    def _cancel_stale(self, path: str, version: int) -> None:
        for old in list(self._queue):
            if old.path == path and old.version is not None and old.version < version:
                self._queue.remove(old)
                self.cancelled += 1
                self._fail(old, P.REQUEST_CANCELLED,
                           f"cancelled: superseded by version {version} of {path}")
        current = self._current
        if current is not None and current.path == path and current.version is not None \
                and current.version < version:
            self._cancel_running(current)

    def cancel_request(self, conn: Connection, request_id: int | str) -> None:
        for old in list(self._queue):
            if old.conn is conn and old.request_id == request_id:
                self._queue.remove(old)
                self.cancelled += 1
                self._fail(old, P.REQUEST_CANCELLED, "cancelled on request")
        current = self._current
        if current is not None and current.conn is conn and current.request_id == request_id:
            self._cancel_running(current)

    def _cancel_running(self, item: WorkItem) -> None:
        # The worker checks between tactics and answers with REQUEST_CANCELLED; a request
        # not sent yet (its process is starting) is failed before it is (`_serve`).
        if item.cancelled_at is not None:
            return
        item.cancelled_at = asyncio.get_running_loop().time()
        if item.worker_id and self.proc is not None and self.proc.stdin is not None:
            self.proc.stdin.write(P.encode({"cancel": item.worker_id}))

    @staticmethod
    def _fail(item: WorkItem, code: int, message: str) -> None:
        if item.future is not None and not item.future.done():
            item.future.set_exception(RpcError(code, message))

    async def _run(self) -> None:
        while True:
            while not self._queue:
                self._wake.clear()
                await self._wake.wait()
            item = self._queue.popleft()
            self._current = item
            try:
                await self._serve(item)
            except Exception as e:  # keep serving whatever happened to one request
                log.exception("worker request %s failed", item.method)
                self._fail(item, P.INTERNAL_ERROR, f"{type(e).__name__}: {e}")
            finally:
                self._current = None

    def start_soon(self) -> None:
        """Start the process in the background, unless it runs or is being started."""
        if self.pid is None and (self._starting is None or self._starting.done()):
            self._starting = asyncio.create_task(self._start_in_background())

    async def _start_in_background(self) -> None:
        try:
            await self._ensure_process()
        except Exception:  # the next request starts it again and reports why it cannot
            log.exception("starting a compiler process failed")

    async def _ensure_process(self) -> None:
        async with self._start_lock:
            if self.proc is None or self.proc.returncode is not None:
                if self.proc is not None:
                    self.restarts += 1
                await self._start_worker()

    async def _start_worker(self) -> None:
        cmd = [*module_command("partir_daemon.worker"), "--workspace",
               str(self.paths.workspace), f"--load-timeout={self.config.load_timeout_s}",
               f"--max-entries={self.config.max_cache_entries}",
               f"--max-ops={self.config.max_cache_ops}",
               f"--lowering-processes={self.config.lowering_processes}"]
        # Partitioning needs no devices: keep the worker off accelerators that jobs use.
        env = child_env({"JAX_PLATFORMS": "cpu"})
        with open(self.paths.log, "ab") as logf:
            self.proc = await asyncio.create_subprocess_exec(
                *cmd, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
                stderr=logf, env=env, cwd=str(self.paths.workspace),
                preexec_fn=die_with_parent(), limit=P.MAX_MESSAGE_BYTES)
        assert self.proc.stdout is not None
        line = await asyncio.wait_for(self.proc.stdout.readline(), WORKER_START_TIMEOUT_S)
        if not line:
            raise RuntimeError(f"the compiler process exited while starting (status "
                               f"{await self.proc.wait()}); see {self.paths.log}")
        log.info("compiler process started: pid %d", self.proc.pid)
        self._reader_task = asyncio.create_task(self._read(self.proc))

    async def _read(self, proc: asyncio.subprocess.Process) -> None:
        assert proc.stdout is not None
        async for line in proc.stdout:
            message = P.child_message(line)
            if message is None:
                continue
            item = self._current
            if item is None or message.get("id") != item.worker_id:
                continue
            if "progress" in message:
                p = message["progress"]
                if p["message"] == "loaded":
                    item.loaded = True
                item.progress(p["message"], p.get("step"), p.get("total"))
            elif "partial" in message:
                item.partial(message["partial"])
            elif "cancelling" in message:
                item.cancel_seen = True
            else:
                future = self._responses.get(item.worker_id)
                if future is not None and not future.done():
                    future.set_result(message)
        code = await proc.wait()
        for future in self._responses.values():
            if not future.done():
                future.set_exception(CompilerExited(code))

    async def _kill_worker(self) -> None:
        proc, self.proc = self.proc, None
        if proc is not None and proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
        if self._reader_task is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._reader_task, timeout=5)

    async def _serve(self, item: WorkItem) -> None:
        await self._ensure_process()
        assert self.proc is not None and self.proc.stdin is not None
        if item.cancelled_at is not None:  # while the process started
            self.cancelled += 1
            self._fail(item, P.REQUEST_CANCELLED, "cancelled: superseded by a newer "
                       "revision, or on request")
            return
        item.worker_id = next(self._worker_ids)
        loop = asyncio.get_running_loop()
        response = self._responses[item.worker_id] = loop.create_future()
        self.proc.stdin.write(P.encode({"id": item.worker_id, "method": item.method,
                                        "params": item.params}))
        start = loop.time()
        try:
            while not response.done():
                limit = self.config.compile_timeout_s if item.loaded else \
                    self.config.load_timeout_s + LOAD_GRACE_S
                remaining = start + limit - loop.time()
                if item.cancelled_at is not None and not item.cancel_seen:
                    # A newer revision (often the fix) waits for no stuck process.
                    remaining = min(remaining, item.cancelled_at + CANCEL_GRACE_S -
                                    loop.time())
                if remaining <= 0:
                    await self._timed_out(item, limit)
                    return
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(asyncio.shield(response), min(remaining, 1.0))
            message = response.result()
        except CompilerExited as e:
            await self._replace_worker()
            if not item.loaded and P.METHODS[item.method].document:
                # The user's code crashed the process (a segfault in a native extension):
                # a diagnostic, as for an exception it raised.
                self._unloaded(item, "execution", f"executing the schedule file crashed: "
                               f"{e} (see {self.paths.log})")
                return
            self._fail(item, P.WORKER_CRASHED, f"{item.method}: {e} while serving it; the "
                       f"compiler process is restarted for the next request (see "
                       f"{self.paths.log})")
            return
        finally:
            self._responses.pop(item.worker_id, None)
            # Killed on purpose, the process leaves its answer failed: read here, it is not
            # reported as an exception never retrieved.
            if response.done() and not response.cancelled():
                response.exception()
        if item.path is not None:
            self.unloaded.pop(item.path, None)
        if item.future is None or item.future.done():
            return
        if "error" in message:
            err = message["error"]
            item.future.set_exception(RpcError(err["code"], err["message"]))
        else:
            item.future.set_result(message["result"])

    async def _replace_worker(self) -> None:
        await self._kill_worker()
        self.restarts += 1
        self.start_soon()

    async def _timed_out(self, item: WorkItem, limit: float) -> None:
        """The worker did not answer in time (or, cancelled, did not read it within
        CANCEL_GRACE_S) and did not interrupt itself: kill it."""
        phase = "compiling" if item.loaded else "executing the schedule file"
        if item.cancelled_at is not None and not item.cancel_seen:
            log.warning("%s: cancelled, and the compiler process did not read it within "
                        "%.0f s (%s: stuck in native code?); killing it", item.method,
                        CANCEL_GRACE_S, phase)
            await self._replace_worker()
            self._fail(item, P.REQUEST_CANCELLED, "cancelled: superseded by a newer "
                       "revision, or on request (the compiler process did not stop, and was "
                       "killed)")
            return
        log.warning("%s: no answer after %.0f s (%s); killing the compiler process",
                    item.method, limit, phase)
        await self._replace_worker()
        if item.loaded or not P.METHODS[item.method].document:
            self._fail(item, P.WORKER_CRASHED, f"{item.method}: the compiler process did "
                       f"not answer within {limit:.0f} s while {phase}; it was killed")
            return
        # A schedule file that cannot be interrupted: a diagnostic, as for one that can.
        self._unloaded(item, "timeout", f"executing the schedule file did not finish within "
                       f"{self.config.load_timeout_s:g} s and could not be interrupted (an "
                       f"infinite loop in native code?)")

    def _unloaded(self, item: WorkItem, kind: P.DiagnosticKind, message: str) -> None:
        """Answer a document request whose schedule file never finished loading (the
        process was killed or crashed) with a diagnostic, and remember what the file
        imports: their fix on disk must bring it back."""
        path = item.params.get("path", "")
        imports: list[str] = []
        if item.path is not None:
            imports = self.unloaded[item.path] = local_imports(item.path,
                                                               item.params.get("text"))
        diagnostic = P.Diagnostic(kind, message, path, 0)
        result: Any
        if item.method == "partition":
            result = P.PartitionResult(path, item.version, False, [diagnostic],
                                       dependencies=imports)
        elif item.method == "ir":
            result = P.IrResult(path, item.version, item.params.get("level", "core"), 0,
                                None, "", [diagnostic])
        else:
            result = P.ExplainResult(path, item.version, [], [], [diagnostic])
        if item.future is not None and not item.future.done():
            item.future.set_result(P.to_json(result))

    async def stop(self) -> None:
        self._loop_task.cancel()
        for item in [*self._queue, *([self._current] if self._current else [])]:
            self._fail(item, P.SHUTTING_DOWN, "the daemon is shutting down")
        self._queue.clear()
        if self._starting is not None:
            # Cancelled mid-spawn, asyncio kills the child; once spawned, we do below.
            self._starting.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._starting
        await self._kill_worker()


# CacheStats fields that are not a sum over the compiler processes.
_POOL_STATS = {"max_ops", "max_entries", "worker_pid", "worker_restarts", "worker_pids"}


class CompilerPool:
    """The compiler processes, and which of them serves each request.

    A path's requests go to the worker running or queueing one (so that they keep their
    order and a newer version cancels older ones), else to its home, the worker that
    served it last (its trace, tactic states and imported modules are cached there), when
    it analyses no other file, else to any worker that does not, which becomes its home,
    else they queue at home. A
    schedule file that loops thus holds its own worker until its timeout, and the others
    serve every other file.

    The first worker starts with the first request; the others start in the background
    once the pool is idle after that: a user with one file open never waits for, or
    shares the CPU with, the start of a process they do not need yet, and a second file
    that overflows later finds a process ready rather than paying JAX's import.
    """

    def __init__(self, config: P.DaemonConfig, paths: DaemonPaths) -> None:
        self.config = config
        self.unloaded: dict[str, list[str]] = {}  # see `WorkerSupervisor`
        self.workers = [WorkerSupervisor(config, paths, self.unloaded)
                        for _ in range(config.compiler_processes)]
        self._home: dict[str, WorkerSupervisor] = {}

    @property
    def busy(self) -> bool:
        return any(w.busy for w in self.workers)

    @property
    def pid(self) -> int | None:
        return self.workers[0].pid

    @property
    def pids(self) -> list[int]:
        return [w.pid for w in self.workers if w.pid is not None]

    async def call(self, item: WorkItem) -> Any:
        """Serve a request for a document (`item.path`) on the worker routed to."""
        assert item.path is not None
        worker = self._home[item.path] = self._route(item.path)
        try:
            return await worker.call(item)
        finally:
            if self.workers[0].pid is not None and not self.busy:
                for spare in self.workers[1:]:
                    spare.start_soon()

    def _route(self, path: str) -> WorkerSupervisor:
        holder = next((w for w in self.workers if w.holds(path)), None)
        if holder is not None:
            return holder
        home = self._home.get(path)
        if home is not None and not home.analysing:
            return home
        idle = [w for w in self.workers if not w.analysing]
        if idle:
            return min(idle, key=lambda w: w.pid is None)  # a running process first
        return home or min(self.workers, key=lambda w: w.load)

    def cancel_request(self, conn: Connection, request_id: int | str) -> None:
        for w in self.workers:
            w.cancel_request(conn, request_id)

    async def _everywhere(self, method: str, params: dict[str, Any],
                          workers: list[WorkerSupervisor]) -> list[dict[str, Any]]:
        """`method` on each of `workers`; the answers of those that gave one."""
        answers = await asyncio.gather(*(w.call(WorkItem(method, params)) for w in workers),
                                       return_exceptions=True)
        for answer in answers:
            if isinstance(answer, RpcError):
                log.warning("%s failed in a compiler process: %s", method, answer.message)
            elif isinstance(answer, BaseException):
                raise answer
        return [a for a in answers if not isinstance(a, BaseException)]

    async def invalidate(self, paths: list[str]) -> P.InvalidatedParams:
        """Drop what the running workers cached of changed files (one that is not running
        has nothing cached). The changed files include those imported by schedule files
        whose load never finished: no process saw them, and their fix must be seen."""
        answers = await self._everywhere("invalidate", {"paths": paths},
                                         [w for w in self.workers if w.pid is not None])
        imported = {os.path.realpath(f) for files in self.unloaded.values() for f in files}
        return P.InvalidatedParams(
            sorted({p for a in answers for p in a["paths"]} |
                   {p for p in paths if os.path.realpath(p) in imported}),
            sum(a["traces"] for a in answers))

    async def stats(self) -> P.CacheStats:
        answers = await self._everywhere("stats", {}, [w for w in self.workers
                                                       if w.pid is not None or w.busy])
        summed = [f.name for f in dataclasses.fields(P.CacheStats)
                  if f.name not in _POOL_STATS]
        stats = {name: sum(a.get(name, 0) for a in answers) for name in summed}
        stats["cancelled_requests"] += sum(w.cancelled for w in self.workers)
        # The cache bounds hold for each process.
        return P.CacheStats(**stats, max_ops=self.config.max_cache_ops,
                            max_entries=self.config.max_cache_entries, worker_pid=self.pid,
                            worker_restarts=sum(w.restarts for w in self.workers),
                            worker_pids=self.pids)

    async def stop(self) -> None:
        await asyncio.gather(*(w.stop() for w in self.workers))


# --- the daemon -----------------------------------------------------------------------------


class Daemon:
    def __init__(self, config: P.DaemonConfig, paths: DaemonPaths) -> None:
        self.config = config
        self.paths = paths
        self.started = time.time()
        self.connections: set[Connection] = set()
        self.last_activity = time.monotonic()
        self._stopped = asyncio.Event()
        self._stopping = False
        self.jobs = JobManager(paths)
        self.compilers = CompilerPool(config, paths)
        self._watch_stop = threading.Event()
        self._tasks: set[asyncio.Task] = set()

    def _spawn(self, coro: Any) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # -- lifecycle -----------------------------------------------------------------------
    async def serve(self, sock: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, lambda s=sig: self._spawn(self.stop(
                f"signal {signal.Signals(s).name}")))
        server = await asyncio.start_unix_server(self._handle, sock=sock,
                                                 limit=P.MAX_MESSAGE_BYTES)
        self._spawn(self._idle_check())
        threading.Thread(target=self._watch, args=(loop,), name="partir-watch",
                         daemon=True).start()
        log.info("serving %s on %s (pid %d)", self.paths.workspace, self.paths.socket,
                 os.getpid())
        async with server:
            await self._stopped.wait()
            server.close()
            # Connections made while `stop` closed the others: their requests were
            # answered SHUTTING_DOWN; the server accepts no more, so this ends.
            deadline = time.monotonic() + 5
            while self.connections and time.monotonic() < deadline:
                await asyncio.gather(*(conn.close() for conn in list(self.connections)))
                await asyncio.sleep(0.01)

    async def stop(self, reason: str) -> None:
        if self._stopping:
            return
        self._stopping = True
        log.info("shutting down: %s", reason)
        self._watch_stop.set()
        await self.jobs.stop_all()
        await self.compilers.stop()
        for conn in list(self.connections):
            await conn.close()
        self._stopped.set()

    async def _idle_check(self) -> None:
        interval = max(0.2, min(5.0, self.config.idle_timeout_s / 4))
        while True:
            await asyncio.sleep(interval)
            if self.connections or self.jobs.running or self.compilers.busy:
                self.last_activity = time.monotonic()
            elif time.monotonic() - self.last_activity > self.config.idle_timeout_s:
                await self.stop(f"idle for {self.config.idle_timeout_s:g} s")
                return

    # -- file watching -------------------------------------------------------------------
    def _watch(self, loop: asyncio.AbstractEventLoop) -> None:
        import watchfiles

        def wanted(change: watchfiles.Change, path: str) -> bool:
            return path.endswith(".py") and os.sep + ".partir" + os.sep not in path

        try:
            for changes in watchfiles.watch(self.paths.workspace, watch_filter=wanted,
                                            stop_event=self._watch_stop, debounce=200,
                                            step=50, yield_on_timeout=False,
                                            raise_interrupt=False):
                paths = sorted({p for _, p in changes})
                loop.call_soon_threadsafe(lambda p=paths: self._spawn(self._changed(p)))
        except Exception:
            log.exception("the file watcher stopped")

    async def _changed(self, paths: list[str]) -> None:
        result = await self.compilers.invalidate(paths)
        # Changed files, even with no trace dropped: the language server analyses again
        # the schedule files that depend on them (one that failed to load holds no trace).
        if result.paths:
            log.info("files changed: %s; %d trace(s) dropped", result.paths, result.traces)
            for conn in list(self.connections):
                conn.send(P.notification(P.INVALIDATED, result))

    # -- connections ---------------------------------------------------------------------
    async def _handle(self, reader: asyncio.StreamReader,
                      writer: asyncio.StreamWriter) -> None:
        sock = writer.get_extra_info("socket")
        uid = _peer_uid(sock) if sock is not None else None
        if uid is not None and uid != os.getuid():
            log.warning("refused a connection from uid %d", uid)
            writer.close()
            return
        conn = Connection(reader, writer)
        self.connections.add(conn)
        self.last_activity = time.monotonic()
        try:
            # Also while the daemon stops: requests get SHUTTING_DOWN errors (`_message`)
            # until `stop` closes the connection.
            while True:
                try:
                    line = await reader.readuntil(b"\n")
                except asyncio.IncompleteReadError as e:
                    if e.partial.strip():
                        self._message(conn, e.partial)
                    break
                except asyncio.LimitOverrunError:
                    conn.send(P.error_response(None, P.INVALID_REQUEST,
                                               "message too long; closing the connection"))
                    break
                except (ConnectionError, OSError):
                    break
                if line.strip():
                    try:
                        self._message(conn, line)
                    except Exception:  # a bad message must not cost the connection
                        log.exception("handling a message failed")
                        conn.send(P.error_response(None, P.INTERNAL_ERROR,
                                                   "internal error handling a message"))
        finally:
            self.connections.discard(conn)
            self.last_activity = time.monotonic()
            await conn.close()

    def _message(self, conn: Connection, line: bytes) -> None:
        try:
            message = P.decode(line)
        except P.ProtocolError as e:
            request_id = None
            with contextlib.suppress(Exception):
                data = json.loads(line)
                if isinstance(data, dict) and P.valid_id(data.get("id")):
                    request_id = data["id"]
            conn.send(P.error_response(request_id, e.code, e.message))
            return
        if P.is_request(message):
            if self._stopping and message["method"] != "shutdown":
                conn.send(P.error_response(message["id"], P.SHUTTING_DOWN,
                                           "the daemon is shutting down"))
                return
            self._spawn(self._request(conn, message))
        elif P.is_notification(message) and message["method"] == P.CANCEL_REQUEST:
            # A notification gets no answer, not even an error: a malformed one (params
            # not an object, no id, an id of another type) is ignored.
            params = message.get("params")
            if isinstance(params, dict) and P.valid_id(params.get("id")):
                self.compilers.cancel_request(conn, params["id"])
        # Responses from clients: the daemon sends no requests, so there are none to match.

    async def _request(self, conn: Connection, message: dict[str, Any]) -> None:
        request_id, method = message["id"], message["method"]
        try:
            params = P.parse_params(method, message.get("params"))
            if P.METHODS[method].process == "compiler":  # a document's: see `Method`
                result = await self.compilers.call(
                    self._document(method, conn, request_id, params))
            else:
                result = await getattr(self, "_m_" + method)(conn, request_id, params)
            conn.send(P.response(request_id, result))
        except P.ProtocolError as e:
            conn.send(P.error_response(request_id, e.code, e.message))
        except RpcError as e:
            conn.send(P.error_response(request_id, e.code, e.message, e.data))
        except Exception as e:
            log.exception("%s failed", method)
            conn.send(P.error_response(request_id, P.INTERNAL_ERROR,
                                       f"{type(e).__name__}: {e}"))
        finally:
            self.last_activity = time.monotonic()
        if method == "shutdown":
            self._spawn(self.stop("shutdown requested"))

    # -- methods -------------------------------------------------------------------------
    def _source_file(self, params: Any, name: str = "path") -> str:
        """The absolute path of the file parameter `name` of `params`, after checking
        that it is a regular file of at most MAX_SOURCE_FILE_BYTES: reading /dev/zero, a
        FIFO or a huge file would not end, or exhaust the memory. A schedule file
        (`path`) that cannot be stat'ed (missing: the editor's unsaved text) passes: the
        worker reports it, as a "read" diagnostic; any other file must be there."""
        where = f"{type(params).__name__}.{name}"
        path = os.path.abspath(os.path.join(self.paths.workspace, getattr(params, name)))
        try:
            st = os.stat(path)
        except OSError as e:
            if name == "path":
                return path
            raise RpcError(P.INVALID_PARAMS, f"{where}: {path}: {e.strerror}") from None
        if not stat.S_ISREG(st.st_mode):
            raise RpcError(P.INVALID_PARAMS, f"{where}: {path} is not a regular file")
        if name == "path" and st.st_size > P.MAX_SOURCE_FILE_BYTES:
            raise RpcError(P.INVALID_PARAMS, f"{where}: {path} has {st.st_size} bytes, more "
                           f"than the limit of {P.MAX_SOURCE_FILE_BYTES} bytes "
                           f"({P.MAX_SOURCE_FILE_BYTES // (1024 * 1024)} MiB)")
        return path

    def _document(self, method: str, conn: Connection, request_id: Any,
                  params: P.DocumentParams) -> WorkItem:
        path = self._source_file(params)
        return WorkItem(method, P.to_json(params), path, params.version, conn, request_id)

    async def _m_run(self, conn: Connection, request_id: Any,
                     params: P.RunParams) -> P.RunResult:
        path = self._source_file(params)
        if params.inputs not in P.RUN_INPUTS:
            # An .npz of the inputs: a regular file (it may be large), relative to the
            # schedule file's directory, where the job runs.
            inputs = os.path.join(os.path.dirname(path), params.inputs)
            self._source_file(dataclasses.replace(params, inputs=inputs), "inputs")
        # Partition first (cached): it validates the file and gives the mesh's size.
        checked = await self.compilers.call(WorkItem(
            "partition", P.to_json(P.PartitionParams(path)), path, None, conn, request_id))
        def progress(p: P.ProgressParams) -> None:
            conn.send(P.notification(P.PROGRESS, p))

        # A job that cannot be recorded (a full disk) is not created: an error answers.
        try:
            if not checked["ok"]:
                d = checked["diagnostics"][0]
                where = f"{d['file']}:{d['line']}" if d["line"] else d["file"]
                return P.RunResult(self.jobs.failed(params, f"{where}: {d['message']}"))
            devices = math.prod(checked["mesh"].values())
            return P.RunResult(await self.jobs.start(params, path, devices, progress))
        except JobStorageError as e:
            raise RpcError(P.INTERNAL_ERROR, str(e)) from None

    async def _m_jobs(self, conn: Connection, request_id: Any,
                      params: P.JobsParams) -> P.JobsResult:
        return P.JobsResult(sorted(self.jobs.jobs.values(), key=lambda j: j.created))

    def _job(self, job_id: str) -> P.JobInfo:
        try:
            return self.jobs.get(job_id)
        except KeyError:
            raise RpcError(P.NOT_FOUND, f"no job {job_id!r}") from None

    async def _m_job(self, conn: Connection, request_id: Any,
                     params: P.JobParams) -> P.JobResult:
        job = self._job(params.id)
        return P.JobResult(job, self.jobs.log_tail(job, params.log_tail))

    async def _m_cancel(self, conn: Connection, request_id: Any,
                        params: P.CancelParams) -> P.CancelResult:
        self._job(params.id)
        return await self.jobs.cancel(params.id)

    async def _m_cache_stats(self, conn: Connection, request_id: Any,
                             params: P.CacheStatsParams) -> P.CacheStats:
        return await self.compilers.stats()

    async def _m_status(self, conn: Connection, request_id: Any,
                        params: P.StatusParams) -> P.DaemonStatus:
        return P.DaemonStatus(os.getpid(), __version__, P.PROTOCOL_VERSION,
                              str(self.paths.workspace), str(self.paths.socket),
                              self.config.hash(), self.started, time.time() - self.started,
                              len(self.connections), self.compilers.pid, str(self.paths.log))

    async def _m_shutdown(self, conn: Connection, request_id: Any,
                          params: P.ShutdownParams) -> P.ShutdownResult:
        return P.ShutdownResult(True)


def _peer_uid(sock: socket.socket) -> int | None:
    try:
        creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    except (OSError, AttributeError):
        return None
    return struct.unpack("3i", creds)[1]


# --- process setup --------------------------------------------------------------------------


def _parse(argv: list[str] | None) -> tuple[P.DaemonConfig, DaemonPaths, bool]:
    parser = argparse.ArgumentParser(prog="partir_daemon.server")
    parser.add_argument("--workspace", required=True)
    parser.add_argument("--runtime-dir", default=None)
    parser.add_argument("--detach", action="store_true",
                        help="run in the background once the workspace's lock is taken")
    defaults = P.DaemonConfig()
    for f in dataclasses.fields(P.DaemonConfig):
        parser.add_argument("--" + f.name.replace("_", "-"), dest=f.name,
                            type=type(getattr(defaults, f.name)),
                            default=getattr(defaults, f.name))
    args = parser.parse_args(argv)
    config = P.DaemonConfig(**{f.name: getattr(args, f.name)
                               for f in dataclasses.fields(P.DaemonConfig)})
    base = Path(args.runtime_dir) if args.runtime_dir else None
    return config, DaemonPaths.of(args.workspace, base), args.detach


def _write_status(paths: DaemonPaths, config: P.DaemonConfig) -> None:
    """The daemon's identity, in the workspace's `.partir/` next to its lock: what a
    second daemon, refused, names, and what clients find the running one by."""
    status = {"pid": os.getpid(), "start_ticks": process_start_ticks(os.getpid()),
              "socket": str(paths.socket), "runtime_dir": str(paths.dir),
              "version": __version__, "protocol": P.PROTOCOL_VERSION,
              "config_hash": config.hash(), "config": P.to_json(config),
              "workspace": str(paths.workspace), "log": str(paths.log),
              "started": time.time()}
    tmp = paths.status.with_name(paths.status.name + ".tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(status, f, indent=1)
        os.replace(tmp, paths.status)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _holder(paths: DaemonPaths) -> dict[str, Any]:
    """The identity of the daemon holding the workspace's lock, waiting a moment for it
    to write it (a daemon takes the lock first)."""
    deadline = time.monotonic() + HOLDER_WAIT_S
    while True:
        status = read_status(paths)
        if daemon_alive(status) or time.monotonic() > deadline:
            return status or {}
        time.sleep(0.05)


def _lock(paths: DaemonPaths) -> int | None:
    """Take the workspace's lock (`.partir/daemon.lock`): its open file descriptor, or
    None when a live daemon holds it. `flock` locks die with their holder, so the lock of
    a daemon that was killed is free: taken over here, its identity file overwritten."""
    paths.lock.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = os.open(paths.lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


_READY = b"ready"


def _detach(paths: DaemonPaths) -> int:
    """Daemonize: fork, the child in a session of its own (so that the terminal's Ctrl-C
    spares it) keeping the lock (flock belongs to the open file description it shares).
    The parent, which its caller waits for, exits once the child has written its
    identity and listens (status 0), or with the reason it could not (STARTUP_FAILED,
    the reason on stderr). Returns, in the child, the pipe's write end to report on."""
    read_end, write_end = os.pipe()
    if os.fork() > 0:
        os.close(write_end)
        chunks = []
        while chunk := os.read(read_end, 4096):
            chunks.append(chunk)
        said = b"".join(chunks)
        if said == _READY:
            os._exit(0)
        why = said.decode(errors="replace") or f"it exited while starting; see {paths.log}"
        os.write(2, f"partir daemon: {why}\n".encode())
        os._exit(STARTUP_FAILED)
    os.close(read_end)
    os.setsid()
    return write_end


def _listen(path: Path) -> socket.socket:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)  # we hold the lock: a socket left there is a dead daemon's
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o177)  # created 0600: no window in which others could connect
    try:
        sock.bind(str(path))
    finally:
        os.umask(old)
    os.chmod(path, 0o600)
    sock.listen(64)
    sock.setblocking(False)
    return sock


def main(argv: list[str] | None = None) -> int:
    config, paths, detach = _parse(argv)
    try:
        check_socket_path(paths.socket)
    except SocketPathTooLong as e:
        print(f"partir daemon: {e}", file=sys.stderr)
        return 2
    ensure_private_dir(paths.dir)
    lock_fd = _lock(paths)
    if lock_fd is None:
        status = _holder(paths)
        print(f"partir daemon: a daemon is already running for {paths.workspace}: pid "
              f"{status.get('pid', '?')}, socket {status.get('socket', '?')} (its lock: "
              f"{paths.lock})", file=sys.stderr)
        return ALREADY_RUNNING
    ready = _detach(paths) if detach else None
    try:
        # From here on nothing goes to the terminal: stdout and stderr are the log file.
        log_fd = os.open(paths.log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        os.dup2(log_fd, 1)
        os.dup2(log_fd, 2)
        os.close(log_fd)
        sys.stdout = sys.stderr = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115
        logging.basicConfig(stream=sys.stderr,
                            level=getattr(logging, config.log_level, "INFO"),
                            format="%(asctime)s daemon[%(process)d] %(levelname)s %(name)s: "
                                   "%(message)s")
        # Listening before the status names this daemon: a client that reads the status
        # finds the socket there (it waits in the backlog until the loop serves it).
        sock = _listen(paths.socket)
        _write_status(paths, config)
    except OSError as e:
        if ready is None:
            raise
        # A full disk or a read-only `.partir/`: said to whoever started the daemon, at
        # once, rather than left for its client to wait out.
        why = f"{e.strerror or e} ({e.filename})" if e.filename else str(e)
        os.write(ready, f"the daemon for {paths.workspace} could not start: {why}".encode())
        os._exit(STARTUP_FAILED)
    if ready is not None:
        os.write(ready, _READY)
        os.close(ready)

    async def run() -> None:
        daemon = Daemon(config, paths)
        daemon.jobs.recover()
        await daemon.serve(sock)

    try:
        asyncio.run(run())
    finally:
        status = read_status(paths)
        if status and status.get("pid") == os.getpid():
            with contextlib.suppress(FileNotFoundError):
                os.unlink(paths.status)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(paths.socket)
        log.info("stopped")
        fcntl.flock(lock_fd, fcntl.LOCK_UN)
        os.close(lock_fd)
    return 0


if __name__ == "__main__":
    sys.exit(main())
