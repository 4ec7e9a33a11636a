"""partir.partition computes the IR texts and the earlier tactics' collectives and costs
when they are first read: same values as computed at once, picklable, errors at the read."""

from __future__ import annotations

import json
import pickle

import pytest

import partir
import partir.api
from examples.mlp.model import example_args, mlp
from partir.core.printing import print_core
from partir.pipeline import lower
from partir.sim import simulate

MESH = {"batch": 4, "model": 2}
SCHEDULE = [partir.ManualPartition({"x": 0}, axis="batch", name="BP"),
            partir.ManualPartition({"w1": 1}, axis="model", name="MP"),
            partir.ManualPartition({"w1": 0, "w2": 1}, axis="batch", name="Z3")]


@pytest.fixture
def lowerings(monkeypatch):
    """The programs partir.api lowers, in order."""
    seen = []

    def counting(program):
        seen.append(program)
        return lower(program)

    monkeypatch.setattr(partir.api, "lower", counting)
    return seen


def test_only_the_final_program_is_lowered_until_more_is_read(lowerings):
    meta = partir.partition(mlp, MESH, SCHEDULE, *example_args())
    result = partir.core_partition(mlp, MESH, SCHEDULE, *example_args())
    assert len(lowerings) == 1
    for i, (tactic, record) in enumerate(zip(meta.tactics, result.tactics, strict=True)):
        eager = lower(record.program)
        assert tactic.collectives == eager.collectives
        assert tactic.cost == simulate(eager.hlo)
        assert tactic.core_ir == print_core(record.program)
        # The last tactic shares the final program's lowering; the others lower on read.
        assert len(lowerings) == 1 + min(i + 1, len(SCHEDULE) - 1)
    final = lower(result.program)
    assert (meta.core_ir, meta.spmd_ir, meta.hlo_ir) == (
        final.text("core"), final.text("spmd"), final.text("hlo"))


def test_metadata_pickles_and_serialises_with_every_field_computed():
    meta = partir.partition(mlp, MESH, SCHEDULE, *example_args())
    copy = pickle.loads(pickle.dumps(meta))
    assert copy == meta
    assert copy.tactics[0].core_ir.startswith("func @mlp")
    assert json.loads(json.dumps(meta.to_json()))["tactics"][1]["collectives"][
        "all_reduce"] == 1


def test_an_earlier_tactics_lowering_error_is_raised_where_it_is_read(monkeypatch):
    meta = partir.partition(mlp, MESH, SCHEDULE, *example_args())

    def failing(program):
        raise RuntimeError("lowering failed")

    monkeypatch.setattr(partir.api, "lower", failing)
    assert meta.tactics[-1].collectives["all_gather"] == 2  # computed with the final one
    with pytest.raises(RuntimeError, match="lowering failed"):
        meta.tactics[0].cost  # noqa: B018


def test_jit_metadata_has_the_executables_stablehlo_once_called():
    fn, meta = partir.jit(mlp, MESH, SCHEDULE)
    assert meta.stablehlo is None
    fn(*example_args())
    assert "stablehlo.dot_general" in meta.stablehlo or "stablehlo.dot" in meta.stablehlo
