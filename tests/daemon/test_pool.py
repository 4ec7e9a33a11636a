"""The pool of compiler processes: a schedule file that loops holds one of them while the
others serve every other file, a path stays with the process that holds its caches, and
the file watcher's invalidations reach every process."""

from __future__ import annotations

import time

import pytest

from partir_daemon import protocol as P
from tests.daemon.support import BP_MP_Z3, wait_until

GOOD = "mlp/bp_mp_z3.partir.py"
# A second schedule sharing GOOD's trace and first tactic only.
OTHER = BP_MP_Z3.replace('{"w1": 1}', '{"w2": 0}')
SLOW = BP_MP_Z3.replace("import partir\n", "import partir\nimport time\n\ntime.sleep(1)\n")
LOOPS = BP_MP_Z3.replace("import partir\n", "import partir\n\nwhile True:\n    pass\n")


def _spread(env, client) -> tuple[str, str]:
    """GOOD served by the first process and OTHER by the second: OTHER asks while the
    first process runs a slow file. Returns their paths."""
    good = str(env.workspace / GOOD)
    assert client.partition(good).ok
    slow = client.request_future("partition", P.PartitionParams(env.write("slow.partir.py",
                                                                          SLOW)))
    other = env.write("other.partir.py", OTHER)
    assert client.partition(other).ok
    assert slow.result(timeout=120).ok
    return good, other


@pytest.mark.slow
def test_a_looping_file_delays_no_other_file(env):
    env.config = P.DaemonConfig(idle_timeout_s=300, load_timeout_s=20.0,
                                compile_timeout_s=300)
    client = env.connect()
    assert client.partition(GOOD).ok
    # Once idle, the pool starts its second process in the background.
    assert wait_until(lambda: len(client.cache_stats().worker_pids) == 2, timeout=120)
    loops = client.request_future("partition", P.PartitionParams(env.write(
        "loops.partir.py", LOOPS)))
    other = env.write("other.partir.py", OTHER)
    start = time.monotonic()
    result = client.partition(other)
    elapsed = time.monotonic() - start
    assert result.ok and not loops.done()
    assert elapsed < env.config.load_timeout_s / 2, elapsed
    (d,) = loops.result(timeout=120).diagnostics
    assert d.kind == "timeout" and "did not finish within 20 s" in d.message
    # Both processes keep serving.
    assert client.partition(GOOD).ok and client.partition(other).ok
    assert len(client.cache_stats().worker_pids) == 2


@pytest.mark.slow
def test_a_path_stays_with_the_process_holding_its_caches(shared):
    client = shared.connect()
    good, other = _spread(shared, client)
    # Were OTHER served by the first process now, only its first tactic (GOOD's) would
    # come from a cache.
    for path in (good, other, good, other):
        again = client.partition(path)
        assert again.trace.cached and again.reused == [1, 2, 3], (path, again.reused)
    stats = client.cache_stats()
    assert len(stats.worker_pids) == 2 and stats.worker_pid == stats.worker_pids[0]
    assert client.status().worker_pid == stats.worker_pid


@pytest.mark.slow
def test_invalidation_reaches_every_process(shared):
    notes: list[tuple[str, dict]] = []
    client = shared.connect(on_notification=lambda m, p: notes.append((m, p)))
    good, other = _spread(shared, client)
    before = client.cache_stats()
    model = shared.workspace / "mlp" / "model.py"
    model.write_text(model.read_text().replace("jax.nn.relu(x @ w1)", "jax.nn.gelu(x @ w1)"))

    def invalidated() -> list[dict]:
        return [p for m, p in notes if m == P.INVALIDATED and str(model) in p["paths"]
                and p["traces"]]

    # Each process dropped its own trace of the model: one notification, summed.
    assert wait_until(invalidated, timeout=30)
    assert invalidated()[0]["traces"] == 2
    assert client.cache_stats().invalidations == before.invalidations + 2
    for path in (good, other):
        after = client.partition(path)
        assert after.ok and after.trace.invalidated_by == [str(model)]


def test_a_changed_dependency_of_a_failed_load_is_announced(shared):
    notes: list[tuple[str, dict]] = []
    client = shared.connect(on_notification=lambda m, p: notes.append((m, p)))
    broken = shared.workspace / "mlp" / "broken.py"
    broken.write_text("raise RuntimeError('broken')\n")
    path = shared.write("broken.partir.py", "import broken  # noqa\n" + BP_MP_Z3)
    (d,) = client.partition(path).diagnostics
    assert d.kind == "execution" and "broken" in d.message
    broken.write_text("")
    # No trace was dropped (there was none), but the client must analyse the file again.
    assert wait_until(lambda: any(m == P.INVALIDATED and str(broken) in p["paths"]
                                  for m, p in notes), timeout=30)
    assert client.partition(path).ok


@pytest.mark.slow
def test_a_new_version_interrupts_its_own_looping_predecessor(env):
    """The user removes the loop: the new version cancels the old one mid-execution
    instead of waiting for its load timeout."""
    env.config = P.DaemonConfig(idle_timeout_s=300, load_timeout_s=60.0,
                                compile_timeout_s=300)
    client = env.connect()
    path = env.write("edited.partir.py", BP_MP_Z3)
    assert client.partition(path, version=1).ok  # the compiler process is up and warm
    loops = client.request_future("partition", P.PartitionParams(path, LOOPS, 2))
    time.sleep(1.5)  # the loop is running
    start = time.monotonic()
    fixed = client.partition(path, text=BP_MP_Z3, version=3)
    elapsed = time.monotonic() - start
    assert fixed.ok and elapsed < 10.0, elapsed
    with pytest.raises(Exception, match="cancel"):
        loops.result(timeout=10)
