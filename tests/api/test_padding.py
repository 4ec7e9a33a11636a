"""Padding of dimensions an axis does not divide (Shardy's semantics): executed through
`partir.jit` on the 8 CPU devices, on both oracles (the sequential Core interpreter and
the SPMD interpreter), equal to the unpartitioned function, with the padding reported."""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import partir
from examples.padding import model
from partir.core.materialize import materialize
from partir.ir.types import padded_size
from partir.spmd import lower_core_to_spmd
from partir.spmd.interpreter import interpret_spmd
from tests.oracles import assert_tree_close

TOL = {"rtol": 1e-5, "atol": 1e-5}


def _oracles(fn, mesh, schedule, *args):
    """fn(*args) by the Core interpreter and by the SPMD interpreter of the partitioned
    program: both must be the unpartitioned function's."""
    res = partir.core_partition(fn, mesh, schedule, *args)
    core = res.interpret(*args)
    spmd = lower_core_to_spmd(materialize(res.program), res.program.mesh)
    outs = interpret_spmd(spmd, *res.flatten_args(*args))
    return core, jax.tree_util.tree_unflatten(res.traced.out_tree, outs)


def _check(fn, mesh, schedule, *args):
    expected = fn(*args)
    core, spmd = _oracles(fn, mesh, schedule, *args)
    assert_tree_close(core, expected)
    assert_tree_close(spmd, expected)
    jitted, meta = partir.jit(fn, mesh, schedule)
    got = jitted(*args)
    for a, e in zip(jax.tree.leaves(got), jax.tree.leaves(expected), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(e), **TOL)
    json.dumps(meta.to_json())
    return meta


# --- batch of 6 on a 4-device axis: an MLP train step with a mean loss ---------------------

@pytest.mark.slow
def test_batch_of_6_on_4_devices_train_step():
    mesh = partir.Mesh({"batch": 4, "model": 2})
    schedule = [partir.ManualPartition({"x": 0, "y": 0}, axis="batch", name="BP"),
                partir.ManualPartition({"params/w1": 1, "params/w2": 0}, axis="model",
                                       name="MP")]
    meta = _check(model.mlp_step, mesh, schedule, *model.mlp_inputs())
    padded = {(p["value"], p["dim"]): p for p in meta.padding}
    assert padded[("x", 0)]["size"] == 6 and padded[("x", 0)]["padded"] == 8
    assert padded[("x", 0)]["axes"] == ["batch"]
    # 2 padded rows of 8 floats on each of the 2 model replicas.
    assert padded[("x", 0)]["wasted_bytes"] == 2 * 8 * 4 * 2
    assert ("y", 0) in padded
    assert any(p["wasted_flops"] > 0 for p in meta.padding)
    assert meta.tactics[0].padding and not meta.tactics[0].conflicts
    assert meta.tactics[-1].padding == meta.padding


# --- vocabulary of 50 on an 8-device axis: embedding, logits, softmax cross-entropy -------

@pytest.mark.slow
def test_vocabulary_of_50_on_8_devices():
    params, ids, labels = model.lm_inputs()
    mesh = partir.Mesh({"vocab": 8})
    schedule = [partir.ManualPartition({"params/embed": 0}, axis="vocab", name="EMB")]
    meta = _check(model.lm_step, mesh, schedule, params, ids, labels)
    padded = {(p["value"], p["dim"]): p for p in meta.padding}
    assert padded[("params/embed", 0)]["size"] == 50
    assert padded[("params/embed", 0)]["padded"] == 56
    assert padded[("params/embed", 0)]["wasted_bytes"] == 6 * 16 * 4
    # The logits are vocabulary-sharded too (padded through the dot_general).
    assert any(p["size"] == 50 and p["value"] != "params/embed" for p in meta.padding)


# --- masking: garbage never reaches a reduction ----------------------------------------------

def test_max_reduction_over_a_padded_dim_ignores_the_padding():
    def f(x):
        return jnp.max(jnp.exp(x), axis=0)  # the padding's garbage is exp(0) = 1 or more

    x = -jnp.abs(jnp.asarray(np.random.default_rng(2).normal(size=(6, 3)), jnp.float32)) - 1
    _check(f, partir.Mesh({"a": 4}), [partir.ManualPartition({"x": 0}, axis="a")], x)


@pytest.mark.slow
def test_max_of_large_values_with_padding_that_could_be_larger():
    def f(x):
        y = jnp.exp(x) * 1e3  # a pass-through factor: computed on the padding too
        return jnp.max(y), jnp.min(-y), jnp.sum(y)

    x = jnp.asarray(np.random.default_rng(3).normal(size=(5,)), jnp.float32)
    _check(f, partir.Mesh({"a": 4}), [partir.ManualPartition({"x": 0}, axis="a")], x)


