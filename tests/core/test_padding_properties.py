"""Property tests of padding: random programs whose dimensions the mesh axes do not
divide (3, 5, 7 on axes of 2 and 4; 6 and 10 on 4), partitioned with the default
`pad=True`, equal the unpartitioned function on both oracles (the sequential Core
interpreter after every tactic, and the SPMD interpreter of the final program) and
executed through `partir.jit` on the 8 CPU devices. Cases whose partitioned program pads
nothing are rejected: each test passes 100 programs that pad. The `nested` cases tile
one dimension on two axes, the second padding the tiles of the first (6 on 2 then 4;
3 on 2 then 4: each tile of a dimension is padded by the axis that splits it).

The programs, meshes and schedules are the other property tests'
(`tests/core/program_strategies.py`), drawn with its dimension sizes replaced."""

from __future__ import annotations

import math
from contextlib import contextmanager

import pytest
from hypothesis import HealthCheck, event, given, note, reject, settings
from hypothesis import strategies as st

import partir
from partir.core.materialize import materialize
from partir.ir import print_function, verify
from partir.spmd import lower_core_to_spmd
from partir.spmd.interpreter import interpret_spmd
from tests.api.test_executed_properties import local_meshes
from tests.budget import examples
from tests.core import program_strategies
from tests.core.program_strategies import PartitionCase, programs, schedules
from tests.oracles import EXPECTED_ERRORS, assert_same

# Sizes no axis divides (3, 5, 7), or only the axis of 2 (6, 10).
PADDED_DIMS = (3, 5, 7, 6, 10)
EXAMPLES = examples(50)
SETTINGS = settings(deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much,
                                           HealthCheck.data_too_large])


@contextmanager
def _dims(dims):
    saved = program_strategies.DIMS
    program_strategies.DIMS = dims
    try:
        yield
    finally:
        program_strategies.DIMS = saved


@st.composite
def padded_cases(draw, local: bool = False, nested: bool = False) -> PartitionCase:
    """A partition case whose inputs (and broadcasts, gathers...) have PADDED_DIMS; with
    `local`, on a mesh of at most 8 devices. With `nested`, on a mesh of 2 or 3 axes,
    and the schedule starts with two tactics on two of them that tile the same
    dimensions of the same inputs (random schedules seldom do)."""
    with _dims(PADDED_DIMS):
        case = draw(programs(max_ops=8), label="program")
        meshes = [m for m in local_meshes() if len(m) > 1] if nested else local_meshes()
        mesh = draw(st.sampled_from(meshes) if local or nested else
                    program_strategies.meshes(), label="mesh")
        schedule = []
        if nested:
            outer, inner = draw(st.permutations(tuple(mesh)), label="axes")[:2]
            ranked = [n for n, s in zip(case.input_names, case.input_shapes, strict=True)
                      if s]
            if not ranked:
                reject()
            names = draw(st.lists(st.sampled_from(ranked), min_size=1, unique=True),
                         label="inputs")
            shape_of = dict(zip(case.input_names, case.input_shapes, strict=True))
            dims = {n: draw(st.integers(0, len(shape_of[n]) - 1), label=f"dim of {n}")
                    for n in names}
            schedule = [partir.ManualPartition(dims, axis=outer, name="outer"),
                        partir.ManualPartition(dims, axis=inner, name="inner")]
        schedule += draw(schedules(case, mesh, min_tactics=0 if nested else 1,
                                   max_tactics=1 if nested else 3), label="schedule")
    return PartitionCase(case, mesh, tuple(schedule))


