"""Sub-axes: a reshape that splits or merges a dimension sharded on an axis the reshape's
major factor is smaller than splits the axis (`x` of 4 -> `x:(1)2`, `x:(2)2`) and keeps
the sharding, through Core, SPMD, HLO and the runtime; where no split exists, propagation
stops and says why.

The property test draws chains of reshapes (splits and merges at any position, by any
divisor) with elementwise ops and a reduction, shards an input dimension, and checks both
oracles: the Core interpreter and the program executed on the CPU devices.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, note, reject, settings
from hypothesis import strategies as st
from jax.sharding import NamedSharding, PartitionSpec

import partir
from partir.mesh import Mesh, split_axis_name
from tests.budget import examples
from tests.core.program_strategies import PartitionCase, program_case
from tests.oracles import EXPECTED_ERRORS, assert_same

# Each case partitions, interprets and compiles one small XLA executable (~0.3 s).
EXAMPLES = examples(100)
SETTINGS = settings(deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much,
                                           HealthCheck.data_too_large])


# -- the mesh --------------------------------------------------------------------------------
def test_refining_an_axis_keeps_the_users_axes_addressable():
    mesh = Mesh({"b": 2, "x": 8}).refine("x", (2, 4))
    assert list(mesh.items()) == [("b", 2), ("x:(1)2", 2), ("x:(2)4", 4)]
    assert mesh.parts("x") == ("x:(1)2", "x:(2)4")
    assert mesh.check_axis("x") == 8 and mesh.user_mesh == Mesh({"b": 2, "x": 8})
    finer = mesh.refine("x:(2)4", (2, 2))
    assert finer.parts("x") == ("x:(1)2", "x:(2)2", "x:(4)2")
    assert finer.parts("x:(2)4") == ("x:(2)2", "x:(4)2")
    assert finer.coalesce(["x:(1)2", "x:(2)2", "x:(4)2"]) == ("x",)
    assert finer.coalesce(["x:(2)2", "x:(4)2"]) == ("x:(2)4",)
    assert finer.coalesce(["b", "x:(1)2", "x:(4)2"]) == ("b", "x:(1)2", "x:(4)2")
    assert finer.parts("y") is None
    with pytest.raises(partir.AxisNotInMeshError, match="'y' is not in the mesh"):
        finer.check_axis("y")
    with pytest.raises(partir.PartitionError, match="cannot split axis 'b'"):
        mesh.refine("b", (3,))


# -- propagation -----------------------------------------------------------------------------
def _split_heads(x):
    return (jnp.sin(x).reshape(2, 4) * 2.0).sum(axis=1)


def test_a_split_whose_major_part_is_smaller_than_the_axis_shards_both_parts():
    x = np.arange(8, dtype=np.float32)
    r = partir.core_partition(_split_heads, {"x": 4},
                              [partir.ManualPartition({"x": 0}, axis="x")], x)
    assert r.tactics[0].conflicts == []
    assert list(r.program.mesh.items()) == [("x:(1)2", 2), ("x:(2)2", 2)]
    reshape = next(op for op in r.program.ops if op.name == "reshape")
    assert [str(a) for lp in r.program.nest(reshape) for a in lp.results] == \
        ["#tile<0>", "#tile<1>"]
    # The input is tiled on both sub-axes, that is on all of `x`, and reported so.
    assert r.program.input_shardings()["x"].dims == (("x",),)
    assert r.program.output_shardings()["out"].dims == (("x:(1)2",),)
    np.testing.assert_allclose(r.interpret(x), _split_heads(x), rtol=1e-6)
    meta = partir.partition(_split_heads, {"x": 4},
                            [partir.ManualPartition({"x": 0}, axis="x")], x)
    assert meta.in_specs == (PartitionSpec("x"),)
    assert '"x:(1)2"' in meta.spmd_ir and '"x:(2)2"' in meta.hlo_ir
    # the sum over the minor sub-axis's dimension is reduced over it alone
    assert meta.collectives["all_reduce"] == 1
    assert 'all_reduce <"x:(2)2">' in meta.hlo_ir


def test_an_indivisible_split_reports_that_no_sub_axis_split_exists():
    def f(x):
        return jnp.sin(x).reshape(2, 6) * 2.0  # 12 on 4: 2 takes 2, then 2 divides 6

    def g(x):
        return jnp.sin(x).reshape(2, 3, 2) * 2.0  # 12 on 4: 2 takes 2, 3 then blocks

    x = np.arange(12, dtype=np.float32)
    tile = [partir.ManualPartition({"x": 0}, axis="x")]
    ok = partir.core_partition(f, {"x": 4}, tile, x)
    assert ok.tactics[0].conflicts == [] and list(ok.program.mesh) == ["x:(1)2", "x:(2)2"]
    blocked = partir.core_partition(g, {"x": 4}, tile, x)
    (conflict,) = blocked.tactics[0].conflicts
    assert conflict.op == "reshape" and conflict.kind == "indivisible"
    assert "no split of the axis into sub-axes" in conflict.detail
    assert list(blocked.program.mesh) == ["x"]
    np.testing.assert_allclose(blocked.interpret(x), g(x), rtol=1e-6)


def test_a_later_tactic_on_a_split_axis_uses_all_its_sub_axes():
    def f(x, w):
        h = jnp.sin(x).reshape(2, 4, 4)  # x: [8, 4] tiled on m(4) -> 2 heads x 4
        return jnp.einsum("hdk,kj->hdj", h, w).sum()

    x = np.arange(32, dtype=np.float32).reshape(8, 4) / 10
    w = np.arange(16, dtype=np.float32).reshape(4, 4) / 10
    schedule = [partir.ManualPartition({"x": 0}, axis="m"),
                partir.ManualPartition({"w": 1}, axis="m", name="w on m"),
                partir.ManualPartition({"w": 0}, axis="b", name="w on b")]
    r = partir.core_partition(f, {"b": 2, "m": 4}, schedule, x, w)
    assert r.tactics[1].actions[0] == 'tile<%w,1,"m">'
    # w is tiled on m's two sub-axes, in order, as tiling it on m would
    assert r.program.input_shardings()["w"].dims == (("b",), ("m",))
    np.testing.assert_allclose(r.interpret(x, w), f(x, w), rtol=1e-5)


# -- the runtime ------------------------------------------------------------------------------
def test_a_users_jax_mesh_is_split_in_its_own_device_order():
    devices = np.array(jax.devices()[:4])[::-1]
    jax_mesh = jax.sharding.Mesh(devices, ("x",))
    x = np.arange(8, dtype=np.float32)
    fn, meta = partir.jit(_split_heads, jax_mesh, [partir.ManualPartition({"x": 0}, axis="x")])
    out = fn(x)
    np.testing.assert_allclose(out, _split_heads(x), rtol=1e-6)
    placed = jax.device_put(x, NamedSharding(jax_mesh, meta.in_specs[0]))
    np.testing.assert_allclose(fn(placed), _split_heads(x), rtol=1e-6)
    # device k of the user's order holds elements [2k, 2k+2) of x, as P("x") says
    for shard in placed.addressable_shards:
        k = list(devices).index(shard.device)
        np.testing.assert_array_equal(shard.data, x[2 * k:2 * k + 2])


# -- property: reshape chains on sharded dimensions -------------------------------------------
SIZES = (2, 3, 4, 6, 8, 12, 16, 24)


def _divisors(n: int) -> list[int]:
    return [d for d in range(2, n) if n % d == 0]


@st.composite
def reshape_cases(draw) -> PartitionCase:
    rank = draw(st.integers(1, 3))
    shape = [draw(st.sampled_from(SIZES)) for _ in range(rank)]
    while math.prod(shape) > 1536:
        shape[shape.index(max(shape))] //= 2
    lines, cur, v = [], list(shape), "x0"
    for step in range(draw(st.integers(1, 4))):
        out = f"v{step}"
        splittable = [d for d, n in enumerate(cur) if _divisors(n)]
        if len(cur) >= 2 and (not splittable or len(cur) >= 4 or draw(st.booleans())):
            d = draw(st.integers(0, len(cur) - 2))  # merge d and d + 1
            cur[d:d + 2] = [cur[d] * cur[d + 1]]
        elif splittable:
            d = draw(st.sampled_from(splittable))
            a = draw(st.sampled_from(_divisors(cur[d])))
            cur[d:d + 1] = [a, cur[d] // a]
        else:
            break
        op = draw(st.sampled_from(("jnp.sin", "jnp.tanh", "")))
        lines.append((out, f"{op}(jnp.reshape({v}, {tuple(cur)}))" if op else
                      f"jnp.reshape({v}, {tuple(cur)}) * 1.5"))
        v = out
    if not lines or draw(st.booleans()):
        axis = draw(st.integers(0, len(cur) - 1))
        lines.append(("s", f"jnp.sum({v}, axis={axis})"))
    case = program_case({"x0": tuple(shape)}, lines)
    mesh = draw(st.sampled_from(({"a": 4}, {"a": 8}, {"a": 2, "b": 4}, {"a": 4, "b": 2})))
    schedule = [partir.ManualPartition({"x0": draw(st.integers(0, rank - 1))}, axis=axis)
                for axis in draw(st.permutations(list(mesh)))[:draw(st.integers(1, len(mesh)))]]
    return PartitionCase(case, mesh, tuple(schedule))


@pytest.mark.slow
@settings(SETTINGS, max_examples=EXAMPLES)
@given(pc=reshape_cases())
def test_reshape_chains_on_sharded_dims_match_both_oracles(pc: PartitionCase):
    note(f"reproducer:\n{pc.reproducer()}")
    case = pc.program
    try:
        res = partir.core_partition(case.fn, pc.mesh, pc.schedule, *case.args)
    except EXPECTED_ERRORS:
        reject()
    refined = list(res.program.mesh) != list(pc.mesh)
    event("sub-axes" if refined else "no sub-axes")
    expected = case.expected()
    assert_same(res.interpret(*case.args), expected, "Core interpreter")
    fn, meta = partir.jit(case.fn, pc.mesh, pc.schedule)
    assert_same(fn(*case.args), expected, "executed")
    note(f"PartIR:HLO:\n{meta.hlo_ir}")
    for spec in jax.tree_util.tree_leaves(
            (meta.in_specs, meta.out_specs),
            is_leaf=lambda s: isinstance(s, PartitionSpec)):
        for entry in spec:
            for axis in () if entry is None else (entry,) if isinstance(entry, str) else entry:
                assert split_axis_name(axis)[0] in pc.mesh, spec


def test_a_tactic_may_name_a_sub_axis():
    def f(x):
        return jnp.tanh(x) @ jnp.ones((4, 2), jnp.float32)

    x = np.arange(32, dtype=np.float32).reshape(8, 4) / 10
    schedule = [partir.ManualPartition({"x": 0}, axis="m:(1)2", name="rows"),
                partir.ManualPartition({"x": 1}, axis="m:(2)2", name="columns")]
    r = partir.core_partition(f, {"m": 4}, schedule, x)
    assert list(r.program.mesh) == ["m:(1)2", "m:(2)2"]
    assert r.program.input_shardings()["x"].dims == (("m:(1)2",), ("m:(2)2",))
    np.testing.assert_allclose(r.interpret(x), f(x), rtol=1e-5)
    fn, meta = partir.jit(f, {"m": 4}, schedule)
    np.testing.assert_allclose(fn(x), f(x), rtol=1e-5)
    assert meta.in_specs == (PartitionSpec("m:(1)2", "m:(2)2"),)
    with pytest.raises(partir.AxisNotInMeshError, match="'m:\\(3\\)2' is not in the mesh"):
        partir.core_partition(f, {"m": 4}, [partir.ManualPartition({"x": 0}, axis="m:(3)2")],
                              x)


@pytest.mark.slow
def test_a_sub_axis_crossing_an_earlier_split_splits_its_sub_axes_further():
    """Issue 26, item 6: `a:(2)4` after `a:(4)2` (which split `a` into `a:(1)4`, `a:(4)2`)
    is `a:(2)2` then `a:(4)2` once `a:(1)4` is split into `a:(1)2`, `a:(2)2`."""
    from tests.api.test_padding import _oracles

    def f(x, w):
        return jnp.tanh(x @ w)

    rng = np.random.default_rng(12)
    x = rng.normal(size=(8, 8)).astype(np.float32)
    w = rng.normal(size=(8, 8)).astype(np.float32)
    schedule = [partir.ManualPartition({"x": 0}, axis="a:(4)2", name="T1"),
                partir.ManualPartition({"w": 1}, axis="a:(2)4", name="T2")]
    r = partir.core_partition(f, {"a": 8}, schedule, x, w)
    assert list(r.program.mesh) == ["a:(1)2", "a:(2)2", "a:(4)2"]
    assert r.program.input_shardings()["w"].dims == ((), ("a:(2)4",))
    assert any("a:(1)4" in n and "tactic T2" in n for n in r.tactics[1].notes)
    for got in _oracles(f, {"a": 8}, schedule, x, w):
        np.testing.assert_allclose(got, f(x, w), rtol=1e-5, atol=1e-6)
    fn, meta = partir.jit(f, {"a": 8}, schedule)
    np.testing.assert_allclose(fn(x, w), f(x, w), rtol=1e-5, atol=1e-6)
    assert meta.in_specs == (PartitionSpec("a:(4)2", None), PartitionSpec(None, "a:(2)4"))
    # The same value tiled on both: the overlap is the sub-axis both tactics hold.
    with pytest.raises(partir.AlreadyTiledError,
                       match=r"'x' is already tiled on dimension 0 by tactic T1 on axis "
                             r"'a:\(4\)2'"):
        partir.core_partition(f, {"a": 8}, [schedule[0], partir.ManualPartition(
            {"x": 1}, axis="a:(2)4", name="T2")], x, w)


def test_a_sub_axis_that_cannot_nest_with_an_earlier_split_says_which():
    """On an axis of 12, `a:(4)3` splits it into `a:(1)4`, `a:(4)3`; `a:(1)3` would end
    inside `a:(1)4`, which no split of 4 puts a boundary at 3 in."""
    x = jax.ShapeDtypeStruct((12, 12), jnp.float32)
    schedule = [partir.ManualPartition({"x": 0}, axis="a:(4)3", name="T1"),
                partir.ManualPartition({"x": 1}, axis="a:(1)3", name="T2")]
    with pytest.raises(partir.SubAxisOverlapError) as e:
        partir.core_partition(jnp.sin, {"a": 12}, schedule, x)
    msg = str(e.value)
    assert "tactic T2: sub-axis 'a:(1)3' overlaps sub-axis 'a:(1)4'" in msg
    assert "split into sub-axes a:(1)4, a:(4)3 as tactic T1 names 'a:(4)3'" in msg
    assert isinstance(e.value, partir.PartitionError)
    # Alone, the same sub-axis is fine.
    partir.core_partition(jnp.sin, {"a": 12}, schedule[1:], x)
