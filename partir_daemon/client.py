"""The daemon's client: connect to (or start) the daemon of a workspace and call its
methods. Used by `partir daemon ...`, the language server and the tests.

    from partir_daemon.client import DaemonClient

    with DaemonClient.connect("/path/to/workspace", on_progress=print) as client:
        result = client.partition("examples/mlp/bp_mp_z3.partir.py")   # PartitionResult
        for t in result.tactics:
            print(t.index, t.name, t.reused, t.metadata["collectives"])
        text = client.ir("examples/mlp/bp_mp_z3.partir.py", level="hlo", after=2).text
        job = client.run("examples/mlp/bp_mp_z3.partir.py", steps=5)
        job = client.wait_job(job.id)                                  # JobInfo

API:
- `DaemonClient.connect(workspace, autostart=True, config=None, timeout=120.0,
  on_progress=None, on_notification=None)`: connects to the workspace's daemon, starting
  one (detached, logging to `<workspace>/.partir/daemon.log`) when none runs and
  `autostart` is set; a daemon answering that it is shutting down (asked to, or idle)
  is waited for and replaced the same way. `timeout` is the default per-request timeout
  in seconds (None: wait forever); every method also takes `timeout=`.
- One method per RPC: `partition`, `ir`, `explain`, `run`, `jobs`, `job`, `cancel`,
  `cache_stats`, `status`, `shutdown`; each returns the result dataclass of
  `partir_daemon.protocol`. `request_future(method, params)` sends without waiting and
  returns a `concurrent.futures.Future` (for asyncio: `asyncio.wrap_future`), and
  `cancel_request(id)` cancels a request in flight. The client is thread-safe.
- `on_progress(ProgressParams)` receives `$/progress` notifications (partition phases and
  tactics, job steps); `on_notification(method, params_dict)` every other notification
  (`partir/invalidated`). Both are called on the client's reader thread.
- Errors: `DaemonNotRunning` (no daemon and no auto-start, or it failed to start),
  `DaemonConnectionLost` (the daemon crashed or exited while a request was pending),
  `InsecureDaemonSocket` (the socket belongs to another user or others can access it),
  `NotADaemon` (what listens on the socket does not answer the opening `status`
  request within 2 s, or answers something that is not the daemon's status),
  `SocketPathTooLongError` (the socket's path is over the 107-byte AF_UNIX limit),
  `RequestError` (a JSON-RPC error; `RequestCancelled` for a superseded or cancelled
  request), `RequestTimeout`. All derive from `DaemonError`.

Module functions: `start_daemon`, `stop_daemon`, `daemon_status` (`partir daemon ...`).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import itertools
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from partir_daemon import protocol as P
from partir_daemon.paths import (
    DaemonPaths,
    InsecurePathError,
    SocketPathTooLong,
    check_private_dir,
    check_socket,
    check_socket_path,
    daemon_alive,
    ensure_private_dir,
    pid_alive,
    read_status,
)


class DaemonError(Exception):
    """Base class of the client's errors."""


class DaemonNotRunning(DaemonError):
    """No daemon serves the workspace (and none was started, or it failed to start)."""


class DaemonConnectionLost(DaemonError):
    """The connection closed while requests were pending: the daemon crashed or exited."""


class DaemonElsewhere(DaemonError):
    """The workspace's daemon runs, but listens in another runtime directory (it was
    started with another XDG_RUNTIME_DIR or PARTIR_DAEMON_DIR): no second daemon may
    start, and this client does not reach that one."""


def _elsewhere(paths: DaemonPaths) -> DaemonElsewhere | None:
    """The error naming the workspace's running daemon if it listens on another socket
    than the one `paths` has."""
    status = read_status(paths)
    if not daemon_alive(status) or status.get("socket") == str(paths.socket):
        return None
    return DaemonElsewhere(
        f"a partir daemon already serves {paths.workspace} from another runtime "
        f"directory: pid {status.get('pid')}, socket {status.get('socket')} (this client "
        f"looks for {paths.socket}); stop it (`partir daemon stop`) or use its runtime "
        f"directory")


class InsecureDaemonSocket(DaemonError):
    """The socket belongs to another user or has loose permissions: refused."""


