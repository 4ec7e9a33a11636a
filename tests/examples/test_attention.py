"""The attention example (examples/attention): 2 heads made by a reshape, Megatron MP on a
4-device axis. The reshape splits "model" into the sub-axes `model:(1)2` (heads) and
`model:(2)2` (head dimension); every schedule runs on 8 CPU devices equal to the
unpartitioned step, and both oracles agree. `examples/attention/README.md` derives the
collectives asserted here.
"""

from __future__ import annotations

import re

import jax
import pytest
from jax.sharding import PartitionSpec

import partir
from examples.attention import model, schedules
from tests.oracles import assert_tree_close

SCHEDULES = {"BP": [schedules.BP], "MP": [schedules.MP],
             "BP+MP": [schedules.BP, schedules.MP]}
# (axes of each all_reduce in the PartIR:HLO program, how many), README "Collectives".
ALL_REDUCES = {
    "BP": {'"batch"': 5},
    "MP": {'"model:(2)2"': 2, '"model:(1)2", "model:(2)2"': 1},
    "BP+MP": {'"batch"': 5, '"model:(2)2"': 2, '"model:(1)2", "model:(2)2"': 1},
}


@pytest.fixture(scope="module")
def inputs():
    return model.make_inputs()


@pytest.mark.slow
@pytest.mark.parametrize("name", SCHEDULES)
def test_schedules_run_equal_to_the_unpartitioned_step(name, inputs):
    fn, meta = partir.jit(model.train_step, schedules.MESH, SCHEDULES[name])
    expected = jax.jit(model.train_step)(*inputs)
    assert_tree_close(fn(*inputs), expected)
    assert all(t.conflicts == [] for t in meta.tactics)
    core = partir.core_partition(model.train_step, schedules.MESH, SCHEDULES[name], *inputs)
    assert_tree_close(core.interpret(*inputs), expected)
    found: dict[str, int] = {}
    for axes in re.findall(r"= all_reduce <([^>]*)>", meta.hlo_ir):
        found[axes] = found.get(axes, 0) + 1
    assert found == ALL_REDUCES[name]
    assert meta.collectives["all_gather"] == 0 and meta.collectives["all_to_all"] == 0


def test_megatron_shards_the_heads_on_a_sub_axis(inputs):
    result = partir.core_partition(model.train_step, schedules.MESH,
                                   [schedules.BP, schedules.MP], *inputs)
    mesh = result.program.mesh
    (note,) = result.tactics[1].notes
    assert note.startswith("axis 'model' split into sub-axes model:(1)2, model:(2)2 to shard "
                           "through reshape at ") and note.endswith("model.py:43")
    assert list(mesh.items()) == [("batch", 2), ("model:(1)2", 2), ("model:(2)2", 2)]
    q = next(op for op in result.program.ops if op.name == "reshape"
             and op.results[0].type.shape == (4, 8, 2, 8))
    # [B, S, D] -> [B, S, H, Dh]: heads on model:(1)2, the head dimension on model:(2)2
    assert result.program.sharding(q.results[0]).dims == (
        ("batch",), (), ("model:(1)2",), ("model:(2)2",))
    # the weights are sharded on all of "model", which the user's mesh can place
    shardings = result.program.input_shardings()
    assert shardings["params/w_q"].dims == ((), ("model",))
    meta = partir.partition(model.train_step, schedules.MESH, [schedules.BP, schedules.MP],
                            *inputs)
    assert meta.in_specs[0]["w_q"] == PartitionSpec(None, "model")
