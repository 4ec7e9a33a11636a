"""Control flow partitioned through its bodies: `scan` (and `fori_loop`, `jax.checkpoint`
inside a scan), `while_loop` and `cond`/`switch` under batch parallelism, forward and
backward, executed on 8 CPU devices and interpreted, both equal to the unpartitioned
function, with no gathering of the batch. A `while` predicate that reads sharded data
stops propagation with a conflict instead (every device must run the same iterations).
ZeRO-3 with the optimizer update inside a `cond` keeps parameters and optimizer state
sharded through the update.
"""

from __future__ import annotations

import functools
import inspect
import operator

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import partir
from partir.core.actions import Loop, Tile
from partir.core.conflicts import AXIS_IN_SCOPE
from partir.core.materialize import materialize
from partir.core.regions import structured
from partir.hlo import interpret_hlo, lower_spmd_to_hlo, optimize, verify_hlo
from partir.pipeline import lower
from partir.rules.catalogue import region_ops
from partir.rules.collectives import ALL_REDUCE, named_axes
from partir.spmd import interpret_spmd, lower_core_to_spmd
from tests.oracles import assert_tree_close

RNG = np.random.default_rng(0)
X = jnp.asarray(RNG.normal(size=(8, 4)).astype(np.float32))
W = jnp.asarray(RNG.normal(size=(4, 4)).astype(np.float32)) / 2
WS = jnp.asarray(RNG.normal(size=(3, 4, 4)).astype(np.float32)) / 2
BP = [partir.ManualPartition({"x": 0}, axis="batch")]
MESH = {"batch": 4}


def scan_layers(x, ws):
    def layer(c, w):
        return jnp.tanh(c @ w), jnp.sum(c)
    c, sums = lax.scan(layer, x, ws)
    return jnp.sum(c) + jnp.sum(sums)


def remat_layers(x, ws):
    @jax.checkpoint
    def layer(c, w):
        return jax.nn.gelu(c @ w), None
    return jnp.sum(lax.scan(layer, x, ws)[0] ** 2)


def fori(x, w):
    return jnp.sum(lax.fori_loop(0, 3, lambda i, c: jnp.tanh(c @ w) + i, x))


def counted_while(x, w):
    def body(s):
        i, c = s
        return i + 1, jax.nn.relu(c @ w)
    return jnp.sum(lax.while_loop(lambda s: s[0] < 3, body, (0, x))[1])


def branches(x, w):
    return jnp.sum(lax.cond(jnp.sum(w) > 0, lambda a: jnp.tanh(a @ w), lambda a: a * 2.0, x))


def switch(x, w):
    k = jnp.int32(jnp.sum(w) > 0)
    return jnp.sum(lax.switch(k, [lambda a: a @ w, jnp.sin, lambda a: a - 1.0], x) ** 2)


CASES = {
    "scan": (scan_layers, WS), "remat scan": (remat_layers, WS), "fori_loop": (fori, W),
    "while": (counted_while, W), "cond": (branches, W), "switch": (switch, W)}


def _control_ops(program):
    """The control-flow ops of a program, each one op again (`structured`)."""
    return [op for op in structured(program).ops if op.name in ("scan", "while", "cond")]


# JAX cannot reverse-differentiate a while_loop
RUNS = [(name, grad) for name in CASES for grad in (False, True)
        if not (grad and name == "while")]


@pytest.mark.slow
@pytest.mark.parametrize(("name", "grad"), RUNS,
                         ids=[f"{n}-{'gradient' if g else 'forward'}" for n, g in RUNS])
def test_batch_parallelism_goes_through_the_bodies(name, grad):
    f, w = CASES[name]
    fn = jax.grad(f, argnums=(0, 1)) if grad else f
    expected = fn(X, w)
    result = partir.core_partition(fn, MESH, BP, X, w)
    assert result.tactics[0].conflicts == []
    loops = _control_ops(result.program)
    assert loops and all(structured(result.program).nest(op) for op in loops), name
    assert_tree_close(result.interpret(X, w), expected)
    jitted, meta = partir.jit(fn, MESH, BP)
    assert_tree_close(jitted(X, w), expected)
    # the batch is never gathered: the loops run on each device's rows
    assert meta.collectives["all_gather"] == 0, meta.hlo_ir


def test_weight_gradients_of_a_scan_over_layers_are_summed_in_the_body():
    """The transposed scan's stacked weight gradients sum over the batch: each layer's
    all-reduced inside the body as it is made, as the unrolled model does."""
    result = partir.core_partition(jax.grad(scan_layers, argnums=1), MESH, BP, X, WS)
    assert ("batch",) in _in_regions(result, ALL_REDUCE)


def _in_regions(result, name):
    """The mesh axes of each `name` collective inside the regions of the lowered program's
    control-flow ops."""
    return [named_axes(inner) for op in lower(result.program).hlo.ops
            for inner, _ in region_ops(op) if inner.name == name]


