"""The primitive catalogue: one declaration per primitive, checked against JAX, from which
the TMR and the simulator's cost rules derive."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from partir.core.tmr import REGISTRY, factor_mappings
from partir.hlo.ops import AXIS_INDEX, COLLECTIVES
from partir.ir import TensorType
from partir.rules import CATALOGUE, REDUCTION, REPLICATION, Factor, Kind, OpView, Primitive
from partir.rules.catalogue import declare, no_flops
from partir.rules.factors import RuleBuilder
from partir.sim import COST_RULES

F32 = np.dtype(np.float32)
ROOT = Path(__file__).resolve().parents[2]


def _view(name, params, in_shapes, out_shapes, dtype=F32):
    return OpView(name, params, tuple(TensorType(s, dtype) for s in in_shapes),
                  tuple(TensorType(s, dtype) for s in out_shapes))


def test_a_name_jax_does_not_have_fails_when_declared():
    with pytest.raises(ValueError, match="not JAX primitives"):
        declare("reduce_summ", Primitive(Kind.REDUCTION, no_flops))
    assert "reduce_summ" not in CATALOGUE


def test_a_primitive_is_declared_once():
    with pytest.raises(ValueError, match="registered twice"):
        declare("add", Primitive(Kind.ELEMENTWISE, no_flops))


def test_tmr_and_cost_rules_derive_from_the_catalogue():
    assert set(REGISTRY) == {n for n, p in CATALOGUE.items() if p.rule is not None}
    assert set(COST_RULES) == set(CATALOGUE)
    for name, p in CATALOGUE.items():
        assert COST_RULES[name].primitive is p


def test_the_hlo_collectives_are_declared_with_the_catalogue_not_by_later_imports():
    # A fresh interpreter: in this one, every stage is imported already.
    code = ("import sys; from partir.rules import CATALOGUE; "
            "print(sorted(n for n in CATALOGUE if n.startswith('hlo.'))); "
            "print('partir.hlo' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=300, cwd=ROOT).stdout.splitlines()
    assert out == [str(sorted({*COLLECTIVES, AXIS_INDEX})), "False"]


def test_factor_kinds_are_checked():
    with pytest.raises(ValueError):
        Factor(4, REDUCTION)  # a reduction needs its monoid
    with pytest.raises(ValueError):
        Factor(4, REPLICATION, "add")


def test_dot_general_factors_and_flops():
    view = _view("dot_general", {"dimension_numbers": (((1,), (0,)), ((), ()))},
                 [(8, 16), (16, 4)], [(8, 4)])
    prim = CATALOGUE["dot_general"]
    rule = prim.rule(view)
    assert rule.sizes == (8, 4, 16)
    assert rule.factors[2].kind == REDUCTION and rule.factors[2].monoid == "add"
    assert rule.operand_dims == ((0, None), (None, 1), (1, 0))
    assert rule.result_dims == ((0,), (1,), (None,))
    assert prim.flops(view, rule) == 2 * 8 * 16 * 4
    # Slicing the contracting factor by 4 leaves each tile a quarter of the FLOPs.
    local = rule.local_sizes([(8, 4), (4, 4)], [(8, 4)])
    assert local == (8, 4, 4) and rule.points(local) * 4 == rule.points()


def test_reshape_splits_into_compound_factors():
    view = _view("reshape", {"new_sizes": (8, 3), "dimensions": None, "sharding": None},
                 [(4, 6)], [(8, 3)])
    rule = CATALOGUE["reshape"].rule(view)
    # 4x6 -> 8x3: factors 4, 2, 3; operand dim 1 is (2, 3), result dim 0 is (4, 2).
    assert rule.sizes == (4, 2, 3)
    assert rule.operands == (((0,), (1, 2)),)
    assert rule.results == (((0, 1), (2,)),)
    # Only the major factor of both sides can be sliced at first ...
    assert [f for f, _ in factor_mappings(rule, rule.sizes)] == [0]
    # ... and once a loop took all of it, the next one of the merged dim.
    local = rule.local_sizes([(1, 6)], [(2, 3)])
    assert local == (1, 2, 3)
    assert [(f, str(m)) for f, m in factor_mappings(rule, local)] == [
        (1, "(#tile<1>) -> #tile<0>")]


def test_reshape_without_common_factors_keeps_what_the_major_dims_share():
    view = _view("reshape", {"new_sizes": (6, 8), "dimensions": None, "sharding": None},
                 [(8, 6)], [(6, 8)])
    rule = CATALOGUE["reshape"].rule(view)
    offered = factor_mappings(rule, rule.sizes)
    assert [(rule.sizes[f], str(m)) for f, m in offered] == [(2, "(#tile<0>) -> #tile<0>")]


def test_a_compound_dimension_gives_its_major_factor_first():
    b = RuleBuilder([1], [2])
    b.factor(4, {0: 0}, {0: 0})
    b.factor(6, {0: 0}, {0: 1})
    rule = b.build()
    # 24 elements split 8 ways: the major factor (4) all taken, the minor halved.
    assert rule.local_sizes([(3,)], [(1, 3)]) == (1, 3)
    assert rule.majors(rule.sizes) == {0}
    assert rule.majors((1, 6)) == {1}


def test_reduce_without_a_monoid_needs_replication():
    prod = CATALOGUE["reduce_prod"].rule(_view("reduce_prod", {"axes": (1,)}, [(4, 6)], [(4,)]))
    assert [f.kind for f in prod.factors] == ["pass-through", REPLICATION]
    ints = CATALOGUE["reduce_or"].rule(_view("reduce_or", {"axes": (1,)}, [(4, 6)], [(4,)],
                                             dtype=np.dtype(np.int32)))
    assert ints.factors[1].kind == REPLICATION  # bitwise on ints, logical as a #sum
