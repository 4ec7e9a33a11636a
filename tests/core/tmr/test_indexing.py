import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from partir.core.actions import Loop, Sum, Tile
from partir.core.tmr import LocalContext, OpView, lookup
from partir.frontend import trace
from partir.ir import TensorType
from partir.ir.opnames import CONSTANT
from tests.core.tmr.oracle import check_entry

rng = np.random.default_rng(0)

MODES = ("promise_in_bounds", "clip", "fill")
# Rows of a 32-row table: every chunk of 2 and 4 is hit, with duplicates.
ROWS = np.array([0, 9, 17, 31, 5, 9, 24, 16, 30, 1, 9, 12, 20, 28, 9, 3], np.int32)
# Out-of-range rows replace some of them where the mode defines what they do.
BAD_ROWS = np.array([-3, 40, 32, -1], np.int32)

EMBED_GATHER = lax.GatherDimensionNumbers(offset_dims=(1,), collapsed_slice_dims=(0,),
                                          start_index_map=(0,))
EMBED_SCATTER = lax.ScatterDimensionNumbers(update_window_dims=(1,), inserted_window_dims=(0,),
                                            scatter_dims_to_operand_dims=(0,))


def _rows(mode, n):
    rows = ROWS[:n].copy()
    if mode != "promise_in_bounds":
        rows[:4] = BAD_ROWS
    return rows[:, None]


def _traced_op(fn, name, *args):
    """The `name` op jax emits for fn(*args)."""
    return next(op for op in trace(fn, *args).function.ops if op.name == name)


def _single_name(fn, *args):
    return next(op.name for op in trace(fn, *args).function.ops if op.name != CONSTANT)


def _mappings(fn, *args):
    op = _traced_op(fn, _single_name(fn, *args), *args)
    view = OpView(op.name, op.params, tuple(v.type for v in op.operands),
                  tuple(v.type for v in op.results))
    return [str(m) for m in lookup(op.name).mappings(view)]


# --- gather ------------------------------------------------------------------------------


def test_gather_embedding_mappings():
    table = rng.normal(size=(32, 8)).astype(np.float32)
    fn = lambda t, i: lax.gather(t, i, EMBED_GATHER, (1, 8), mode="clip")  # noqa: E731
    assert _mappings(fn, table, _rows("clip", 8)) == [
        "(⊥, #tile<0>) -> #tile<0>", "(#tile<1>, ⊥) -> #tile<1>", "(#tile<0>, ⊥) -> #sum"]


@pytest.mark.slow
@pytest.mark.parametrize("mode", MODES)
def test_gather_embedding_lookup(mode):
    table = rng.normal(size=(32, 8)).astype(np.float32)
    assert check_entry(lambda t, i: lax.gather(t, i, EMBED_GATHER, (1, 8), mode=mode),
                       table, _rows(mode, 8)) >= 24


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [np.int32, np.uint8, np.bool_])
def test_gather_fill_of_non_float_tables_counts_once(dtype):
    table = rng.integers(0, 2 if dtype == np.bool_ else 100, size=(32, 8)).astype(dtype)
    fn = lambda t, i: lax.gather(t, i, EMBED_GATHER, (1, 8), mode="fill")  # noqa: E731
    # Booleans cannot be added: the chunks are or-ed.
    monoid = "#sum<or>" if dtype == np.bool_ else "#sum"
    assert _mappings(fn, table, _rows("fill", 8))[-1] == f"(#tile<0>, ⊥) -> {monoid}"
    assert check_entry(fn, table, _rows("fill", 8)) >= 24


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["clip", "fill"])
def test_gather_two_indexed_dims(mode):
    x = rng.normal(size=(8, 16, 4)).astype(np.float32)
    idx = np.array([[0, 0], [7, 15], [3, 9], [4, 2], [-1, 3], [5, 16], [2, 20], [6, 5]],
                   np.int32)
    dn = lax.GatherDimensionNumbers(offset_dims=(1,), collapsed_slice_dims=(0, 1),
                                    start_index_map=(0, 1))
    # 4 mappings per size, each followed by 4 inner ones of which all divide by 2.
    assert check_entry(lambda a, i: lax.gather(a, i, dn, (1, 1, 4), mode=mode), x, idx) >= 36