def _all_oracles(fn, mesh, schedule, *args):
    """fn's results by the Core interpreter, the SPMD and HLO interpreters (before and
    after fusion) and partir.jit on the devices, each equal to fn(*args); returns the
    Core result and the jitted function's metadata."""
    expected = fn(*args)
    result = partir.core_partition(fn, mesh, schedule, *args)
    assert_tree_close(result.interpret(*args), expected)
    flat = result.flatten_args(*args)
    spmd = lower_core_to_spmd(materialize(result.program), result.program.mesh)
    hlo = lower_spmd_to_hlo(spmd)
    verify_hlo(hlo, check_primitives=True)
    unflatten = functools.partial(jax.tree_util.tree_unflatten, result.traced.out_tree)
    assert_tree_close(unflatten(interpret_spmd(spmd, *flat)), expected)
    for program in (hlo, optimize(hlo)):
        assert_tree_close(unflatten(interpret_hlo(program, *flat)), expected)
    jitted, meta = partir.jit(fn, mesh, schedule)
    assert_tree_close(jitted(*args), expected)
    return result, meta


def test_a_while_predicate_summing_sharded_data_sums_it_on_every_device():
    def f(x):
        return lax.while_loop(lambda c: jnp.sum(c) < 100.0, lambda c: c * 2.0, x + 10.0)

    result, _ = _all_oracles(f, MESH, BP, X)
    assert result.tactics[0].conflicts == []
    (loop,) = _control_ops(result.program)
    assert [lp.axis for lp in structured(result.program).nest(loop)] == ["batch"]


def test_a_while_predicate_taking_the_max_of_sharded_data_takes_it_on_every_device():
    def f(x):
        return lax.while_loop(lambda c: jnp.max(c) < 100.0, lambda c: c * 2.0, x + 10.0)

    result, meta = _all_oracles(f, MESH, BP, X)
    assert meta.collectives["all_gather"] == 0
    (loop,) = _control_ops(result.program)
    assert [lp.axis for lp in structured(result.program).nest(loop)] == ["batch"]


def test_a_while_predicate_that_reads_sharded_data_otherwise_takes_it_whole():
    """The predicate reads one element of the batch: its region takes the element whole
    (every device decides alike) while the loop stays sliced by batch."""
    def f(x):
        return lax.while_loop(lambda c: c[0, 0] < 100.0, lambda c: c * 2.0, x + 10.0)

    result, _ = _all_oracles(f, MESH, BP, X)
    (loop,) = _control_ops(result.program)
    assert [lp.axis for lp in structured(result.program).nest(loop)] == ["batch"]


W1 = jnp.asarray(RNG.normal(size=(3, 4, 8)).astype(np.float32)) / 2
W2 = jnp.asarray(RNG.normal(size=(3, 8, 4)).astype(np.float32)) / 2


def megatron_layers(x, w1, w2):
    def layer(c, ws):
        a, b = ws
        return c + jnp.tanh(c @ a) @ b, jnp.sum(c)
    c, sums = lax.scan(layer, x, (w1, w2))
    return jnp.sum(c ** 2) + jnp.sum(sums)


def _assert_zero3_conflicts(result):
    """BP none; ZeRO-3 only where the body's matmuls, already looped over "batch" by BP,
    read a weight slice whole (which they gather): the conflicts the unrolled layers
    report at each layer's matmuls, reported once for the body."""
    bp, z3 = result.tactics
    assert bp.conflicts == []
    line = megatron_layers.__code__.co_firstlineno + 3  # the body's `return c + ...`
    assert z3.conflicts and {(c.kind, c.op, c.loc.line) for c in z3.conflicts} == {
        (AXIS_IN_SCOPE, "dot_general", line)}, z3.conflicts


BP_MP = [partir.ManualPartition({"x": 0}, axis="batch"),
         partir.ManualPartition({"w1": 2, "w2": 1}, axis="model")]


@pytest.mark.slow
@pytest.mark.parametrize("grad", [False, True], ids=["forward", "gradient"])
def test_megatron_through_a_scan_over_layers_sums_inside_the_body(grad):
    """The hidden dimension of every layer is sliced on "model": the second matmul's
    partial sums are summed over "model" inside the body, before the residual add, and
    the stacked weights stay sliced (never gathered)."""
    fn = jax.grad(megatron_layers, argnums=(0, 1, 2)) if grad else megatron_layers
    result, meta = _all_oracles(fn, {"batch": 2, "model": 2}, BP_MP, X, W1, W2)
    assert result.tactics[-1].conflicts == []
    for loop in _control_ops(result.program):
        assert {lp.axis for lp in structured(result.program).nest(loop)} == {"batch", "model"}
    shardings = result.program.input_shardings()
    assert shardings["w1"].dims[2] == ("model",) and shardings["w2"].dims[1] == ("model",)
    # the weights are never gathered for the layers (the weight gradients are, for the
    # function's replicated results, after the backward scan)
    lines = meta.hlo_ir.splitlines()
    last_scan = max(i for i, line in enumerate(lines) if " scan(" in line)
    assert not any("all_gather" in line for line in lines[:last_scan]), meta.hlo_ir


