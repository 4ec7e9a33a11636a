"""The search behind `AutomaticPartition`: which inputs (and tagged values) to tile on
which dimension along the tactic's mesh axes, guided by the simulator.

Action space. A decision tiles a *group* of values on one dimension along one axis. The
values of a group have the same shape and names that differ only in their numeric path
components (`params/layers/3/w_up` and `params/layers/7/w_up` are `params/layers/*/w_up`):
a repeated layer is decided once for all its copies. Each (group, dim, axis) is first
applied alone to the state the search starts from, on a fork, and propagated; candidates
whose propagation reaches the same shardings of the inputs and outputs are one decision
(tiling `w_up` on d_ff, `w_down` on d_ff or `b_up` is one Megatron MLP decision, and the
optimizer's moments follow their parameters), so the first pass evaluates distinct
outcomes, not tensors; later passes try the candidates in the order of how much their
outcome alone improved (batch parallelism first when it pays most).

Search. Passes of local search, each from the `beam_width` best states the previous
pass reached (1 by default: a greedy descent). A pass expands every live candidate from
its state — incrementally: a child is a `CoreModule.fork()` of its parent with one
decision's tile actions and a propagation from them, never a re-partition from scratch —
and deduplicates the children by the shardings they reach *there* (a parameter tiled on
"batch" is batch parallelism alone but ZeRO-like after BP, so outcomes equal from the
start may differ later); each distinct outcome is evaluated once in the whole search.
Then, unless the pass starts from the fully replicated program (where every candidate
parallelises the whole program alone: alternatives, not parts of one strategy):

- pair moves: the `PAIRS` best improving candidates two at a time. They find decisions
  worth more together than apart (Megatron's attention and MLP shardings, each alone
  worse than sharding the sequence, which then blocks them);
- compound moves: the improving candidates (the best pair first when it beats every
  single) applied together, one per group and axis, evaluated after 2, 4, 8, ... of them
  while that improves: independent decisions (sharding each parameter's optimizer state,
  ZeRO-like) are so taken in one step rather than one pass each.

The next pass starts from the best states reached; a state's children try only the
candidates that improved on it (the others made it worse or changed nothing), and a
candidate whose values are all already sharded on its axis is dropped for good. It stops
when a pass improves on nothing, when a state has `max_decisions`, or when the budget
(seconds, or evaluations) runs out: it is anytime, returning the best state found.

An evaluation lowers the state's program to PartIR:HLO and simulates it (`partir.sim`);
the cost is the simulated step time, with the device's memory capacity as a hard
constraint (a state that fits beats any that does not; among states that do not fit, the
smaller step time scaled by the memory excess is better, so that decisions saving time
and memory come before those saving memory only) — objective "step_time" — or the peak
memory then the step time (objective "memory").

The search is deterministic for a seed (which orders the candidates, hence ties and what
a budget cut off), unless the time budget cuts it short.
"""

from __future__ import annotations

import random
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from partir.cancel import Cancelled, checkpoint, report
from partir.core.module import CoreModule
from partir.core.propagation import propagate
from partir.core.value_actions import tile_value
from partir.errors import PartitionError
from partir.ir import Value
from partir.tactics.manual import ActionSpec, issue

if TYPE_CHECKING:
    from partir.core.program import CoreProgram
    from partir.tactics.auto import AutomaticPartition

# A cost has the fields of `partir.sim.Cost` the search reads: step_time_s,
# peak_memory_bytes, memory_capacity_bytes, fits (tactics come before lowering and the
# simulator in the pipeline, so the search is given its evaluator).
Cost = Any
Evaluator = Callable[["CoreProgram"], Cost]
_evaluator_factory: Callable[[str | None], tuple[str, Evaluator]] | None = None


def register_evaluator(factory: Callable[[str | None], tuple[str, Evaluator]]) -> None:
    """Set how the search evaluates a program: `factory(device)` gives the device's
    name and a function from a Core program to its simulated cost (`partir.api`
    registers lowering + `partir.sim.simulate`)."""
    global _evaluator_factory
    _evaluator_factory = factory

OBJECTIVES = ("step_time", "memory")
PAIRS = 5  # the best improving candidates of a pass tried two at a time

_NUMERIC = re.compile(r"(?<![^/])\d+(?![^/])")  # a whole numeric path component


def name_pattern(name: str) -> str:
    """`params/layers/3/w_up` -> `params/layers/*/w_up`."""
    return _NUMERIC.sub("*", name)


