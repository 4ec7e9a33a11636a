"""Property-based tests of PartIR:Core partitioning on random programs and schedules.

The sequential interpreter is the oracle: for every random program, mesh and schedule,
the Core program after every tactic must compute what the original function computes,
print, and verify. Partitioning may reject a schedule only with the errors a schedule can
legitimately cause (an indivisible dimension, a value tiled twice on an axis).

The strategies live in `tests/core/program_strategies.py`; a failing case prints as a
standalone reproducer script (program source, arguments, mesh and schedule). Explicit
examples pin cases these tests found.
"""

from __future__ import annotations

from hypothesis import HealthCheck, event, example, given, note, reject, settings

import partir
from partir.core.materialize import materialize
from partir.ir import verify
from tests.budget import examples
from tests.core.program_strategies import PartitionCase, partition_cases
from tests.oracles import EXPECTED_ERRORS, REPLICATED_TWICE, STATIC_SLICE, assert_same

# About 0.45 s per interpreted case and 25 ms per partition-only case on 2 cores: ~2.5
# minutes. Random programs in their thousands are the fuzzer's (scripts/fuzz.py).
INTERPRET_EXAMPLES = examples(260)
PARTITION_EXAMPLES = examples(800)
SETTINGS = settings(deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much,
                                           HealthCheck.data_too_large])

@settings(SETTINGS, max_examples=INTERPRET_EXAMPLES)
@given(pc=partition_cases())
@example(pc=STATIC_SLICE)
@example(pc=REPLICATED_TWICE)
def test_interpreter_matches_function_after_every_tactic(pc: PartitionCase):
    note(f"reproducer:\n{pc.reproducer()}")
    case, schedule = pc.program, pc.schedule
    try:
        res = partir.core_partition(case.fn, pc.mesh, schedule, *case.args)
    except EXPECTED_ERRORS:
        reject()
    assert len(res.tactics) == len(schedule)
    event("loops" if any(res.program.nest(op) for op in res.program.ops
                         if not op.is_identity) else "no loops")
    expected = case.expected()
    for i in range(1, len(schedule) + 1):
        note(f"after tactic {i}:\n{res.core_ir(i)}")
        verify(materialize(res.tactics[i - 1].program))
        # The last tactic's program is the final one: check it through the default too.
        after = None if i == len(schedule) else i
        assert_same(res.interpret(*case.args, after=after), expected, f"after tactic {i}")


@settings(SETTINGS, max_examples=PARTITION_EXAMPLES)
@given(pc=partition_cases(only_unknown=None))
@example(pc=STATIC_SLICE)
@example(pc=REPLICATED_TWICE)
def test_partitioning_raises_only_partition_errors(pc: PartitionCase):
    note(f"reproducer:\n{pc.reproducer()}")
    try:
        res = partir.core_partition(pc.program.fn, pc.mesh, pc.schedule, *pc.program.args)
    except partir.PartitionError:
        assert not pc.only_unknown, "a schedule of UNKNOWN inputs raised"
        return
    for i, t in enumerate(res.tactics, 1):
        assert res.core_ir(i)
        verify(materialize(t.program))
        t.program.input_shardings()
        t.program.output_shardings()
        if pc.only_unknown:
            assert not t.program.nests, f"tactic {i} of UNKNOWN inputs made loops"
            assert t.actions == ["propagate"]
            assert not t.conflicts
