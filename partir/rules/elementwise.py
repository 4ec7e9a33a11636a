"""Elementwise primitives and identities: one pass-through factor per result dimension.

Operands JAX broadcasts implicitly (rank-0 literals, and size-1 dims of a larger result
dim) do not have the factor of that dimension: every tile of the result reads all of it.
"""

from __future__ import annotations

import functools
from dataclasses import replace

from partir.ir.opnames import ATOMIC, SHARDING_CONSTRAINT, TAG, TILE
from partir.rules.catalogue import Kind, OpView, Primitive, declare, no_flops, per_point
from partir.rules.factors import RuleBuilder, ShardingRule

# Transcendentals and the like: XLA's "expensive" elementwise ops.
EXPENSIVE_UNARY = (
    "acos", "acosh", "asin", "asinh", "atan", "atanh", "bessel_i0e", "bessel_i1e", "cbrt",
    "cos", "cosh", "digamma", "erf", "erf_inv", "erfc", "exp", "exp2", "expm1", "lgamma",
    "log", "log1p", "logistic", "rsqrt", "sin", "sinh", "sqrt", "tan", "tanh",
)
CHEAP_UNARY = (
    "abs", "ceil", "clz", "conj", "convert_element_type", "copy", "floor", "imag",
    "integer_pow", "is_finite", "neg", "not", "population_count", "real", "reduce_precision",
    "round", "sign", "square",
)
EXPENSIVE_BINARY = ("atan2", "igamma", "igamma_grad_a", "igammac", "polygamma", "pow", "zeta")
# eq_to, le_to, lt_to: comparisons in the total order of floats (jnp.searchsorted, sorts).
CHEAP_BINARY = (
    "add", "add_any", "and", "complex", "div", "eq", "eq_to", "ge", "gt", "le", "le_to", "lt",
    "lt_to", "max", "min", "mul", "mulhi", "ne", "nextafter", "or", "rem", "shift_left",
    "shift_right_arithmetic", "shift_right_logical", "sub", "xor",
)
NARY = ("select_n", "clamp")
EXPENSIVE_NARY = ("regularized_incomplete_beta",)


def elementwise_rule(view: OpView) -> ShardingRule:
    return _elementwise(view.in_shapes, view.out_types[0].shape, len(view.out_types))


@functools.lru_cache(maxsize=8192)  # the same shapes recur in every layer of a model
def _elementwise(in_shapes: tuple[tuple[int, ...], ...], out: tuple[int, ...],
                 n_results: int) -> ShardingRule:
    b = RuleBuilder([len(s) for s in in_shapes], [len(out)] * n_results)
    for d, size in enumerate(out):
        b.factor(size, {i: d for i, s in enumerate(in_shapes)
                        if s and not (s[d] == 1 and size != 1)},
                 dict.fromkeys(range(n_results), d))
    return b.build()


def leading_dims_rule(view: OpView) -> ShardingRule:
    """One pass-through factor for each dim up to the smallest rank among the operands and
    results, for ops that add or drop trailing dims around an elementwise computation;
    the trailing dims are each their own need-replication factor."""
    return _leading(view.in_shapes, view.out_shapes)


@functools.lru_cache(maxsize=1024)
def _leading(in_shapes: tuple[tuple[int, ...], ...],
             out_shapes: tuple[tuple[int, ...], ...]) -> ShardingRule:
    rank = min(len(s) for s in (*in_shapes, *out_shapes))
    b = RuleBuilder([len(s) for s in in_shapes], [len(s) for s in out_shapes])
    for d in range(rank):
        b.factor(in_shapes[0][d] if in_shapes else out_shapes[0][d],
                 dict.fromkeys(range(len(in_shapes)), d),
                 dict.fromkeys(range(len(out_shapes)), d))
    for i, s in enumerate(in_shapes):
        for d in range(rank, len(s)):
            b.replicated(s[d], operands={i: d})
    for k, s in enumerate(out_shapes):
        for d in range(rank, len(s)):
            b.replicated(s[d], results={k: d})
    return b.build()


ELEMENTWISE_DOC = "t_d, ..., t_d -> t_d for every dimension d"
_CHEAP = Primitive(Kind.ELEMENTWISE, per_point(1), elementwise_rule, doc=ELEMENTWISE_DOC)
# The cheap ops through which partial sums stay partial sums (`Primitive.linear`).
_LINEAR = {"add": "all", "add_any": "all", "sub": "all", "neg": "all", "copy": "all",
           "convert_element_type": "all", "reduce_precision": "all", "mul": "one",
           "div": (0,), "select_n": "cases"}
declare([n for n in CHEAP_UNARY + CHEAP_BINARY + NARY if n not in _LINEAR], _CHEAP)
for _name, _how in _LINEAR.items():
    declare(_name, replace(_CHEAP, linear=_how))
declare(EXPENSIVE_UNARY + EXPENSIVE_BINARY + EXPENSIVE_NARY,
        Primitive(Kind.ELEMENTWISE, per_point(1), elementwise_rule, expensive=True,
                  doc=ELEMENTWISE_DOC))
# The result is the operand's buffer.
declare("stop_gradient", Primitive(Kind.FREE, no_flops, elementwise_rule, doc=ELEMENTWISE_DOC))
# jax.ad_checkpoint.checkpoint_name: the identity, naming a value for remat policies
# (`jax.checkpoint_policies.save_only_these_names`); models name activations with it.
declare("name", Primitive(Kind.FREE, no_flops, elementwise_rule, linear="all",
                          doc=ELEMENTWISE_DOC))
# partir's own identities: `tag` from partir.tag, the Core value actions (a value
# tiling loop `tile` and `atomic`) and the model's sharding annotations, which
# materialization removes before lowering where their uses read the value as it is.
declare((TAG, TILE, ATOMIC, SHARDING_CONSTRAINT),
        Primitive(Kind.FREE, no_flops, elementwise_rule, doc=ELEMENTWISE_DOC), jax=False)
# JAX's sharding annotations, each with the parameter holding its sharding: the identity
# for the computation, which the frontend makes a `partir.sharding_constraint` op.
ANNOTATIONS = {"sharding_constraint": "sharding", "reshard": "dst_sharding"}
# A bitcast between widths adds (or drops) a trailing dim holding one element's bytes.
declare("bitcast_convert_type",
        Primitive(Kind.FREE, no_flops, leading_dims_rule,
                  doc="t_d -> t_d for every dim but a width change's trailing one"))
# An identity on each of its operands, which may differ in rank.
declare("optimization_barrier",
        Primitive(Kind.FREE, no_flops, leading_dims_rule,
                  doc="t_d, ..., t_d -> t_d, ..., t_d for every dim d all operands have"))