@dataclass(frozen=True)
class Group:
    """Values decided together: same shape, names equal up to numeric components."""

    pattern: str
    names: tuple[str, ...]
    shape: tuple[int, ...]


@dataclass(frozen=True)
class Candidate:
    group: Group
    dim: int
    axis: str

    def __str__(self) -> str:
        return f'tile<{self.group.pattern},{self.dim},"{self.axis}">'


@dataclass(frozen=True)
class Decision:
    """A candidate as taken in a state: the values it tiled (those of its group that
    were not already sharded on the axis there)."""

    candidate: Candidate
    names: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        c = self.candidate
        return {"inputs": c.group.pattern, "dim": c.dim, "axis": c.axis,
                "names": list(self.names)}


@dataclass
class State:
    module: CoreModule
    decisions: tuple[Decision, ...]
    signature: tuple
    sharded: dict[str, set[str]]  # input name -> the axes some dim of it is sharded on
    cost: Cost | None = None
    key: tuple = (3,)
    # The candidates its children try (those that improved on its parent); None: all.
    improving: frozenset | None = None


@dataclass
class Found:
    decisions: tuple[Decision, ...]
    record: dict[str, Any]
    notes: list[str] = field(default_factory=list)
    signature: tuple | None = None  # the best state's shardings


def groups(names: Mapping[str, list[Value]], prefixes: Sequence[str] | None) -> list[Group]:
    out: dict[tuple, list[str]] = {}
    for name, values in names.items():
        if prefixes is not None and not any(name == p or name.startswith(p + "/")
                                            for p in prefixes):
            continue
        shapes = tuple(v.type.shape for v in values)
        if not shapes or len(set(shapes)) != 1 or not shapes[0]:
            continue  # scalars, and tags of values of several shapes
        out.setdefault((name_pattern(name), shapes[0]), []).append(name)
    return [Group(p, tuple(ns), shape) for (p, shape), ns in out.items()]


def _signature(module: CoreModule) -> tuple[tuple, dict[str, set[str]]]:
    snap = module.snapshot()
    ins = snap.input_shardings()
    outs = snap.output_shardings()
    sig = (tuple((n, tuple(map(tuple, s.dims))) for n, s in ins.items()),
           tuple((n, tuple(map(tuple, s.dims))) for n, s in outs.items()))
    sharded = {n: {a for axes in s.dims for a in axes} for n, s in ins.items()}
    return sig, sharded


class _Search:
    def __init__(self, module: CoreModule, names: Mapping[str, list[Value]],
                 tactic: AutomaticPartition) -> None:
        if _evaluator_factory is None:
            raise RuntimeError("no evaluator registered for the search (import partir)")
        self.names = names
        self.tactic = tactic
        self.device_name, self.evaluator = _evaluator_factory(tactic.device)
        self.start = time.perf_counter()
        self.deadline = self.start + tactic.budget_s
        self.evaluations = 0
        self.expansions = 0
        self.failed = 0
        self.duplicates = 0
        self.seen: dict[tuple, State] = {}
        self.history: list[list[float]] = []
        self.best: State | None = None
        self.stopped = "converged"
        self.expand_s = self.evaluate_s = 0.0  # time spent expanding, evaluating
        self.dead: set[Candidate] = set()  # candidates that can no longer change a state
        self.order: list[Candidate] = []
        self.pass_log: list[tuple[Candidate, State | None]] = []
        self.position: dict[str, int] = {}
        self.keep: frozenset = frozenset()
        sig, sharded = _signature(module)
        self.root = State(module.fork(), (), sig, sharded)
        self.replicated = not any(sharded.values())  # no input sharded on any axis
        self.seen[sig] = self.root
        self.evaluate(self.root)
        self.best = self.root
        self.note_best(self.root)

    # -- budget ---------------------------------------------------------------------------
    def out_of_budget(self) -> bool:
        checkpoint()
        # Stop when the next step (an expansion and an evaluation, as long as they have
        # taken on average) would end past the budget: the budget bounds the search's
        # time rather than when it starts its last evaluation.
        step = (self.expand_s / max(self.expansions, 1) +
                self.evaluate_s / max(self.evaluations, 1))
        if time.perf_counter() + step >= self.deadline:
            self.stopped = "budget"
            return True
        limit = self.tactic.max_evaluations
        if limit is not None and self.evaluations >= limit:
            self.stopped = "max_evaluations"
            return True
        return False

    # -- states ---------------------------------------------------------------------------
    def expand(self, state: State, cand: Candidate) -> State | None:
        """The state with the candidate applied and propagated, on a fork; None when it
        changes nothing there or cannot be applied."""
        axis = cand.axis
        module = state.module
        parts = module.mesh.parts(axis) or (axis,)
        members = tuple(n for n in cand.group.names if axis not in state.sharded.get(n, ())
                        and not any((v, p) in module.acted for v in self.names[n]
                                    for p in parts))
        if not members:  # all already sharded on the axis: so in every descendant
            self.dead.add(cand)
            return None
        self.expansions += 1
        began = time.perf_counter()
        try:
            return self._expand(state, cand, members)
        finally:
            self.expand_s += time.perf_counter() - began

    def _expand(self, state: State, cand: Candidate, members: tuple[str, ...]) -> State | None:
        axis = cand.axis
        module = state.module
        fork = module.fork()
        seeds: list[int] = []
        try:
            for n in members:
                for v in self.names[n]:
                    seeds += tile_value(fork, v, cand.dim, axis, label=f"input {n!r}",
                                        tactic=self.tactic.label)
            propagate(fork, seeds)
        except PartitionError:
            self.failed += 1
            return None
        sig, sharded = _signature(fork)
        if sig == state.signature:
            return None
        return State(fork, (*state.decisions, Decision(cand, members)), sig, sharded)

    def key(self, cost: Cost) -> tuple:
        if self.tactic.objective == "memory":
            return (0, cost.peak_memory_bytes, cost.step_time_s)
        if cost.peak_memory_bytes <= cost.memory_capacity_bytes:
            return (0, cost.step_time_s, cost.peak_memory_bytes)
        # Not fitting: the step time scaled by how much too large the state is, so that a
        # decision that saves both time and memory (model parallelism) is preferred to
        # one that saves memory only (sharding an optimizer state), on the way to fit.
        over = cost.peak_memory_bytes / cost.memory_capacity_bytes
        return (1, cost.step_time_s * over, cost.peak_memory_bytes)

    def evaluate(self, state: State) -> None:
        self.evaluations += 1
        began = time.perf_counter()
        try:
            state.cost = self.evaluator(state.module.snapshot())
        except Cancelled:
            raise
        except Exception:  # a lowering the stack does not support: not a strategy
            self.failed += 1
            state.cost, state.key = None, (2,)
            return
        finally:
            self.evaluate_s += time.perf_counter() - began
        state.key = self.key(state.cost)
        best = self.best.cost if self.best is not None else None
        report(f"{self.evaluations} evaluations" +
               (f", best step {best.step_time_s * 1e3:.1f} ms" if best else ""),
               self.evaluations, self.tactic.max_evaluations)

    def note_best(self, state: State) -> None:
        if self.best is None or state.key < self.best.key or state is self.best:
            self.best = state
            cost = state.cost
            self.history.append([round(time.perf_counter() - self.start, 4),
                                 cost.step_time_s if cost else float("nan"),
                                 cost.peak_memory_bytes if cost else 0, self.evaluations])

    def visit(self, state: State | None) -> State | None:
        """Evaluate a new state (None if already seen or out of budget)."""
        if state is None:
            return None
        if state.signature in self.seen:
            self.duplicates += 1
            return None
        self.seen[state.signature] = state
        self.evaluate(state)
        self.note_best(state)
        return state

    # -- the search -----------------------------------------------------------------------
    def run(self) -> Found:
        tactic = self.tactic
        mesh = self.root.module.mesh
        all_groups = groups(self.names, tactic.inputs)
        raw = [Candidate(g, d, axis) for axis in tactic.axis_names for g in all_groups
               for d, size in enumerate(g.shape) if size % mesh.check_axis(axis) == 0]
        random.Random(tactic.seed).shuffle(raw)
        self.order = raw
        self.position = {n: i for i, n in enumerate(self.names)}
        # Pass 0 from the starting state: every candidate alone; those reaching the same
        # shardings are one outcome. Later passes try the candidates in the order of how
        # much their outcome alone improved (batch parallelism first when it pays most).
        first = self.descend([self.root], 0)
        rank = {}
        for k, (cand, child) in enumerate(self.pass_log):
            rank[cand] = (child.key if child is not None else (4,),
                          self.position[cand.group.names[0]], k)
        self.order = sorted(raw, key=lambda c: rank.get(c, ((5,), 0, 0)))
        n_distinct = len({child.signature for _, child in self.pass_log if child is not None})
        n_promising = sum(1 for _, child in self.pass_log
                          if child is not None and child.key < self.root.key)
        frontier, depth = first, 1
        while frontier and self.stopped == "converged":
            frontier = self.descend(frontier, depth)
            depth += 1
        return self.found(len(all_groups), len(raw), n_distinct, n_promising)

    def descend(self, frontier: list[State], depth: int) -> list[State]:
        """One pass: from each of the `beam_width` best states of the frontier, try every
        live candidate (deduplicated by the shardings it reaches there, each outcome
        evaluated once), then compound the improving ones (see `compound`). The next
        frontier: the best states this pass reached that improve on their parent."""
        tactic = self.tactic
        nexts: list[State] = []
        for state in frontier[:tactic.beam_width]:
            if len(state.decisions) >= tactic.max_decisions:
                self.stopped = "max_decisions"
                break
            improving = self.one_pass(state)
            # From the replicated program every candidate parallelises the whole program
            # on its own: they are alternatives, not to be paired or compounded.
            if improving and (depth > 0 or not self.replicated) and \
                    self.stopped == "converged":
                pairs = self.pairs(state, improving)
                nexts += pairs
                if self.stopped == "converged":
                    nexts += self.compound(state, improving, min(pairs, default=None,
                                                                 key=lambda p: p.key))
            nexts += [c for c, _ in improving]
            if self.stopped != "converged":
                break
        unique = {id(s): s for s in nexts}
        return sorted(unique.values(), key=lambda s: s.key)

    def one_pass(self, state: State) -> list[tuple[State, Candidate]]:
        """The children of `state` by one candidate each that improve on it, best first."""
        taken = {d.candidate for d in state.decisions}
        improving: dict[int, tuple[State, Candidate]] = {}
        self.pass_log = []
        tried = []
        local: set[tuple[str, str]] = set()  # (group, axis) with an improving local dim
        for cand in self.order:
            if cand in taken or cand in self.dead or \
                    (state.improving is not None and cand not in state.improving):
                continue
            tried.append(cand)
            if (cand.group.pattern, cand.axis) in local:
                continue
            if self.out_of_budget():
                break
            child = self.expand(state, cand)
            if child is None:
                self.pass_log.append((cand, None))
                continue
            known = self.seen.get(child.signature)
            if known is not None:
                self.duplicates += 1
                # The same outcome: name it by the decision on the earliest input (a
                # parameter rather than its optimizer moment), whatever the seed's order.
                if known.decisions[:-1] == state.decisions and \
                        known.decisions[-1].candidate != cand and \
                        self.position[cand.group.names[0]] < \
                        self.position[known.decisions[-1].candidate.group.names[0]]:
                    known.decisions = child.decisions
                child = known
            else:
                self.visit(child)
            self.pass_log.append((cand, child))
            if child.key < state.key:
                improving.setdefault(id(child), (child, cand))
                if _local(state, child, cand):
                    local.add((cand.group.pattern, cand.axis))
        # Name each improving child by its (renamed) decision when it is one from `state`.
        improving = {k: (c, c.decisions[-1].candidate
                         if c.decisions[:-1] == state.decisions else cand)
                     for k, (c, cand) in improving.items()}
        # A state's children try only the candidates that improved on it (the others
        # made it worse, or changed nothing); when the pass was cut short by the budget,
        # the untried ones too.
        keep = {c for _, c in improving.values()} | {c for c in self.order if c not in tried}
        self.keep = frozenset(keep)
        for child, _ in improving.values():
            if child.improving is None:
                child.improving = self.keep
        return sorted(improving.values(), key=lambda sc: sc[0].key)

    def pairs(self, state: State, improving: list[tuple[State, Candidate]]) -> list[State]:
        """Pair moves: the `PAIRS` best improving candidates (one per group and axis)
        applied two at a time, each pair evaluated once. They find decisions worth more
        together than apart — Megatron's attention and MLP shardings on one axis, each
        alone worse than a one-step alternative (sharding the sequence) that blocks them."""
        top: list[tuple[State, Candidate]] = []
        used: set[tuple[str, str]] = set()
        for child, cand in improving:
            if (cand.group.pattern, cand.axis) not in used and len(top) < PAIRS:
                used.add((cand.group.pattern, cand.axis))
                top.append((child, cand))
        out: list[State] = []
        for i, (first, _) in enumerate(top):
            for _, cand in top[i + 1:]:
                if len(first.decisions) >= self.tactic.max_decisions or self.out_of_budget():
                    return out
                child = self.expand(first, cand)
                if child is None:
                    continue
                reached = self.settle(child)
                if reached.key < first.key:
                    out.append(reached)
        return out

    def compound(self, state: State, improving: list[tuple[State, Candidate]],
                 pair: State | None = None) -> list[State]:
        """Compound moves: the improving candidates of a pass applied together, best
        first — one per group and axis (the others tile the same values another way) and
        skipping those that no longer change anything — evaluated after 2, 4, 8, ... of
        them and after the last, each prefix extending the one before; stops at the first
        that does not improve on the best so far. Independent decisions (say, sharding each
        parameter's optimizer state) are so taken in one step rather than one pass each."""
        best = improving[0][0]
        if pair is not None and pair.key < best.key:
            # The best pair beats every single: the compound starts with it.
            first = [d.candidate for d in pair.decisions[len(state.decisions):]]
            improving = [(pair, c) for c in first] + \
                [sc for sc in improving if sc[1] not in first]
            best = pair
        out: list[State] = []
        current, applied, target = state, 0, 2
        used: set[tuple[str, str]] = set()
        pending = False
        for k, (_, cand) in enumerate(improving):
            if (cand.group.pattern, cand.axis) in used:
                continue
            if len(current.decisions) >= self.tactic.max_decisions or self.out_of_budget():
                return out
            child = self.expand(current, cand)
            if child is None:
                continue
            current, applied, pending = child, applied + 1, True
            used.add((cand.group.pattern, cand.axis))
            if applied < target and k < len(improving) - 1:
                continue
            pending = False
            if applied < 2:
                continue
            reached = self.settle(current)
            if reached.key >= best.key:
                return out
            best = reached
            out.append(reached)
            target *= 2
        if pending and applied >= 2 and not self.out_of_budget():
            reached = self.settle(current)
            if reached.key < best.key:
                out.append(reached)
        return out

    def settle(self, state: State) -> State:
        """The state as evaluated (the earlier one when its shardings were seen)."""
        known = self.seen.get(state.signature)
        if known is not None:
            self.duplicates += 1
        else:
            self.visit(state)
        reached = known or state
        if reached.improving is None:
            reached.improving = self.keep
        return reached

    def found(self, n_groups: int, n_raw: int, n_distinct: int, n_promising: int) -> Found:
        best = self.best
        record = {
            "objective": self.tactic.objective, "device": self.device_name,
            "axes": list(self.tactic.axis_names), "seed": self.tactic.seed,
            "budget_s": self.tactic.budget_s,
            "elapsed_s": round(time.perf_counter() - self.start, 4),
            "stopped": self.stopped, "evaluations": self.evaluations,
            "expansions": self.expansions, "duplicates": self.duplicates,
            "failed": self.failed, "groups": n_groups, "candidates": n_raw,
            "distinct": n_distinct, "promising": n_promising,
            "baseline": _cost_json(self.root.cost), "best": _cost_json(best.cost),
            "history": self.history,
            "decisions": [d.to_json() for d in best.decisions],
        }
        notes = [f"search: {len(best.decisions)} decision(s) after {self.evaluations} "
                 f"evaluations in {record['elapsed_s']:.2f} s ({self.stopped})"]
        if best.cost is not None and not best.cost.fits:
            notes.append(f"search: the best strategy found does not fit the memory of "
                         f"{self.device_name} ({best.cost.peak_memory_bytes / 2**30:.2f} GiB "
                         f"> {best.cost.memory_capacity_bytes / 2**30:.2f} GiB)")
        return Found(best.decisions, record, notes, best.signature)


def _local(parent: State, child: State, cand: Candidate) -> bool:
    """Whether the candidate changed, of the inputs, only its group's values and their
    mirrors (inputs of the same leaf name: a parameter's optimizer moments). The dimension
    of such a decision (ZeRO-like: it shards storage and the update, nothing the rest of
    the program sees) matters little, so once one improves, a pass skips the group's other
    dimensions on that axis."""
    leaf = cand.group.pattern.rsplit("/", 1)[-1]
    before = dict(parent.signature[0])
    return all(n.rsplit("/", 1)[-1] == leaf for n, dims in child.signature[0]
               if before.get(n) != dims)


def _cost_json(cost: Cost | None) -> dict[str, Any] | None:
    if cost is None:
        return None
    return {"step_time_s": cost.step_time_s, "peak_memory_bytes": cost.peak_memory_bytes,
            "fits": cost.fits}


def search(module: CoreModule, names: Mapping[str, list[Value]],
           tactic: AutomaticPartition) -> Found:
    """Search from `module`'s state (left unchanged) for the tactic's decisions."""
    return _Search(module, names, tactic).run()


# -- applying what was found ----------------------------------------------------------------


def blocks(decisions: Sequence[Decision], joint: bool) -> list[list[Decision]]:
    """The decisions as ManualPartition-like steps (one axis each, tiles then one
    propagation): runs of one axis when `joint`, else one step per decision."""
    out: list[list[Decision]] = []
    for d in decisions:
        if joint and out and out[-1][0].candidate.axis == d.candidate.axis:
            out[-1].append(d)
        else:
            out.append([d])
    return out


def _specs(block: list[Decision], names: Mapping[str, list[Value]]) -> list[ActionSpec]:
    return [ActionSpec("tile", n, v, d.candidate.axis, d.candidate.dim)
            for d in block for n in d.names for v in names[n]]


def replay(module: CoreModule, names: Mapping[str, list[Value]], found: Found,
           tactic: AutomaticPartition) -> tuple[list[str], float]:
    """Apply the decisions found to `module` as the ManualPartitions `emit` writes: runs
    of decisions on one axis together when that reaches the search's state (checked on a
    fork), else one decision at a time, as the search applied them. Records the steps in
    `found.record["manual"]`."""
    joint = True
    if len(found.decisions) > 1:
        fork = module.fork()
        for block in blocks(found.decisions, True):
            issue(fork, _specs(block, names), tactic.label, tactic.loc)
        sig, _ = _signature(fork)
        joint = found.signature is None or sig == found.signature
    actions: list[str] = []
    prop_s = 0.0
    steps = []
    for block in blocks(found.decisions, joint):
        acts, s = issue(module, _specs(block, names), tactic.label, tactic.loc)
        actions += acts
        prop_s += s
        steps.append({"axis": block[0].candidate.axis,
                      "inputs": {n: d.candidate.dim for d in block for n in d.names}})
    found.record["manual"] = steps
    # The steps as source, for tools that do not import partir (the language server).
    found.record["source"] = manual_source(found.record, tactic.label)
    if not actions:
        actions.append("propagate")
    return actions, prop_s