class SocketPathTooLongError(DaemonError):
    """The socket's path is over the AF_UNIX limit (107 bytes): no daemon can listen
    there."""


class NotADaemon(DaemonError):
    """Something that is not the partir daemon holds the socket: it does not answer the
    client's opening `status` request, or answers something else."""


class _ShuttingDown(Exception):
    """The daemon holding the socket answered that it is shutting down (it was asked to,
    or idled out as the client arrived): `DaemonClient.connect` waits for it to exit and
    starts a new one."""


class RequestTimeout(DaemonError):
    """No response within the timeout (the request is cancelled in the daemon)."""


class RequestError(DaemonError):
    """The daemon answered with a JSON-RPC error."""

    def __init__(self, code: int, message: str, data: Any = None) -> None:
        super().__init__(f"{message} (JSON-RPC error {code})")
        self.code = code
        self.message = message
        self.data = data


class RequestCancelled(RequestError):
    """The request was cancelled: superseded by a newer revision of its document, or by
    `cancel_request`."""


ProgressCallback = Callable[[P.ProgressParams], None]
NotificationCallback = Callable[[str, Any], None]


def _package_root() -> str:
    # The directory holding `partir_daemon/` (and `partir/`), for child processes started
    # with `-m`: they must import this copy even when it is not installed.
    return str(Path(__file__).resolve().parents[1])


def module_command(module: str) -> list[str]:
    """The command running `module` in a child process. `-P`: `python -m` would put the
    current directory (the workspace, for the daemon and its compiler) first on
    `sys.path`, ahead of the standard library, so that a workspace's `random.py`,
    `logging.py` or `queue.py` would replace the standard module. The children add the
    directories the user's modules are in at the end of `sys.path` themselves."""
    return [sys.executable, "-P", "-m", module]


def child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    root = _package_root()
    env["PYTHONPATH"] = os.pathsep.join([root, *filter(None, [env.get("PYTHONPATH")])])
    env.update(extra or {})
    return env


def _check_socket_path(paths: DaemonPaths) -> None:
    try:
        check_socket_path(paths.socket)
    except SocketPathTooLong as e:
        raise SocketPathTooLongError(str(e)) from None


def _connect_socket(paths: DaemonPaths) -> socket.socket:
    """A connected socket, after checking its ownership and mode. Raises
    FileNotFoundError/ConnectionRefusedError when nothing listens there."""
    _check_socket_path(paths)
    try:
        if paths.dir.exists():
            check_private_dir(paths.dir)
        check_socket(paths.socket)
    except InsecurePathError as e:
        raise InsecureDaemonSocket(str(e)) from None
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(str(paths.socket))
    except OSError:
        sock.close()
        raise
    return sock


# How long the client waits for the answer to its opening `status` request before it
# concludes that what holds the socket is not a daemon.
HANDSHAKE_TIMEOUT_S = 1.5
_HANDSHAKE_ID = "partir-client-handshake"


def _handshake(sock: socket.socket, paths: DaemonPaths) -> bytes:
    """Check that the daemon is what listens on `sock`: send a `status` request (an
    ordinary one: the wire format is unchanged) and read its answer within
    HANDSHAKE_TIMEOUT_S. Returns the bytes that came before and after the answer
    (notifications), for the client's reader. Raises NotADaemon."""
    what = f"something other than the partir daemon holds the socket {paths.socket}"
    deadline = time.monotonic() + HANDSHAKE_TIMEOUT_S
    before: list[bytes] = []
    buffer = b""
    try:
        sock.settimeout(HANDSHAKE_TIMEOUT_S)
        sock.sendall(P.encode(P.request(_HANDSHAKE_ID, "status", P.StatusParams())))
        while True:
            while b"\n" not in buffer:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError
                sock.settimeout(remaining)
                chunk = sock.recv(1 << 16)
                if not chunk:
                    raise NotADaemon(f"{what}: it closed the connection without answering "
                                     f"the client's status request")
                buffer += chunk
                if len(buffer) > P.MAX_MESSAGE_BYTES:
                    raise NotADaemon(f"{what}: it sent {len(buffer)} bytes without a "
                                     f"line break")
            line, buffer = buffer.split(b"\n", 1)
            if not line.strip():
                continue
            try:
                message = P.decode(line)
            except P.ProtocolError:
                raise NotADaemon(f"{what}: it answered {line[:80]!r}, which is not "
                                 f"JSON-RPC") from None
            if P.is_notification(message):
                before.append(line + b"\n")
                continue
            if message.get("id") == _HANDSHAKE_ID and \
                    (message.get("error") or {}).get("code") == P.SHUTTING_DOWN:
                raise _ShuttingDown
            if message.get("id") != _HANDSHAKE_ID or "result" not in message:
                raise NotADaemon(f"{what}: it answered the status request with "
                                 f"{line[:200]!r}")
            try:
                P.parse_result("status", message["result"])
            except P.ProtocolError:
                raise NotADaemon(f"{what}: its answer to the status request is not a "
                                 f"daemon's status: {line[:200]!r}") from None
            return b"".join(before) + buffer
    except TimeoutError:
        raise NotADaemon(f"{what}: it accepted the connection but did not answer the "
                         f"client's status request within {HANDSHAKE_TIMEOUT_S} s") from None
    except OSError as e:
        raise NotADaemon(f"{what}: {e}") from None
    finally:
        with contextlib.suppress(OSError):
            sock.settimeout(None)


