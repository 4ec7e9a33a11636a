"""Shrinking a failing case while it keeps failing the same way (greedy delta debugging):
drop chunks of ops, then single ops (with whatever reads them), bypass ops whose argument
has their type, drop outputs, tactics, tactic entries and unused mesh axes. Each round
evaluates a batch of candidates (in parallel on a pool) and keeps the first, in order,
whose outcome has the failure's signature."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

from tests.fuzz.program import (
    Case,
    Program,
    TacticSpec,
    prune,
    render,
    restrict_schedule,
    var_types,
    walk_ops,
)
from tests.fuzz.runner import Outcome, normalize

Evaluate = Callable[[list[Case]], list[Outcome]]


def same_failure(a: Outcome, b: Outcome) -> bool:
    if a.cls != b.cls or a.error != b.error:
        return False
    if a.cls in ("CRASH", "REFUSED"):
        # the message's first words, names and numbers normalized: the same bug, not just
        # the same exception class
        return normalize(a.message)[:60] == normalize(b.message)[:60]
    return True


def size(case: Case) -> tuple[int, ...]:
    ops = list(walk_ops(case.program.ops))
    sched = restrict_schedule(case)
    devices = 1
    for _, n in case.mesh:
        devices *= n
    return (len(ops), sum(len(t.entries) for t in sched), len(sched),
            len(case.program.outputs), len(case.mesh), devices,
            sum(not t.pad for t in sched) + sum(t.name is not None for t in sched))


def _with_program(case: Case, program: Program) -> Case:
    c = case.copy()
    c.program = program
    c.schedule = restrict_schedule(c)
    return c


def candidates(case: Case) -> Iterator[Case]:
    prog = case.program
    top = [op.outs[0].name for op in prog.ops]
    # chunks of top-level ops, halves first
    n = len(top)
    chunk = n // 2
    while chunk >= 2:
        for start in range(0, n, chunk):
            yield _with_program(case, prune(prog, set(top[start:start + chunk])))
        chunk //= 2
    every = [op for op in walk_ops(prog.ops)]
    for op in reversed(every):
        yield _with_program(case, prune(prog, {op.outs[0].name}))
    # bypass: read an argument of the same type instead of the op's result
    types = var_types(prog)
    for op in reversed(every):
        if len(op.outs) != 1:
            continue
        for a in op.args:
            if (types[a].shape, types[a].dtype) == (op.outs[0].shape, op.outs[0].dtype):
                yield _with_program(case, prune(prog, {op.outs[0].name}, {op.outs[0].name: a}))
                break
    if len(prog.outputs) > 1:
        for o in prog.outputs:
            p = Program(prog.inputs, prog.ops, [x for x in prog.outputs if x != o])
            yield _with_program(case, prune(p, set()))
    sched = restrict_schedule(case)
    for i in range(len(sched)):
        c = case.copy()
        c.schedule = sched[:i] + sched[i + 1:]
        yield c
    for i, t in enumerate(sched):
        if len(t.entries) > 1:
            for j in range(len(t.entries)):
                c = case.copy()
                c.schedule = [*sched[:i], TacticSpec(t.axis, t.entries[:j] + t.entries[j + 1:],
                                                     t.name, t.pad), *sched[i + 1:]]
                yield c
        if not t.pad or t.name:
            c = case.copy()
            c.schedule = [*sched[:i], TacticSpec(t.axis, t.entries, None, True), *sched[i + 1:]]
            yield c
    for i, (a, n) in enumerate(case.mesh):
        if n > 2:  # a smaller axis (sub-axes of it may then be refused: not kept)
            c = case.copy()
            c.mesh = [*case.mesh[:i], (a, 2 if n % 2 == 0 else 1), *case.mesh[i + 1:]]
            yield c
    used = {t.axis.split(":")[0] for t in sched}
    for a, _ in case.mesh:
        if a not in used and len(case.mesh) > 1:
            c = case.copy()
            c.mesh = [(b, k) for b, k in case.mesh if b != a]
            yield c


def minimize(case: Case, mode: str, core: bool, failure: Outcome, evaluate: Evaluate,
             batch: int = 1, budget_s: float = 60.0, max_evals: int = 300,
             log: Callable[[str], None] | None = None) -> tuple[Case, int]:
    """The smallest case found (and the evaluations spent) whose outcome is still
    `failure` (same class and error)."""
    deadline = time.monotonic() + budget_s
    current, evals = case, 0
    seen = {render(case, mode, core)}
    # One pass walks the candidate list; after a hit it goes on from the same position in
    # the new case's list (not from the start: the earlier candidates were just tried), and
    # passes repeat until one shrinks nothing.
    pos, shrunk_in_pass = 0, False
    while time.monotonic() < deadline and evals < max_evals:
        cands = [c for c in candidates(current) if size(c) < size(current)]
        group = []
        while pos < len(cands) and len(group) < batch:
            src = render(cands[pos], mode, core)
            pos += 1
            if src not in seen:
                seen.add(src)
                group.append(cands[pos - 1])
        if not group:
            if not shrunk_in_pass:
                break
            pos, shrunk_in_pass = 0, False
            continue
        outs = evaluate(group)
        evals += len(group)
        hit = next((c for c, o in zip(group, outs, strict=True) if same_failure(failure, o)),
                   None)
        if hit is not None:
            current, shrunk_in_pass = hit, True
            pos = max(0, pos - len(group))
            if log:
                log(f"  shrunk to {size(current)[0]} ops ({evals} evaluations)")
    return current, evals