# -- the decisions as source --------------------------------------------------------------


def _dict_source(inputs: Mapping[str, int], indent: str) -> str:
    """A dict literal of the inputs, with each run of names that differ in one numeric
    component counting 0, 1, ..., n-1 written as a comprehension."""
    items = list(inputs.items())
    parts: list[str] = []
    i = 0
    while i < len(items):
        j, prefix, suffix = _run(items, i)
        if j - i > 1:
            parts.append(f'**{{f"{prefix}{{i}}{suffix}": {items[i][1]} '
                         f"for i in range({j - i})}}")
        else:
            parts.append(f"{items[i][0]!r}: {items[i][1]}")
        i = j
    inner = ",\n".join(indent + "    " + p for p in parts)
    return "{\n" + inner + ",\n" + indent + "}"


def _run(items: list[tuple[str, int]], i: int) -> tuple[int, str, str]:
    """The end of the run starting at items[i], and the text around its counter."""
    name, dim = items[i]
    if any(c in name for c in '{}"\\'):
        return i + 1, "", ""
    for m in _NUMERIC.finditer(name):
        if m.group() != "0":
            continue
        prefix, suffix = name[:m.start()], name[m.end():]
        j = i + 1
        while j < len(items) and items[j] == (f"{prefix}{j - i}{suffix}", dim):
            j += 1
        if j - i > 1:
            return j, prefix, suffix
    return i + 1, "", ""


def manual_source(record: Mapping[str, Any], name: str, indent: str = "") -> list[str]:
    """Each step of a search record as `partir.ManualPartition(...)` source."""
    steps = record.get("manual", [])
    out = []
    for k, step in enumerate(steps, 1):
        label = name if len(steps) == 1 else f"{name}.{k}"
        out.append(f"partir.ManualPartition({_dict_source(step['inputs'], indent)}, "
                   f"axis={step['axis']!r}, name={label!r})")
    return out
