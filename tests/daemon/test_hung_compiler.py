"""A compiler process stuck in native code, or crashed by the user's code (issue 31,
items 3 and 4): a diagnostic, a process replaced at once, and the fix on disk analysed
again."""

from __future__ import annotations

import dataclasses
import time

import pytest

from partir_daemon import protocol as P
from partir_daemon.client import RequestCancelled
from tests.daemon.support import BP_MP_Z3, processes_mentioning, wait_until

# `sum` over a range runs in C: no signal interrupts it, only the daemon's kill.
NATIVE_LOOP = "x = sum(range(10**15))\n"
SEGFAULT = "import ctypes\n\nctypes.string_at(0)\n"


def _compilers(env) -> list[int]:
    return processes_mentioning(f"partir_daemon.worker --workspace {env.workspace}")


@pytest.mark.slow
def test_a_model_looping_in_native_code_times_out_and_its_fix_is_analysed(env):
    notes: list[tuple[str, dict]] = []
    client = env.connect(on_notification=lambda m, p: notes.append((m, p)))
    model = env.workspace / "mlp" / "native.py"
    model.write_text(NATIVE_LOOP)
    path = env.write("native.partir.py", "import native  # noqa\n" + BP_MP_Z3)
    result = client.partition(path)
    (d,) = result.diagnostics
    assert d.kind == "timeout" and "could not be interrupted" in d.message
    assert str(model) in result.dependencies
    # Replaced at once, not at the next request.
    assert wait_until(lambda: len(_compilers(env)) >= 1, timeout=30)
    # The fix on disk is reported, for the editor to analyse the schedule file again.
    model.write_text("x = 1\n")
    assert wait_until(lambda: any(m == P.INVALIDATED and str(model) in p["paths"]
                                  for m, p in notes), timeout=30), notes
    assert client.partition(path).ok
    log = env.paths.log.read_text()
    assert "never retrieved" not in log, log[-3000:]


@pytest.mark.slow
def test_a_segfault_while_loading_is_a_diagnostic_and_a_failed_job(env):
    client = env.connect()
    path = env.write("segfault.partir.py", SEGFAULT + BP_MP_Z3)
    result = client.partition(path)
    (d,) = result.diagnostics
    assert d.kind == "execution" and "SIGSEGV" in d.message and d.file == path
    job = client.run(path, steps=1)
    assert job.state == "failed" and "SIGSEGV" in job.error
    assert {j.id: j.state for j in client.jobs()}[job.id] == "failed"
    assert client.partition(env.write("good.partir.py", BP_MP_Z3)).ok


@pytest.mark.slow
def test_a_newer_revision_frees_its_file_from_a_process_stuck_in_native_code(env):
    env.config = dataclasses.replace(env.config, load_timeout_s=120.0)
    client = env.connect()
    path = env.write("edited.partir.py", NATIVE_LOOP + BP_MP_Z3)
    stuck = client.request_future("partition", P.PartitionParams(path, NATIVE_LOOP + BP_MP_Z3,
                                                                  version=1))
    time.sleep(3)  # loading
    start = time.monotonic()
    fixed = client.partition(path, BP_MP_Z3, version=2)
    assert fixed.ok and time.monotonic() - start < 60  # not the load timeout of 120 s
    with pytest.raises(RequestCancelled):
        stuck.result(timeout=5)


# Tracing that takes longer than the cancel grace, in Python (as a large model's).
SLOW_TRACE = BP_MP_Z3.replace(
    "program = partir.Program(mlp, *example_args())",
    "import time\n\n\ndef slow(x, w1, w2):\n    time.sleep(8)\n    return mlp(x, w1, w2)\n\n\n"
    "program = partir.Program(slow, *example_args())")


@pytest.mark.slow
def test_a_cancelled_request_in_slow_python_code_is_not_killed(env):
    # The process reads the cancellation, so it is left to finish, caches and all.
    client = env.connect()
    assert client.partition(env.write("warm.partir.py", BP_MP_Z3)).ok  # a process ready
    path = env.write("slow.partir.py", SLOW_TRACE)
    tracing = client.request_future("partition", P.PartitionParams(path, SLOW_TRACE,
                                                                   version=1))
    time.sleep(2)
    assert client.partition(path, BP_MP_Z3, version=2).ok
    with pytest.raises(RequestCancelled):
        tracing.result(timeout=5)
    assert client.cache_stats().worker_restarts == 0, env.paths.log.read_text()[-3000:]


@pytest.mark.slow
def test_a_request_cancelled_while_its_process_starts_is_never_sent(env):
    client = env.connect()
    path = env.write("slow.partir.py", SLOW_TRACE)
    start = time.monotonic()
    first = client.request_future("partition", P.PartitionParams(path, SLOW_TRACE,
                                                                 version=1))
    time.sleep(0.5)  # taken from the queue; its process takes seconds to start
    assert client.partition(path, BP_MP_Z3, version=2).ok
    with pytest.raises(RequestCancelled):
        first.result(timeout=5)
    assert time.monotonic() - start < 8  # the slow trace never ran
    assert client.cache_stats().worker_restarts == 0
