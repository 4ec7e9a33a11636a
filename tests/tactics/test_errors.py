"""Bad schedules get PartitionError subclasses naming the input, tactic and source line."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

import partir

S = jax.ShapeDtypeStruct
MESH = partir.Mesh({"batch": 4, "model": 2})


def step(params, x):
    return jnp.tanh(x @ params["dense"]["w"]) @ params["out"]


ARGS = ({"dense": {"w": S((8, 16), jnp.float32)}, "out": S((16, 6), jnp.float32)},
        S((12, 8), jnp.float32))


def partition(*tactics):
    return partir.core_partition(step, MESH, list(tactics), *ARGS)


def test_unknown_input_suggests_close_names():
    tactic = partir.ManualPartition({"params/dense/ww": 1}, axis="model", name="MP")
    with pytest.raises(partir.UnknownInputError) as e:
        partition(tactic)
    msg = str(e.value)
    assert "'params/dense/ww'" in msg and "did you mean 'params/dense/w'" in msg
    assert "tactic MP" in msg and f"test_errors.py:{tactic.loc.line}" in msg


def test_dimension_out_of_range():
    with pytest.raises(partir.DimensionOutOfRangeError) as e:
        partition(partir.ManualPartition({"x": 2}, axis="batch", name="BP"))
    assert "input 'x'" in str(e.value) and "dimension 2" in str(e.value)
    assert "tactic BP" in str(e.value)


def test_negative_dimension_counts_from_the_end():
    r = partition(partir.ManualPartition({"x": -2}, axis="batch"))
    assert r.tactics[0].actions[0] == 'tile<%x,0,"batch">'


def test_axis_not_in_mesh():
    tactic = partir.ManualPartition({"x": 0}, axis="data", name="BP")
    with pytest.raises(partir.AxisNotInMeshError) as e:
        partition(tactic)
    assert "'data'" in str(e.value) and "'batch', 'model'" in str(e.value)
    assert f"test_errors.py:{tactic.loc.line}" in str(e.value)


def test_indivisible_dimension_names_both_sizes():
    with pytest.raises(partir.IndivisibleDimensionError) as e:
        partition(partir.ManualPartition({"params/out": 1}, axis="batch", name="Z",
                                         pad=False))
    msg = str(e.value)
    assert "size 6" in msg and "size 4" in msg and "'params/out'" in msg
    # By default the dimension is padded instead (6 -> 8).
    (record,) = partition(partir.ManualPartition({"params/out": 1}, axis="batch")).tactics
    assert record.actions[0] == 'tile<%params/out,1,"batch">'


def test_indivisible_after_earlier_sharding_says_so():
    # With pad=False, tiles of 3 (12 on batch) are not padded to 4 for model.
    with pytest.raises(partir.IndivisibleDimensionError) as e:
        partition(partir.ManualPartition({"x": 0}, axis="batch"),
                  partir.ManualPartition({"x": 0}, axis="model", pad=False))
    msg = str(e.value)
    assert "size 3" in msg and "already divided by batch" in msg and "pad=False" in msg
    # By default each tile of 3 is padded to 4.
    r = partition(partir.ManualPartition({"x": 0}, axis="batch"),
                  partir.ManualPartition({"x": 0}, axis="model"))
    assert r.tactics[1].actions[0] == 'tile<%x,0,"model">' and not r.conflicts


def test_input_tiled_twice_on_the_same_axis():
    with pytest.raises(partir.AlreadyTiledError) as e:
        partition(partir.ManualPartition({"x": 0}, axis="batch", name="BP"),
                  partir.ManualPartition({"x": 1}, axis="batch", name="BP2"))
    msg = str(e.value)
    assert "'x'" in msg and "tiled on dimension 0 by tactic BP" in msg and "tactic BP2" in msg


def test_bad_value_form():
    with pytest.raises(partir.InvalidTacticError) as e:
        partir.ManualPartition({"x": "0"}, axis="batch")
    assert "input 'x'" in str(e.value) and "'0'" in str(e.value)


def test_callable_rule_result_is_checked():
    with pytest.raises(partir.InvalidTacticError) as e:
        partition(partir.ManualPartition({"params": lambda name, shape: 1.5}, axis="model"))
    assert "params/dense/w" in str(e.value)


def test_partition_errors_are_not_bare_python_errors():
    for exc in (partir.UnknownInputError, partir.AxisNotInMeshError,
                partir.IndivisibleDimensionError, partir.AlreadyTiledError,
                partir.DimensionOutOfRangeError, partir.InvalidTacticError):
        assert issubclass(exc, partir.PartitionError)
        assert not issubclass(exc, KeyError | IndexError)


def test_value_forms():
    def rule(name, shape):
        return 1 if name.endswith("/w") else partir.UNKNOWN

    r = partition(partir.ManualPartition({"x": 0}, axis="batch"),
                  partir.ManualPartition({"params": rule}, axis="model"),
                  partir.ManualPartition({"params": partir.FIRST_DIVISIBLE_DIM}, axis="batch"))
    assert r.tactics[1].actions == ['tile<%params/dense/w,1,"model">', "propagate"]
    # dense/w: dim 1 is sharded on model, dim 0 (8) is divisible by 4; out (16x6): dim 0
    # is sliced on model by inference, dim 1 (6) is not divisible.
    assert r.tactics[2].actions[:1] == ['tile<%params/dense/w,0,"batch">']
    assert any("params/out" in n for n in r.tactics[2].notes)
