"""Start-up and permission edges (issue 15, item 4): private job files whatever the
umask, a workspace that shadows standard modules, socket paths over the AF_UNIX limit,
and something other than the daemon listening on the socket."""

from __future__ import annotations

import contextlib
import os
import socket
import stat
import threading
import time
from pathlib import Path

import pytest

from partir_daemon.client import (
    DaemonClient,
    DaemonNotRunning,
    NotADaemon,
    SocketPathTooLongError,
    start_daemon,
)
from partir_daemon.paths import DaemonPaths
from tests.daemon.support import make_env

SCHEDULE = "mlp/bp_mp_z3.partir.py"


def _mode(path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


@pytest.mark.slow
@pytest.mark.parametrize("umask", [0o022, 0o000], ids=["umask022", "umask000"])
def test_job_directories_and_files_are_private_whatever_the_umask(umask):
    old = os.umask(umask)
    env = make_env()
    try:
        client = env.connect()  # the daemon inherits the umask
        done = client.wait_job(client.run(SCHEDULE, steps=2).id, timeout=180)
        assert done.state == "succeeded", done.error
        assert done.metrics is not None  # the results are in the record
        failed = client.run("mlp/missing.partir.py", steps=1)  # a job that never started
        job_dir = env.workspace / ".partir" / "jobs" / done.id
        assert _mode(env.workspace / ".partir" / "jobs") == 0o700
        for d in (job_dir, os.path.dirname(failed.record_path)):
            assert _mode(d) == 0o700, d
        files = sorted(job_dir.iterdir())
        assert {f.name for f in files} >= {"job.json", "log.txt"}
        for f in [*files, failed.record_path]:
            assert _mode(f) == 0o600, f
    finally:
        os.umask(old)
        env.teardown()


SHADOWING = ("random", "logging", "queue")


@pytest.mark.slow
def test_a_workspace_shadowing_standard_modules_breaks_neither_daemon_nor_compiler():
    import partir
    from examples.mlp.model import example_args, mlp
    from partir.tactics import ManualPartition

    env = make_env()
    try:
        # At the workspace's root (the daemon's and compiler's working directory) and
        # next to the schedule file: importing any of them is a failure.
        for directory in (env.workspace, env.workspace / "mlp"):
            for name in SHADOWING:
                (directory / f"{name}.py").write_text(
                    f"raise RuntimeError('the workspace\\'s {name}.py was imported "
                    f"instead of the standard library\\'s')\n")
        client = env.connect()
        result = client.partition(SCHEDULE)
        assert result.ok, result.diagnostics
        assert [t.name for t in result.tactics] == ["BP", "MP", "Z3"]
        schedule = [ManualPartition({"x": 0}, axis="batch", name="BP"),
                    ManualPartition({"w1": 1}, axis="model", name="MP"),
                    ManualPartition({"w1": 0, "w2": 1}, axis="batch", name="Z3")]
        meta = partir.partition(mlp, {"batch": 4, "model": 2}, schedule, *example_args())
        assert [t.metadata["collectives"] for t in result.tactics] == \
            [t.collectives for t in meta.tactics]
        # The user's own modules still import (the schedule imports `model`), and a job
        # runs too.
        done = client.wait_job(client.run(SCHEDULE, steps=1).id, timeout=180)
        assert done.state == "succeeded", done.error
        log = env.paths.log.read_text()
        assert "instead of the standard library" not in log
    finally:
        env.teardown()


def test_a_socket_path_over_the_af_unix_limit_fails_at_once_naming_path_and_limit():
    env = make_env()
    long_runtime = env.runtime / ("r" * 110)
    try:
        start = time.monotonic()
        with pytest.raises(SocketPathTooLongError) as e:
            DaemonClient.connect(env.workspace, runtime_dir=long_runtime, config=env.config)
        assert time.monotonic() - start < 2
        socket_path = str(DaemonPaths.of(env.workspace, long_runtime).socket)
        assert socket_path in str(e.value) and "107" in str(e.value)
        with pytest.raises(SocketPathTooLongError):
            start_daemon(env.workspace, env.config, runtime_dir=long_runtime)
        assert not long_runtime.exists()  # nothing was started or created
    finally:
        env.teardown()


def test_a_daemon_that_cannot_write_its_identity_fails_its_client_at_once_saying_why():
    """The identity file is written through `daemon.json.tmp`: a directory in its place
    fails that write as a full disk would. The client hears why within seconds, not
    after its start timeout, and nothing is left holding the workspace."""
    env = make_env()
    tmp = env.paths.status.with_name(env.paths.status.name + ".tmp")
    try:
        tmp.mkdir(parents=True)
        start = time.monotonic()
        with pytest.raises(DaemonNotRunning) as e:
            env.connect(start_timeout=60)
        assert time.monotonic() - start < 10
        assert "could not start" in str(e.value) and str(tmp) in str(e.value), e.value
        assert not env.paths.status.exists()
        tmp.rmdir()
        with env.connect() as client:  # the lock was released with the failed daemon
            assert client.status().pid == env.daemon_pid()
    finally:
        env.teardown()


def _impostor(path: Path, answer: bytes | None) -> tuple[socket.socket, threading.Thread]:
    """A process-like listener on the daemon's socket that is not the daemon: it accepts
    and then never answers (`answer` None) or answers `answer`."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o177)
    try:
        listener.bind(str(path))
    finally:
        os.umask(old)
    listener.listen(8)
    conns = []

    def serve() -> None:
        with contextlib.suppress(OSError):
            while True:
                conn, _ = listener.accept()
                conns.append(conn)
                if answer is not None:
                    conn.recv(1 << 16)
                    conn.sendall(answer)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return listener, thread


@pytest.mark.slow
@pytest.mark.parametrize("answer", [
    None, b"HTTP/1.1 400 Bad Request\r\n\r\n", b'{"jsonrpc": "2.0", "id": 7, "result": 1}\n',
    b'{"jsonrpc": "2.0", "id": "partir-client-handshake", "result": {"x": 1}}\n',
], ids=["silent", "garbage", "wrong-id", "not-a-status"])
def test_something_else_on_the_socket_fails_the_client_within_2_s(answer):
    env = make_env()
    paths = env.paths
    listener, _thread = _impostor(paths.socket, answer)
    try:
        for autostart in (False, True):
            start = time.monotonic()
            with pytest.raises(NotADaemon) as e:
                env.connect(autostart=autostart, timeout=60)
            assert time.monotonic() - start < 2
            assert "something other than the partir daemon holds the socket" in str(e.value)
            assert str(paths.socket) in str(e.value)
    finally:
        listener.close()
        env.teardown()