@pytest.mark.slow
def test_dot_general_contracting_a_padded_dim():
    def f(x, w):
        return x @ w

    rng = np.random.default_rng(4)
    x = jnp.asarray(rng.normal(size=(3, 10)), jnp.float32)
    w = jnp.asarray(rng.normal(size=(10, 5)), jnp.float32)
    meta = _check(f, partir.Mesh({"a": 4}), [partir.ManualPartition({"x": 1}, axis="a")],
                  x, w)
    assert meta.collectives["all_reduce"] >= 1
    # w is sliced by propagation on its padded rows too.
    assert {(p["value"], p["dim"]) for p in meta.padding} >= {("x", 1), ("w", 0)}


@pytest.mark.slow
def test_dot_general_of_padded_operands_whose_padding_is_inf():
    def f(x, w):
        return jnp.log(x) @ jnp.log(w)  # log(0) = -inf on zero padding

    rng = np.random.default_rng(5)
    x = jnp.asarray(rng.uniform(1, 2, size=(3, 7)), jnp.float32)
    w = jnp.asarray(rng.uniform(1, 2, size=(7, 2)), jnp.float32)
    _check(f, partir.Mesh({"a": 2, "b": 4}), [partir.ManualPartition({"x": 1}, axis="b")],
           x, w)


def test_nested_axes_on_a_padded_dim_whose_tile_the_second_divides():
    def f(x):
        return jnp.sum(jnp.sin(x), axis=0)

    x = jnp.asarray(np.random.default_rng(6).normal(size=(7, 3)), jnp.float32)
    # 7 on a (4): tiles of 2, which b (2) divides.
    _check(f, partir.Mesh({"a": 4, "b": 2}),
           [partir.ManualPartition({"x": 0}, axis="a"),
            partir.ManualPartition({"x": 0}, axis="b")], x)


def test_a_sum_over_a_dim_whose_inner_sub_axis_pads_masks_each_tiles_padding():
    """6 on the axis a (4), split into sub-axes a:(1)2 x a:(2)2 by the reshape of the
    other input: the outer sub-axis divides 6 exactly (tiles of 3), the inner one pads
    each 3 to 4. The sum masks the padding of each outer tile, not positions past 3 of
    the whole dimension (which would drop the second tile)."""
    def f(x, y):
        return jnp.sum(x + (np.arange(6, dtype=np.float32) % 5 - 2)), -jnp.reshape(y, (2, 2))

    x = jnp.arange(1, 7, dtype=jnp.float32)
    y = jnp.arange(4, dtype=jnp.float32)
    schedule = [partir.ManualPartition({"x": 0, "y": 0}, axis="a")]
    _check(f, partir.Mesh({"a": 4}), schedule, x, y)
    program = partir.core_partition(f, partir.Mesh({"a": 4}), schedule, x, y).program
    assert tuple(program.mesh.axis_names) == ("a:(1)2", "a:(2)2")


# --- errors and conflicts ------------------------------------------------------------------

def test_pad_false_keeps_the_indivisible_error():
    x = jnp.zeros((6, 8))
    with pytest.raises(partir.IndivisibleDimensionError, match="4 does not divide 6"):
        partir.partition(lambda x: x * 2, partir.Mesh({"a": 4}),
                         [partir.ManualPartition({"x": 0}, axis="a", pad=False)], x)


def test_pad_must_be_a_bool():
    with pytest.raises(partir.InvalidTacticError, match="pad"):
        partir.ManualPartition({"x": 0}, axis="a", pad="yes")


def test_pad_false_keeps_the_indivisible_conflict_in_propagation():
    def f(x):
        # the axis (4) would slice the major factor, of size 2, and no split of it into
        # sub-axes helps: its second half would have to tile the 3
        return x.reshape(2, 3, 2) * 2

    for pad in (False, True):
        res = partir.core_partition(f, partir.Mesh({"a": 4}),
                                    [partir.ManualPartition({"x": 0}, axis="a", pad=pad)],
                                    jnp.zeros((12,)))
        (c,) = res.conflicts
        assert c.kind == "indivisible" and c.op == "reshape"
        # Padding is refused there: the reshape splits the dimension.
        assert ("cannot pad" in c.detail) == pad