@pytest.mark.slow
@pytest.mark.parametrize("mode", MODES)
def test_gather_indexed_whole_window(mode):
    # Dim 1 is indexed but taken whole: only start 0 is in bounds, which every chunk sees.
    x = rng.normal(size=(16, 8)).astype(np.float32)
    cols = [0, 3, -1, 0, 0, 2, 0, 0] if mode != "promise_in_bounds" else [0] * 8
    idx = np.stack([ROWS[:8] % 16, np.array(cols)], axis=1).astype(np.int32)
    if mode != "promise_in_bounds":
        idx[0, 0] = 19
    dn = lax.GatherDimensionNumbers(offset_dims=(1,), collapsed_slice_dims=(0,),
                                    start_index_map=(0, 1))
    fn = lambda a, i: lax.gather(a, i, dn, (1, 8), mode=mode)  # noqa: E731
    assert "(#tile<1>, ⊥) -> #tile<1>" in _mappings(fn, x, idx)
    assert check_entry(fn, x, idx) >= 24


@pytest.mark.slow
def test_take_along_axis_batching_dims():
    lp = rng.normal(size=(4, 8, 32)).astype(np.float32)
    labels = rng.integers(0, 32, size=(4, 8)).astype(np.int32)
    labels[0, :3] = [33, 40, 32]  # past the vocabulary: FILL_OR_DROP gives NaN
    op = _traced_op(lambda a, b: jnp.take_along_axis(a, b[..., None], -1), "gather", lp,
                    labels)
    dn = op.params["dimension_numbers"]
    assert (dn.operand_batching_dims, dn.start_indices_batching_dims) == ((0, 1), (0, 1))
    fn = lambda a, i: op.prim.bind(a, i, **op.params)  # noqa: E731
    idx = labels[..., None, None]
    assert _mappings(fn, lp, idx) == [
        "(#tile<0>, #tile<0>) -> #tile<0>", "(#tile<1>, #tile<1>) -> #tile<1>",
        "(⊥, #tile<2>) -> #tile<2>", "(#tile<2>, ⊥) -> #sum"]
    assert check_entry(fn, lp, idx) >= 18


def test_unindexed_partial_window_is_not_sliced():
    x = rng.normal(size=(16, 8)).astype(np.float32)
    dn = lax.GatherDimensionNumbers(offset_dims=(1,), collapsed_slice_dims=(0,),
                                    start_index_map=(0,))
    fn = lambda a, i: lax.gather(a, i, dn, (1, 4), mode="clip")  # noqa: E731
    assert _mappings(fn, x, _rows("clip", 8)) == [
        "(⊥, #tile<0>) -> #tile<0>", "(#tile<0>, ⊥) -> #sum"]


# --- scatter-add -------------------------------------------------------------------------


def test_scatter_add_embedding_gradient_mappings():
    table = rng.normal(size=(32, 8)).astype(np.float32)
    upd = rng.normal(size=(16, 8)).astype(np.float32)
    fn = lambda t, i, u: lax.scatter_add(t, i, u, EMBED_SCATTER)  # noqa: E731
    assert _single_name(fn, table, _rows("clip", 16), upd) == "scatter-add"
    assert _mappings(fn, table, _rows("clip", 16), upd) == [
        "(⊥, #tile<0>, #tile<0>) -> #sum", "(#tile<1>, ⊥, #tile<1>) -> #tile<1>",
        "(#tile<0>, ⊥, ⊥) -> #tile<0>"]


@pytest.mark.slow
@pytest.mark.parametrize("mode", MODES)
def test_scatter_add_embedding_gradient(mode):
    # A nonzero operand checks that it is added once under #sum.
    table = rng.normal(size=(32, 8)).astype(np.float32)
    upd = rng.normal(size=(16, 8)).astype(np.float32)
    assert check_entry(lambda t, i, u: lax.scatter_add(t, i, u, EMBED_SCATTER, mode=mode),
                       table, _rows(mode, 16), upd) >= 24


