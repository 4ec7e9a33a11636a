"""AutomaticPartition: the search tactic composes with manual tactics, its strategies run
equal to the unpartitioned function, it is deterministic for a seed, and what it found
can be kept as ManualPartitions (in Python and as source from `partir partition
--emit-schedule`)."""

from __future__ import annotations

import dataclasses
import json
import textwrap

import pytest

import partir
from examples.transformer import model, schedules
from partir.cli import main
from partir.errors import InvalidTacticError, UnknownInputError
from partir.tactics import manual_tactics
from partir.tactics.search import _dict_source, groups, name_pattern
from tests.oracles import assert_tree_close

SMALL = dataclasses.replace(model.TINY, layers=2)
MESH = {"batch": 4, "model": 2}
# A 2-layer T32 (abstract): large enough for the simulator to prefer sharding on "model".
T2 = dataclasses.replace(model.T32, layers=2)
T32_MESH = {"batch": 16, "model": 2}


def auto(**kw) -> partir.AutomaticPartition:
    args = {"axis": "model", "name": "AutoMP", "device": "a100", "budget_s": 60.0} | kw
    return partir.AutomaticPartition(**args)


@pytest.fixture(scope="module")
def small_inputs():
    return model.make_inputs(SMALL)


def shardings(meta: partir.Metadata) -> dict:
    return meta.tactics[-1].shardings


@pytest.mark.slow
def test_found_strategy_runs_equal_to_the_unpartitioned_step(small_inputs):
    import jax

    # Objective "memory": on this tiny model every sharding saves memory, so the search
    # takes decisions whatever the step times.
    schedule = [schedules.BP, auto(objective="memory", max_evaluations=25)]
    fn, meta = partir.jit(model.train_step, MESH, schedule)
    assert_tree_close(fn(*small_inputs), jax.jit(model.train_step)(*small_inputs))
    search = meta.tactics[-1].search
    assert search["decisions"] and search["evaluations"] <= 25
    assert meta.tactics[-1].actions[-1] == "propagate"
    assert any(a.startswith("tile<") for a in meta.tactics[-1].actions)
    # The earlier tactic's decision is kept: the batch stays sharded on "batch".
    assert shardings(meta)["batch/tokens"][0][:1] == ["batch"]
    assert json.dumps(meta.to_json()["tactics"][-1]["search"])


@pytest.mark.slow
def test_all_auto_on_both_axes_runs_equal(small_inputs):
    import jax

    schedule = [auto(axis=None, axes=["batch", "model"], name="AllAuto", objective="memory",
                     max_evaluations=30)]
    fn, meta = partir.jit(model.train_step, MESH, schedule)
    assert_tree_close(fn(*small_inputs), jax.jit(model.train_step)(*small_inputs))
    assert meta.tactics[0].axis == "batch,model"


@pytest.mark.slow
def test_deterministic_for_a_seed():
    args = model.abstract_inputs(T2)

    def run(seed):
        meta = partir.partition(model.train_step, T32_MESH,
                                [schedules.BP, auto(seed=seed, max_evaluations=20)], *args)
        s = meta.tactics[-1].search
        return s["decisions"], s["evaluations"], meta.tactics[-1].actions

    first = run(3)
    assert first == run(3)
    assert first[0]


@pytest.mark.slow
def test_auto_mp_matches_megatron_on_a_2_layer_t32():
    args = model.abstract_inputs(T2)
    manual = partir.partition(model.train_step, T32_MESH, [schedules.BP, schedules.MP],
                              *args, device="a100")
    found = partir.partition(model.train_step, T32_MESH, [schedules.BP, auto()], *args,
                             device="a100")
    assert found.cost.step_time_s <= 1.05 * manual.cost.step_time_s
    assert found.cost.peak_memory_bytes <= manual.cost.peak_memory_bytes
    search = found.tactics[-1].search
    # Layers collapse: far fewer distinct decisions than (input, dim) pairs.
    assert search["distinct"] < search["candidates"] / 4
    assert search["history"][-1][1] == pytest.approx(found.cost.step_time_s)
    assert search["elapsed_s"] < 60


