"""How many generated cases a property suite runs: all of them in a full run, a sample in
the fast loop (`pytest -m "not slow"`, see tests/conftest.py), whose point is a verdict
within minutes while editing; CI runs every case."""

from __future__ import annotations

FAST = False  # set by tests/conftest.py when the fast subset is selected


def examples(full: int) -> int:
    return max(10, full // 20) if FAST else full