@pytest.mark.slow
def test_scatter_add_take_along_axis_gradient():
    lp = rng.normal(size=(4, 8, 32)).astype(np.float32)
    labels = rng.integers(0, 32, size=(4, 8)).astype(np.int32)
    labels[1, :2] = [32, 47]  # dropped
    grad = jax.grad(lambda a, b: jnp.take_along_axis(a, b[..., None], -1).sum())
    op = _traced_op(grad, "scatter-add", lp, labels)
    dn = op.params["dimension_numbers"]
    assert (dn.operand_batching_dims, dn.scatter_indices_batching_dims) == ((0, 1), (0, 1))
    fn = lambda a, i, u: op.prim.bind(a, i, u, **op.params)  # noqa: E731
    upd = rng.normal(size=(4, 8, 1)).astype(np.float32)
    idx = labels[..., None, None]
    assert _mappings(fn, lp, idx, upd) == [
        "(#tile<0>, #tile<0>, #tile<0>) -> #tile<0>",
        "(#tile<1>, #tile<1>, #tile<1>) -> #tile<1>",
        "(⊥, #tile<2>, #tile<2>) -> #sum", "(#tile<2>, ⊥, ⊥) -> #tile<2>"]
    assert check_entry(fn, lp, idx, upd) >= 18


@pytest.mark.slow
@pytest.mark.parametrize("mode", MODES)
def test_scatter_add_indexed_whole_window(mode):
    x = rng.normal(size=(16, 8)).astype(np.float32)
    cols = [0, 3, -1, 0, 0, 2, 0, 0] if mode != "promise_in_bounds" else [0] * 8
    idx = np.stack([ROWS[:8] % 16, np.array(cols)], axis=1).astype(np.int32)
    if mode != "promise_in_bounds":
        idx[0, 0] = 19
    upd = rng.normal(size=(8, 8)).astype(np.float32)
    dn = lax.ScatterDimensionNumbers(update_window_dims=(1,), inserted_window_dims=(0,),
                                     scatter_dims_to_operand_dims=(0, 1))
    fn = lambda a, i, u: lax.scatter_add(a, i, u, dn, mode=mode)  # noqa: E731
    assert "(#tile<1>, ⊥, #tile<1>) -> #tile<1>" in _mappings(fn, x, idx, upd)
    assert check_entry(fn, x, idx, upd) >= 24


@pytest.mark.slow
def test_scatter_add_two_indexed_dims():
    x = rng.normal(size=(8, 16, 4)).astype(np.float32)
    idx = np.array([[0, 0], [7, 15], [3, 9], [4, 2], [-1, 3], [5, 16], [2, 20], [7, 15]],
                   np.int32)
    upd = rng.normal(size=(8, 4)).astype(np.float32)
    dn = lax.ScatterDimensionNumbers(update_window_dims=(1,), inserted_window_dims=(0, 1),
                                     scatter_dims_to_operand_dims=(0, 1))
    assert check_entry(lambda a, i, u: lax.scatter_add(a, i, u, dn, mode="clip"),
                       x, idx, upd) >= 36


def test_scatter_add_partial_window_is_not_sliced():
    table = rng.normal(size=(32, 8)).astype(np.float32)
    upd = rng.normal(size=(16, 4)).astype(np.float32)
    fn = lambda t, i, u: lax.scatter_add(t, i, u, EMBED_SCATTER)  # noqa: E731
    assert _mappings(fn, table, _rows("clip", 16), upd) == [
        "(⊥, #tile<0>, #tile<0>) -> #sum", "(#tile<0>, ⊥, ⊥) -> #tile<0>"]


# --- apply with traced loop indices ------------------------------------------------------


