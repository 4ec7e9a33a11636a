"""The runtime under `jax.distributed`: two local processes of 4 CPU devices each run the
same PartIR:HLO programs on one 8-device mesh (see multiprocess_worker.py), talking over
loopback only. Both processes are killed at the end whatever happens."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT_S = 180
CHECKS = 6  # `ok` lines each worker prints


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_two_processes_one_mesh(tmp_path):
    coordinator = f"127.0.0.1:{_free_port()}"
    logs = [(tmp_path / f"p{i}.out", tmp_path / f"p{i}.err") for i in range(2)]
    procs = []
    # Output goes to files, not pipes: a worker blocked on a full pipe would hang the
    # other one in a collective.
    for i, (out, err) in enumerate(logs):
        with out.open("w") as o, err.open("w") as e:
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "tests.runtime.multiprocess_worker", coordinator,
                 str(i)], cwd=ROOT, stdout=o, stderr=e))
    deadline = time.monotonic() + TIMEOUT_S
    try:
        for p in procs:
            p.wait(timeout=max(0.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        pass  # reported below with the workers' output
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()
    for i, (p, (out, err)) in enumerate(zip(procs, logs, strict=True)):
        stdout, stderr = out.read_text(), err.read_text()
        assert p.returncode == 0, (f"process {i} exited with {p.returncode} (killed after "
                                   f"{TIMEOUT_S}s if negative):\n{stdout}\n{stderr[-4000:]}")
        assert stdout.count("ok ") == CHECKS, stdout
