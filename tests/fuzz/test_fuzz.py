"""Differential fuzzing in the suite: a fixed range of seeds (not picked to pass), each in
every mode (partir.jit, under jax.jit, jax.grad of it, partitioning a value_and_grad),
compared with jax.jit and on every 5th seed with the Core interpreter too. Any WRONG,
CRASH or TIMEOUT fails the test, printing each failure's seed and minimized repro; an
INVALID case (JAX rejected the generated program itself) is the generator's bug and fails
it too. Longer campaigns: scripts/fuzz.py."""

from __future__ import annotations

import pytest

from tests.fuzz.campaign import run_campaign
from tests.fuzz.program import MODES

FAST_SEEDS = range(0, 6)
SLOW_SEEDS = range(6, 30)
WORKERS = 2
# Generous: a case takes 1-5 s, but the machine may be shared with other test runs.
TIMEOUT_S = 300


def _check(seeds: range, min_ok: float) -> None:
    report = run_campaign(seeds, MODES, workers=WORKERS, timeout=TIMEOUT_S, minimize_s=30,
                          minimize_total_s=120)
    counts = report.counts()
    assert len(report.results) == len(seeds) * len(MODES)
    assert not counts["INVALID"] and not report.failures, report.format()
    # Cases partition and run: a generator whose schedules were all refused (or shard
    # nothing) would test nothing.
    ok = [r for r in report.results if r.outcome.cls == "OK"]
    assert len(ok) >= min_ok * len(report.results), report.format(repros=False)
    assert sum(bool(r.outcome.sharded) for r in ok) >= 0.7 * len(ok), report.format(False)


@pytest.mark.slow
def test_fuzz_fast_seeds():
    _check(FAST_SEEDS, min_ok=0.25)


@pytest.mark.slow
def test_fuzz_more_seeds():
    _check(SLOW_SEEDS, min_ok=0.5)
