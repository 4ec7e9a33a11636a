"""Random loops that accumulate reductions of sharded data (`sum_after_loops` and
`sum_stacked_results_together` in partir/hlo/fusion.py): scans, fori_loops and while loops
whose carry adds (or takes the max or min of) a sum, mean, max or min each iteration, from
zeros or a value, through ops that move elements, nested in an outer loop, or with the
carry read elsewhere in the body; and stacked per-iteration means added together. Both
oracles equal the function, and a sum the body does not otherwise read is reduced once
per call."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from jax import lax

import partir
from tests.budget import examples
from tests.oracles import check_oracles

MESH = partir.Mesh({"a": 4, "b": 2})
AXES = [("a",), ("b",), ("a", "b")]
TRIPS = 3
ELEMENTWISE = {"sin": jnp.sin, "double": lambda x: x * 2.0, "square": jnp.square}
REDUCE = {"sum": (jnp.sum, jnp.add), "mean": (jnp.mean, jnp.add),
          "max": (jnp.max, jnp.maximum), "min": (jnp.min, jnp.minimum)}


def _schedule(axes):
    return [partir.ManualPartition({"xs": 1}, axis=a) for a in axes]


def _loop(kind: str, body, init, xs):
    """`body(c, x) -> c` over the rows of xs, as a scan, a fori_loop or a while loop."""
    if kind == "scan":
        return lax.scan(lambda c, x: (body(c, x), None), init, xs)[0]
    if kind == "fori_loop":
        return lax.fori_loop(0, TRIPS, lambda i, c: body(c, xs[i]), init)

    def step(s):
        i, c = s
        return i + 1, body(c, lax.dynamic_index_in_dim(xs, i, keepdims=False))
    return lax.while_loop(lambda s: s[0] < TRIPS, step, (0, init))[1]


@settings(max_examples=examples(40), deadline=None)
@given(st.sampled_from(["scan", "fori_loop", "while"]), st.sampled_from(sorted(REDUCE)),
       st.sampled_from(sorted(ELEMENTWISE)), st.sampled_from(["zeros", "value"]),
       st.sampled_from(["none", "reshape", "transpose"]), st.booleans(), st.booleans(),
       st.sampled_from(AXES))
def test_random_accumulators_of_reductions(kind, monoid, elementwise, init, mover,
                                           read_elsewhere, nested, axes):
    reduce, combine = REDUCE[monoid]
    f = ELEMENTWISE[elementwise]
    move = {"none": lambda v: v, "reshape": lambda v: v.reshape(2, 2),
            "transpose": lambda v: v.reshape(2, 2).T}[mover]
    shape = (4,) if mover == "none" else (2, 2)

    def body(c, x):
        part = move(reduce(f(x), axis=0))  # over x's sharded rows
        if read_elsewhere:
            part = part * jnp.tanh(c)
        return combine(c, part)

    def start():
        return jnp.zeros(shape) if init == "zeros" else jnp.full(shape, 0.5)

    def fn(xs):
        if nested:
            return _loop("scan", lambda c, x: c + _loop(kind, body, start(), xs), start(), xs)
        return _loop(kind, body, start(), xs)

    xs = jax.random.normal(jax.random.key(0), (TRIPS, 8, 4))
    meta = check_oracles(fn, MESH, _schedule(axes), xs)
    # Each device's part of a sum it accumulates without reading is reduced once: the
    # loop's iterations take none, nor do the outer loop's where the inner sum starts
    # from zeros (from a value, each outer iteration adds it after its reduction).
    if combine is jnp.add and not read_elsewhere:
        once = not nested or init == "zeros"
        assert meta.executed_collectives["all_reduce"] == (1 if once else TRIPS)


@settings(max_examples=examples(30), deadline=None)
@given(st.integers(2, 4), st.sampled_from(sorted(ELEMENTWISE)),
       st.sampled_from(["none", "transpose"]), st.booleans(), st.sampled_from(AXES))
def test_random_sums_of_stacked_sums(scans, elementwise, mover, in_a_loop, axes):
    """`scans` scans' stacked per-iteration means (each [TRIPS, 4]) added together: one
    reduction per call, in a loop's body or not."""
    f = ELEMENTWISE[elementwise]

    def stacked(xs, k):
        ys = lax.scan(lambda c, x: (c, jnp.mean(f(x * k), axis=0)), 0.0, xs)[1]
        return ys.T if mover == "transpose" else ys

    def total(xs):
        out = stacked(xs, 1.0)
        for k in range(2, scans + 1):
            out = out + stacked(xs, float(k))
        return out

    def fn(xs):
        if in_a_loop:
            return lax.fori_loop(0, 2, lambda i, c: c + total(xs + i),
                                 jnp.zeros_like(total(xs)))
        return total(xs)

    xs = jax.random.normal(jax.random.key(1), (TRIPS, 8, 4))
    meta = check_oracles(fn, MESH, _schedule(axes), xs)
    assert meta.executed_collectives["all_reduce"] == 1
    assert np.isfinite(np.asarray(fn(xs))).all()
