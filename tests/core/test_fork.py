"""`CoreModule.fork`: resuming a schedule from the state after tactic k-1 on a fork gives
exactly what applying the whole schedule gives, and leaves the forked module alone (the
daemon's incremental re-application relies on both)."""

import pytest

from examples.mlp.model import example_args, mlp
from examples.transformer import model, schedules
from partir.core.module import CoreModule
from partir.core.padding import op_padding, padding_report
from partir.core.printing import print_core
from partir.frontend import trace
from partir.mesh import Mesh
from partir.tactics import ManualPartition
from partir.tactics.driver import apply_tactic, named_values

MLP_SCHEDULE = [
    ManualPartition({"x": 0}, axis="batch", name="BP"),
    ManualPartition({"w1": 1}, axis="model", name="MP"),
    ManualPartition({"w1": 0, "w2": 1}, axis="batch", name="Z3"),
]


def _cases():
    yield "mlp", mlp, example_args(), MLP_SCHEDULE
    tiny = model.abstract_inputs(model.TINY)
    yield "transformer", model.train_step, tiny, [schedules.BP, schedules.MP, schedules.Z3]


def _state(module: CoreModule) -> tuple:
    snap = module.snapshot()
    return (print_core(snap), sorted(map(str, module.conflicts.values())),
            sorted((str(v), a, w) for (v, a), w in module.acted.items()))


@pytest.mark.slow
@pytest.mark.parametrize("case", list(_cases()), ids=lambda c: c[0])
def test_fork_resumes_like_a_full_application(case):
    _, fn, args, schedule = case
    traced = trace(fn, *args)
    mesh = Mesh({"batch": 4, "model": 2})
    full = CoreModule(traced, mesh)
    names = named_values(full, traced)
    full_records = [apply_tactic(full, t, names) for t in schedule]
    expected = _state(full)
    for k in range(len(schedule) + 1):
        # The state after tactics 1..k, then the rest on a fork of it.
        base = CoreModule(traced, mesh)
        base_names = named_values(base, traced)
        for t in schedule[:k]:
            apply_tactic(base, t, base_names)
        before = _state(base)
        fork = base.fork()
        records = [apply_tactic(fork, t, base_names) for t in schedule[k:]]
        assert _state(fork) == expected
        assert [r.actions for r in records] == [r.actions for r in full_records[k:]]
        assert [list(map(str, r.conflicts)) for r in records] == \
            [list(map(str, r.conflicts)) for r in full_records[k:]]
        assert [r.core_ir() for r in records] == [r.core_ir() for r in full_records[k:]]
        assert _state(base) == before  # the forked module is unaffected


def test_fork_twice_from_one_state_gives_independent_modules():
    traced = trace(mlp, *example_args())
    mesh = Mesh({"batch": 4, "model": 2})
    base = CoreModule(traced, mesh)
    names = named_values(base, traced)
    apply_tactic(base, MLP_SCHEDULE[0], names)
    a, b = base.fork(), base.fork()
    apply_tactic(a, MLP_SCHEDULE[1], names)
    apply_tactic(b, ManualPartition({"w2": 0}, axis="model", name="other"), names)
    assert _state(a) != _state(b)
    again = base.fork()
    apply_tactic(again, MLP_SCHEDULE[1], names)
    assert _state(again) == _state(a)


def _uses(module: CoreModule) -> dict:
    return {v: list(u) for v, u in module.uses.items() if u}


def test_a_fork_copies_only_the_use_lists_a_rewrite_changes():
    """A fork shares its parent's per-value use lists, and either module copies a list
    before it first changes it: a schedule's states fork once per tactic, and copying
    every list cost each tactic of a 200-tactic schedule as much as propagating it. Neither
    module sees the other's rewrites."""
    traced = trace(mlp, *example_args())
    base = CoreModule(traced, Mesh({"batch": 4, "model": 2}))
    names = named_values(base, traced)
    apply_tactic(base, MLP_SCHEDULE[0], names)
    before = _uses(base)
    fork = base.fork()
    apply_tactic(fork, MLP_SCHEDULE[1], names)
    assert _uses(base) == before
    changed = [v for v, u in before.items() if fork.uses.get(v) != u]
    shared = [v for v in before if fork.uses.get(v) is base.uses[v]]
    assert changed and len(shared) > len(changed)
    forked = _uses(fork)
    apply_tactic(base, MLP_SCHEDULE[2], names)
    assert _uses(base) != before and _uses(fork) == forked


def test_a_forks_padding_is_its_parents_with_the_ops_it_changed_looked_at_again():
    """`CoreModule.changed`: the ops a fork's rewrites changed, from which its program's
    padding is made from its parent's (`op_padding`), as made whole; on a mesh whose
    batch axis of 3 pads the transformer's dimensions."""
    traced = trace(model.train_step, *model.abstract_inputs(model.TINY))
    module = CoreModule(traced, Mesh({"batch": 3, "model": 2}))
    names = named_values(module, traced)
    ops = op_padding(module.snapshot())
    for tactic in [schedules.BP, schedules.MP, schedules.Z3]:
        module = module.fork()
        program = apply_tactic(module, tactic, names).program
        assert 0 < len(module.changed) < len(program.ops)
        ops = op_padding(program, since=ops,
                         changed=[module.by_uid[uid] for uid in module.changed])
        assert padding_report(program, ops=ops) == padding_report(program)
    assert ops.ops, "the batch axis of 3 pads"
