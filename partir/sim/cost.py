"""Per-op cost rules, derived from the primitive catalogue (`partir.rules`).

A rule holds the op's declaration, whose *kind* the fusion heuristic and the memory model
read (and whether it runs on the matrix units, or is too expensive to duplicate), and adds
its FLOPs per device, from the factor sizes of the op's sharding rule on its device-local
types. Counts follow XLA's HloCostAnalysis conventions:

* `dot_general`: 2 FLOPs (a multiply and an add) per point of its iteration space:
  2 * |out| * prod(contracting dims);
* `conv_general_dilated`: 2 * |out| * (input features per group) * prod(window), i.e.
  2 * |out| * |rhs| / (output features);
* elementwise ops (arithmetic, comparisons, selects, conversions, transcendentals): 1 FLOP
  per output element;
* reductions, cumulative ops: 1 FLOP per input element; the scatters: 1 per update;
  `sort`: |x| log2(n) comparisons along the sorted dimension;
* window reductions (pooling): 1 FLOP per window element per output element;
  `select_and_scatter_add`: per source element, one select per window element and one
  add; `select_and_gather_add`: one select per window element per output element;
* `top_k`, `approx_top_k`: |x| log2(k) comparisons (a selection keeping k candidates per
  row);
* `fft`: 5 N log2 N per transform of N = prod(fft_lengths) points;
* PRNG: one threefry2x32 hash (THREEFRY_OPS integer ops) per random word or new key;
  `random_gamma` a few hashes and transcendentals per draw (rejection sampling);
* data movement (broadcasts, transposes, slices, gathers, ...) and bitcasts, key
  wrapping and unwrapping: 0.

Bytes are not a rule's business: the simulator counts the bytes of the buffers an op reads
and writes once the fusion heuristic (`partir.sim.memory`) decided which are materialized.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from partir.ir import Op, TensorType
from partir.rules import CATALOGUE, Kind, OpView, Primitive, catalogue
from partir.rules.catalogue import flops_of
from partir.rules.random import THREEFRY_OPS

FUSIBLE_PRODUCERS = frozenset({Kind.ELEMENTWISE, Kind.BROADCAST, Kind.MOVEMENT})
FUSIBLE_CONSUMERS = frozenset({Kind.ELEMENTWISE, Kind.BROADCAST, Kind.MOVEMENT,
                               Kind.REDUCTION})

# flops(op, size) where size(type) is the element count of a tensor type (cached).
SizeFn = Callable[[TensorType], int]
FlopsFn = Callable[[Op, SizeFn], float]


@dataclass(frozen=True)
class CostRule:
    """What the simulator adds to a declaration, which says the op's kind, `matmul` and
    `expensive`: its FLOPs, remembered by the op's types and parameters."""

    primitive: Primitive
    flops: FlopsFn


_MEMO_SIZE = 1 << 16


def _catalogue_flops(primitive: Primitive) -> FlopsFn:
    # The layers of a model repeat their ops' types and parameters: FLOPs are remembered
    # by them rather than rebuilding a rule per op.
    memo: dict[tuple, float] = {}

    def compute(op: Op, in_types: tuple, out_types: tuple) -> float:
        return flops_of(primitive, OpView(op.name, op.params, in_types, out_types,
                                          regions=tuple(op.regions)))

    def flops(op: Op, size: SizeFn) -> float:
        in_types = tuple([v.type for v in op.operands])
        out_types = tuple([v.type for v in op.results])
        if op.regions:  # a control-flow op: its FLOPs are its regions', not its types'
            return compute(op, in_types, out_types)
        # Keyed by the types' shapes and dtypes, which hash in C: a TensorType's hash is
        # a Python call (the key is hashed for every op).
        key = (tuple([t.shape for t in in_types]), tuple([t.dtype for t in in_types]),
               tuple([t.shape for t in out_types]), tuple([t.dtype for t in out_types]),
               tuple(op.params.items()))
        try:
            return memo[key]
        except KeyError:
            if len(memo) >= _MEMO_SIZE:  # a long-running daemon sees many programs
                memo.clear()
            f = memo[key] = compute(op, in_types, out_types)
            return f
        except TypeError:  # unhashable parameters
            return compute(op, in_types, out_types)
    return flops


def no_flops(op: Op, size: SizeFn) -> float:
    return 0.0


def _cost_rule(primitive: Primitive) -> CostRule:
    # Ops without FLOPs skip building their views and rules.
    flops = no_flops if primitive.flops is catalogue.no_flops else _catalogue_flops(primitive)
    return CostRule(primitive, flops)


COST_RULES: dict[str, CostRule] = {name: _cost_rule(p) for name, p in CATALOGUE.items()}


# A primitive without a rule, or whose rule fails on the op, is costed as its own kernel
# that reads its operands and writes its results, with no FLOPs, and reported in
# `Cost.unknown_ops`.
UNKNOWN_RULE = CostRule(Primitive(Kind.KERNEL, catalogue.no_flops), no_flops)

__all__ = ["COST_RULES", "FUSIBLE_CONSUMERS", "FUSIBLE_PRODUCERS", "THREEFRY_OPS",
           "UNKNOWN_RULE", "CostRule", "Kind"]
