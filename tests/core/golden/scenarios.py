"""The paper's PartIR:Core examples (sections 4-5, the discussion, appendix B), each
returning the printed Core program; `expected.py` holds the reviewed listings."""

from __future__ import annotations

import jax
import jax.numpy as jnp

import partir
from partir.core.module import CoreModule
from partir.core.printing import print_core
from partir.core.propagation import propagate
from partir.core.value_actions import atomic_value, tile_value
from partir.frontend import trace

S = jax.ShapeDtypeStruct
MESH = partir.Mesh({"B": 4, "M": 2})
CHAIN_ARGS = (S((256, 8), jnp.float32), S((8, 16), jnp.float32), S((16, 8), jnp.float32))


def chain(x, w1, w2):
    return (x @ w1) @ w2


def xxt(x):
    return x @ partir.tag(x.T, "transposed")


def mm(x, w):
    return x @ w


def _chain_module() -> CoreModule:
    return CoreModule(trace(chain, *CHAIN_ARGS), MESH)


def value_tiling_of_x() -> str:
    """Section 4.1: tile<%x, 0, "B"> before propagation."""
    m = _chain_module()
    tile_value(m, m.args[0], 0, "B", label="x")
    return print_core(m.snapshot())


def _tile_x1() -> tuple[CoreModule, list[int]]:
    m = _chain_module()
    x1 = m.ops[0].results[0]
    x1.name = "x1"
    return m, tile_value(m, x1, 0, "B", label="x1")


def tiling_of_x1() -> str:
    """Section 4.2: %x1 value-tiled, before propagation."""
    m, _ = _tile_x1()
    return print_core(m.snapshot())


def propagation_unfused() -> str:
    """Section 4.2: the results of backward and forward propagation, loop by loop."""
    m, seeds = _tile_x1()
    propagate(m, seeds)
    return print_core(m.snapshot(), fuse=False, elide_identities=False)


def propagation_fused() -> str:
    """Listing Core-chain-matmul-tiled-on-batch: the fused program."""
    m, seeds = _tile_x1()
    propagate(m, seeds)
    return print_core(m.snapshot())


def inference_from_w2() -> str:
    """Section 4.2 inference: after BP, tiling %w2 on dim 0 over "M" slices %w1 too."""
    r = partir.core_partition(chain, MESH, [partir.ManualPartition({"x": 0}, axis="B"),
                                            partir.ManualPartition({"w2": 0}, axis="M")],
                              *CHAIN_ARGS)
    return r.core_ir()


def conflict_x_w1() -> str:
    """Section 4.3: %x dim 0 and %w1 dim 1 tiled on "B" in one tactic: a conflict."""
    r = partir.core_partition(chain, MESH, [partir.ManualPartition({"x": 0, "w1": 1},
                                                                   axis="B")], *CHAIN_ARGS)
    return r.core_ir()


def conflict_resolved_incrementally() -> str:
    """Section 4.3: tiling %x first and propagating, then %w1, resolves the conflict."""
    r = partir.core_partition(chain, MESH, [partir.ManualPartition({"x": 0}, axis="B"),
                                            partir.ManualPartition({"w1": 1}, axis="B")],
                              *CHAIN_ARGS)
    return r.core_ir()


def _mm_module() -> CoreModule:
    return CoreModule(trace(mm, S((8, 64), jnp.float32), S((64, 4), jnp.float32)),
                      partir.Mesh({"a": 4, "b": 2}))


def deep_tiling() -> str:
    """Appendix B: %x already sliced on "a" (dim 1) is tiled on "b" (dim 1)."""
    m = _mm_module()
    propagate(m, tile_value(m, m.args[1], 0, "a", label="w"))
    tile_value(m, m.args[0], 1, "b", label="x")
    return print_core(m.snapshot(), elide_identities=False)


def deep_tiling_propagated() -> str:
    m = _mm_module()
    propagate(m, tile_value(m, m.args[1], 0, "a", label="w"))
    propagate(m, tile_value(m, m.args[0], 1, "b", label="x"))
    return print_core(m.snapshot())


def atomic() -> str:
    """Discussion: atomic<%x, "b"> replaces %x with an `any` loop."""
    m = _mm_module()
    atomic_value(m, m.args[0], "b", label="x")
    return print_core(m.snapshot())


def transpose_conflict() -> str:
    """Discussion: x @ x.T with %x tiled on dim 0 over "M" is a conflict."""
    r = partir.core_partition(xxt, MESH, [partir.ManualPartition({"x": 0}, axis="M")],
                              S((256, 256), jnp.float32))
    return r.core_ir()


def transpose_resolved_with_tag_and_atomic() -> str:
    """Discussion: tag the transpose and keep it replicated before tiling %x."""
    r = partir.core_partition(
        xxt, MESH, [partir.ManualPartition({"transposed": partir.REPLICATED, "x": 0},
                                           axis="M")], S((256, 256), jnp.float32))
    return r.core_ir()


SCENARIOS = {f.__name__: f for f in (
    value_tiling_of_x, tiling_of_x1, propagation_unfused, propagation_fused,
    inference_from_w2, conflict_x_w1, conflict_resolved_incrementally, deep_tiling,
    deep_tiling_propagated, atomic, transpose_conflict, transpose_resolved_with_tag_and_atomic)}