def test_pad_false_on_a_dimension_an_earlier_axis_divided_says_so():
    x = jnp.zeros((12, 3))
    with pytest.raises(partir.IndivisibleDimensionError,
                       match=r"of size 6 \(already divided by a\) on axis 'b' of size 4: 4 does "
                             r"not divide 6, and the tactic has pad=False \(pad=True would pad "
                             r"it to 8\)"):
        partir.partition(lambda x: x * 2, partir.Mesh({"a": 2, "b": 4}),
                         [partir.ManualPartition({"x": 0}, axis="a"),
                          partir.ManualPartition({"x": 0}, axis="b", pad=False)], x)


# --- a later axis padding the tiles of an earlier one ----------------------------------------
# Each axis pads the tiles it splits: 12 on a (2) then b (4) has tiles of 6, each padded to
# 8 (4 tiles of 2, the last of each padding); on b then a, tiles of 3 padded to 4.

NESTED = {
    "exact_then_padded": ({"a": 2, "b": 4}, ("a", "b"), 12),
    "exact_then_padded_reversed": ({"a": 2, "b": 4}, ("b", "a"), 12),
    "padded_then_padded": ({"a": 2, "b": 4}, ("b", "a"), 10),
    "padded_then_padded_reversed": ({"a": 2, "b": 4}, ("a", "b"), 5),
}


def _nested(axes, inputs):
    return [partir.ManualPartition(inputs, axis=a) for a in axes]


def test_offsets_of_one_program_on_meshes_whose_axes_have_other_sizes():
    """The local computation of an index-dependent op (an iota's offset) traced for one
    mesh is not reused on a mesh with the same axis names in other sizes, where the
    local types are the same (8 on a then b: tiles of 1 with a of 4 or of 2)."""
    def f(x):
        return x + jnp.arange(8, dtype=jnp.float32)

    x = jnp.zeros((8,), jnp.float32)
    for mesh in ({"a": 4, "b": 2}, {"a": 2, "b": 4}):
        core, spmd = _oracles(f, partir.Mesh(mesh), _nested(("a", "b"), {"x": 0}), x)
        assert_tree_close(core, f(x))
        assert_tree_close(spmd, f(x))


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(NESTED))
def test_later_axis_pads_each_tile_of_an_earlier_one(case):
    def f(x, w):
        # elementwise, contracted by a dot_general (#sum, masked), max/min reductions
        # (masked with -inf/+inf: the padding computes exp(0) = 1 > every value)
        y = jnp.exp(x) - 3
        return jnp.sin(x) * 2, y.T @ w, jnp.max(y, axis=0), jnp.min(-y, axis=0)

    mesh, axes, n = NESTED[case]
    rng = np.random.default_rng(11)
    x = jnp.asarray(rng.normal(size=(n, 3)) - 2, jnp.float32)
    w = jnp.asarray(rng.normal(size=(n, 5)), jnp.float32)
    meta = _check(f, partir.Mesh(mesh), _nested(axes, {"x": 0}), x, w)
    (p,) = [p for p in meta.padding if p["value"] == "x"]
    assert (p["size"], p["padded"], p["axes"]) == (n, padded_size(n, 8), list(axes))
    assert {(q["value"], q["dim"]) for q in meta.padding} >= {("w", 0)}
    assert meta.collectives["all_reduce"] >= 1
    assert not any(t.conflicts for t in meta.tactics)


@pytest.mark.slow
def test_train_step_whose_batch_a_later_axis_pads():
    mesh = partir.Mesh({"batch": 2, "model": 4})
    # 6 on batch (2): tiles of 3, each padded to 4 by model
    schedule = [partir.ManualPartition({"x": 0, "y": 0}, axis="batch", name="BP"),
                partir.ManualPartition({"x": 0, "y": 0}, axis="model", name="BP2")]
    meta = _check(model.mlp_step, mesh, schedule, *model.mlp_inputs())
    padded = {(p["value"], p["dim"]): p for p in meta.padding}
    assert padded[("x", 0)]["axes"] == ["batch", "model"]
    assert padded[("x", 0)]["padded"] == 8 and not meta.tactics[1].conflicts


def test_padded_dim_through_a_reshape_is_refused_with_a_conflict():
    def f(x):
        return jnp.tanh(x).reshape(-1)  # merges the padded rows with the columns

    x = jnp.asarray(np.random.default_rng(7).normal(size=(6, 3)), jnp.float32)
    res = partir.core_partition(f, partir.Mesh({"a": 4}),
                                [partir.ManualPartition({"x": 0}, axis="a")], x)
    (c,) = [c for c in res.conflicts if c.op == "reshape"]
    assert c.kind == "indivisible"
    assert "cannot pad" in c.detail and "reshape of a padded dimension" in c.detail
    assert_tree_close(res.interpret(x), f(x))
    _check(f, partir.Mesh({"a": 4}), [partir.ManualPartition({"x": 0}, axis="a")], x)


