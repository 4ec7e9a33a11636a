"""Evaluation of one primitive op on operand values, shared by the Core and PartIR:HLO
interpreters and the runtime: each handles its dialect's own ops (Core's slices and
loops, the collectives) and hands every other op here.

A primitive is re-bound with its public parameters: those named with a leading `_` are
partir's notes on the op (for the passes), which the JAX primitive does not take.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax.numpy as jnp

from partir.errors import ProgramError
from partir.ir.opnames import CONSTANT, TAG
from partir.ir.ops import Op


def evaluate(op: Op, operands: Sequence[Any]) -> list[Any]:
    """The results of a primitive op, a `constant` or a `tag` on `operands`, whichever
    arrays they are: global, device-local or traced."""
    if op.name == TAG:
        return [operands[0]]
    if op.name == CONSTANT:
        return [jnp.asarray(op.params["value"])]
    if op.prim is None:
        raise ProgramError(f"op {op.name!r} is neither an op of its dialect, a tag, a "
                           f"constant nor a JAX primitive, so it cannot be evaluated",
                           loc=op.loc)
    params = {k: v for k, v in op.params.items() if not k.startswith("_")}
    outs = op.prim.bind(*operands, **params)
    return list(outs) if op.prim.multiple_results else [outs]