def start_daemon(workspace: str | os.PathLike[str], config: P.DaemonConfig | None = None, *,
                 runtime_dir: Path | None = None, timeout: float = 60.0) -> dict[str, Any]:
    """Start the workspace's daemon (detached from this process) and wait until it
    accepts connections; returns its status file. If one is already running, returns its
    status instead (the new process refuses to start and exits)."""
    paths = DaemonPaths.of(workspace, runtime_dir)
    _check_socket_path(paths)  # else the daemon fails to bind, and only its log says why
    ensure_private_dir(paths.dir)
    paths.log.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    config = config or P.DaemonConfig()
    cmd = [*module_command("partir_daemon.server"), "--workspace", str(paths.workspace),
           "--runtime-dir", str(paths.dir), "--detach", *config.to_args()]
    # The daemon forks into the background (a new session, so that the terminal's Ctrl-C
    # spares it) and logs to its file; the process started here exits at once (status 3
    # when another daemon holds the workspace) and is reaped below.
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, start_new_session=True,
                            env=child_env(), cwd=str(paths.workspace))
    try:
        _, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise DaemonNotRunning(f"the daemon did not start within {timeout:.0f} s") from None
    if proc.returncode not in (0, 3):  # 3: another daemon serves it: connect to that one
        raise DaemonNotRunning(f"the daemon failed to start (status {proc.returncode}): "
                               f"{err.decode(errors='replace').strip()[-2000:]}")
    if proc.returncode == 3 and (elsewhere := _elsewhere(paths)) is not None:
        raise elsewhere
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status = read_status(paths)
        if daemon_alive(status):
            try:
                _connect_socket(paths).close()
                return status
            except (FileNotFoundError, ConnectionRefusedError):
                pass
        time.sleep(0.05)
    raise DaemonNotRunning(f"the daemon did not start within {timeout:.0f} s; see {paths.log}")


def daemon_status(workspace: str | os.PathLike[str], *,
                  runtime_dir: Path | None = None) -> dict[str, Any] | None:
    """The status file of the workspace's daemon if that daemon is alive, else None."""
    paths = DaemonPaths.of(workspace, runtime_dir)
    status = read_status(paths)
    if daemon_alive(status):
        return status
    return None


def stop_daemon(workspace: str | os.PathLike[str], *, runtime_dir: Path | None = None,
                timeout: float = 15.0) -> bool:
    """Ask the workspace's daemon to shut down (SIGTERM if it does not answer); wait until
    it is gone. Returns False when no daemon was running."""
    status = daemon_status(workspace, runtime_dir=runtime_dir)
    if status is None:
        return False
    pid = int(status["pid"])
    try:
        with DaemonClient.connect(workspace, autostart=False, runtime_dir=runtime_dir,
                                  timeout=timeout) as client:
            client.shutdown()
    except DaemonError:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            return True
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not pid_alive(pid):
            return True
        time.sleep(0.05)
    os.kill(pid, signal.SIGKILL)
    return True