@pytest.mark.slow
def test_divisible_programs_report_no_padding():
    meta = _check(model.mlp_step, partir.Mesh({"batch": 4, "model": 2}),
                  [partir.ManualPartition({"x": 0, "y": 0}, axis="batch")],
                  *model.mlp_inputs(batch=8))
    assert meta.padding == [] and meta.tactics[0].padding == []


# --- runtime: padded arguments arrive sharded, padded results leave cut ---------------------

def test_padded_arguments_and_results_are_device_local():
    from jax.sharding import PartitionSpec

    from partir.hlo.interpreter import HloInterpreter

    def f(x, w):
        return jnp.tanh(x @ w)  # a batch-sharded result of 6 rows, padded to 8

    rng = np.random.default_rng(8)
    x = jnp.asarray(rng.normal(size=(6, 8)), jnp.float32)
    w = jnp.asarray(rng.normal(size=(8, 5)), jnp.float32)
    mesh = partir.Mesh({"batch": 4, "model": 2})
    schedule = [partir.ManualPartition({"x": 0}, axis="batch")]
    fn, meta = partir.jit(f, mesh, schedule)
    np.testing.assert_allclose(fn(x, w), f(x, w), **TOL)
    # x arrives as its tiles of the padded 8 rows, the result leaves as tiles of 8 rows.
    assert meta.in_specs[0] == PartitionSpec("batch", None)
    assert meta.out_specs[0] == PartitionSpec("batch", None)
    assert "in_sizes=((6, 8), None)" in meta.hlo_ir and "out_sizes=((6, 5),)" in meta.hlo_ir
    assert "all_gather" not in meta.hlo_ir and "all_slice" not in meta.hlo_ir
    # Under an outer jax.jit (traced arguments), and lowered for its memory analysis.
    np.testing.assert_allclose(jax.jit(fn)(x, w), f(x, w), **TOL)
    assert fn.lower(x, w).compile() is not None
    # The HLO interpreter takes and gives the unpadded arrays too.
    _, _, final = partir.api.partition_program(f, mesh, schedule, (x, w), ())
    (out,) = HloInterpreter(final.hlo)(x, w)
    np.testing.assert_allclose(out, f(x, w), **TOL)


# --- reductions and dimension-moving ops over a padded dimension --------------------------

OPS_ON_A_PADDED_DIM = {
    "softmax": (lambda x: jax.nn.softmax(x, axis=0), 0),
    "layernorm": (lambda x: (x - x.mean(-1, keepdims=True))
                  / jnp.sqrt(x.var(-1, keepdims=True) + 1e-5), 1),
    "cumsum": (lambda x: jnp.cumsum(jnp.exp(x), axis=0), 0),  # gathered first
    "argmax": (lambda x: jnp.argmax(x, axis=0), 0),
    "min_of_ints": (lambda x: jnp.min((x * 10).astype(jnp.int32), axis=0), 0),
    "prod": (lambda x: jnp.prod(jnp.exp(x), axis=0), 0),
    "any": (lambda x: jnp.any(x > 1.5, axis=0), 0),
    "all": (lambda x: jnp.all(x > -1.5, axis=1), 1),
    "gram": (lambda x: (x.T @ x).sum(), 0),
    "concatenate": (lambda x: jnp.concatenate([x, x * 2], axis=0), 0),
    "slice": (lambda x: jnp.exp(x)[1:5].sum(0), 0),
    "pad": (lambda x: jnp.pad(jnp.exp(x), ((1, 2), (0, 0))).sum(0), 0),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(OPS_ON_A_PADDED_DIM))
def test_ops_over_a_padded_dim(name):
    f, dim = OPS_ON_A_PADDED_DIM[name]
    x = jnp.asarray(np.random.default_rng(9).normal(size=(6, 10)), jnp.float32)
    meta = _check(f, partir.Mesh({"a": 4, "b": 2}),
                  [partir.ManualPartition({"x": dim}, axis="a")], x)
    assert ("x", dim) in {(p["value"], p["dim"]) for p in meta.padding}


def test_both_dims_padded_on_two_axes():
    x = jnp.asarray(np.random.default_rng(10).normal(size=(6, 5)), jnp.float32)
    meta = _check(lambda x: jnp.sum(jnp.exp(x)), partir.Mesh({"a": 4, "b": 2}),
                  [partir.ManualPartition({"x": 0}, axis="a"),
                   partir.ManualPartition({"x": 1}, axis="b")], x)
    assert {(p["dim"], p["padded"]) for p in meta.padding if p["value"] == "x"} == {
        (0, 8), (1, 6)}