@pytest.mark.slow
def test_a_scans_stacked_partial_sums_are_summed_by_its_body_per_iteration():
    """Each step's column sums of a batch-sliced carry are partial sums over "batch": the
    body all-reduces each one as it makes it (one per step, as an unrolled loop would),
    and no all-reduce of the stacked result follows the scan."""
    def f(x, ws):
        return lax.scan(lambda c, w: (jnp.tanh(c * w), jnp.sum(c * w, axis=0)), x, ws)[1]

    result, meta = _all_oracles(f, MESH, BP, X, WS[:, 0])
    assert result.tactics[0].conflicts == []
    hlo = lower(result.program).hlo
    assert [op.name for op in hlo.ops if op.name.startswith("hlo.")] == []
    assert meta.collectives["all_reduce"] == 1  # in the body
    assert meta.executed_collectives["all_reduce"] == len(WS)


def test_a_carry_ending_as_a_partial_sum_is_summed_before_the_next_iteration():
    def f(s, ws):
        return lax.scan(lambda c, w: (jnp.sum(jnp.tanh(w * c)), None), s, ws)[0]

    ws = jnp.asarray(RNG.normal(size=(3, 8)).astype(np.float32))
    result, _ = _all_oracles(f, MESH, [partir.ManualPartition({"ws": 1}, axis="batch")],
                             jnp.float32(0.5), ws)
    (loop,) = _control_ops(result.program)
    assert [lp.axis for lp in structured(result.program).nest(loop)] == ["batch"]


XS = jnp.asarray(RNG.normal(size=(3, 8)).astype(np.float32))
XS_ON_BATCH = [partir.ManualPartition({"xs": 1}, axis="batch")]
ACCUMULATORS = {
    "sum from zero": (lambda xs: lax.scan(lambda c, x: (c + jnp.sum(x), None), 0.0, xs)[0]),
    "mean": (lambda xs: lax.scan(lambda c, x: (c + jnp.mean(x), None), 0.0, xs)[0]),
    "sum from a value": (lambda xs: lax.scan(lambda c, x: (jnp.sum(x) + c, None),
                                             xs[0, 0], xs)[0]),
    "max from a value": (lambda xs: lax.scan(lambda c, x: (jnp.maximum(c, jnp.max(x)), None),
                                             xs[0, 0] + 1.0, xs)[0]),
    "moved elements": (lambda xs: lax.scan(
        lambda c, x: (c + jnp.sum(x.reshape(2, 4), axis=1).T, None), jnp.ones(2), xs)[0]),
    "fori_loop": (lambda xs: lax.fori_loop(0, 3, lambda i, c: c + jnp.sum(xs[i]), 1.0)),
    "nested": (lambda xs: lax.scan(lambda c, x: (c + lax.scan(
        lambda d, y: (d + jnp.sum(y * x), None), 0.0, xs)[0], None), 0.0, xs)[0]),
}


@pytest.mark.parametrize("name", sorted(ACCUMULATORS))
def test_an_accumulator_of_reductions_is_reduced_once_after_the_loop(name):
    """A carry each iteration adds (or takes the max of) a reduction of sharded data to,
    and nothing else reads, accumulates each device's part, all-reduced once after the
    loop (nested loops alike): one all-reduce per call, none in a body, both oracles
    equal to the function."""
    result, meta = _all_oracles(ACCUMULATORS[name], MESH, XS_ON_BATCH, XS)
    assert _in_regions(result, ALL_REDUCE) == []
    assert meta.executed_collectives["all_reduce"] == 1


def _stacked_sums(xs, f):
    return lax.scan(lambda c, x: (c, f(x)), 0.0, xs)[1]


STACKED_SUMS = {
    "two scans": lambda xs: (_stacked_sums(xs, jnp.sum)
                             + _stacked_sums(xs, lambda x: jnp.sum(x ** 2))),
    "moved elements": lambda xs: functools.reduce(operator.add, (
        _stacked_sums(xs, lambda x, k=k: jnp.sum(x.reshape(2, 4) ** k, axis=1)).T
        for k in (1, 2, 3))),
    "in a body": lambda xs: lax.scan(lambda c, x: (c + _stacked_sums(xs, lambda y: jnp.sum(
        y * x)) + _stacked_sums(xs, lambda y: jnp.sum(y - x)), None), jnp.zeros(3), xs)[0],
}


@pytest.mark.parametrize("name", sorted(STACKED_SUMS))
def test_stacked_sums_added_together_are_reduced_once(name):
    """Scans' stacked results that their bodies all-reduce slice by slice, added together
    (as a pipeline's stages add each step's weight gradients): each scan stacks its
    devices' parts, reduced once after them; in a loop's body, once after that loop."""
    result, meta = _all_oracles(STACKED_SUMS[name], MESH, XS_ON_BATCH, XS)
    assert _in_regions(result, ALL_REDUCE) == []
    assert meta.executed_collectives["all_reduce"] == 1


