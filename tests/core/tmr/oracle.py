"""Checks a TMR entry against the primitive it describes, independently of propagation.

For an op traced from a one-primitive function, every mapping the entry offers (that the
axis sizes divide) is executed as a loop: operands are sliced per the mapping, the local
op runs with localized params (and the entry's `apply`, given the loop index), and the
iterations' results are combined per action. The result must equal the global op. Two
nested loops over different axes are checked as well, so localize/apply see already
local types and offsets compose.
"""

from __future__ import annotations

import itertools

import jax
import numpy as np
from jax import lax

from partir.core.actions import AnyAction, Loop, Sum, Tile
from partir.core.tmr import LocalContext, OpView, factor_mappings, localized, lookup
from partir.frontend import trace
from partir.ir import TensorType
from partir.ir.dtypes import sliceable, to_host
from partir.ir.opnames import CONSTANT

_COMBINE = {"add": np.add, "max": np.maximum, "min": np.minimum,
            "and": np.logical_and, "or": np.logical_or}


def _single_op(fn, *args):
    prog = trace(fn, *args)
    ops = [op for op in prog.function.ops if op.name != CONSTANT]
    assert len(ops) == 1, [op.name for op in prog.function.ops]
    op = ops[0]
    env = dict(zip(prog.function.args, args, strict=True))
    for c in prog.function.ops:
        if c.name == CONSTANT:
            env[c.results[0]] = c.params["value"]
    return op, [sliceable(env[v]) for v in op.operands]


def _local_types(types, nest, which):
    out = []
    for i, t in enumerate(types):
        shape = list(t.shape)
        for lp, size in nest:
            d = lp.operands[i] if which == "in" else (
                lp.results[i].dim if isinstance(lp.results[i], Tile) else None)
            if d is not None:
                shape[d] //= size
        out.append(TensorType(tuple(shape), t.dtype))
    return tuple(out)


def _nest_runner(op, entry, nest):
    """The op at one point of the nest, as one computation (`jax.jit`): local results of
    (operands, the point's index on each loop of the nest). Each op the entry's `apply`
    runs eagerly would be a compilation of its own."""
    in_global = tuple(v.type for v in op.operands)
    out_global = tuple(v.type for v in op.results)
    local_in = _local_types(in_global, nest, "in")
    local_out = _local_types(out_global, nest, "out")
    sizes = {lp.axis: n for lp, n in nest}
    view = OpView(op.name, op.params, local_in, local_out)
    params = localized(entry, view)
    local_view = OpView(op.name, params, local_in, local_out)

    def run(operands, point):
        index = dict(zip((lp.axis for lp, _ in nest), point, strict=True))
        local_operands = []
        for i, x in enumerate(operands):
            for lp, n in nest:
                d = lp.operands[i]
                if d is not None:
                    chunk = x.shape[d] // n
                    x = lax.dynamic_slice_in_dim(x, index[lp.axis] * chunk, chunk, axis=d)
            local_operands.append(x)
        if entry.apply is not None:
            ctx = LocalContext([lp for lp, _ in nest], in_global, out_global,
                               index=lambda a: index[a], axis_size=lambda a: sizes[a])
            outs = entry.apply(local_view, op.prim, local_operands, ctx)
        else:
            outs = op.prim.bind(*local_operands, **params)
            outs = list(outs) if op.prim.multiple_results else [outs]
        for o, t in zip(outs, local_out, strict=True):
            assert tuple(np.shape(o)) == t.shape, (op.name, np.shape(o), t.shape, params)
        return outs

    return jax.jit(run)


def _combine(action, parts):
    if isinstance(action, Tile):
        return np.concatenate(parts, axis=action.dim)
    if isinstance(action, Sum):
        return _COMBINE[action.monoid].reduce(np.stack(parts), axis=0)
    assert isinstance(action, AnyAction)
    return parts[0]


