"""The PartIR:HLO oracle: the lowering of an SPMD program, before and after the fusion
passes, verifies and computes on the simulated mesh what the original function computes.

Programs come from the matmul-chain schedules, the paper's Core scenarios, and the random
programs, meshes and schedules of the Core property tests.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, note, reject, settings

import partir
from partir.core.materialize import materialize
from partir.hlo import count_collectives, interpret_hlo, lower_spmd_to_hlo, optimize, verify_hlo
from partir.hlo.printing import print_hlo
from partir.spmd import interpret_spmd, lower_core_to_spmd
from tests.budget import examples
from tests.core.golden import scenarios
from tests.core.program_strategies import PartitionCase, partition_cases
from tests.oracles import EXPECTED_ERRORS, assert_same
from tests.spmd.test_oracle import SCHEDULE, _inputs, _scenario_program

EXAMPLES = examples(60)
SETTINGS = settings(deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much,
                                           HealthCheck.data_too_large])


def check_hlo(spmd, args, want):
    """Lower and optimize the SPMD program; both HLO programs verify and compute `want`.
    Returns the optimized one."""
    hlo = lower_spmd_to_hlo(spmd)
    verify_hlo(hlo, check_primitives=True)
    opt = optimize(hlo)
    verify_hlo(opt, check_primitives=True)
    for fn in (hlo, opt):
        for got, w in zip(interpret_hlo(fn, *args), want, strict=True):
            np.testing.assert_allclose(got, w, rtol=1e-4, atol=1e-4)
    return opt


@pytest.mark.parametrize("tactics", [1, 2, 3], ids=["BP", "BP+MP", "BP+MP+Z3"])
def test_mlp_chain_schedules(tactics):
    args = _inputs(scenarios.CHAIN_ARGS)
    r = partir.core_partition(scenarios.chain, scenarios.MESH, SCHEDULE[:tactics], *args)
    spmd = lower_core_to_spmd(materialize(r.program), scenarios.MESH)
    opt = check_hlo(spmd, args, [scenarios.chain(*args)])
    # Every slice of the inputs ends up in their shardings, every gather of the output in
    # its own: what is left is the communication the strategy needs.
    assert count_collectives(opt)["all_slice"] == 0


@pytest.mark.parametrize("name", sorted(scenarios.SCENARIOS))
def test_paper_scenarios(monkeypatch, name):
    prog, options = _scenario_program(monkeypatch, name)
    core = materialize(prog, **options)
    args = _inputs([a.type for a in core.args], seed=1)
    fn = {"chain": scenarios.chain, "mm": scenarios.mm, "xxt": scenarios.xxt}[core.name]
    check_hlo(lower_core_to_spmd(core, prog.mesh), args, [fn(*args)])


@settings(SETTINGS, max_examples=EXAMPLES)
@given(pc=partition_cases())
def test_hlo_interpreter_matches_function(pc: PartitionCase):
    case = pc.program
    try:
        res = partir.core_partition(case.fn, pc.mesh, pc.schedule, *case.args)
    except EXPECTED_ERRORS:
        reject()
    spmd = lower_core_to_spmd(materialize(res.program), res.program.mesh)
    hlo = lower_spmd_to_hlo(spmd)
    note(f"reproducer:\n{pc.reproducer()}\nPartIR:HLO program:\n{print_hlo(hlo)}")
    verify_hlo(hlo)
    opt = optimize(hlo)
    note(f"optimized:\n{print_hlo(opt)}")
    verify_hlo(opt)
    counts = count_collectives(opt)
    event(", ".join(k for k, n in counts.items() if n) or "no collectives")
    args = res.flatten_args(*case.args)
    expected = tuple(case.expected())
    assert_same(tuple(interpret_hlo(hlo, *args)), expected, "HLO interpreter")
    assert_same(tuple(interpret_hlo(opt, *args)), expected, "HLO interpreter, optimized")


def test_hlo_agrees_with_spmd_interpreter_on_a_stacked_program():
    """The Z3 chain slices the weights in an execute over ("M", "B") and gathers them
    back: the only schedule of the three whose SPMD program redistributes between two
    distributed types. Both interpreters agree on it before optimization."""
    args = _inputs(scenarios.CHAIN_ARGS, seed=2)
    r = partir.core_partition(scenarios.chain, scenarios.MESH, SCHEDULE, *args)
    spmd = lower_core_to_spmd(materialize(r.program), scenarios.MESH)
    hlo = lower_spmd_to_hlo(spmd)
    np.testing.assert_allclose(interpret_hlo(hlo, *args)[0], interpret_spmd(spmd, *args)[0],
                               rtol=1e-5, atol=1e-5)