@pytest.mark.slow
def test_an_accumulator_read_by_its_loop_otherwise_is_reduced_every_iteration():
    """The body reads the carry beside accumulating it (the scan), or a while loop's
    condition does: every iteration needs the whole value, reduced there."""
    def scanned(xs):
        return lax.scan(lambda c, x: (c + jnp.sum(x * c), None), 1.0, xs)[0]

    def bounded(xs):
        def body(s):
            i, c = s
            return i + 1, c + jnp.sum(lax.dynamic_index_in_dim(xs, i, keepdims=False) ** 2)
        return lax.while_loop(lambda s: (s[0] < 3) & (s[1] < 1e3), body, (0, 0.0))[1]

    for f in (scanned, bounded):
        result, _ = _all_oracles(f, MESH, XS_ON_BATCH, XS)
        assert _in_regions(result, ALL_REDUCE) == [("batch",)]


def test_zero3_keeps_parameters_sharded_through_an_update_inside_a_cond():
    def step(params, opt, x, count):
        grads = jax.grad(lambda p: jnp.sum(jnp.tanh(x @ p["w"]) ** 2))(params)

        def update(operands):
            p, o, g = operands
            m = jax.tree.map(lambda a, b: 0.9 * a + 0.1 * b, o, g)
            return jax.tree.map(lambda a, b: a - 0.01 * b, p, m), m

        return lax.cond(count % 2 == 0, update, lambda ops: ops[:2], (params, opt, grads))

    params = {"w": W}
    opt = {"w": W * 0.1}
    count = jnp.int32(2)
    z3 = [partir.ManualPartition({"x": 0}, axis="batch", name="BP"),
          partir.ManualPartition({"params": 0, "opt": 0}, axis="batch", name="Z3")]
    expected = step(params, opt, X, count)
    result = partir.core_partition(step, MESH, z3, params, opt, X, count)
    (cond,) = _control_ops(result.program)
    assert structured(result.program).nest(cond), "the update runs on each device's shard"
    shardings = result.program.output_shardings()
    assert all(s.dims[0] == ("batch",) for s in shardings.values()), shardings
    assert_tree_close(result.interpret(params, opt, X, count), expected)
    jitted, meta = partir.jit(step, MESH, z3)
    assert_tree_close(jitted(params, opt, X, count), expected)
    # w is gathered once, for the forward pass (ZeRO-3); the update gathers nothing
    assert meta.collectives["all_gather"] == 1, meta.hlo_ir


def tagged_layers(x, ws):
    def layer(c, w):
        h = partir.tag(c @ w, "hidden")
        return jnp.tanh(h), partir.tag(jnp.sum(h, axis=1), "row_sums")
    c, sums = lax.scan(layer, x, ws)
    return jnp.sum(c) + jnp.sum(sums ** 2)


@pytest.mark.parametrize("grad", [False, True], ids=["forward", "gradient"])
def test_a_tag_inside_a_loop_body_is_named_by_tactics(grad):
    """Tiling a value tagged inside a scan's body slices the scan on the factor that
    dimension belongs to: the batch, here, as tiling the input would."""
    fn = jax.grad(tagged_layers, argnums=(0, 1)) if grad else tagged_layers
    expected = fn(X, WS)
    by_tag = [partir.ManualPartition({"hidden": 0}, axis="batch")]
    result = partir.core_partition(fn, MESH, by_tag, X, WS)
    assert result.tactics[0].conflicts == []
    assert result.tactics[0].actions[0] == 'tile<%hidden,0,"batch">'
    by_input = partir.core_partition(fn, MESH, BP, X, WS)
    assert result.program.input_shardings() == by_input.program.input_shardings()
    assert result.program.output_shardings() == by_input.program.output_shardings()
    assert_tree_close(result.interpret(X, WS), expected)
    jitted, meta = partir.jit(fn, MESH, by_tag)
    assert_tree_close(jitted(X, WS), expected)
    assert meta.collectives["all_gather"] == 0, meta.hlo_ir


WSS = jnp.asarray(RNG.normal(size=(2, 3, 4, 4)).astype(np.float32)) / 2


def nested_layers(x, wss):
    """Blocks of layers: a scan over blocks whose body scans over the block's layers."""
    def block(c, ws):
        def layer(c2, w):
            h = partir.tag(c2 @ w, "hidden")
            return jnp.tanh(h), None
        return lax.scan(layer, c, ws)[0], jnp.sum(c)
    c, sums = lax.scan(block, x, wss)
    return jnp.sum(c) + jnp.sum(sums ** 2)


@pytest.mark.slow
@pytest.mark.parametrize("grad", [False, True], ids=["forward", "gradient"])
def test_a_tag_inside_a_loop_nested_in_a_body_is_named_by_tactics(grad):
    """A value tagged in the body of a scan inside a scan's body: tiling it slices the
    outer scan on the factor the inner scan's dimension is, the batch, as tiling the
    input would; its sharding reads back through both loops."""
    fn = jax.grad(nested_layers, argnums=(0, 1)) if grad else nested_layers
    by_tag = [partir.ManualPartition({"hidden": 0}, axis="batch")]
    result, meta = _all_oracles(fn, MESH, by_tag, X, WSS)
    assert result.tactics[0].conflicts == []
    assert result.tactics[0].actions[0] == 'tile<%hidden,0,"batch">'
    by_input = partir.core_partition(fn, MESH, BP, X, WSS)
    assert result.program.input_shardings() == by_input.program.input_shardings()
    assert meta.collectives["all_gather"] == 0, meta.hlo_ir
    (tag,) = result.traced.tags["hidden"]
    assert result.program.sharding(tag).dims == (("batch",), ())


