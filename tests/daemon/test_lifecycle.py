"""Starting, refusing, stopping: the socket and status file, a second daemon, signals,
the idle timeout, insecure sockets, lost connections and `partir daemon ...`."""

from __future__ import annotations

import json
import os
import signal
import socket
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from partir.cli import main as cli
from partir_daemon import protocol as P
from partir_daemon.client import (
    DaemonClient,
    DaemonConnectionLost,
    DaemonNotRunning,
    InsecureDaemonSocket,
    child_env,
)
from partir_daemon.paths import pid_alive, read_status
from tests.daemon.support import (
    BP_MP_Z3,
    STUBBORN,
    processes_mentioning,
    read_reply,
    wait_until,
)


def test_the_socket_and_status_file(env):
    client = env.connect()
    status = client.status()
    paths = env.paths
    st = os.lstat(paths.socket)
    assert stat.S_ISSOCK(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o600
    assert stat.S_IMODE(os.lstat(paths.dir).st_mode) == 0o700
    on_disk = read_status(paths)
    assert on_disk["pid"] == status.pid and on_disk["socket"] == str(paths.socket)
    assert on_disk["version"] == status.version
    assert on_disk["config_hash"] == env.config.hash() == status.config_hash
    assert status.workspace == str(env.workspace)


@pytest.mark.slow
def test_a_second_daemon_refuses_and_points_at_the_first(env):
    # Started directly, not through the client: its stdout must stay empty.
    cmd = [sys.executable, "-m", "partir_daemon.server", "--workspace", str(env.workspace),
           "--runtime-dir", str(env.runtime), *env.config.to_args()]
    first = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             env=child_env())
    try:
        assert wait_until(lambda: env.daemon_pid() == first.pid, timeout=30)
        client = env.connect(autostart=False)
        assert client.partition("mlp/bp_mp_z3.partir.py").ok
        second = subprocess.run(cmd, capture_output=True, text=True, env=child_env(),
                                timeout=60)
        assert second.returncode == 3
        assert f"pid {first.pid}" in second.stderr and str(env.paths.socket) in second.stderr
        assert client.status().pid == first.pid  # the first one is unaffected
        client.shutdown()
        out, _ = first.communicate(timeout=30)
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
    assert first.returncode == 0 and out == b""  # nothing on stdout: logs go to the file
    log = env.paths.log.read_text()
    assert "serving" in log and "shutting down: shutdown requested" in log


def test_sigterm_shuts_down_cleanly(env):
    client = env.connect()
    assert client.partition("mlp/bp_mp_z3.partir.py").ok
    worker = client.status().worker_pid
    pid = env.daemon_pid()
    os.kill(pid, signal.SIGTERM)
    assert wait_until(lambda: not pid_alive(pid), timeout=30)
    assert not pid_alive(worker)
    assert not env.paths.socket.exists() and not env.paths.status.exists()
    assert "signal SIGTERM" in env.paths.log.read_text()


@pytest.mark.slow
def test_the_idle_timeout(env):
    env.config = P.DaemonConfig(idle_timeout_s=1.0, load_timeout_s=2.0)
    client = env.connect()
    pid = client.status().pid
    assert wait_until(lambda: pid_alive(pid), timeout=1)
    client.close()  # no clients, no jobs: the daemon exits after about a second
    assert wait_until(lambda: not pid_alive(pid), timeout=30)
    assert not env.paths.socket.exists()
    assert "idle for 1 s" in env.paths.log.read_text()


def test_no_daemon_and_no_autostart(env):
    with pytest.raises(DaemonNotRunning, match="no partir daemon is running"):
        env.connect(autostart=False)
    client = env.connect()
    pid = client.status().pid
    os.kill(pid, signal.SIGKILL)
    assert wait_until(lambda: not pid_alive(pid), timeout=10)
    wait_until(lambda: not processes_mentioning(str(env.workspace)), timeout=15)
    with pytest.raises(DaemonNotRunning, match="crashed or was killed"):
        env.connect(autostart=False)