def _eval_nest(op, entry, operands, nest):
    """The op's results from running it at every point of the nest and combining the
    points' local results per each loop's actions."""
    run = _nest_runner(op, entry, nest)

    def at(depth, point):
        if depth == len(nest):
            return [to_host(o) for o in run(operands, tuple(np.int32(i) for i in point))]
        lp, n = nest[depth]
        per_iter = [at(depth + 1, (*point, r)) for r in range(n)]
        return [_combine(lp.results[k], [it[k] for it in per_iter])
                for k in range(len(op.results))]

    return at(0, ())


def _divisible(mapping, view, n, factor_size=None):
    # As propagation: the axis must divide the sliced factor, not only its dimensions (a
    # compound dimension's major factor may be smaller than the axis).
    if factor_size is not None and factor_size % n:
        return False
    for d, t in zip(mapping.operands, view.in_types, strict=True):
        if d is not None and t.shape[d] % n:
            return False
    for a, t in zip(mapping.results, view.out_types, strict=True):
        if isinstance(a, Tile) and t.shape[a.dim] % n:
            return False
    return True


def check_entry(fn, *args, sizes=(2, 4), rtol=1e-5, atol=1e-5, min_mappings=1):
    """Check every mapping (and every ordered pair over two axes) of the entry for the
    single primitive in `fn`. Returns the number of loop nests checked."""
    op, operands = _single_op(fn, *args)
    entry = lookup(op.name)
    assert entry is not None, f"no TMR entry for {op.name}"
    expected = jax.jit(fn)(*args)
    expected = [to_host(e) for e in jax.tree_util.tree_leaves(expected)]
    checked = 0

    def mappings_at(nest):
        view = OpView(op.name, op.params, _local_types(tuple(v.type for v in op.operands), nest,
                                                       "in"),
                      _local_types(tuple(v.type for v in op.results), nest, "out"))
        rule = entry.rule(view)
        return view, [(m, rule.sizes[f]) for f, m in factor_mappings(rule, rule.sizes)]

    _, first = mappings_at([])
    assert len(first) >= min_mappings, f"{op.name}: only {len(first)} mappings"
    for n in sizes:
        view, ms = mappings_at([])
        for m, size in ms:
            if not _divisible(m, view, n, size):
                continue
            nest = [(Loop("a", m.results, m.operands), n)]
            got = _eval_nest(op, entry, operands, nest)
            for g, e in zip(got, expected, strict=True):
                np.testing.assert_allclose(g, e, rtol=rtol, atol=atol, err_msg=f"{op.name} {m}")
            checked += 1
            # a second loop over another axis, inside the first
            view2, ms2 = mappings_at(nest)
            for m2, size2 in itertools.islice(ms2, 6):
                if not _divisible(m2, view2, 2, size2):
                    continue
                nest2 = [*nest, (Loop("b", m2.results, m2.operands), 2)]
                got = _eval_nest(op, entry, operands, nest2)
                for g, e in zip(got, expected, strict=True):
                    np.testing.assert_allclose(g, e, rtol=rtol, atol=atol,
                                               err_msg=f"{op.name} {m} then {m2}")
                checked += 1
    return checked


def random_operands(op, rng, ints=None):
    """Random values of an op's operand types: normal floats, integers in [0, ints[i])
    (default 8) for integer operands."""
    out = []
    for i, v in enumerate(op.operands):
        t = v.type
        if np.issubdtype(t.dtype, np.integer):
            hi = (ints or {}).get(i, 8)
            out.append(rng.integers(0, hi, size=t.shape).astype(t.dtype))
        else:
            out.append(rng.normal(size=t.shape).astype(t.dtype))
    return out


def traced_ops(fn, name, *args):
    """The `name` ops jax emits for fn(*args) (e.g. the convs of a gradient)."""
    return [op for op in trace(fn, *args).function.ops if op.name == name]


def check_op(op, *args, **kw):
    """check_entry on one traced op, bound alone to `args`."""
    def single(*xs):
        out = op.prim.bind(*xs, **op.params)
        return tuple(out) if op.prim.multiple_results else out
    return check_entry(single, *args, **kw)
