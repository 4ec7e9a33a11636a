"""Multi-process runs on this machine under `jax.distributed`, as a cluster runs them.

`launch` starts N processes of a command (`partir run`, the daemon's job runner) with a
local coordinator; each process reads its place from the environment (`current`) and
joins the others (`initialize`) before JAX starts its backend, with its share of this
machine's virtual CPU devices (8 in all by default), split evenly. From there every
process runs the same program on the one global mesh, the code path a cluster job takes
(where `jax.distributed.initialize` reads SLURM's or Kubernetes' settings itself). A
process's output goes to its own log files, never to a pipe: a process blocked on a full
pipe would hang the others in a collective. When one process fails, or the launcher is
interrupted, every process is ended.
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
from collections.abc import Callable, Sequence
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


def places(processes: int, devices: int = LOCAL_DEVICES) -> list[Place]:
    """The places of a run of `processes` processes sharing `devices` on this machine."""
    if processes < 1 or devices % processes:
        divisors = [n for n in range(1, devices + 1) if devices % n == 0]
        raise ValueError(f"{processes} processes cannot share {devices} devices evenly "
                         f"(use {', '.join(map(str, divisors))})")
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        coordinator = f"127.0.0.1:{s.getsockname()[1]}"
    return [Place(coordinator, processes, i, devices // processes) for i in range(processes)]


def launch(command: Sequence[str], processes: int, log_dir: Path, devices: int = LOCAL_DEVICES,
           timeout_s: float | None = None, tick: Callable[[], None] | None = None
           ) -> list[Finished]:
    """Run `command` as `processes` processes of one run sharing `devices`, each logging
    to `log_dir/p<i>.out` and `.err`, and wait for all, calling `tick` every 0.1 s (to
    follow their output). The first to fail (or the timeout, or an interrupt) ends the
    others."""
    log_dir.mkdir(parents=True, exist_ok=True)
    running: list[tuple[subprocess.Popen, Path, Path]] = []
    try:
        for place in places(processes, devices):
            out = log_dir / f"p{place.process_id}.out"
            err = log_dir / f"p{place.process_id}.err"
            with out.open("w") as o, err.open("w") as e:
                running.append((subprocess.Popen(
                    command, stdout=o, stderr=e, env={**os.environ, ENV: place.encode()}),
                    out, err))
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while any(p.poll() is None for p, _, _ in running):
            if any(p.returncode not in (None, 0) for p, _, _ in running) or (
                    deadline is not None and time.monotonic() > deadline):
                break
            if tick is not None:
                tick()
            time.sleep(0.1)
    finally:
        for p, _, _ in running:
            if p.poll() is None:
                p.kill()
            p.wait()
    return [Finished(i, p.returncode, out, err) for i, (p, out, err) in enumerate(running)]
