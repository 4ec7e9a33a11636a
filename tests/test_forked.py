"""Work done in this process and forked ones (`partir.forked`): every item done once, its
result the same whoever made it; items a forked process could not do (it raised, died,
stalled, or would have dispatched to JAX) are done here; cancelling kills the forks."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from partir import CancellationToken, Cancelled
from partir.cancel import cancellable
from partir.forked import ForkedDispatchError, check_dispatch, run_forked
from partir.ir import Op, TensorType, Value
from partir.ir.evaluate import evaluate
from partir.ir.opnames import CONSTANT

PARENT = os.getpid()


def children() -> set[int]:
    """The live (not zombie) child processes of this one (the test runner may have some
    of its own)."""
    pid = os.getpid()
    out = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid and fields[0] != "Z":
            out.add(int(stat.parent.name))
    return out


def run(items, work, processes=2, **kw):
    """{item: (result, pid of the process that made it)} and the count run_forked gives."""
    got: dict = {}
    before = children()

    def done(item, result):
        assert item not in got, f"{item} done twice"
        got[item] = result

    forked = run_forked(items, lambda x: (work(x), os.getpid()), done, processes, **kw)
    assert set(got) == set(items)
    assert children() <= before  # every fork reaped
    return got, forked


def slow_square(x: int) -> int:
    time.sleep(0.02)
    return x * x


def test_every_item_is_done_once_by_one_of_the_processes() -> None:
    got, forked = run(list(range(24)), slow_square, processes=3)
    assert {x: r for x, (r, _) in got.items()} == {x: x * x for x in range(24)}
    pids = {pid for _, pid in got.values()}
    assert PARENT in pids and len(pids) == 3  # the work was shared
    assert forked == sum(pid != PARENT for _, pid in got.values())


def test_one_process_or_one_item_forks_nothing() -> None:
    for items, processes in ((list(range(5)), 1), ([7], 4)):
        got, forked = run(items, slow_square, processes)
        assert forked == 0 and {pid for _, pid in got.values()} == {PARENT}


@pytest.mark.parametrize("fault", ["raises", "dies", "stalls"])
def test_what_a_forked_process_does_not_report_is_done_here(fault: str) -> None:
    def work(x: int) -> int:
        if os.getpid() != PARENT and x >= 3:
            if fault == "raises":
                raise ValueError("a bug that only shows in the fork")
            if fault == "dies":
                os._exit(7)
            time.sleep(600)
        return slow_square(x)

    start = time.perf_counter()
    got, _ = run(list(range(12)), work, stall_s=0.5)
    assert {x: r for x, (r, _) in got.items()} == {x: x * x for x in range(12)}
    assert all(pid == PARENT for x, (_, pid) in got.items() if x >= 3)
    assert time.perf_counter() - start < 10


def test_a_fork_that_fails_leaves_the_work_here(monkeypatch) -> None:
    def no_fork() -> int:
        raise BlockingIOError("fork: Resource temporarily unavailable")

    monkeypatch.setattr(os, "fork", no_fork)
    got, forked = run(list(range(5)), slow_square)
    assert forked == 0 and {pid for _, pid in got.values()} == {PARENT}


def test_an_error_here_is_raised_and_the_forks_killed() -> None:
    done_here = []

    def work(x: int) -> int:
        if os.getpid() == PARENT:
            done_here.append(x)
            if len(done_here) == 2:  # the first item after the fork
                raise KeyError("in this process")
        return slow_square(x)

    before = children()
    with pytest.raises(KeyError, match="in this process"):
        run_forked(list(range(40)), work, lambda *_: None, 2)
    assert children() <= before


def test_cancelling_stops_the_work_and_kills_the_forks() -> None:
    token = CancellationToken()
    threading.Timer(0.3, token.cancel, ("a newer revision",)).start()
    start, before = time.perf_counter(), children()
    with cancellable(token), pytest.raises(Cancelled, match="a newer revision"):
        run_forked(list(range(200)), slow_square, lambda *_: None, 2)
    assert time.perf_counter() - start < 2
    assert children() <= before


def test_a_fork_never_dispatches_to_jax() -> None:
    """XLA's threads are not copied by a fork: evaluating an op there raises, and the item
    is evaluated here instead."""
    check_dispatch("nothing")  # here: allowed
    op = Op(CONSTANT, [], [Value(TensorType((2,), np.float32))],
            {"value": np.array([1.0, 2.0], np.float32)})

    def work(x: int) -> list[float]:
        time.sleep(0.02)
        return [float(v) for v in np.asarray(evaluate(op, [])[0])]

    got, forked = run(list(range(6)), work)
    assert forked == 0 and all(r == [1.0, 2.0] for r, _ in got.values())

    def allowed(x: int) -> bool:
        time.sleep(0.02)
        try:
            check_dispatch("a computation")
        except ForkedDispatchError:
            return False
        return True

    got, forked = run(list(range(6)), allowed)
    assert forked > 0 and all(ok == (pid == PARENT) for ok, pid in got.values())