@pytest.mark.slow
def test_a_nested_body_value_tiled_where_its_loops_cannot_carry_it_runs_sliced_inside():
    """A value of an inner scan's body tiled on a dimension its loops' values do not
    share: the body's ops around it run sliced, with what crosses a loop's edges taken
    whole there (issue 28: this was refused)."""
    _all_oracles(nested_layers, MESH, [partir.ManualPartition({"hidden": 1}, axis="batch")],
                 X, WSS)


@pytest.mark.slow
def test_a_body_value_tiled_or_kept_whole_inside_a_loop_is_honoured():
    """Tiled on a dimension the body contracts with the next layer's weights: the
    contraction sums inside the body. Kept replicated: the body ops around it do not
    slice it. Both were refused before issue 28."""
    for form in (1, partir.REPLICATED):
        result, _ = _all_oracles(tagged_layers, MESH,
                                 [partir.ManualPartition({"hidden": form}, axis="batch")],
                                 X, WS)
        assert result.tactics[0].actions


@pytest.mark.slow
def test_collectives_inside_a_body_are_counted_per_run_and_placed_at_their_model_line():
    result, meta = _all_oracles(megatron_layers, {"batch": 2, "model": 2}, BP_MP, X, W1, W2)
    sites = lower(result.program).collective_sites()
    # the residual add's partial sum, on "model", and the stacked `jnp.sum(c)` of a batch
    # slice, on "batch", once per layer
    line = inspect.getsource(megatron_layers).splitlines().index(
        "        return c + jnp.tanh(c @ a) @ b, jnp.sum(c)")
    body = [(kind, axes, count) for (kind, axes, _, file, at, _), count in sites.items()
            if file == __file__ and at == megatron_layers.__code__.co_firstlineno + line]
    assert sorted(body) == [("all_reduce", ("batch",), 1), ("all_reduce", ("model",), 1)], \
        sites
    # run 3 times per call: the executed count has 2 x 2 more than the program holds
    assert meta.executed_collectives["all_reduce"] == meta.collectives["all_reduce"] + 4
    assert meta.tactics[-1].executed_collectives == meta.executed_collectives


@pytest.mark.slow
@pytest.mark.parametrize("grad", [False, True], ids=["forward", "gradient"])
def test_zero3_through_a_scan_over_layers_gathers_one_layer_at_a_time(grad):
    """The stacked weights sharded on a dimension the layers need whole (ZeRO-3 after
    batch parallelism): the scan takes them sharded and its body all-gathers each
    layer's slice where its matmul reads it, so they are never gathered whole."""
    fn = jax.grad(megatron_layers, argnums=(0, 1, 2)) if grad else megatron_layers
    z3 = [partir.ManualPartition({"x": 0}, axis="batch"),
          partir.ManualPartition({"w1": 1, "w2": 2}, axis="batch")]
    result, meta = _all_oracles(fn, MESH, z3, X, W1, W2)
    _assert_zero3_conflicts(result)
    shardings = result.program.input_shardings()
    assert shardings["w1"].dims[1] == ("batch",) and shardings["w2"].dims[2] == ("batch",)
    scans = len(_control_ops(result.program))
    # each scan gathers both weights' layer slices, once per layer (3)
    assert meta.collectives["all_gather"] == 2 * scans
    assert meta.executed_collectives["all_gather"] == 2 * 3 * scans
    assert _in_regions(result, "hlo.all_gather") == [("batch",)] * 2 * scans


@pytest.mark.slow
def test_zero3_through_a_scan_reduce_scatters_each_layers_gradients_in_the_body():
    """An SGD step of the scanned layers under BP then ZeRO-3: the update reads the
    stacked gradients sharded like the parameters, so the backward scan's body
    reduce-scatters each layer's gradient (a sum over the batch) as it makes it."""
    def step(x, w1, w2):
        grads = jax.grad(megatron_layers, argnums=(1, 2))(x, w1, w2)
        return w1 - 0.1 * grads[0], w2 - 0.1 * grads[1]

    z3 = [partir.ManualPartition({"x": 0}, axis="batch"),
          partir.ManualPartition({"w1": 1, "w2": 2}, axis="batch")]
    result, meta = _all_oracles(step, MESH, z3, X, W1, W2)
    _assert_zero3_conflicts(result)
    shardings = result.program.output_shardings()
    assert [s.dims for s in shardings.values()] == [((), ("batch",), ()), ((), (), ("batch",))]
    assert meta.collectives["reduce_scatter"] == 2  # in the backward scan's body ...
    assert meta.executed_collectives["reduce_scatter"] == 2 * 3  # ... once per layer
    assert _in_regions(result, "hlo.reduce_scatter") == [("batch",)] * 2


