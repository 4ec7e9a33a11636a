"""The SPMD oracle: interpreting the SPMD lowering of a Core program computes what the
Core interpreter and the original function compute, and the lowering verifies."""

from __future__ import annotations

import numpy as np
import pytest

import partir
import partir.api
from partir.core.interpreter import interpret
from partir.core.materialize import materialize
from partir.ir import verify
from partir.spmd import interpret_spmd, lower_core_to_spmd
from partir.spmd.ops import EXECUTE
from tests.core.golden import scenarios

SCHEDULE = [
    partir.ManualPartition({"x": 0}, axis="B", name="BP"),
    partir.ManualPartition({"w1": 1}, axis="M", name="MP"),
    partir.ManualPartition({"w1": 0, "w2": 1}, axis="B", name="Z3"),
]


def _inputs(types, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.normal(size=t.shape).astype(t.dtype) for t in types]


def check_lowering(core, mesh, args, want):
    """Lower, verify, and compare the SPMD interpreter with the Core interpreter and
    the expected outputs; returns the SPMD function."""
    spmd = lower_core_to_spmd(core, mesh)
    verify(spmd)
    got = interpret_spmd(spmd, *args)
    for g, c, w in zip(got, interpret(core, *args), want, strict=True):
        np.testing.assert_allclose(g, c, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4)
    return spmd


@pytest.mark.parametrize("tactics", [1, 2, 3], ids=["BP", "BP+MP", "BP+MP+Z3"])
def test_mlp_chain_schedules(tactics):
    args = _inputs(scenarios.CHAIN_ARGS)
    r = partir.core_partition(scenarios.chain, scenarios.MESH, SCHEDULE[:tactics], *args)
    core = materialize(r.program)
    spmd = check_lowering(core, scenarios.MESH, args, [scenarios.chain(*args)])
    executes = [op for op in spmd.ops if op.name == EXECUTE]
    # BP and MP run the whole chain in one execute; Z3 adds the one slicing the weights
    assert [op.params["axes"] for op in executes] == {
        1: [("B",)], 2: [("B", "M")], 3: [("M", "B"), ("B", "M")]}[tactics]


def _scenario_program(monkeypatch, name):
    """The Core program a scenario prints, with the printing options it uses."""
    captured = []

    def capture(prog, **options):
        captured.append((prog, options))
        return ""

    monkeypatch.setattr(scenarios, "print_core", capture)
    monkeypatch.setattr(partir.api, "print_core", capture)
    scenarios.SCENARIOS[name]()
    ((prog, options),) = captured
    return prog, options


@pytest.mark.parametrize("name", sorted(scenarios.SCENARIOS))
def test_paper_scenarios(monkeypatch, name):
    prog, options = _scenario_program(monkeypatch, name)
    core = materialize(prog, **options)
    args = _inputs([a.type for a in core.args], seed=1)
    fn = {"chain": scenarios.chain, "mm": scenarios.mm, "xxt": scenarios.xxt}[core.name]
    check_lowering(core, prog.mesh, args, [fn(*args)])