def _pads_a_divided_dim(res) -> bool:
    """Whether some op's operand has a dimension that a loop pads after an outer loop of
    its nest divided it (the tile of an earlier axis padded by a later one)."""
    program = res.program
    for op in program.ops:
        for i, v in enumerate(op.operands):
            local = list(v.type.shape)
            for lp in program.nest(op):
                d = lp.operands[i]
                if d is None:
                    continue
                n = program.mesh[lp.axis]
                if local[d] % n and local[d] != v.type.shape[d]:
                    return True
                local[d] = -(-local[d] // n)
    return False


def _partition(pc: PartitionCase):
    try:
        res = partir.core_partition(pc.program.fn, pc.mesh, pc.schedule, *pc.program.args)
    except EXPECTED_ERRORS:
        reject()
    padded = any(lp.operands[i] is not None and v.type.shape[lp.operands[i]] % pc.mesh[lp.axis]
                 for op in res.program.ops for lp in res.program.nest(op)
                 for i, v in enumerate(op.operands))
    if not padded:  # every passing case pads (a schedule may replicate, or divide)
        reject()
    return res


@pytest.mark.slow
@settings(SETTINGS, max_examples=EXAMPLES)
@given(pc=padded_cases())
def test_core_interpreter_with_padding(pc: PartitionCase):
    note(f"reproducer:\n{pc.reproducer()}")
    res = _partition(pc)
    expected = pc.program.expected()
    for i in range(1, len(pc.schedule) + 1):
        note(f"after tactic {i}:\n{res.core_ir(i)}")
        verify(materialize(res.tactics[i - 1].program))
        assert_same(res.interpret(*pc.program.args, after=i), expected, f"after tactic {i}")


@pytest.mark.slow
@settings(SETTINGS, max_examples=EXAMPLES)
@given(pc=padded_cases())
def test_spmd_interpreter_with_padding(pc: PartitionCase):
    note(f"reproducer:\n{pc.reproducer()}")
    res = _partition(pc)
    spmd = lower_core_to_spmd(materialize(res.program), res.program.mesh)
    note(f"SPMD program:\n{print_function(spmd)}")
    verify(spmd)
    outs = interpret_spmd(spmd, *res.flatten_args(*pc.program.args))
    assert_same(tuple(outs), tuple(pc.program.expected()), "SPMD interpreter")


@pytest.mark.slow
@settings(SETTINGS, max_examples=EXAMPLES)
@given(pc=padded_cases(nested=True))
def test_padding_a_dimension_an_earlier_axis_divided(pc: PartitionCase):
    """Both oracles and `partir.jit` (every nested case's mesh is local) on schedules
    whose later axis pads the tiles of an earlier one."""
    note(f"reproducer:\n{pc.reproducer()}")
    res = _partition(pc)
    if not _pads_a_divided_dim(res):
        reject()
    expected = pc.program.expected()
    for i in range(1, len(pc.schedule) + 1):
        assert_same(res.interpret(*pc.program.args, after=i), expected, f"after tactic {i}")
    spmd = lower_core_to_spmd(materialize(res.program), res.program.mesh)
    note(f"SPMD program:\n{print_function(spmd)}")
    verify(spmd)
    outs = interpret_spmd(spmd, *res.flatten_args(*pc.program.args))
    assert_same(tuple(outs), tuple(expected), "SPMD interpreter")
    fn, meta = partir.jit(pc.program.fn, pc.mesh, pc.schedule)
    out = fn(*pc.program.args)
    note(f"PartIR:HLO:\n{meta.hlo_ir}")
    assert_same(out, expected, "partir.jit")
    assert meta.padding, "the program pads, so Metadata.padding must say so"


@pytest.mark.slow
@settings(SETTINGS, max_examples=EXAMPLES)
@given(pc=padded_cases(local=True))
def test_jit_executes_with_padding(pc: PartitionCase):
    note(f"reproducer:\n{pc.reproducer()}")
    _partition(pc)
    fn, meta = partir.jit(pc.program.fn, pc.mesh, pc.schedule)
    try:
        out = fn(*pc.program.args)
    except EXPECTED_ERRORS:
        reject()
    note(f"PartIR:HLO:\n{meta.hlo_ir}")
    event(f"mesh of {math.prod(pc.mesh.values())} devices")
    assert meta.padding, "the program pads, so Metadata.padding must say so"
    assert_same(out, pc.program.expected(), "partir.jit")
