"""Collectives carry the model line they are attributed to: a reduction the line of the op
whose partial results it sums, a gathered argument the line of its first user."""

from __future__ import annotations

import inspect

import jax
import numpy as np

import partir
from partir.hlo.ops import ALL_GATHER, ALL_REDUCE, COLLECTIVES
from partir.pipeline import lower
from tests.oracles import assert_tree_close


def two_layers(x, w1, w2):
    h = x @ w1
    return h @ w2


def _line(text: str) -> int:
    lines, first = inspect.getsourcelines(two_layers)
    return first + next(i for i, line in enumerate(lines) if text in line)


def test_collectives_point_at_the_model_lines_that_cause_them():
    args = (np.zeros((16, 8), np.float32), np.zeros((8, 4), np.float32),
            np.zeros((4, 8), np.float32))
    schedule = [partir.ManualPartition({"x": 0}, axis="batch"),
                partir.ManualPartition({"w1": 1}, axis="model"),
                partir.ManualPartition({"w1": 0, "w2": 1}, axis="batch")]
    result = partir.core_partition(two_layers, {"batch": 2, "model": 2}, schedule, *args)
    hlo = lower(result.program).hlo
    found = [(op.name, op.operands[0].name, op.loc.line) for op in hlo.ops
             if op.name in COLLECTIVES]
    assert all(op.loc.file.endswith("test_locations.py") for op in hlo.ops
               if op.name in COLLECTIVES)
    first, second = _line("h = x @ w1"), _line("return h @ w2")
    # h is sharded on model: the second matmul sums partial products over it
    assert (ALL_REDUCE, second) in {(name, line) for name, _, line in found}
    # Z3 gathers each weight where it is used
    gathers = {name: line for kind, name, line in found if kind == ALL_GATHER}
    assert gathers == {"w1": first, "w2": second}


def test_zero3_gathers_a_weight_again_for_the_backward_pass_that_reads_it():
    """The gradient of two layers under BP and Z3: each weight is gathered where the
    forward uses it, and w2, which the backward reads (the cotangent of h is g @ w2.T),
    gathered again where the backward uses it, as ZeRO-3 does; w1's backward use is only
    its own gradient, which needs no w1."""
    def loss(x, w1, w2):
        return np.float32(0.5) * (two_layers(x, w1, w2) ** 2).sum()

    rng = np.random.default_rng(0)
    args = tuple(rng.normal(size=s).astype(np.float32) for s in ((16, 8), (8, 4), (4, 8)))
    step = jax.grad(loss, argnums=(1, 2))
    schedule = [partir.ManualPartition({"x": 0}, axis="batch"),
                partir.ManualPartition({"w1": 0, "w2": 1}, axis="batch")]
    result = partir.core_partition(step, {"batch": 4}, schedule, *args)
    hlo = lower(result.program).hlo
    gathers = sorted((op.operands[0].name, op.loc.line, op.loc.backward) for op in hlo.ops
                     if op.name == ALL_GATHER)
    first, second = _line("h = x @ w1"), _line("return h @ w2")
    assert gathers == [("w1", first, False), ("w2", second, False), ("w2", second, True)]
    # both oracles: the sequential Core interpreter and the program run on the devices
    assert_tree_close(result.interpret(*args), step(*args))
    fn, _ = partir.jit(step, {"batch": 4}, schedule)
    assert_tree_close(fn(*args), step(*args))