# --- values tagged inside loop bodies on a dimension the axis does not divide -------------

def _tagged_layers(x, ws):
    def layer(c, w):
        h = partir.tag(c @ w, "h")
        return jnp.tanh(h), partir.tag(jnp.sum(h, axis=1), "row_sums")
    c, sums = jax.lax.scan(layer, x, ws)
    return jnp.sum(c) + jnp.sum(sums ** 2)


def _fori_layers(x, w):
    def body(i, c):
        return partir.tag(jnp.tanh(c @ w), "h") * 0.5
    return jnp.max(jax.lax.fori_loop(0, 3, body, x), axis=0)


def _stacked_step_sums(x, ws):
    def layer(c, w):
        h = partir.tag(jnp.tanh(c @ w), "h")
        return h, c.T @ h  # each step's sum over the batch, stacked
    return jax.lax.scan(layer, x, ws)


@pytest.mark.slow
@pytest.mark.parametrize("case", ["scan", "scan_gradient", "fori_loop", "stacked_sums"])
def test_a_body_value_on_a_dimension_the_axis_does_not_divide_is_padded(case):
    """Issue 26, item 7: tiling a value tagged in a loop body (a batch of 6 on 4 devices)
    pads the loop's factor, as tiling the loop's input does: the loop's edges carry the
    padded tiles into its body, whose reductions over them mask the padding as any
    reduction does (`stacked_sums`: each step's sum over the batch)."""
    rng = np.random.default_rng(13)
    x = jnp.asarray(rng.normal(size=(6, 4)), jnp.float32)
    ws = jnp.asarray(rng.normal(size=(3, 4, 4)) / 2, jnp.float32)
    fn, args = {"scan": (_tagged_layers, (x, ws)),
                "scan_gradient": (jax.grad(_tagged_layers, argnums=(0, 1)), (x, ws)),
                "fori_loop": (_fori_layers, (x, ws[0])),
                "stacked_sums": (_stacked_step_sums, (x, ws))}[case]
    mesh = partir.Mesh({"a": 4, "b": 2})
    by_tag = [partir.ManualPartition({"h": 0}, axis="a")]
    meta = _check(fn, mesh, by_tag, *args)
    assert ("x", 0) in {(p["value"], p["dim"]) for p in meta.padding}
    by_input = partir.core_partition(fn, mesh, [partir.ManualPartition({"x": 0}, axis="a")],
                                     *args).program
    program = partir.core_partition(fn, mesh, by_tag, *args).program
    assert program.input_shardings() == by_input.input_shardings()
    assert program.output_shardings() == by_input.output_shardings()


@pytest.mark.slow
def test_a_body_value_that_cannot_be_padded_says_why():
    """Tiling a body value pads it, as any value. Where a body op cannot carry the padding
    (a reshape merging the padded rows) or an edge of the loop cannot (a factor another
    axis tiled first: its region's arguments are laid out with the padding on their major
    axis only), propagation stops there and the conflict says why; the program is still
    exact (a yield made whole is padded before it is sliced as the loop carries it)."""
    def merged(x, ws):
        def layer(c, w):
            h = jnp.tanh(partir.tag(c @ w, "h"))
            return jnp.reshape(jnp.reshape(h, (-1,)) * 0.5, c.shape), jnp.sum(h, axis=1)
        c, sums = jax.lax.scan(layer, x, ws)
        return jnp.sum(c) + jnp.sum(sums ** 2)

    rng = np.random.default_rng(14)
    x = jnp.asarray(rng.normal(size=(6, 4)), jnp.float32)
    ws = jnp.asarray(rng.normal(size=(3, 4, 4)) / 2, jnp.float32)
    mesh = partir.Mesh({"a": 4, "b": 2})
    by_tag = [partir.ManualPartition({"h": 0}, axis="a")]
    _check(merged, mesh, by_tag, x, ws)
    res = partir.core_partition(merged, mesh, by_tag, x, ws)
    assert any(c.op == "reshape" and "reshape of a padded dimension" in c.detail
               for c in res.conflicts)
    after_b = [partir.ManualPartition({"x": 0}, axis="b"), *by_tag]
    _check(_tagged_layers, mesh, after_b, x, ws)
    res = partir.core_partition(_tagged_layers, mesh, after_b, x, ws)
    assert any(c.op == "scan" and "already tiled by other axes (tiles of 3)" in c.detail
               for c in res.conflicts)
    with pytest.raises(partir.IndivisibleDimensionError, match="the tactic has pad=False"):
        partir.partition(_tagged_layers, mesh,
                         [partir.ManualPartition({"h": 0}, axis="a", pad=False)], x, ws)