def _open(paths: DaemonPaths, autostart: bool, config: P.DaemonConfig | None,
          start_timeout: float) -> socket.socket:
    """A socket connected to the workspace's daemon, started first if none runs and
    `autostart` is set."""
    try:
        sock = _connect_socket(paths)
        status = read_status(paths)
        if status and not daemon_alive(status):
            # A killed daemon's socket can outlive it for a moment in a child it was
            # forking: what answers there is not a daemon.
            sock.close()
            raise ConnectionRefusedError(f"daemon pid {status.get('pid')} is gone")
    except (FileNotFoundError, ConnectionRefusedError) as e:
        if (elsewhere := _elsewhere(paths)) is not None:
            raise elsewhere from None
        if not autostart:
            status = read_status(paths)
            why = ""
            if status and not daemon_alive(status):
                why = (f" (its status file names pid {status.get('pid')}, which is not "
                       f"running: it crashed or was killed; see {paths.log})")
            raise DaemonNotRunning(f"no partir daemon is running for "
                                   f"{paths.workspace}{why}") from e
        try:
            start_daemon(paths.workspace, config, runtime_dir=paths.dir,
                         timeout=start_timeout)
        except InsecurePathError as e2:
            raise InsecureDaemonSocket(str(e2)) from None
        try:
            sock = _connect_socket(paths)
        except (FileNotFoundError, ConnectionRefusedError) as e2:
            raise DaemonNotRunning(f"the daemon for {paths.workspace} started but does "
                                   f"not accept connections: {e2}") from None
    return sock


def _wait_for_exit(paths: DaemonPaths, deadline: float) -> None:
    """Wait until the daemon that answered it is shutting down has exited: its process,
    which holds the workspace's lock until its very end, not just its status file."""
    status = read_status(paths)
    while daemon_alive(status):
        if time.monotonic() > deadline:
            raise DaemonNotRunning(f"the daemon for {paths.workspace} is shutting down and "
                                   f"did not exit in time; see {paths.log}")
        time.sleep(0.05)


@dataclass
class Pending:
    """A request sent and not answered yet."""

    method: str
    future: concurrent.futures.Future
    on_partial: Callable[[Any], None] | None = None


