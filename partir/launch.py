"""Multi-process runs on this machine under `jax.distributed`, as a cluster runs them.

`launch` starts N processes of a `partir` command with a local coordinator; each process
reads its place from the environment (`current`) and joins the others (`initialize`)
before JAX starts its backend, with its share of this machine's devices: 8 virtual CPU
devices in all, split evenly. From there every process runs the same program on the
one global mesh, the code path a cluster job takes (where `jax.distributed.initialize`
reads SLURM's or Kubernetes' settings itself). A process's output goes to its own log
files, never to a pipe: a process blocked on a full pipe would hang the others in a
collective. When one process fails, or the launcher is interrupted, every process is
ended.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

# The environment variable a launched process finds its place in.
ENV = "PARTIR_DISTRIBUTED"
# The virtual CPU devices of a run on this machine, split over its processes.
LOCAL_DEVICES = 8


@dataclass(frozen=True)
class Place:
    """One process's place in a multi-process run."""

    coordinator: str  # host:port of process 0's coordinator service
    processes: int
    process_id: int
    devices: int  # this process's devices

    def encode(self) -> str:
        return f"{self.coordinator};{self.processes};{self.process_id};{self.devices}"


@dataclass(frozen=True)
class Finished:
    """How one launched process ended, and where its output is."""

    process_id: int
    returncode: int  # negative: killed by that signal (-9 when the others failed first)
    stdout: Path
    stderr: Path


def current() -> Place | None:
    """This process's place, if `launch` started it."""
    text = os.environ.get(ENV)
    if not text:
        return None
    coordinator, processes, process_id, devices = text.split(";")
    return Place(coordinator, int(processes), int(process_id), int(devices))


def initialize(place: Place) -> None:
    """Join the run: this process's devices, then `jax.distributed.initialize`. Must come
    before JAX's backend starts (its first use)."""
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                               f" --xla_force_host_platform_device_count={place.devices}"
                               ).strip()
    os.environ["JAX_PLATFORMS"] = "cpu"
    import jax

    # CPU collectives across processes go over gloo; the coordinator listens on loopback
    # only, as every process is on this machine.
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(coordinator_address=place.coordinator,
                               coordinator_bind_address=place.coordinator,
                               num_processes=place.processes, process_id=place.process_id,
                               initialization_timeout=120)


def places(processes: int) -> list[Place]:
    """The places of a run of `processes` processes on this machine."""
    if processes < 1 or LOCAL_DEVICES % processes:
        raise ValueError(f"{processes} processes cannot share this machine's "
                         f"{LOCAL_DEVICES} devices evenly (use 1, 2, 4 or 8)")
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        coordinator = f"127.0.0.1:{s.getsockname()[1]}"
    return [Place(coordinator, processes, i, LOCAL_DEVICES // processes)
            for i in range(processes)]


def launch(argv: Sequence[str], processes: int, log_dir: Path,
           timeout_s: float | None = None) -> list[Finished]:
    """Run `python -m partir.cli *argv` as `processes` processes of one run, each logging
    to `log_dir/p<i>.out` and `.err`; wait for all. The first to fail (or the timeout, or
    an interrupt) ends the others."""
    log_dir.mkdir(parents=True, exist_ok=True)
    running: list[tuple[subprocess.Popen, Path, Path]] = []
    try:
        for place in places(processes):
            out = log_dir / f"p{place.process_id}.out"
            err = log_dir / f"p{place.process_id}.err"
            with out.open("w") as o, err.open("w") as e:
                running.append((subprocess.Popen(
                    [sys.executable, "-m", "partir.cli", *argv], stdout=o, stderr=e,
                    env={**os.environ, ENV: place.encode()}), out, err))
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while any(p.poll() is None for p, _, _ in running):
            if any(p.returncode not in (None, 0) for p, _, _ in running) or (
                    deadline is not None and time.monotonic() > deadline):
                break
            time.sleep(0.1)
    finally:
        for p, _, _ in running:
            if p.poll() is None:
                p.kill()
            p.wait()
    return [Finished(i, p.returncode, out, err) for i, (p, out, err) in enumerate(running)]
