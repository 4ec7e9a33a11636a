"""Per-op cost rules: a registry keyed by primitive name, like the TMR's families.

A rule gives an op's *kind*, which the fusion heuristic and the memory model read, and its
FLOPs per device. Counts follow XLA's HloCostAnalysis conventions:

* `dot_general`: 2 FLOPs (a multiply and an add) per output element and contracted
  element: 2 * |out| * prod(contracting dims);
* `conv_general_dilated`: 2 * |out| * (input features per group) * prod(window), i.e.
  2 * |out| * |rhs| / (output features);
* elementwise ops (arithmetic, comparisons, selects, conversions, transcendentals): 1 FLOP
  per output element;
* reductions, cumulative ops: 1 FLOP per input element; `scatter-add`: 1 per update;
  `sort`: |x| log2(n) comparisons along the sorted dimension;
* `top_k`: |x| log2(k) comparisons (a selection keeping k candidates per row);
* PRNG: one threefry2x32 hash (THREEFRY_OPS integer ops) per random word or new key;
  `random_gamma` a few hashes and transcendentals per draw (rejection sampling);
* data movement (broadcasts, transposes, slices, gathers, ...) and bitcasts, key
  wrapping and unwrapping: 0.

Bytes are not a rule's business: the simulator counts the bytes of the buffers an op reads
and writes once the fusion heuristic (`partir.sim.memory`) decided which are materialized.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from enum import IntEnum

from partir.ir import Op, TensorType
from partir.registry import Registry


class Kind(IntEnum):
    FREE = 0  # no kernel, no buffer: the result is the operand's buffer (reshape, tag)
    ELEMENTWISE = 1  # fusible; one output element from the same elements of the operands
    BROADCAST = 2  # fusible and cheap enough to duplicate into every consumer
    MOVEMENT = 3  # fusible data movement: transpose, slice, pad, concatenate, all_slice
    REDUCTION = 4  # fusible as a consumer (XLA's input fusion), a fusion root
    KERNEL = 5  # its own kernel: matmuls, convolutions, gathers, scatters, sorts
    COLLECTIVE = 6  # communication, costed by partir.sim.collectives


FUSIBLE_PRODUCERS = frozenset({Kind.ELEMENTWISE, Kind.BROADCAST, Kind.MOVEMENT})
FUSIBLE_CONSUMERS = frozenset({Kind.ELEMENTWISE, Kind.BROADCAST, Kind.MOVEMENT,
                               Kind.REDUCTION})

# flops(op, size) where size(type) is the element count of a tensor type (cached).
SizeFn = Callable[[TensorType], int]
FlopsFn = Callable[[Op, SizeFn], float]


@dataclass(frozen=True)
class CostRule:
    kind: Kind
    flops: FlopsFn
    matmul: bool = False  # runs on the matrix units (DeviceSpec.matmul_flops)
    # Transcendentals and the like: the fusion heuristic does not duplicate them into
    # several consumers (XLA's "expensive" elementwise ops).
    expensive: bool = False


COST_RULES: Registry[CostRule] = Registry("cost rule")


def register_cost(names: str | Iterable[str], rule: CostRule) -> CostRule:
    return COST_RULES.register(names, rule)


def lookup_cost(name: str) -> CostRule | None:
    return COST_RULES.get(name)


# --- FLOP counts -----------------------------------------------------------------------------


def no_flops(op: Op, size: SizeFn) -> float:
    return 0.0


def per_output_element(op: Op, size: SizeFn) -> float:
    return float(size(op.results[0].type))


def per_input_element(op: Op, size: SizeFn) -> float:
    return float(size(op.operands[0].type))


def dot_general_flops(op: Op, size: SizeFn) -> float:
    (lhs_contract, _), _ = op.params["dimension_numbers"]
    shape = op.operands[0].type.shape
    return 2.0 * size(op.results[0].type) * math.prod(shape[d] for d in lhs_contract)


def conv_flops(op: Op, size: SizeFn) -> float:
    rhs = op.operands[1].type
    out_feature_dim = op.params["dimension_numbers"].rhs_spec[0]
    return 2.0 * size(op.results[0].type) * size(rhs) / rhs.shape[out_feature_dim]


def scatter_flops(op: Op, size: SizeFn) -> float:
    return float(size(op.operands[2].type))  # one combine per update element


def sort_flops(op: Op, size: SizeFn) -> float:
    x = op.operands[0].type
    n = x.shape[op.params["dimension"]] if x.shape else 1
    return float(size(x)) * max(1.0, math.log2(max(n, 1)))


def top_k_flops(op: Op, size: SizeFn) -> float:
    return float(size(op.operands[0].type)) * max(1.0, math.log2(max(op.params["k"], 1)))


# threefry2x32's 20 rounds of add, rotate (2 shifts and an or) and xor, and its 5 key
# injections of 3 adds, on a pair of 32-bit words.
THREEFRY_OPS = 20 * 5 + 5 * 3
# Marsaglia-Tsang's gamma sampler: a key split, about 1.2 rounds of a normal and a uniform
# draw (3 hashes), and some 30 arithmetic ops and transcendentals per draw.
GAMMA_OPS = 4 * THREEFRY_OPS + 30


def threefry_flops(op: Op, size: SizeFn) -> float:
    return float(THREEFRY_OPS * size(op.results[0].type))


def gamma_flops(op: Op, size: SizeFn) -> float:
    return float(GAMMA_OPS * size(op.results[0].type))


# --- families ------------------------------------------------------------------------------

UNARY = ("abs", "acos", "acosh", "asin", "asinh", "atan", "atanh", "cbrt", "ceil", "conj",
         "convert_element_type", "copy", "copy_p", "cos", "cosh", "digamma", "erf",
         "erf_inv", "erfc", "exp", "exp2", "expm1", "floor", "imag", "integer_pow",
         "is_finite", "lgamma", "log", "log1p", "logistic", "neg", "not", "population_count",
         "real", "reduce_precision", "round", "rsqrt", "sign", "sin", "sinh", "sqrt",
         "square", "tan", "tanh", "clz")
BINARY = ("add", "add_any", "and", "atan2", "div", "eq", "ge", "gt", "igamma", "igammac",
          "le", "lt", "max", "min", "mul", "ne", "nextafter", "or", "pow", "rem",
          "shift_left", "shift_right_arithmetic", "shift_right_logical", "sub", "xor",
          "complex", "select_n", "clamp")
# Same-size reinterpretations and identities: the result is the operand's buffer.
FREE = ("reshape", "squeeze", "expand_dims", "stop_gradient", "tag", "bitcast_convert_type",
        "optimization_barrier", "hlo.axis_index", "random_wrap", "random_unwrap",
        "random_clone")
BROADCASTS = ("broadcast_in_dim", "iota", "constant")
MOVEMENT = ("transpose", "slice", "pad", "concatenate", "rev", "dynamic_slice",
            "hlo.all_slice", "split")
REDUCTIONS = ("reduce_sum", "reduce_max", "reduce_min", "reduce_prod", "reduce_and",
              "reduce_or", "reduce_xor", "argmax", "argmin")
CUMULATIVE = ("cumsum", "cumprod", "cummax", "cummin", "cumlogsumexp")
COLLECTIVES = ("hlo.all_gather", "hlo.all_reduce", "hlo.reduce_scatter", "hlo.all_to_all")

EXPENSIVE = ("acos", "acosh", "asin", "asinh", "atan", "atanh", "atan2", "cbrt", "cos",
             "cosh", "digamma", "erf", "erf_inv", "erfc", "exp", "exp2", "expm1", "igamma",
             "igammac", "lgamma", "log", "log1p", "logistic", "pow", "rsqrt", "sin", "sinh",
             "sqrt", "tan", "tanh")

register_cost([n for n in UNARY + BINARY if n not in EXPENSIVE],
              CostRule(Kind.ELEMENTWISE, per_output_element))
register_cost(EXPENSIVE, CostRule(Kind.ELEMENTWISE, per_output_element, expensive=True))
register_cost(FREE, CostRule(Kind.FREE, no_flops))
register_cost(BROADCASTS, CostRule(Kind.BROADCAST, no_flops))
register_cost(MOVEMENT, CostRule(Kind.MOVEMENT, no_flops))
register_cost(REDUCTIONS, CostRule(Kind.REDUCTION, per_input_element))
register_cost(CUMULATIVE, CostRule(Kind.KERNEL, per_input_element))
register_cost("dot_general", CostRule(Kind.KERNEL, dot_general_flops, matmul=True))
register_cost("conv_general_dilated", CostRule(Kind.KERNEL, conv_flops, matmul=True))
register_cost(("gather", "dynamic_update_slice", "select_and_gather_add"),
              CostRule(Kind.KERNEL, no_flops))
register_cost(("scatter-add", "scatter_add", "scatter", "scatter-mul", "scatter-min",
               "scatter-max"), CostRule(Kind.KERNEL, scatter_flops))
register_cost("sort", CostRule(Kind.KERNEL, sort_flops))
register_cost("top_k", CostRule(Kind.KERNEL, top_k_flops))
# A counter-based hash per output element, fused with its consumers as XLA fuses the
# iota/threefry/xor it lowers to; too costly to duplicate into several of them.
register_cost(("random_bits", "random_split", "random_fold_in", "threefry2x32"),
              CostRule(Kind.ELEMENTWISE, threefry_flops, expensive=True))
register_cost("random_seed", CostRule(Kind.ELEMENTWISE, per_output_element))
register_cost("random_gamma", CostRule(Kind.KERNEL, gamma_flops))
register_cost(COLLECTIVES, CostRule(Kind.COLLECTIVE, no_flops))

# A primitive without a rule, or whose rule fails on the op, is costed as its own kernel
# that reads its operands and writes its results, with no FLOPs, and reported in
# `Cost.unknown_ops`.
UNKNOWN_RULE = CostRule(Kind.KERNEL, no_flops)
