"""Property test of `partir.jit` end to end on random programs, meshes and schedules: the
partitioned program, lowered Core -> SPMD -> HLO and executed as `jax.jit(shard_map(...))`
on the 8 virtual CPU devices, computes what the original function computes, and the
`Metadata` it fills agrees with the schedule and the final program.

The strategies are the Core property tests' (`tests/core/program_strategies.py`), with
meshes restricted to the devices this process has (at most 8: axes of size 2 and 4, so
{2}, {4}, {2,2}, {2,4}, {4,2}, {2,2,2}). The programs are the Core tests' (up to 4 inputs
and 10 ops, at most 4096 elements a value): every case compiles an XLA executable, and
small programs keep that to a fraction of a second. Partitioning may reject a schedule
only with the errors a random schedule can legitimately cause (`EXPECTED_ERRORS`); any
other exception fails the test. A failing case prints as a standalone reproducer of the
partitioning, and the PartIR:HLO program that ran.
"""

from __future__ import annotations

import itertools
import math
import re

import jax
from hypothesis import HealthCheck, event, example, given, note, reject, settings
from hypothesis import strategies as st

import partir
from partir.hlo.ops import COLLECTIVES as HLO_COLLECTIVES
from partir.mesh import split_axis_name
from tests.budget import examples
from tests.core.program_strategies import (
    AXIS_NAMES,
    AXIS_SIZES,
    PartitionCase,
    programs,
    schedules,
)
from tests.oracles import EXPECTED_ERRORS, REPLICATED_TWICE, STATIC_SLICE, assert_same

DEVICES = 8
# Each accepted case traces, partitions, lowers and compiles one XLA executable (about
# 0.55 s on 2 cores, so ~2 minutes for the file); rejected cases (an expected
# PartitionError) stop before compiling.
EXAMPLES = examples(200)
MAX_OPS = 10
SETTINGS = settings(deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much,
                                           HealthCheck.data_too_large])
COLLECTIVE_KINDS = {name.removeprefix("hlo.") for name in HLO_COLLECTIVES}


def local_meshes(max_devices: int = DEVICES) -> list[dict[str, int]]:
    """The meshes of `meshes()` (1-3 axes of size 2 or 4) with at most `max_devices`
    devices."""
    return [dict(zip(AXIS_NAMES, sizes, strict=False)) for n in range(1, len(AXIS_NAMES) + 1)
            for sizes in itertools.product(AXIS_SIZES, repeat=n)
            if math.prod(sizes) <= max_devices]


@st.composite
def local_partition_cases(draw) -> PartitionCase:
    case = draw(programs(max_ops=MAX_OPS), label="program")
    mesh = draw(st.sampled_from(local_meshes()), label="mesh")
    schedule = draw(schedules(case, mesh), label="schedule")
    return PartitionCase(case, mesh, tuple(schedule))


def test_local_meshes_fit_the_devices():
    assert len(jax.devices()) >= DEVICES
    found = {tuple(m.values()) for m in local_meshes()}
    assert found == {(2,), (4,), (2, 2), (2, 4), (4, 2), (2, 2, 2)}


def _check_metadata(meta: partir.Metadata, pc: PartitionCase, n_outputs: int) -> None:
    schedule = pc.schedule
    assert [t.name for t in meta.tactics] == [t.label for t in schedule]
    assert [t.axis for t in meta.tactics] == [t.axis for t in schedule]
    names = set(pc.program.input_names)
    for t in meta.tactics:
        assert set(t.collectives) == COLLECTIVE_KINDS, t.collectives
        assert all(isinstance(n, int) and n >= 0 for n in t.collectives.values())
        assert t.core_ir and t.actions
        assert names <= set(t.shardings), (t.name, sorted(t.shardings))
    assert set(meta.collectives) == COLLECTIVE_KINDS
    # The final program is the last tactic's, so its counts are the last tactic's.
    assert meta.collectives == meta.tactics[-1].collectives
    # Each is an op in the printed program, those inside a loop's regions included.
    for kind, n in meta.collectives.items():
        printed = len(re.findall(rf"= {kind}(?=[ <])", meta.hlo_ir))
        assert printed == n, (kind, meta.hlo_ir)
    assert meta.core_ir and meta.spmd_ir and meta.hlo_ir
    # One PartitionSpec per input and output leaf, each of the value's rank.
    specs = jax.tree_util.tree_leaves(
        meta.in_specs, is_leaf=lambda s: isinstance(s, jax.sharding.PartitionSpec))
    assert [len(s) for s in specs] == [len(s) for s in pc.program.input_shapes]
    outs = jax.tree_util.tree_leaves(
        meta.out_specs, is_leaf=lambda s: isinstance(s, jax.sharding.PartitionSpec))
    assert len(outs) == n_outputs
    mesh_axes = set(pc.mesh)
    for spec in specs + outs:
        for entry in spec:
            axes = () if entry is None else (entry,) if isinstance(entry, str) else entry
            # the mesh's axes, or sub-axes of them a reshape split them into
            assert {split_axis_name(a)[0] for a in axes} <= mesh_axes, spec


@settings(SETTINGS, max_examples=EXAMPLES)
@given(pc=local_partition_cases())
@example(pc=STATIC_SLICE)
@example(pc=REPLICATED_TWICE)
def test_jit_executes_like_the_function(pc: PartitionCase):
    note(f"reproducer:\n{pc.reproducer()}")
    case = pc.program
    fn, meta = partir.jit(case.fn, pc.mesh, pc.schedule)
    assert meta.tactics == []  # filled on the first call, as jax.jit traces on first use
    try:
        out = fn(*case.args)
    except EXPECTED_ERRORS:
        reject()
    note(f"PartIR:HLO:\n{meta.hlo_ir}")
    event(f"mesh of {math.prod(pc.mesh.values())} devices")
    event("collectives" if any(meta.collectives.values()) else "no collectives")
    expected = case.expected()
    assert_same(out, expected, "partir.jit")
    _check_metadata(meta, pc, len(jax.tree_util.tree_leaves(expected)))