def two_blocks(x, a1, b1, a2, b2):
    def body(c, _):
        c = c + jnp.tanh(c @ a1) @ b1
        c = c + jnp.tanh(c @ a2) @ b2
        return c, None
    return lax.scan(body, x, None, length=3)[0]


A = jnp.asarray(RNG.normal(size=(4, 8)).astype(np.float32)) / 2
B = jnp.asarray(RNG.normal(size=(8, 4)).astype(np.float32)) / 2
BLOCKS = [{"a1": 1, "b1": 0}, {"a2": 1, "b2": 0}]


@pytest.mark.parametrize("tactics", [1, 2], ids=["one tactic", "two tactics"])
def test_independent_groups_of_a_body_are_sliced_by_one_loop(tactics):
    """Two Megatron blocks in a loop body: the loop slices both hidden dimensions on
    "model" together, whether one tactic names them all or two tactics name one each."""
    schedule = ([partir.ManualPartition({**BLOCKS[0], **BLOCKS[1]}, axis="model")]
                if tactics == 1 else
                [partir.ManualPartition(block, axis="model") for block in BLOCKS])
    result, meta = _all_oracles(two_blocks, {"model": 2}, schedule, X, A, B, A, B)
    assert all(t.conflicts == [] for t in result.tactics)
    (loop,) = _control_ops(result.program)
    (lp,) = structured(result.program).nest(loop)
    # the scan takes the weights as consts, then the carry
    assert lp.axis == "model" and lp.operands == (1, 0, 1, 0, None)
    assert meta.collectives["all_gather"] == 0
    assert meta.executed_collectives["all_reduce"] == 2 * 3  # each block's sum, per step


@jax.jit
def _spread(a):  # one inner jaxpr, called at two sites of a body
    return jnp.broadcast_to(a[:, None, :], (8, 2, 4)).sum(1)


def test_an_inner_call_at_two_sites_of_a_body_is_localized_at_each_sites_shapes():
    def f(x, y):
        def body(c, _):
            x, y = c
            # x's call is sliced by the batch, y's is not (cumsum needs the whole batch)
            return (jnp.tanh(_spread(x)), jnp.cumsum(_spread(y), axis=0) / 8), None
        return lax.scan(body, (x, y), None, length=3)[0]

    result, _ = _all_oracles(f, MESH, BP, X, X * 0.5)
    (loop,) = _control_ops(result.program)
    assert [lp.axis for lp in structured(result.program).nest(loop)] == ["batch"]


def test_a_python_scalar_passed_to_an_inner_call_in_a_body_is_typed():
    def f(x):
        def body(c, pos):
            return c + jnp.where(jnp.arange(4) <= pos, 0.0, -1.0), None
        return lax.scan(body, x, jnp.arange(3))[0]

    _all_oracles(f, MESH, BP, X)


def test_a_loop_summing_over_a_dimension_inside_its_body_pads_it_and_masks_the_sums():
    """Found by the padding property tests: with padding allowed, 3 rows on an axis of 2
    give tiles of 2, one holding a row of padding, which the body's sum for the predicate
    would add in. The loop's edges carry the padded tiles into its body, whose sum masks
    the padding as any reduction does."""
    def f(x):
        return lax.while_loop(lambda c: jnp.sum(jnp.abs(c)) < 20.0,
                              lambda c: c * 1.5 + 0.25, jnp.tanh(x))

    x = jnp.asarray(RNG.integers(-3, 4, (3, 3)).astype(np.float32))
    padded = [partir.ManualPartition({"x": 0}, axis="a", pad=True)]
    result, _ = _all_oracles(f, {"a": 2}, padded, x)
    assert result.tactics[0].conflicts == []
    (loop,) = _control_ops(result.program)
    assert structured(result.program).nest(loop) == (Loop("a", (Tile(0),), (0,)),)


@pytest.mark.slow
def test_a_loop_whose_inner_loop_sums_over_a_dimension_pads_it_and_masks_the_sums():
    """Fuzzer seed 3662: a while inside a fori takes a mean of its carry. When the outer
    loop padded the carry's rows as an op and the inner one did not, the padding's rows
    (no longer zeros after the first step) entered the mean. Both loops' edges now carry
    the padded rows into their bodies, and the mean masks them."""
    def f(x):
        def body(s):
            i, c = s
            return i + 1, jnp.minimum(x, c) + jnp.mean(c)
        return lax.fori_loop(0, 2, lambda _, c: lax.while_loop(
            lambda s: s[0] < 2, body, (jnp.int32(0), c))[1], x)

    x = jnp.asarray(RNG.standard_normal((12, 4)).astype(np.float32))
    padded = [partir.ManualPartition({"x": 0}, axis="a", pad=True)]
    result, _ = _all_oracles(f, {"a": 8}, padded, x)
    assert result.tactics[0].conflicts == []
    (loop,) = _control_ops(result.program)
    assert [lp.axis for lp in structured(result.program).nest(loop)] == ["a"]


