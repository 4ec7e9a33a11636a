"""partition, ir, explain and the caches, through a real daemon and its client."""

from __future__ import annotations

import threading

import pytest

import partir
from examples.mlp.model import example_args, mlp
from partir_daemon import protocol as P
from partir_daemon.client import RequestCancelled, RequestError
from tests.daemon.support import BP_MP_Z3, wait_until

SCHEDULE = "mlp/bp_mp_z3.partir.py"


def _expected_collectives(schedule):
    meta = partir.partition(mlp, {"batch": 4, "model": 2}, schedule, *example_args())
    return [t.collectives for t in meta.tactics]


def sharding_after(result: P.PartitionResult, name: str, tactic: int) -> list[list[str]]:
    """The sharding of input `name` after `tactic`, from the result's values (the steps
    of the tactics that changed it)."""
    value = next(v for v in result.values if v.kind == "input" and v.name == name)
    steps = [s for s in value.history if s.tactic <= tactic]
    return steps[-1].sharding if steps else [[] for _ in value.shape]


def test_partition_reports_tactics_ranges_and_metadata(shared):
    client = shared.connect()
    result = client.partition(SCHEDULE)
    assert result.ok and result.diagnostics == []
    assert [t.name for t in result.tactics] == ["BP", "MP", "Z3"]
    assert result.function == "mlp" and result.mesh == {"batch": 4, "model": 2}
    # Source ranges: the three list elements (lines 8-10) and each input key.
    assert [t.range.line for t in result.tactics] == [8, 9, 10]
    z3 = result.tactics[2]
    assert sorted(z3.inputs) == ["w1", "w2"]
    line10 = BP_MP_Z3.splitlines()[9]
    assert line10[z3.inputs["w2"].col:z3.inputs["w2"].end_col] == '"w2"'
    assert result.program_range.line == 5 and result.schedule_range.line == 7
    from partir.tactics import ManualPartition
    schedule = [ManualPartition({"x": 0}, axis="batch", name="BP"),
                ManualPartition({"w1": 1}, axis="model", name="MP"),
                ManualPartition({"w1": 0, "w2": 1}, axis="batch", name="Z3")]
    assert [t.metadata["collectives"] for t in result.tactics] == \
        _expected_collectives(schedule)
    assert z3.metadata["actions"] == ['tile<%w1,0,"batch">', 'tile<%w2,1,"batch">',
                                      "propagate"]
    # Each input's sharding after each tactic is in `values`, not in every tactic's
    # metadata (quadratic in the schedule's length).
    assert "shardings" not in z3.metadata
    assert sharding_after(result, "w1", 3) == [["batch"], ["model"]]
    assert z3.metadata["core_ir"] == ""  # only on request
    with_ir = client.partition(SCHEDULE, include_ir=True)
    assert "loop" in with_ir.tactics[2].metadata["core_ir"]


def test_editing_a_later_tactic_reuses_the_earlier_ones(shared):
    client = shared.connect()
    path = shared.workspace / SCHEDULE
    text = path.read_text()
    first = client.partition(SCHEDULE, text, version=1)
    assert first.ok
    again = client.partition(SCHEDULE, text, version=2)
    assert again.reused == [1, 2, 3] and again.reapplied == []
    assert again.trace.cached
    # Unsaved edit of the last tactic: only it is applied again.
    edited = text.replace('{"w1": 0, "w2": 1}', '{"w1": 0}')
    third = client.partition(SCHEDULE, edited, version=3)
    assert third.ok and third.reused == [1, 2] and third.reapplied == [3]
    assert [t.reused for t in third.tactics] == [True, True, False]
    assert third.tactics[2].metadata["collectives"]["all_gather"] == 1
    assert third.tactics[1].state == first.tactics[1].state
    assert third.tactics[2].state != first.tactics[2].state
    # An edit of the second tactic resumes after the first.
    fourth = client.partition(SCHEDULE, edited.replace('{"w1": 1}', '{"w2": 0}'),
                              version=4)
    assert fourth.ok and fourth.reused == [1] and fourth.reapplied == [2, 3]
    # Moving the schedule down a line re-uses everything: locations are not in the keys.
    moved = client.partition(SCHEDULE, "# a comment\n" + text, version=5)
    assert moved.reused == [1, 2, 3] and moved.tactics[0].range.line == 9


def test_applying_without_metadata_answers_first_and_metadata_follows(shared):
    client = shared.connect()
    text = (shared.workspace / SCHEDULE).read_text()
    edited = text.replace('{"w1": 0, "w2": 1}', '{"w2": 1}')
    fast = client.partition(SCHEDULE, edited, version=11, metadata=False)
    assert fast.ok and [t.name for t in fast.tactics] == ["BP", "MP", "Z3"]
    z3 = fast.tactics[2].metadata
    assert sharding_after(fast, "w2", 3) == [["model"], ["batch"]]
    assert z3["actions"] == ['tile<%w2,1,"batch">', "propagate"]
    assert "collectives" not in z3 and "cost" not in z3
    lowered = client.cache_stats().lowered
    full = client.partition(SCHEDULE, edited, version=11)
    # the tactics come from the cache: only the new state is lowered
    assert client.cache_stats().lowered == lowered + 1
    assert full.reused == [1, 2, 3] and full.reapplied == []
    assert full.values == fast.values
    assert full.tactics[2].metadata["collectives"]["all_gather"] == 1
    assert full.tactics[2].metadata["cost"]["flops"] > 0


def test_one_request_sends_the_applied_tactics_before_their_lowering(shared):
    client = shared.connect()
    text = (shared.workspace / SCHEDULE).read_text()
    # A last tactic no other test applies (a rename alone is no new work).
    edited = text.replace('{"w1": 0, "w2": 1}', '{"w2": 0}')
    edited = edited.replace('name="Z3"', 'name="Z3-partial"')
    partials: list[P.PartitionResult] = []
    full = client.partition(SCHEDULE, edited, version=21, on_partial=partials.append)
    assert len(partials) == 1
    (partial,) = partials
    assert partial.version == 21 and partial.reapplied == full.reapplied
    assert [t.name for t in partial.tactics] == ["BP", "MP", "Z3-partial"]
    first = partial.tactics[2].metadata
    assert "collectives" not in first and "cost" not in first
    # the values' shardings come after the diagnostics: with the next result
    assert partial.values == [] and full.values
    assert full.tactics[2].metadata["collectives"]["all_gather"] >= 1
    assert full.timings.metadata_s > 0 and partial.timings.metadata_s == 0
    # Nothing left to lower: the complete answer is the only one.
    again = client.partition(SCHEDULE, edited, version=22, on_partial=partials.append)
    assert len(partials) == 1 and again.reused == [1, 2, 3]
    assert again.tactics[2].metadata["collectives"] == full.tactics[2].metadata["collectives"]


def test_model_file_edit_invalidates_the_trace(shared):
    notes = []
    client = shared.connect(on_notification=lambda m, p: notes.append((m, p)))
    model = shared.workspace / "mlp" / "model.py"
    before = client.partition(SCHEDULE)
    assert before.ok and str(model) in before.trace.dependencies
    stats = client.cache_stats()
    # Rewriting the file with the same content invalidates nothing (content hash).
    model.write_text(model.read_text())
    same = client.partition(SCHEDULE)
    assert same.trace.cached and same.reused == [1, 2, 3]
    model.write_text(model.read_text().replace("jax.nn.relu(x @ w1)", "jax.nn.gelu(x @ w1)"))
    # The watcher reports the change to every client (and may have reported the rewrite
    # above, with no trace dropped).
    assert wait_until(lambda: any(m == P.INVALIDATED and p["traces"] for m, p in notes),
                      timeout=15)
    _, params = next((m, p) for m, p in notes if m == P.INVALIDATED and p["traces"])
    assert str(model) in params["paths"]
    assert client.cache_stats().invalidations > stats.invalidations
    after = client.partition(SCHEDULE)
    assert after.ok and not after.trace.cached
    assert after.trace.invalidated_by == [str(model)]
    assert after.reused == [] and after.reapplied == [1, 2, 3]
    assert "tanh" in client.ir(SCHEDULE, after=0).text  # the new trace: gelu's tanh


def test_ir_after_each_tactic(shared):
    client = shared.connect()
    traced = client.ir(SCHEDULE, after=0)
    assert traced.tactic is None and "loop" not in traced.text
    core = client.ir(SCHEDULE, after=2)
    assert core.tactic == "MP" and "loop" in core.text
    hlo = client.ir(SCHEDULE, level="hlo", after=3)
    assert hlo.text.count("all_gather") == 2 and "all_reduce" in hlo.text
    spmd = client.ir(SCHEDULE, level="spmd")
    assert spmd.after == 3 and spmd.text
    out_of_range = client.ir(SCHEDULE, after=7)
    assert out_of_range.text == "" and "7" in out_of_range.diagnostics[0].message


def test_explain_an_input_and_a_model_line(shared):
    client = shared.connect()
    result = client.explain(SCHEDULE, name="w1")
    (w1,) = result.values
    assert w1.kind == "input" and w1.shape == [8, 16]
    # BP left it replicated: the steps of MP and Z3, which changed it.
    assert [(s.tactic, s.sharding) for s in w1.history] == [(2, [[], ["model"]]),
                                                          (3, [["batch"], ["model"]])]
    assert [s.changed for s in w1.history] == [True, True]
    assert w1.history[-1].local_shape == [2, 8]
    gathers = [c for c in result.collectives if c.kind == "all_gather"]
    assert gathers and all(c.tactic == 3 and c.tactic_name == "Z3" and c.value == "w1"
                           for c in gathers)
    model = shared.workspace / "mlp" / "model.py"
    line = next(i for i, text in enumerate(model.read_text().splitlines(), 1)
                if "return jax.nn" in text)
    by_line = client.explain(SCHEDULE, file=str(model), line=line)
    assert by_line.values and all(v.history for v in by_line.values)
    with pytest.raises(RequestError) as e:
        client.explain(SCHEDULE)
    assert e.value.code == P.INVALID_PARAMS


def test_a_newer_revision_cancels_the_pending_one(shared):
    client = shared.connect()
    slow = BP_MP_Z3.replace("import partir\n", "import partir\nimport time\n"
                            "time.sleep(1.0)\n")
    path = shared.write("slow.partir.py", slow)
    old = client.request_future("partition", P.PartitionParams(path, slow, 1))
    new = client.request_future("partition", P.PartitionParams(path, slow, 2))
    with pytest.raises(RequestCancelled):
        old.result(timeout=60)
    assert new.result(timeout=60).ok
    assert client.cache_stats().cancelled_requests >= 1


def test_concurrent_clients_are_served_independently(shared):
    results: dict[str, list] = {}
    errors = []

    def work(label: str, path: str, text: str | None) -> None:
        progress = []
        try:
            client = shared.connect(on_progress=progress.append)
            out = [client.partition(path, text) for _ in range(3)]
            out.append(client.status())
            tokens = {p.token for p in progress}
            results[label] = [out, tokens]
        except Exception as e:  # reported below, in the main thread
            errors.append(e)

    other = BP_MP_Z3.replace('{"w1": 1}', '{"w2": 0}')
    threads = [threading.Thread(target=work, args=("lsp", SCHEDULE, None)),
               threading.Thread(target=work, args=("cli", "mlp/other.partir.py", other))]
    shared.write("other.partir.py", other)
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors
    lsp, cli = results["lsp"][0], results["cli"][0]
    assert all(r.ok for r in lsp[:3] + cli[:3])
    assert sharding_after(lsp[0], "w1", 2) == [[], ["model"]]
    assert sharding_after(cli[0], "w2", 2) == [["model"], []]
    assert lsp[3].pid == cli[3].pid  # one daemon served both
    # Each client saw progress for its own requests only (ids 1-3 of its connection).
    assert results["lsp"][1] <= {1, 2, 3} and results["cli"][1] <= {1, 2, 3}


def test_a_future_the_caller_cancelled_does_not_stop_the_client(shared):
    client = shared.connect()
    future = client.request_future("cache_stats", P.CacheStatsParams())
    future.cancel()  # not yet running: cancelled on the caller's side, answered anyway
    assert client.partition(SCHEDULE, timeout=60).ok  # the reader thread is alive
