"""Evaluation of one device-local op on operand values, shared by the Core and PartIR:HLO
interpreters and the runtime: each handles its dialect's own ops (Core's slices and
loops) and hands every other op here.

A primitive is re-bound with its public parameters: those named with a leading `_` are
partir's notes on the op (for the passes), which the JAX primitive does not take. A
collective runs as JAX's named-axis collectives (`partir.ir.lax_collectives`): inside a
shard_map, or under vmaps naming the mesh axes. A control-flow op runs its regions with
`lax.scan`, `lax.while_loop` or `lax.switch` (its `REGION_EVALUATORS` entry, declared
with the primitive), each region's ops evaluated here in turn.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
from jax.custom_batching import custom_vmap
from jax.extend.random import threefry2x32_p

from partir.errors import ProgramError
from partir.forked import check_dispatch
from partir.ir.lax_collectives import COLLECTIVES
from partir.ir.opnames import CONSTANT, TAG
from partir.ir.ops import Op, Region
from partir.registry import Registry


def evaluate(op: Op, operands: Sequence[Any]) -> list[Any]:
    """The results of a primitive op, a `constant` or a `tag` on `operands`, whichever
    arrays they are: global, device-local or traced."""
    if op.name == TAG:
        return [operands[0]]
    check_dispatch(f"evaluating {op.name}")
    if op.name == CONSTANT:
        return [jnp.asarray(op.params["value"])]
    collective = COLLECTIVES.get(op.name)
    if collective is not None:
        return [collective(*operands, **op.params)]
    if op.regions:
        return _compiled_control_flow(op)(*operands)
    if op.prim is None:
        raise ProgramError(f"op {op.name!r} is neither an op of its dialect, a tag, a "
                           f"constant nor a JAX primitive, so it cannot be evaluated",
                           loc=op.loc)
    params = {k: v for k, v in op.params.items() if not k.startswith("_")}
    if op.prim is threefry2x32_p:
        return list(_threefry2x32(*operands))
    outs = op.prim.bind(*operands, **params)
    return list(outs) if op.prim.multiple_results else [outs]


@custom_vmap
def _threefry2x32(k1: Any, k2: Any, x1: Any, x2: Any) -> Any:
    return threefry2x32_p.bind(k1, k2, x1, x2)


@_threefry2x32.def_vmap
def _threefry2x32_batched(axis_size: int, in_batched: Sequence[bool], *args: Any) -> Any:
    # JAX batches threefry2x32 by broadcasting, leaving an unbatched operand with a batch
    # dimension of 1, which its CPU lowering cannot take: the interpreters' lockstep
    # vmaps meet it where a tile's random bits count from the device's coordinate.
    args = [x if b else jnp.broadcast_to(x, (axis_size, *x.shape))
            for x, b in zip(args, in_batched, strict=True)]
    # Through `_threefry2x32` again, so that an enclosing vmap (nested lockstep over
    # several mesh axes) also takes this rule rather than JAX's broadcasting one.
    return _threefry2x32(*args), [True, True]


def run_region(region: Region, args: Sequence[Any]) -> list[Any]:
    """The values a region yields on `args`."""
    env = dict(zip(region.args, args, strict=True))
    for op in region.ops:
        env.update(zip(op.results, evaluate(op, [env[v] for v in op.operands]), strict=True))
    return [env[v] for v in region.yields]


# name -> how an op with regions runs them on operand values, declared beside the
# primitive's other rules (`partir.rules.control`).
RegionEvaluator = Callable[[Op, Sequence[Any]], list[Any]]
REGION_EVALUATORS: Registry[RegionEvaluator] = Registry("region evaluator")


# op -> its control flow under jax.jit. Run op by op (the interpreters), a lax.scan of a
# fresh closure compiles anew at every call: an interpreter running a loop's iterations
# one by one would compile the same op once per iteration. Ops compare by identity; the
# table is emptied when it grows past its bound, so it keeps no program alive for long.
_COMPILED: dict[Op, Callable[..., list[Any]]] = {}
_COMPILED_BOUND = 1024


def _compiled_control_flow(op: Op) -> Callable[..., list[Any]]:
    fn = _COMPILED.get(op)
    if fn is None:
        if len(_COMPILED) >= _COMPILED_BOUND:
            _COMPILED.clear()
        fn = _COMPILED[op] = jax.jit(lambda *operands: _control_flow(op, operands))
    return fn


def _control_flow(op: Op, operands: Sequence[Any]) -> list[Any]:
    run = REGION_EVALUATORS.get(op.name)
    if run is None:
        raise ProgramError(f"op {op.name!r} has regions but is no control flow partir runs",
                           loc=op.loc)
    return run(op, operands)