@pytest.mark.slow
def test_manual_tactics_found_give_the_same_program():
    args = model.abstract_inputs(T2)
    found = partir.partition(model.train_step, T32_MESH, [schedules.BP, auto()], *args)
    kept = manual_tactics(found.tactics[-1].search, "AutoMP")
    assert kept and all(isinstance(t, partir.ManualPartition) for t in kept)
    again = partir.partition(model.train_step, T32_MESH, [schedules.BP, *kept], *args)
    assert shardings(again) == shardings(found)
    assert again.collectives == found.collectives
    assert again.cost.step_time_s == pytest.approx(found.cost.step_time_s)


@pytest.mark.slow
def test_a_later_tactic_sees_its_decisions():
    args = model.abstract_inputs(T2)
    meta = partir.partition(model.train_step, T32_MESH,
                            [schedules.BP, auto(), schedules.Z3], *args, device="a100")
    assert [t.name for t in meta.tactics] == ["BP", "AutoMP", "Z3"]
    before = meta.tactics[1].shardings
    after = meta.tactics[2].shardings
    for name, dims in before.items():
        for d, axes in enumerate(dims):
            assert after[name][d][:len(axes)] == axes


def test_layers_are_grouped_by_name_pattern():
    assert name_pattern("params/layers/12/w_up") == "params/layers/*/w_up"
    assert name_pattern("opt_state/0/mu/x1") == "opt_state/*/mu/x1"
    traced_names = partir.core_partition(model.train_step, MESH, [],
                                         *model.abstract_inputs(SMALL)).traced.input_names
    fake = {n: [type("V", (), {"type": type("T", (), {"shape": (2, 2)})()})()]
            for n in traced_names}
    pats = {g.pattern: g.names for g in groups(fake, ["params"])}
    assert pats["params/layers/*/w_up"] == ("params/layers/0/w_up", "params/layers/1/w_up")


def test_dict_source_writes_layer_runs_as_comprehensions():
    inputs = {f"params/layers/{i}/w_up": 1 for i in range(3)} | {"params/embed": 0}
    src = _dict_source(inputs, "")
    assert 'for i in range(3)' in src and "'params/embed': 0" in src
    assert eval(src) == inputs


def test_invalid_arguments():
    with pytest.raises(InvalidTacticError, match="one of axes"):
        partir.AutomaticPartition()
    with pytest.raises(InvalidTacticError, match="objective"):
        partir.AutomaticPartition(axis="model", objective="speed")
    with pytest.raises(InvalidTacticError, match="budget_s"):
        partir.AutomaticPartition(axis="model", budget_s=0)
    args = model.abstract_inputs(SMALL)
    with pytest.raises(partir.AxisNotInMeshError):
        partir.core_partition(model.train_step, MESH, [auto(axis="modle")], *args)
    with pytest.raises(UnknownInputError, match="did you mean"):
        partir.core_partition(model.train_step, MESH, [auto(inputs=["parms"])], *args)


SCHEDULE_FILE = """\
import dataclasses

import partir
from examples.transformer import model, schedules

cfg = dataclasses.replace(model.T32, layers=2)
program = partir.Program(model.train_step, *model.abstract_inputs(cfg))
mesh = {"batch": 16, "model": 2}
schedule = [
    schedules.BP,
    partir.AutomaticPartition(axis="model", device="a100", name="AutoMP"),
]
"""


@pytest.mark.slow
def test_schedule_file_with_partir_partition(capsys, tmp_path):
    path = tmp_path / "auto.partir.py"
    path.write_text(SCHEDULE_FILE)
    assert main(["partition", str(path), "--device", "a100"]) == 0
    table = capsys.readouterr().out
    assert "AutoMP" in table and "model" in table
    assert main(["partition", str(path), "--json"]) == 0
    record = json.loads(capsys.readouterr().out)["tactics"][1]
    assert record["search"]["decisions"] and record["name"] == "AutoMP"
    assert main(["partition", str(path), "--emit-schedule"]) == 0
    emitted = capsys.readouterr().out
    assert "partir.ManualPartition(" in emitted and "AutomaticPartition" not in emitted
    assert "    schedules.BP," in emitted
    # The emitted schedule, pasted in place of the automatic one, gives the same shardings.
    kept = tmp_path / "kept.partir.py"
    head = SCHEDULE_FILE[:SCHEDULE_FILE.index("schedule = [")]
    kept.write_text(head + textwrap.dedent(emitted.split("\n", 1)[1]))
    assert main(["partition", str(kept), "--json"]) == 0
    kept_record = json.loads(capsys.readouterr().out)["tactics"][-1]
    assert kept_record["input_shardings"] == record["input_shardings"]
    assert kept_record["collectives"] == record["collectives"]
