"""The XLA flags the suite runs under, set by tests/conftest.py before JAX starts.

Most of the suite's time is XLA compiling small programs, most of that in LLVM: its cheap
pipeline halves that. Both sides of every comparison run under the same flags."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

DEVICES = "--xla_force_host_platform_device_count=8"
CHEAP_CODEGEN = ("--xla_backend_optimization_level=0", "--xla_llvm_disable_expensive_passes=true")


def set_flags() -> None:
    # Each xdist worker imports conftest with the flags its parent set: add only those
    # missing, so the processes the tests start do not carry them several times.
    flags = os.environ.get("XLA_FLAGS", "").split()
    os.environ["XLA_FLAGS"] = " ".join(
        [*flags, *(f for f in (DEVICES, *CHEAP_CODEGEN) if f not in flags)])


def optimizing() -> bool:
    """Whether XLA optimizes as it does by default (a run with flags of its own)."""
    return CHEAP_CODEGEN[0] not in os.environ.get("XLA_FLAGS", "").split()


def run_optimizing(code: str, timeout: float = 300) -> str:
    """The standard output of `code`, run by Python in a process of its own where XLA
    optimizes as it does by default: for tests of what XLA's optimizations do."""
    root = Path(__file__).resolve().parents[1]
    flags = " ".join(f for f in os.environ.get("XLA_FLAGS", "").split()
                     if f not in CHEAP_CODEGEN)
    env = dict(os.environ, XLA_FLAGS=flags, PYTHONPATH=str(root))
    out = subprocess.run([sys.executable, "-c", code], env=env, cwd=root,
                         capture_output=True, text=True, timeout=timeout)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout
