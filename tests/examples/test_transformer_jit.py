"""The tiny transformer training step, partitioned by every schedule of the paper's
appendix and executed on 8 CPU devices, equals the unpartitioned step."""

from __future__ import annotations

import pytest

import partir
from examples.transformer import model, schedules
from tests.oracles import assert_tree_close


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(schedules.SCHEDULES))
def test_schedule_on_batch4_model2(name, tiny_inputs, tiny_expected):
    fn, meta = partir.jit(model.train_step, schedules.mesh(), schedules.SCHEDULES[name])
    assert_tree_close(fn(*tiny_inputs), tiny_expected)
    assert len(meta.tactics) == len(schedules.SCHEDULES[name])


@pytest.mark.slow
@pytest.mark.parametrize("name", ["BP", "BP+Z2", "BP+Z3"])
def test_batch_only_schedules_on_batch8(name, tiny_inputs, tiny_expected):
    tactics = {"BP": schedules.BP, "Z2": schedules.Z2, "Z3": schedules.Z3}
    fn, meta = partir.jit(model.train_step, partir.Mesh({"batch": 8}),
                          [tactics[t] for t in name.split("+")])
    assert_tree_close(fn(*tiny_inputs), tiny_expected)
    if name == "BP":
        # one all_reduce per parameter gradient (4 layers x 9 + embedding) and the loss
        assert meta.collectives["all_reduce"] == 4 * 9 + 1 + 1