def _inner_sum(d):
    return d + jnp.sum(d) * 0.1


NESTED_SUMS = {
    "scan in scan": lambda x, p: lax.scan(lambda c, _: (lax.scan(
        lambda d, _: (_inner_sum(d), None), c, None, length=2)[0], None), x, None, length=2)[0],
    "fori in fori": lambda x, p: lax.fori_loop(
        0, 2, lambda i, c: lax.fori_loop(0, 2, lambda j, d: _inner_sum(d), c), x),
    "scan in while": lambda x, p: lax.while_loop(
        lambda s: s[0] < 2, lambda s: (s[0] + 1, lax.scan(
            lambda d, _: (_inner_sum(d), None), s[1], None, length=2)[0]), (0, x))[1],
    "scan in cond": lambda x, p: lax.cond(p > 0, lambda c: lax.scan(
        lambda d, _: (_inner_sum(d), None), c, None, length=2)[0], lambda c: c * 2.0, x),
}


@pytest.mark.parametrize("name", NESTED_SUMS)
def test_a_loop_nested_in_a_body_sums_over_the_axes_slicing_it(name):
    """An inner loop's body sums over dimensions two axes slice (issue 28 item 5: its
    local view did not say which axes): both oracles, and the loops stay sliced, with one
    all-reduce per inner iteration and no gather."""
    def f(x, p):
        return NESTED_SUMS[name](x, p)

    schedule = [partir.ManualPartition({"x": 0}, axis="a"),
                partir.ManualPartition({"x": 1}, axis="b")]
    _, meta = _all_oracles(f, {"a": 2, "b": 2}, schedule, X, jnp.float32(1.0))
    assert meta.collectives["all_gather"] == 0 and meta.collectives["all_reduce"] == 1
    assert meta.out_specs == (jax.sharding.PartitionSpec("a", "b"),)


def _conv(x, w, groups=1):
    return lax.conv_general_dilated(x, w, (1, 1), "SAME", feature_group_count=groups,
                                    dimension_numbers=("NHWC", "HWIO", "NHWC"))


IMAGES = jnp.asarray(RNG.normal(size=(2, 4, 4, 3)).astype(np.float32))
KERNEL = jnp.asarray(RNG.normal(size=(3, 3, 3, 3)).astype(np.float32)) / 4


@pytest.mark.slow
def test_a_convolution_in_a_while_body_over_a_kernel_tiled_on_two_axes_one_of_size_1():
    def f(x, w):
        return lax.while_loop(lambda s: s[0] < 2, lambda s: (s[0] + 1, _conv(s[1], w)),
                              (0, x))[1]

    schedule = [partir.ManualPartition({"w": 3}, axis="a"),
                partir.ManualPartition({"w": 3}, axis="u")]
    _all_oracles(f, {"a": 3, "u": 1}, schedule, IMAGES, KERNEL)


