"""Elementwise primitives: tiling the result on dimension d tiles every operand on d.
Operands JAX broadcasts implicitly (rank-0 literals, and size-1 dims of a larger result
dim) are used whole."""

from __future__ import annotations

import functools

from partir.core.actions import Tile
from partir.core.tmr.registry import Entry, OpView, TileMapping, register

UNARY = (
    "abs", "acos", "acosh", "asin", "asinh", "atan", "atanh", "cbrt", "ceil", "conj",
    "convert_element_type", "copy", "copy_p", "cos", "cosh", "digamma", "erf", "erf_inv",
    "erfc", "exp", "exp2", "expm1", "floor", "imag", "integer_pow", "is_finite", "lgamma",
    "log", "log1p", "logistic", "neg", "not", "population_count", "real", "reduce_precision",
    "round", "rsqrt", "sign", "sin", "sinh", "sqrt", "square", "stop_gradient", "tan", "tanh",
    "clz",
)
BINARY = (
    "add", "add_any", "and", "atan2", "div", "eq", "ge", "gt", "igamma", "igammac", "le",
    "lt", "max", "min", "mul", "ne", "nextafter", "or", "pow", "rem", "shift_left",
    "shift_right_arithmetic", "shift_right_logical", "sub", "xor", "complex",
)
NARY = ("select_n", "clamp")
# Identities of the Core dialect and the frontend: a value tiling/atomic loop and `tag`.
IDENTITIES = ("tag", "tile", "atomic")


def elementwise_mappings(op: OpView) -> tuple[TileMapping, ...]:
    return _mappings(op.in_shapes, op.out_types[0].shape, len(op.out_types))


@functools.lru_cache(maxsize=8192)  # the same shapes recur in every layer of a model
def _mappings(in_shapes: tuple[tuple[int, ...], ...], out: tuple[int, ...],
              n_results: int) -> tuple[TileMapping, ...]:
    return tuple(
        TileMapping(tuple(None if not s or (s[d] == 1 and out[d] != 1) else d for s in in_shapes),
                    (Tile(d),) * n_results)
        for d in range(len(out)))


ELEMENTWISE = Entry(elementwise_mappings, doc="t_d, ..., t_d -> t_d for every dimension d")
register(UNARY + BINARY + NARY + IDENTITIES, ELEMENTWISE)


def leading_dims_mappings(op: OpView):
    """t_d on every operand and result for each dim d up to the smallest rank among them:
    for ops that add or drop trailing dims around an elementwise computation."""
    rank = min(t.rank for t in (*op.in_types, *op.out_types))
    for d in range(rank):
        yield TileMapping((d,) * len(op.in_types), (Tile(d),) * len(op.out_types))


# A bitcast between widths adds (or drops) a trailing dim holding one element's bytes.
register("bitcast_convert_type", Entry(leading_dims_mappings,
                                       doc="t_d -> t_d for every dim but a width change's "
                                           "trailing one"))
# An identity on each of its operands, which may differ in rank.
register("optimization_barrier", Entry(leading_dims_mappings,
                                       doc="t_d, ..., t_d -> t_d, ..., t_d for every dim d "
                                           "all operands have"))
