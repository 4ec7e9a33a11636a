"""partir.jit / partir.partition end to end: executed results equal the function, and the
metadata reports what each tactic did."""

from __future__ import annotations

import json

import jax
import numpy as np
import pytest

import partir
from examples.mlp.model import example_args, mlp
from partir.runtime import DeviceCountError
from tests.examples import counts

MESH = partir.Mesh({"batch": 4, "model": 2})
BP = partir.ManualPartition({"x": 0}, axis="batch", name="BP")
MP = partir.ManualPartition({"w1": 1}, axis="model", name="MP")
Z3 = partir.ManualPartition({"w1": 0, "w2": 1}, axis="batch", name="Z3")
NONE = counts()


def test_mlp_schedule_runs_on_8_devices_and_reports_each_tactic():
    args = example_args()
    fn, meta = partir.jit(mlp, MESH, [BP, MP, Z3])
    np.testing.assert_allclose(fn(*args), mlp(*args), rtol=1e-4, atol=1e-4)
    assert [t.name for t in meta.tactics] == ["BP", "MP", "Z3"]
    assert [t.collectives for t in meta.tactics] == [
        NONE, {**NONE, "all_reduce": 1}, {**NONE, "all_reduce": 1, "all_gather": 2}]
    assert meta.tactics[2].shardings["w1"] == [["batch"], ["model"]]
    P = jax.sharding.PartitionSpec
    assert meta.in_specs == (P("batch", None), P("batch", "model"), P("model", "batch"))
    assert meta.out_specs == (P("batch", None),)
    assert "all_reduce" in meta.hlo_ir and "spmd.execute" in meta.spmd_ir
    compiled = fn.lower(*args).compile()
    assert compiled.memory_analysis() is not None
    assert "stablehlo" in meta.stablehlo or "func.func" in meta.stablehlo
    json.dumps(meta.to_json())


def test_partition_needs_no_devices_and_accepts_large_meshes():
    S = jax.ShapeDtypeStruct
    big = partir.Mesh({"batch": 16, "model": 4})
    meta = partir.partition(mlp, big, [partir.ManualPartition({"x": 0}, axis="batch"),
                                       partir.ManualPartition({"w1": 1}, axis="model")],
                            S((256, 8), np.float32), S((8, 16), np.float32),
                            S((16, 8), np.float32))
    assert meta.collectives["all_reduce"] == 1
    assert "tensor<16x8xf32>" in meta.hlo_ir


def test_jit_on_a_mesh_larger_than_the_devices_says_what_to_do():
    fn, _ = partir.jit(mlp, partir.Mesh({"batch": 16, "model": 2}), [BP])
    with pytest.raises(DeviceCountError) as e:
        fn(*example_args())
    assert "partir.partition" in str(e.value)
    assert isinstance(e.value, partir.PartitionError)


def test_already_sharded_inputs_are_accepted():
    args = example_args()
    fn, meta = partir.jit(mlp, MESH, [BP, MP])
    fn(*args)
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:8]).reshape(4, 2), ("batch", "model"))
    placed = [jax.device_put(a, jax.sharding.NamedSharding(mesh, s))
              for a, s in zip(args, meta.in_specs, strict=True)]
    np.testing.assert_allclose(fn(*placed), mlp(*args), rtol=1e-4, atol=1e-4)
