"""partir's own ops never share a name with a JAX primitive: an op's name is what every
stage dispatches on, and JAX 0.10's `tile` primitive (`jnp.tile`) was once taken for the
Core value-tiling identity and dropped by materialization."""

from __future__ import annotations

import gc

import jax.numpy as jnp
import numpy as np
import pytest
from jax.extend.core import Primitive as JaxPrimitive

import partir
import partir.core.dialect  # each dialect registers its ops' printers and type rules
import partir.hlo.ops
import partir.spmd.ops
from partir.core.program import IDENTITY_KINDS
from partir.frontend import annotation_p, tag_p
from partir.ir import opnames
from partir.ir.printer import OP_PRINTERS
from partir.ir.verifier import TYPE_RULES
from partir.rules import CATALOGUE, Kind, Primitive
from partir.rules.catalogue import OWN_NAMES, declare, no_flops


def _registered_jax_primitives() -> set[str]:
    """Every primitive JAX has registered, read afresh (not the catalogue's cached set), but
    partir's own (`tag`, and the sharding annotation the frontend makes JAX's)."""
    import jax.random  # noqa: F401
    return {o.name for o in gc.get_objects()
            if isinstance(o, JaxPrimitive) and o not in (tag_p, annotation_p)}


def _own_op_names() -> set[str]:
    """Everything declared with `jax=False` and every op name the IR dialects use (a type
    rule may also be a declared JAX primitive's: control flow's, from its regions)."""
    jax_declared = set(CATALOGUE) - OWN_NAMES
    return (set(OWN_NAMES) | set(OP_PRINTERS) | (set(TYPE_RULES) - jax_declared)
            | set(IDENTITY_KINDS) | set(opnames.OWN_OPS))


def test_no_own_op_is_named_like_a_jax_primitive():
    own = _own_op_names()
    assert {opnames.TAG, opnames.TILE, opnames.ATOMIC, opnames.CONSTANT} <= own
    assert {"core.loop", "spmd.execute", "hlo.all_gather"} <= own  # the dialects are read
    assert sorted(own & _registered_jax_primitives()) == []


def test_every_jax_declaration_is_a_jax_primitive():
    jax_names = _registered_jax_primitives()
    assert sorted(set(CATALOGUE) - OWN_NAMES - jax_names) == []
    # JAX's primitives in the catalogue under their own names, not taken for partir's
    assert {"tile", "slice", "stack", "unstack"} <= set(CATALOGUE) - OWN_NAMES


def test_an_own_op_needs_a_namespace():
    with pytest.raises(ValueError, match="namespace"):
        declare("tile2", Primitive(Kind.FREE, no_flops), jax=False)
    assert "tile2" not in CATALOGUE


def test_the_tag_primitive_is_namespaced_and_prints_bare():
    assert tag_p.name == opnames.TAG

    def f(x):
        return jnp.sin(partir.tag(x * 2.0, "h"))

    mesh = partir.Mesh({"b": 2})
    meta = partir.partition(f, mesh, [partir.ManualPartition({"h": 0}, axis="b")],
                            np.ones((4, 3), np.float32))
    assert 'tag "h"' in meta.core_ir and "partir." not in meta.core_ir


@pytest.mark.parametrize("reps", [(1, 2), 3])
def test_jnp_tile_is_not_taken_for_the_value_tiling_identity(reps):
    """A program with JAX's `tile` partitioned on the other input (or on `tile`'s own) gives
    JAX's result: the op was once dropped as partir's identity."""
    def f(x, y):
        return x * 2.0, jnp.sum(jnp.tile(y, reps), axis=-1)

    x = np.arange(8, dtype=np.float32)
    y = np.arange(32, dtype=np.float32).reshape(8, 4)
    for spec in ({"x": 0}, {"y": 0}):
        fn, _ = partir.jit(f, partir.Mesh({"a": 2}), [partir.ManualPartition(spec, axis="a")])
        for got, want in zip(fn(x, y), f(x, y), strict=True):
            np.testing.assert_allclose(np.asarray(got), np.asarray(want))