def test_a_daemon_killed_mid_request_is_a_lost_connection(env):
    client = env.connect()
    slow = BP_MP_Z3.replace("import partir\n", "import partir\nimport time\n"
                            "time.sleep(1.5)\n")
    path = env.write("slow.partir.py", slow)
    future = client.request_future("partition", P.PartitionParams(path))
    assert wait_until(lambda: client.status().worker_pid is not None, timeout=30)
    os.kill(env.daemon_pid(), signal.SIGKILL)
    with pytest.raises(DaemonConnectionLost):
        future.result(timeout=30)
    with pytest.raises(DaemonConnectionLost):
        client.status()


def test_a_socket_with_loose_permissions_is_refused(env):
    env.connect()
    socket_path = env.paths.socket
    os.chmod(socket_path, 0o666)
    try:
        with pytest.raises(InsecureDaemonSocket, match="mode 0666"):
            env.connect(autostart=False)
    finally:
        os.chmod(socket_path, 0o600)
    os.chmod(env.runtime, 0o755)
    try:
        with pytest.raises(InsecureDaemonSocket, match="0755"):
            env.connect(autostart=False)
    finally:
        os.chmod(env.runtime, 0o700)
    assert env.connect(autostart=False).status().pid == env.daemon_pid()


def test_a_socket_of_another_user_is_refused(env, monkeypatch):
    env.connect()
    me = os.getuid()
    # As seen by another user: the socket (and directory) belong to `me`, not to them.
    monkeypatch.setattr(os, "getuid", lambda: me + 1)
    with pytest.raises(InsecureDaemonSocket, match=f"belongs to uid {me}"):
        DaemonClient.connect(env.workspace, runtime_dir=env.runtime, autostart=False)


def test_the_cli(env, monkeypatch, capsys):
    monkeypatch.setenv("PARTIR_DAEMON_DIR", str(env.runtime))
    workspace = str(env.workspace)
    assert cli(["daemon", "status", "--workspace", workspace]) == 1
    assert "no partir daemon" in capsys.readouterr().out
    assert cli(["daemon", "start", "--workspace", workspace]) == 0
    assert "started the partir daemon" in capsys.readouterr().out
    pid = env.daemon_pid()
    assert cli(["daemon", "start", "--workspace", workspace]) == 0
    assert f"already running for {env.workspace}: pid {pid}" in capsys.readouterr().out
    assert cli(["daemon", "status", "--workspace", workspace]) == 0
    text = capsys.readouterr().out
    assert text.startswith(f"partir daemon for {env.workspace}: running, pid {pid}, for ")
    assert f"log     {env.paths.log}" in text and "jobs    none" in text
    assert cli(["daemon", "status", "--workspace", workspace, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["pid"] == pid
    assert cli(["daemon", "stop", "--workspace", workspace]) == 0
    assert not pid_alive(pid)
    assert cli(["daemon", "stop", "--workspace", workspace]) == 1
    capsys.readouterr()
    # The workspace named as what it is, not as the "." it defaults to.
    monkeypatch.chdir(env.workspace)
    assert cli(["daemon", "status"]) == 1
    assert capsys.readouterr().out == f"no partir daemon is running for {env.workspace}\n"


@pytest.mark.slow
def test_connecting_while_the_daemon_shuts_down_starts_a_new_one(env):
    client = env.connect()
    job = client.run(env.write("stubborn.partir.py", STUBBORN), steps=1)
    assert wait_until(lambda: "SIGTERM-IGNORED" in Path(job.log_path).read_text(), timeout=60)
    old = env.daemon_pid()
    client.shutdown()
    # The old daemon waits for its job's grace period, answering that it shuts down.
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(30)
        sock.connect(str(env.paths.socket))
        sock.sendall(P.encode(P.request(5, "status", P.StatusParams())))
        assert read_reply(sock)["error"]["code"] == P.SHUTTING_DOWN
    new = env.connect()
    assert not pid_alive(old)
    assert new.status().pid == env.daemon_pid() != old
