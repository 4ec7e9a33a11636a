"""Property test of the lowering on random programs, meshes and schedules: the SPMD
program verifies and, interpreted, computes what the original function computes.

The strategies are the Core property tests' (`tests/core/program_strategies.py`); a
failing case prints as a standalone reproducer of the partitioning.
"""

from __future__ import annotations

from hypothesis import HealthCheck, event, given, note, reject, settings

import partir
from partir.core.materialize import materialize
from partir.ir import print_function, verify
from partir.spmd import interpret_spmd, lower_core_to_spmd
from partir.spmd.ops import EXECUTE
from tests.budget import examples
from tests.core.program_strategies import PartitionCase, partition_cases
from tests.oracles import EXPECTED_ERRORS, assert_same

EXAMPLES = examples(60)
SETTINGS = settings(deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much,
                                           HealthCheck.data_too_large])


@settings(SETTINGS, max_examples=EXAMPLES)
@given(pc=partition_cases())
def test_spmd_interpreter_matches_function(pc: PartitionCase):
    case = pc.program
    try:
        res = partir.core_partition(case.fn, pc.mesh, pc.schedule, *case.args)
    except EXPECTED_ERRORS:
        reject()
    spmd = lower_core_to_spmd(materialize(res.program), res.program.mesh)
    note(f"SPMD program:\n{print_function(spmd)}")
    verify(spmd)
    depth = max((len(op.params["axes"]) for op in spmd.ops if op.name == EXECUTE), default=0)
    event(f"executes span up to {depth} axes")
    outs = interpret_spmd(spmd, *res.flatten_args(*case.args))
    assert_same(tuple(outs), tuple(case.expected()), "SPMD interpreter")