@pytest.mark.parametrize("groups", [1, 3])
def test_a_convolution_in_a_switch_branch(groups):
    def f(x, w):
        kernel = w[:, :, :3 // groups, :]
        return lax.switch(jnp.int32(1), [lambda a: a, lambda a: _conv(a, kernel, groups)], x)

    _, meta = _all_oracles(f, {"a": 2}, [partir.ManualPartition({"x": 0}, axis="a")],
                           IMAGES, KERNEL)
    assert meta.collectives["all_gather"] == 0


@pytest.mark.parametrize("reduce", [jnp.max, jnp.min, jax.nn.logsumexp,
                                    lambda c: jnp.max(jnp.sum(c, axis=1))])
def test_a_max_or_min_reduction_in_a_body_keeps_the_loop_sliced(reduce):
    """Reductions other than sums are all-reduced with their monoid where the body makes
    them (a max of partial sums sums them first)."""
    def f(x):
        return lax.scan(lambda c, _: (c - reduce(c), None), x, None, length=2)[0]

    result, meta = _all_oracles(f, MESH, BP, X)
    assert meta.collectives["all_gather"] == 0
    assert {"max", "min"} & {inner.params["monoid"] for op in lower(result.program).hlo.ops
                             for inner, _ in region_ops(op) if inner.name == ALL_REDUCE}
    assert meta.out_specs == (jax.sharding.PartitionSpec("batch", None),)


def _dropout(c, key):
    return jnp.where(jax.random.bernoulli(key, 0.75, c.shape), c / 0.75, 0.0)


POSITIONAL = {
    "iota": lambda c, _: c + lax.broadcasted_iota(jnp.float32, c.shape, 0),
    "dropout": _dropout,
    "gather": lambda c, _: c + jnp.take(c, jnp.asarray([1, 0, 3, 2, 5, 4, 7, 6]), axis=0,
                                        mode="clip") * 0.5,
}


@pytest.mark.slow
@pytest.mark.parametrize("grad", [False, True])
@pytest.mark.parametrize("name", sorted(POSITIONAL))
def test_a_primitive_computing_from_positions_in_a_body_keeps_the_loop_sliced(name, grad):
    """A body op whose tile depends on where it lies (iota along the batch, dropout's
    random bits, a gather of rows) computes it from the device's coordinate: the scan
    keeps the batch sliced instead of gathering it."""
    op = POSITIONAL[name]

    def f(x, key):
        keys = jax.random.split(key, 3)
        return lax.scan(lambda c, k: (jnp.tanh(op(c, k)), None), x, keys)[0]

    fn = (lambda x, key: jax.grad(lambda y: jnp.sum(f(y, key) ** 2))(x)) if grad else f
    _, meta = _all_oracles(fn, MESH, BP, X, jax.random.key(3))
    if name != "gather":  # its rows come from other devices' slices: gathered
        assert meta.collectives["all_gather"] == 0
        assert meta.out_specs[0] == jax.sharding.PartitionSpec("batch", None)


@pytest.mark.slow
def test_a_factor_only_the_bodies_operands_have_is_sliced_or_gathered_as_propagation_says():
    """Fuzzer seed 617: the indices of a gather in a while body (a factor no result of the
    loop has) arrive sliced, to be gathered where the body takes them, beside another
    factor sliced on an overlapping sub-axis. The local op took them for a sliced factor
    and summed the body's partial results over both: half the pairs were missing."""
    def f(x, table, idx):
        def body(s):
            i, c = s
            rows = partir.tag(jnp.take(table, idx, axis=0, mode="wrap"), "rows")
            return i + 1, c + jnp.mean(rows)
        return lax.while_loop(lambda s: s[0] < 2, body, (jnp.int32(0), x))[1]

    x = jnp.asarray(RNG.standard_normal((3, 12)).astype(np.float32))
    table = jnp.asarray(RNG.standard_normal((1, 4, 4)).astype(np.float32))
    idx = jnp.asarray(RNG.integers(-3, 3, (6,)).astype(np.int32))
    schedule = [partir.ManualPartition({"idx": 0, "table": 2}, axis="a"),
                partir.ManualPartition({"rows": 1}, axis="a:(1)2")]
    _all_oracles(f, {"a": 6}, schedule, x, table, idx)


@pytest.mark.slow
def test_a_scatter_in_a_body_whose_updates_are_sliced_keeps_its_updates_whole():
    """Fuzzer seed 5426: a scatter-max in a fori body, its operand and updates sliced on
    the same axis. Its tiles' results combine by position (the operand kept by each
    tile's own rows), which the local region does not compute: the loop keeps the
    scatter's updates whole instead."""
    def f(x, u):
        def body(i, c):
            return c.at[jnp.asarray([-1, -5, 3, -2], jnp.int32)].max(u, mode="drop") + 0.5
        return lax.fori_loop(0, 2, body, x)

    x = jnp.asarray(RNG.standard_normal((8, 3)).astype(np.float32))
    u = jnp.asarray(RNG.standard_normal((4, 3)).astype(np.float32))
    _all_oracles(f, {"a": 2}, [partir.ManualPartition({"x": 0, "u": 0}, axis="a")], x, u)


def _accumulated_gradient(w, x, tag: bool):
    """Gradient accumulation over 4 microbatches of x's batch, as users write it."""
    def accumulate(g, microbatch):
        return g + jax.grad(lambda v: jnp.sum(jnp.tanh(microbatch @ v) ** 2))(w), None

    microbatches = x.reshape(4, x.shape[0] // 4, x.shape[1])
    if tag:
        microbatches = partir.tag(microbatches, "microbatches")
    return w - 0.1 * lax.scan(accumulate, jnp.zeros_like(w), microbatches)[0]


@pytest.mark.slow
def test_a_batch_tiling_reaching_the_scanned_dimension_says_how_to_run_the_loop_sliced():
    """Batch parallelism on x tiles the microbatch dimension the loop scans (the reshape
    keeps x's tiles whole): the loop runs every iteration whole on every device, and the
    conflict says to tile another dimension. Doing so, on the tagged microbatches' batch,
    runs the loop sliced after one all_to_all, its gradients summed once after it."""
    w = jnp.asarray(RNG.normal(size=(16, 4)).astype(np.float32)) * 0.1
    x = jnp.asarray(RNG.normal(size=(32, 16)).astype(np.float32))
    bp = partir.ManualPartition({"x": 0}, axis="batch")
    result, meta = _all_oracles(functools.partial(_accumulated_gradient, tag=False), MESH,
                                [bp], w, x)
    (conflict,) = result.tactics[0].conflicts
    assert conflict.op == "scan" and "tile another of its dimensions" in conflict.detail
    assert meta.collectives["all_gather"] == 1
    hinted = [bp, partir.ManualPartition({"microbatches": 1}, axis="batch")]
    result, meta = _all_oracles(functools.partial(_accumulated_gradient, tag=True), MESH,
                                hinted, w, x)
    (scan,) = _control_ops(result.program)
    assert [lp.axis for lp in structured(result.program).nest(scan)] == ["batch"]
    assert meta.collectives["all_gather"] == 0 and meta.collectives["all_to_all"] == 1
    assert meta.executed_collectives["all_reduce"] == 1
