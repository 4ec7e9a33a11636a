"""Golden tests: the paper's Core listings, up to value names."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

import partir
from partir.core.materialize import materialize
from partir.ir import verify
from tests.core.golden import scenarios
from tests.core.golden.expected import EXPECTED
from tests.listings import normalize


@pytest.mark.parametrize("name", sorted(scenarios.SCENARIOS))
def test_listing(name):
    assert normalize(scenarios.SCENARIOS[name]()) == normalize(EXPECTED[name].rstrip("\n"))


def test_normalize_is_only_renaming():
    a = "%x = matmul(%x1, %w) : t\n%y = add(%x, %x)"
    b = "%0 = matmul(%1, %2) : t\n%3 = add(%0, %0)"
    assert normalize(a) == normalize(b)
    assert normalize(a) != normalize(b.replace("add(%0, %0)", "add(%0, %1)"))


def _chain_inputs():
    rng = np.random.default_rng(0)
    return [rng.normal(size=a.shape).astype(np.float32) for a in scenarios.CHAIN_ARGS]


def test_conflict_of_x_and_w1_is_recorded():
    r = partir.core_partition(scenarios.chain, scenarios.MESH,
                              [partir.ManualPartition({"x": 0, "w1": 1}, axis="B")],
                              *scenarios.CHAIN_ARGS)
    (c,) = r.conflicts
    assert (c.kind, c.op, c.axis) == ("multiple_matches", "dot_general", "B")
    assert c.choices == ("(#tile<0>, ⊥) -> #tile<0>", "(⊥, #tile<1>) -> #tile<1>")
    assert c.loc.file.endswith("scenarios.py") and c.loc.line > 0


def test_incremental_resolution_records_axis_in_scope():
    r = partir.core_partition(scenarios.chain, scenarios.MESH,
                              [partir.ManualPartition({"x": 0}, axis="B"),
                               partir.ManualPartition({"w1": 1}, axis="B")],
                              *scenarios.CHAIN_ARGS)
    assert r.tactics[0].conflicts == []
    (c,) = r.tactics[1].conflicts
    assert c.kind == "axis_in_scope" and c.axis == "B"


def test_transpose_conflict_and_its_resolution():
    x = jnp.asarray(np.random.default_rng(1).normal(size=(256, 256)), jnp.float32)
    mesh = scenarios.MESH
    r = partir.core_partition(scenarios.xxt, mesh, [partir.ManualPartition({"x": 0}, axis="M")],
                              x)
    assert [c.kind for c in r.conflicts] == ["multiple_matches"]
    r = partir.core_partition(scenarios.xxt, mesh, [partir.ManualPartition(
        {"transposed": partir.REPLICATED, "x": 0}, axis="M")], x)
    assert r.conflicts == []
    assert r.tactics[0].actions == ['atomic<%transposed,"M">', 'tile<%x,0,"M">', "propagate"]
    np.testing.assert_allclose(r.interpret(x), scenarios.xxt(x), rtol=1e-4, atol=1e-3)


def test_paper_schedule_actions_and_oracle():
    """Section 3: the BP, MP, Z3 schedule issues 7 actions; every step equals f."""
    args = _chain_inputs()
    r = partir.core_partition(scenarios.chain, scenarios.MESH, [
        partir.ManualPartition({"x": 0}, axis="B"),
        partir.ManualPartition({"w1": 1}, axis="M"),
        partir.ManualPartition({"w1": 0, "w2": 1}, axis="B"),
    ], *args)
    assert [t.actions for t in r.tactics] == [
        ['tile<%x,0,"B">', "propagate"],
        ['tile<%w1,1,"M">', "propagate"],
        ['tile<%w1,0,"B">', 'tile<%w2,1,"B">', "propagate"],
    ]
    want = scenarios.chain(*args)
    for i in range(4):
        np.testing.assert_allclose(r.interpret(*args, after=i), want, rtol=1e-4, atol=1e-4)
        verify(materialize(r.tactics[i - 1].program if i else r.initial), check_primitives=True)
    shardings = r.program.input_shardings()
    assert str(shardings["x"]) == '[{"B"}, {}]'
    assert str(shardings["w1"]) == '[{"B"}, {"M"}]'
    assert str(shardings["w2"]) == '[{"M"}, {"B"}]'