class DaemonClient:
    def __init__(self, sock: socket.socket, paths: DaemonPaths, *, timeout: float | None,
                 on_progress: ProgressCallback | None = None,
                 on_notification: NotificationCallback | None = None,
                 pending: bytes = b"") -> None:
        self.paths = paths
        self.timeout = timeout
        self.on_progress = on_progress
        self.on_notification = on_notification
        self._sock = sock
        self._send_lock = threading.Lock()
        self._ids = itertools.count(1)
        self._pending: dict[int | str, Pending] = {}
        self._pending_lock = threading.Lock()
        self._closed = False
        self._lost: str | None = None
        self._initial = pending  # what came with the handshake's answer
        self._reader = threading.Thread(target=self._read_loop, name="partir-daemon-client",
                                        daemon=True)
        self._reader.start()

    # -- connecting ----------------------------------------------------------------------
    @classmethod
    def connect(cls, workspace: str | os.PathLike[str], *, autostart: bool = True,
                config: P.DaemonConfig | None = None, timeout: float | None = 120.0,
                start_timeout: float = 60.0, runtime_dir: Path | None = None,
                on_progress: ProgressCallback | None = None,
                on_notification: NotificationCallback | None = None) -> DaemonClient:
        """Connect to the daemon of `workspace`, starting one if none runs and
        `autostart` is set. A daemon that is shutting down is waited for (at most
        `start_timeout`), and replaced as if none ran."""
        paths = DaemonPaths.of(workspace, runtime_dir)
        deadline = time.monotonic() + start_timeout
        while True:
            sock = _open(paths, autostart, config, start_timeout)
            try:
                pending = _handshake(sock, paths)
            except _ShuttingDown:
                sock.close()
                _wait_for_exit(paths, deadline)
                continue
            except NotADaemon:
                sock.close()
                raise
            return cls(sock, paths, timeout=timeout, on_progress=on_progress,
                       on_notification=on_notification, pending=pending)

    def __enter__(self) -> DaemonClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        self._sock.close()
        self._reader.join(timeout=5)

    # -- messages ------------------------------------------------------------------------
    def _send(self, message: dict[str, Any]) -> None:
        data = P.encode(message)
        with self._send_lock:
            if self._lost is not None:
                raise DaemonConnectionLost(self._lost)
            try:
                self._sock.sendall(data)
            except OSError as e:
                raise DaemonConnectionLost(f"cannot send to the daemon: {e}") from None

    def request_future(self, method: str, params: Any, *,
                       on_partial: Callable[[Any], None] | None = None
                       ) -> concurrent.futures.Future:
        """Send a request; the future resolves to its result dataclass or raises one of
        the client's errors. `future.request_id` is the id (for `cancel_request`).
        `on_partial` is called (on the reader thread) with each partial result the daemon
        sends for it first (see `PartitionParams.partial`)."""
        request_id = next(self._ids)
        future: concurrent.futures.Future = concurrent.futures.Future()
        future.request_id = request_id  # type: ignore[attr-defined]
        with self._pending_lock:
            self._pending[request_id] = Pending(method, future, on_partial)
        try:
            self._send(P.request(request_id, method, params))
        except DaemonError as e:
            with self._pending_lock:
                self._pending.pop(request_id, None)
            future.set_exception(e)
        return future

    def request(self, method: str, params: Any, timeout: float | None = -1.0, *,
                on_partial: Callable[[Any], None] | None = None) -> Any:
        """Send a request and wait for its result (timeout -1: the client's default)."""
        future = self.request_future(method, params, on_partial=on_partial)
        wait = self.timeout if timeout == -1.0 else timeout
        try:
            return future.result(timeout=wait)
        except concurrent.futures.TimeoutError:
            self.cancel_request(future.request_id)  # type: ignore[attr-defined]
            raise RequestTimeout(f"{method}: no answer from the daemon within "
                                 f"{wait} s") from None

    def notify(self, method: str, params: Any) -> None:
        self._send(P.notification(method, params))

    def cancel_request(self, request_id: int | str) -> None:
        """Ask the daemon to cancel a pending request (it then fails with
        RequestCancelled). Harmless if it already finished."""
        with contextlib.suppress(DaemonConnectionLost):
            self.notify(P.CANCEL_REQUEST, P.CancelRequestParams(request_id))

    def _read_loop(self) -> None:
        buffer, self._initial = self._initial, b""
        reason = "the daemon closed the connection"
        try:
            while True:
                while b"\n" in buffer:
                    line, buffer = buffer.split(b"\n", 1)
                    if line.strip():
                        self._dispatch(line)
                chunk = self._sock.recv(1 << 20)
                if not chunk:
                    break
                buffer += chunk
        except OSError as e:
            reason = f"connection to the daemon lost: {e}"
        if self._closed:
            reason = "the client was closed"
        with self._send_lock:
            self._lost = reason
        with self._pending_lock:
            pending, self._pending = self._pending, {}
        for entry in pending.values():
            if not entry.future.done():
                entry.future.set_exception(DaemonConnectionLost(f"{entry.method}: {reason}"))

    def _dispatch(self, line: bytes) -> None:
        try:
            message = P.decode(line)
        except P.ProtocolError:
            return  # the daemon only sends valid messages; nothing to answer to
        if P.is_notification(message):
            self._notification(message["method"], message.get("params"))
            return
        with self._pending_lock:
            entry = self._pending.pop(message.get("id"), None)
        if entry is None:
            return
        method, future = entry.method, entry.future
        if future.cancelled():  # the caller gave up on it (see `request_future`)
            return
        if "error" in message:
            err = message["error"] or {}
            cls = RequestCancelled if err.get("code") == P.REQUEST_CANCELLED else RequestError
            future.set_exception(cls(err.get("code", P.INTERNAL_ERROR),
                                     err.get("message", ""), err.get("data")))
            return
        try:
            future.set_result(P.parse_result(method, message.get("result")))
        except P.ProtocolError as e:
            future.set_exception(RequestError(e.code, f"malformed {method} result: "
                                              f"{e.message}"))

    def _notification(self, method: str, params: Any) -> None:
        try:
            if method == P.PROGRESS:
                if self.on_progress is not None:
                    self.on_progress(P.from_json(P.ProgressParams, params))
            elif method == P.PARTIAL:
                with self._pending_lock:
                    entry = self._pending.get((params or {}).get("token"))
                if entry is not None and entry.on_partial is not None and \
                        not entry.future.done():
                    entry.on_partial(P.from_json(P.METHODS[entry.method].result,
                                                 params["result"]))
            elif self.on_notification is not None:
                self.on_notification(method, params)
        except Exception:  # a callback's bug must not kill the reader thread
            import traceback
            traceback.print_exc()

    # -- methods -------------------------------------------------------------------------
    def partition(self, path: str | os.PathLike[str], text: str | None = None, *,
                  version: int | None = None, include_ir: bool = False,
                  metadata: bool = True,
                  on_partial: Callable[[P.PartitionResult], None] | None = None,
                  timeout: float | None = -1.0) -> P.PartitionResult:
        """Apply the schedule file at `path` (or its unsaved `text`): per-tactic records,
        which tactics were reused from the cache, source ranges and diagnostics. With
        `metadata=False` the records lack `collectives` and `cost` (no lowering): the
        fast first answer to an edit (see `PartitionParams.metadata`). `on_partial`
        receives that fast answer, when there is lowering left to do, before the
        complete one is returned (see `PartitionParams.partial`)."""
        return self.request("partition", P.PartitionParams(
            os.fspath(path), text, version, include_ir, metadata, on_partial is not None),
            timeout, on_partial=on_partial)

    def ir(self, path: str | os.PathLike[str], *, level: P.IrLevel = "core",
           after: int | None = None, text: str | None = None, version: int | None = None,
           timeout: float | None = -1.0) -> P.IrResult:
        """The program after tactic `after` (0: traced; None: last) as Core/SPMD/HLO text."""
        return self.request("ir", P.IrParams(os.fspath(path), text, version, level, after),
                            timeout)

    def explain(self, path: str | os.PathLike[str], *, name: str | None = None,
                file: str | None = None, line: int | None = None, text: str | None = None,
                version: int | None = None,
                timeout: float | None = -1.0) -> P.ExplainResult:
        """Shardings of an input/tag `name` (or the values of model `file`:`line`) after
        each tactic, and the collectives attributed to it with the tactic that
        introduced them."""
        return self.request("explain", P.ExplainParams(os.fspath(path), text, version, name,
                                                       file, line), timeout)

    def run(self, path: str | os.PathLike[str], *, steps: int = 10, inputs: str = "example",
            seed: int = 0, timeout_s: float = 1800.0, check: bool = True,
            processes: int = 1, timeout: float | None = -1.0) -> P.JobInfo:
        """Start a job running the partitioned program; returns at once with its record."""
        return self.request("run", P.RunParams(os.fspath(path), steps, inputs, seed,
                                               timeout_s, check, processes), timeout).job

    def jobs(self, timeout: float | None = -1.0) -> list[P.JobInfo]:
        return self.request("jobs", P.JobsParams(), timeout).jobs

    def job(self, job_id: str, *, log_tail: int = 200,
            timeout: float | None = -1.0) -> P.JobResult:
        return self.request("job", P.JobParams(job_id, log_tail), timeout)

    def cancel(self, job_id: str, timeout: float | None = -1.0) -> P.CancelResult:
        return self.request("cancel", P.CancelParams(job_id), timeout)

    def wait_job(self, job_id: str, timeout: float = 600.0,
                 poll_s: float = 0.1) -> P.JobInfo:
        """Poll until the job reaches a final state; RequestTimeout after `timeout`."""
        deadline = time.monotonic() + timeout
        while True:
            info = self.job(job_id, log_tail=0).job
            if info.state in P.FINAL_JOB_STATES:
                return info
            if time.monotonic() > deadline:
                raise RequestTimeout(f"job {job_id} still {info.state} after {timeout} s")
            time.sleep(poll_s)

    def cache_stats(self, timeout: float | None = -1.0) -> P.CacheStats:
        return self.request("cache_stats", P.CacheStatsParams(), timeout)

    def status(self, timeout: float | None = -1.0) -> P.DaemonStatus:
        return self.request("status", P.StatusParams(), timeout)

    def shutdown(self, timeout: float | None = -1.0) -> P.ShutdownResult:
        """Ask the daemon to exit (after answering; running jobs are stopped and marked
        interrupted)."""
        return self.request("shutdown", P.ShutdownParams(), timeout)
