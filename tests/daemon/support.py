"""Helpers of the daemon tests: workspaces with a private runtime directory, clients on
their daemons, and the processes a workspace still has running."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from partir_daemon import protocol as P
from partir_daemon.client import DaemonClient, DaemonError
from partir_daemon.paths import DaemonPaths, read_status

ROOT = Path(__file__).resolve().parents[2]
# Small limits so that the timeout cases stay fast.
CONFIG = P.DaemonConfig(idle_timeout_s=300, load_timeout_s=2.0, compile_timeout_s=300)

BP_MP_Z3 = '''\
from model import example_args, mlp

import partir

program = partir.Program(mlp, *example_args())
mesh = {"batch": 4, "model": 2}
schedule = [
    partir.ManualPartition({"x": 0}, axis="batch", name="BP"),
    partir.ManualPartition({"w1": 1}, axis="model", name="MP"),
    partir.ManualPartition({"w1": 0, "w2": 1}, axis="batch", name="Z3"),
]
'''

# A schedule file whose job ignores SIGTERM: stopping the daemon waits the jobs' grace
# period (2 s) for it, a window in which the daemon is shutting down but listening.
STUBBORN = '''\
import os
import signal
import sys
import time
from pathlib import Path

if os.environ.get("PARTIR_JOB_ID"):
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    print("SIGTERM-IGNORED", file=sys.stderr, flush=True)
    time.sleep(120)
''' + BP_MP_Z3


def processes_mentioning(text: str) -> list[int]:
    """Pids of live processes whose command line contains `text` (not zombies)."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmdline = f.read().replace(b"\0", b" ").decode(errors="replace")
            with open(f"/proc/{entry}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if text in cmdline and state != "Z":
            pids.append(int(entry))
    return pids


def raw_connection(env) -> socket.socket:
    """A plain socket to the daemon of `env` (started if needed), for bytes no client
    would send."""
    env.connect()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(str(env.paths.socket))
    sock.settimeout(60)
    return sock


def read_reply(sock: socket.socket) -> dict:
    """The one JSON-RPC answer the daemon sends next on a raw connection."""
    data = b""
    while not data.endswith(b"\n"):
        chunk = sock.recv(65536)
        assert chunk, "the daemon closed the connection"
        data += chunk
    (line,) = data.splitlines()  # one answer, not one per notification sent before
    return json.loads(line)


def wait_until(predicate, timeout: float = 20.0, interval: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()


def remove_workspace(workspace: Path, runtime: Path) -> None:
    """After its daemon was asked to stop: wait for the processes of the workspace to
    exit, kill whatever is left (a test killed something half-way) and fail, and remove
    the workspace and its runtime directory."""
    wait_until(lambda: not processes_mentioning(str(workspace)), timeout=15)
    leftovers = processes_mentioning(str(workspace))
    for pid in leftovers:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    shutil.rmtree(workspace, ignore_errors=True)
    shutil.rmtree(runtime, ignore_errors=True)
    assert not leftovers, f"processes left running: {leftovers}"


@dataclass
class Env:
    """A workspace with its runtime directory, and the clients opened on it."""

    workspace: Path
    runtime: Path
    config: P.DaemonConfig = field(default_factory=lambda: CONFIG)
    clients: list[DaemonClient] = field(default_factory=list)

    @property
    def paths(self) -> DaemonPaths:
        return DaemonPaths.of(self.workspace, self.runtime)

    def connect(self, **kwargs) -> DaemonClient:
        kwargs.setdefault("config", self.config)
        kwargs.setdefault("timeout", 120.0)
        client = DaemonClient.connect(self.workspace, runtime_dir=self.runtime, **kwargs)
        self.clients.append(client)
        return client

    def write(self, name: str, text: str) -> str:
        path = self.workspace / "mlp" / name
        path.write_text(text)
        return str(path)

    def daemon_pid(self) -> int | None:
        status = read_status(self.paths)
        return int(status["pid"]) if status else None

    def teardown(self) -> None:
        for client in self.clients:
            client.close()
        with contextlib.suppress(DaemonError, OSError), DaemonClient.connect(
                self.workspace, runtime_dir=self.runtime, autostart=False,
                timeout=20) as client:
            client.shutdown()
        remove_workspace(self.workspace, self.runtime)


def make_env() -> Env:
    # Short paths: a Unix socket path has at most 107 bytes.
    workspace = Path(tempfile.mkdtemp(prefix="pdws"))
    runtime = Path(tempfile.mkdtemp(prefix="pdrt"))
    runtime.chmod(0o700)
    shutil.copytree(ROOT / "examples" / "mlp", workspace / "mlp")
    (workspace / "mlp" / "bp_mp_z3.partir.py").write_text(BP_MP_Z3)
    return Env(workspace, runtime)