def _run_traced(fn, args, mapping_index, n=4):
    """Run one mapping as a loop whose index is traced (as in the SPMD runtime)."""
    op = _traced_op(fn, _single_name(fn, *args), *args)
    entry = lookup(op.name)
    in_types = tuple(v.type for v in op.operands)
    out_types = tuple(v.type for v in op.results)
    view = OpView(op.name, op.params, in_types, out_types)
    m = list(entry.mappings(view))[mapping_index]

    def shrink(t, d):
        shape = list(t.shape)
        if d is not None:
            shape[d] //= n
        return TensorType(tuple(shape), t.dtype)

    local_in = tuple(shrink(t, d) for t, d in zip(in_types, m.operands, strict=True))
    local_out = tuple(shrink(t, a.dim if isinstance(a, Tile) else None)
                      for t, a in zip(out_types, m.results, strict=True))
    local_view = OpView(op.name, entry.localize(OpView(op.name, op.params, local_in, local_out))
                        if entry.localize else op.params, local_in, local_out)

    @jax.jit
    def body(r, *xs):
        ctx = LocalContext([Loop("a", m.results, m.operands)], in_types, out_types,
                           index=lambda _: r, axis_size=lambda _: n)
        xs = [x if d is None else lax.dynamic_slice_in_dim(x, r * (x.shape[d] // n),
                                                              x.shape[d] // n, d)
              for x, d in zip(xs, m.operands, strict=True)]
        return entry.apply(local_view, op.prim, xs, ctx)[0]

    parts = [np.asarray(body(jnp.int32(r), *args)) for r in range(n)]
    (action,) = m.results
    if isinstance(action, Sum):
        return np.sum(parts, axis=0)
    return np.concatenate(parts, axis=action.dim)


@pytest.mark.parametrize("mode", MODES)
def test_indexed_mappings_with_traced_loop_index(mode):
    table = rng.normal(size=(32, 8)).astype(np.float32)
    upd = rng.normal(size=(16, 8)).astype(np.float32)
    gather = lambda t, i: lax.gather(t, i, EMBED_GATHER, (1, 8), mode=mode)  # noqa: E731
    rows = _rows(mode, 16)
    np.testing.assert_allclose(_run_traced(gather, (table, rows), 2), gather(table, rows),
                               rtol=1e-6)
    scatter = lambda t, i, u: lax.scatter_add(t, i, u, EMBED_SCATTER, mode=mode)  # noqa: E731
    for k in (0, 2):  # #sum over updates, tile over table rows
        np.testing.assert_allclose(_run_traced(scatter, (table, rows, upd), k),
                                   scatter(table, rows, upd), rtol=1e-5, atol=1e-6)


# --- dynamic_slice / dynamic_update_slice ------------------------------------------------


def test_dynamic_slice_whole_dims():
    x = rng.normal(size=(16, 8)).astype(np.float32)
    # The nonzero start of a whole dim is clamped to 0.
    assert check_entry(lambda a: lax.dynamic_slice(a, (5, 3), (4, 8)), x) >= 3
    assert check_entry(lambda a: lax.dynamic_slice(a, (7, 2), (16, 4)), x) >= 3
    assert check_entry(lambda a: lax.dynamic_slice(a, (0, 0), (16, 8)), x) >= 12


def test_dynamic_slice_partial_dims_are_not_sliced():
    x = rng.normal(size=(16, 8)).astype(np.float32)
    assert _mappings(lambda a: lax.dynamic_slice(a, (5, 3), (4, 8)), x) == [
        "(#tile<1>, ⊥, ⊥) -> #tile<1>"]


def test_dynamic_update_slice_whole_dims():
    x = rng.normal(size=(16, 8)).astype(np.float32)
    rows = rng.normal(size=(4, 8)).astype(np.float32)
    cols = rng.normal(size=(16, 4)).astype(np.float32)
    assert _mappings(lambda a, u: lax.dynamic_update_slice(a, u, (6, 3)), x, rows) == [
        "(#tile<1>, #tile<1>, ⊥, ⊥) -> #tile<1>"]
    assert check_entry(lambda a, u: lax.dynamic_update_slice(a, u, (6, 3)), x, rows) >= 3
    assert check_entry(lambda a, u: lax.dynamic_update_slice(a, u, (5, 2)), x, cols) >= 3
