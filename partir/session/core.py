"""The compiler core that tools analyse schedule files with, in process (DESIGN §6, §8):
a `Session` executes schedule files and keeps traces and per-tactic `State`s cached, so
that an edit of tactic k resumes from the state after tactic k-1. The daemon's compiler
process wraps one (`partir_daemon.engine`) and only translates to and from its protocol;
tests call it directly.

    session = Session(workspace)
    analysis = session.analyse("t32.partir.py", token=token)  # load, trace, apply
    analysis.tactics()          # typed: TacticResult.metadata is a TacticMetadata
    session.lower(analysis, token=token)                     # collectives and cost
    session.ir(analysis, "hlo", after=2); session.explain(analysis, name="params")

Work is cancellable: each call takes an optional `partir.CancellationToken`, checked
between tactics and inside propagation, lowering and simulation (`partir.cancel`), so
that a newer revision stops the older one within milliseconds. A cancelled tactic
rewrote a fork of its cached predecessor (`CoreModule.fork`) and a cancelled lowering
built new programs: both are dropped, every cache stays valid.

Caches:
- traces, keyed by `Fingerprinter.trace_key` (function fingerprint with the workspace
  modules it imports, argument shapes/dtypes, static args, JAX version), each with the
  content hashes of its workspace dependencies;
- states, keyed by the hash chain over (trace, mesh, tactic 1..i): the Core module after
  tactic i (never rewritten again: the next tactic applies to a fork of it), its
  `TacticRecord`, and lazily its `TacticMetadata`;
- what a program determines (`ProgramFacts`: its padding, its collectives and cost,
  which need it lowered and simulated, the shardings of its named values): a state
  whose tactic changed nothing shares its predecessor's (of 200 one-leaf tactics of a
  transformer, 151 name a leaf that propagation from an earlier one sharded already),
  and before a program is lowered its content (`fingerprint.program_key`) finds the
  collectives and cost of an equal program lowered before (an edit that undoes another,
  after its states were evicted), so that a program is lowered once however many
  states have it; its padding (which diagnostics need) is its parent state's with the
  records of the ops its tactic changed (`CoreModule.changed`) made again;
- a few lowered programs, for `ir` and `explain`, by program;
- per trace, the fragments lowering made (`partir.ir.fragments`: materialized loop nests
  and their SPMD translations, by op), so that lowering a state's program makes afresh
  only what its tactic changed since a program lowered before (of 2,490 ops of a
  200-tactic schedule's states, a one-leaf tactic changes a few dozen).
Traces and states share one LRU bound on entries and on held ops; program facts, which
hold no program, have a bound of their own on entries.

Files are hashed before they run and checked again after: the schedule file read from
disk is hashed as read (the text executed is that one), the user's modules as imported
(`partir.user_modules` reads and hashes them before the import). Once the analysis is
done, a file whose content now differs — an edit landed while it ran — drops the trace
made from it and the analysis runs again (at most MAX_STALE_RERUNS times), so that a
result is never cached under a content it was not made from.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import logging
import math
import os
import signal
import threading
import time
import traceback
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterable
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from partir.api import LOWERED_FIELDS, applied_metadata, tactic_metadata
from partir.cancel import CancellationToken, Cancelled, Progress, cancellable, reporting
from partir.core.module import CoreModule
from partir.core.padding import OpPadding, op_padding, padding_report
from partir.core.printing import print_core
from partir.core.program import CoreProgram, sharding_of
from partir.errors import PartitionError, UnknownInputError
from partir.forked import run_forked
from partir.frontend import TracedProgram, trace
from partir.frontend.source import is_user_file
from partir.gcpause import paused_gc
from partir.ir import Location
from partir.ir.fragments import Fragments
from partir.ir.types import tile_size
from partir.metadata import TacticMetadata
from partir.pipeline import Lowered, lower
from partir.schedule_file import (
    ScheduleExecutionError,
    ScheduleFile,
    ScheduleFileError,
    ScheduleMissingError,
    ScheduleSyntaxError,
    ScheduleTypeError,
    SourceRange,
    load_schedule_file,
)
from partir.session import results as R
from partir.session.cache import LruCache
from partir.session.definitions import definitions
from partir.session.fingerprint import (
    Fingerprinter,
    chain,
    mesh_key,
    program_key,
    same_program,
)
from partir.tactics import PipelinePartition, TacticRecord, pipelined
from partir.tactics.driver import apply_tactic, named_values
from partir.user_modules import USER_MODULES, content_hash

log = logging.getLogger("partir.session")
_SESSION_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep

# (message, step, total): what the session is doing, for a tool to show.

# Lowering in several processes pays (a fork, some 20 ms) from programs this large in all.
PARALLEL_MIN_OPS = 4_000
# Lowered programs kept for `ir`/`explain` (each is a full Core+SPMD+HLO program).
MAX_LOWERED = 6
# How many times an analysis runs again because a file it read changed meanwhile.
MAX_STALE_RERUNS = 3

__all__ = ["Analysis", "Cancelled", "Explanation", "Invalidation", "Session",
           "SessionStats", "State", "TacticResult", "TraceEntry"]


def _no_progress(message: str, step: int | None, total: int | None) -> None:
    pass


class ScheduleLoadTimeout(Exception):
    """Raised inside the schedule file's code when executing it takes too long."""


class LoadInterrupted(Exception):
    """Raised inside the schedule file's code when its request is cancelled (a newer
    revision arrived): a file that loops must not hold back the fix of its loop."""


# Sent to the process to interrupt the schedule file it is executing (user code, which
# checks no token); ignored outside `_time_limit` (see `ignore_interrupts`).
INTERRUPT_SIGNAL = signal.SIGUSR1


def ignore_interrupts() -> None:
    """An interrupt that arrives just after the load it was meant for ends is dropped (the
    work is then cancelled by its token)."""
    signal.signal(INTERRUPT_SIGNAL, signal.SIG_IGN)


@dataclass
class TraceEntry:
    key: str
    traced: TracedProgram
    files: dict[str, str | None]  # workspace dependencies -> content hash when traced
    function: str
    elapsed_s: float
    # (kind, name) -> where inputs and tags are defined in the user's code, made once
    definitions: dict[tuple[str, str], list[R.SourceLocation]] | None = None
    # What lowering the programs of its states made, by op: consecutive states differ in
    # the few ops their tactic changed, and only those are lowered again
    fragments: Fragments = field(default_factory=Fragments)


@dataclass
class ProgramFacts:
    """What a program determines, made once per program and shared by the states that
    have it. Each field is set once made whole (a cancelled lowering leaves it None)."""

    trace_key: str
    key: int | None = None  # `program_key`, made when first needed (to lower the program)
    padding: list[dict[str, Any]] | None = None  # `partir.core.padding.padding_report`
    op_padding: OpPadding | None = None  # its ops' part, which the next program's starts from
    # LOWERED_FIELDS of its TacticMetadata: collectives, executed ones, cost
    lowered: dict[str, Any] | None = None
    attribution: Counter | None = None  # collective signature -> count, for explain
    core_ir: str | None = None  # printed on request
    # (kind, name) -> the sharding of each value so named
    value_shardings: dict[tuple[str, str], list[list[list[str]]]] | None = None


@dataclass
class State:
    """The program after a prefix of a schedule (immutable once cached: the next tactic
    applies to a fork of `module`)."""

    key: str
    trace_key: str
    module: CoreModule  # the state after this tactic; never rewritten again
    record: TacticRecord | None  # None for the traced program (state 0)
    facts: ProgramFacts  # shared with the states whose programs equal this one's
    metadata: TacticMetadata | None = None  # complete: lowered and simulated, made once
    applied: TacticMetadata | None = None  # short of lowering, made once
    _initial: CoreProgram | None = None
    # The facts of the state its module was forked from (whose program differs from this
    # one's in the ops `module.changed`), None for the traced program's
    previous: ProgramFacts | None = None

    @property
    def program(self) -> CoreProgram:
        if self.record is not None:
            return self.record.program
        if self._initial is None:
            self._initial = self.module.snapshot()
        return self._initial

    @property
    def lowered(self) -> bool:
        """Whether its collectives and cost are known (its program, or an equal one, was
        lowered and simulated)."""
        return self.facts.lowered is not None

    def applied_metadata(self, fragments: Fragments | None = None) -> TacticMetadata:
        """Its tactic's metadata short of lowering, its program's padding shared (made
        with its trace's `fragments`)."""
        if self.applied is None:
            facts = self.facts
            if facts.padding is None:
                # From the previous program's, looking at the ops this one changed only
                since = self.previous.op_padding if self.previous is not None else None
                changed = [self.module.by_uid[uid] for uid in self.module.changed] \
                    if since is not None else []
                with paused_gc():
                    facts.op_padding = op_padding(self.program, fragments, since, changed)
                    facts.padding = padding_report(self.program, ops=facts.op_padding)
            # The shardings of every input and output stay deferred: no tool reads them
            # on every edit (`values` has them by value).
            self.applied = applied_metadata(self.record, defer=True).replaced(
                padding=facts.padding)
        return self.applied

    def complete_metadata(self, fragments: Fragments | None = None) -> TacticMetadata | None:
        """Its tactic's complete metadata once its program is lowered, else None."""
        if self.metadata is None and self.facts.lowered is not None:
            self.metadata = self.applied_metadata(fragments).replaced(**self.facts.lowered)
        return self.metadata

    def renamed(self, name: str) -> State:
        """This state under another tactic name: what a name labels (its record and
        metadata) is renamed, what the program determines is shared."""
        def named(metadata: TacticMetadata | None) -> TacticMetadata | None:
            return None if metadata is None else metadata.replaced(name=name)
        return dataclasses.replace(self, record=dataclasses.replace(self.record, name=name),
                                   metadata=named(self.metadata), applied=named(self.applied))


@dataclass
class TacticResult:
    """One applied tactic of an analysis. `metadata` is the complete `TacticMetadata`
    once the state is lowered (`lowered`), else the one short of lowering (no
    collectives, no cost)."""

    index: int  # 1-based
    name: str
    axis: str
    range: R.Range | None
    inputs: dict[str, R.Range]  # each key of the tactic's inputs dict -> its source range
    reused: bool  # taken from the cache
    state: str  # hash-chain key of the state after this tactic
    metadata: TacticMetadata
    lowered: bool


@dataclass
class Analysis:
    """What `Session.analyse` computed for a schedule file: its diagnostics, the trace,
    and one `State` per applied tactic (up to a failing one)."""

    path: str
    schedule_file: ScheduleFile | None
    diagnostics: list[R.Diagnostic]
    trace: TraceEntry | None = None
    trace_cached: bool = False
    invalidated_by: list[str] = field(default_factory=list)
    initial: State | None = None
    states: list[State] = field(default_factory=list)  # one per applied tactic
    reused: list[bool] = field(default_factory=list)
    timings: R.Timings = field(default_factory=R.Timings)
    dependencies: list[str] = field(default_factory=list)  # the user's modules it imported
    # `Session.values`, made once: lowering changes no sharding, and a tool sends the
    # values with each result while the states are lowered
    values: list[R.ExplainedValue] | None = None

    @property
    def ok(self) -> bool:
        return not self.diagnostics

    @property
    def program(self) -> TracedProgram | None:
        """The program the tactics rewrite: the trace, as the schedule's pipeline tactic
        rewrote it (`partir.tactics.pipelined`)."""
        if self.initial is not None:
            return self.initial.module.traced
        return self.trace.traced if self.trace is not None else None

    @property
    def reused_indexes(self) -> list[int]:
        return [i for i, r in enumerate(self.reused, 1) if r]

    @property
    def applied_indexes(self) -> list[int]:
        return [i for i, r in enumerate(self.reused, 1) if not r]

    def tactics(self) -> list[TacticResult]:
        """The applied tactics, typed, with the metadata known so far."""
        sf = self.schedule_file
        fragments = self.trace.fragments if self.trace is not None else None
        out = []
        for i, (st, reused) in enumerate(zip(self.states, self.reused, strict=True), 1):
            source = sf.tactics[i - 1]
            metadata = st.complete_metadata(fragments)
            out.append(TacticResult(
                i, st.record.name, st.record.axis, _range(source.span),
                {k: _range(r) for k, r in source.inputs.items()}, reused, st.key[:16],
                metadata or st.applied_metadata(fragments), metadata is not None))
        return out


@dataclass
class Explanation:
    values: list[R.ExplainedValue]
    collectives: list[R.AttributedCollective]


@dataclass
class Invalidation:
    paths: list[str]  # the files whose content differs from what a trace or import saw
    traces: int  # traces dropped


@dataclass
class SessionStats:
    traces: int
    states: int
    trace_hits: int
    trace_misses: int
    state_hits: int
    state_misses: int
    invalidations: int
    evictions: int
    held_ops: int
    max_ops: int
    max_entries: int
    cancelled_requests: int
    lowered: int
    tactics_applied: int


@dataclass
class Loaded:
    """A schedule file as last executed, reused while its text and the user's modules it
    imported are unchanged: hovers, IR and explain requests ask again for the text the
    last analysis ran."""

    text: str
    schedule_file: ScheduleFile


class Session:
    """Analyses schedule files of `workspace`, caching traces and per-tactic states.
    Not thread-safe: one call at a time (another thread may cancel its token).
    `tool_dirs`: code of the tool running the session, never taken for the user's.
    `lowering_processes`: how many processes lower an edit's states (this one and forks
    of it, `partir.forked`)."""

    def __init__(self, workspace: str, *, load_timeout_s: float = 30.0,
                 max_entries: int = 256, max_ops: int = 4_000_000,
                 tool_dirs: Iterable[str] = (), lowering_processes: int = 1) -> None:
        self.workspace = os.path.realpath(workspace)
        self.lowering_processes = lowering_processes
        self.load_timeout_s = load_timeout_s
        self.tool_dirs = tuple(os.path.abspath(d) + os.sep for d in tool_dirs)
        # What the caches drop, freed by `release` between requests.
        self._dropped: list[Any] = []
        self.traces: LruCache[str, TraceEntry] = LruCache(max_entries, max_ops,
                                                          self._dropped.append)
        self.states: LruCache[str, State] = LruCache(max_entries, max_ops,
                                                     self._dropped.append)
        self.programs: LruCache[tuple[str, int], ProgramFacts] = LruCache(
            max_entries, max_entries)
        self.lowered: OrderedDict[tuple[str, int], Lowered] = OrderedDict()
        self.invalidations = 0
        self.cancelled = 0
        self.lowerings = 0
        self.tactics_applied = 0
        self.stale_reruns = 0  # analyses run again: a file changed while they ran
        self._last_trace: dict[str, str] = {}  # schedule path -> trace key last used
        self._invalidated_by: dict[str, list[str]] = {}  # path -> changed files, unreported
        self._loaded: dict[str, Loaded] = {}  # schedule path -> as last executed

    # -- the shared bound ----------------------------------------------------------------
    def _put_trace(self, entry: TraceEntry) -> None:
        self.traces.put(entry.key, entry, len(entry.traced.function.ops))
        self._rebalance()

    def _put_state(self, entry: State) -> None:
        self.states.put(entry.key, entry, len(entry.module.ops))
        self._rebalance()

    def _rebalance(self) -> None:
        # One bound for both caches: evict states first (cheap to recompute from a trace),
        # then traces, always keeping the newest of each.
        limit_n = self.states.max_entries
        limit_ops = self.states.max_cost
        while (len(self.states) + len(self.traces) > limit_n or
               self.states.cost + self.traces.cost > limit_ops):
            cache = self.states if len(self.states) > 1 else self.traces
            if len(cache) <= 1:
                break
            key = next(iter(k for k, _ in cache.items()))
            self._dropped.append(cache.pop(key))
            cache.counters.evictions += 1

    # -- requests ------------------------------------------------------------------------
    def lower(self, analysis: Analysis, progress: Progress = _no_progress,
              token: CancellationToken | None = None,
              lowered: Callable[[int], None] | None = None) -> None:
        """Lower and simulate the program of each applied state not lowered before (its
        metadata then complete, with collectives and cost), in the schedule's order, in
        `lowering_processes` processes (`partir.forked`; the programs of an edit are
        independent); `lowered` is called with the (1-based) index of each state
        lowered (a tool shows the tactics lowered so far)."""
        t0 = time.perf_counter()
        states = analysis.states
        # The first state of each program: the states whose tactic changed nothing share
        # their predecessor's facts, lowered with it.
        first: dict[int, int] = {}
        for i, st in enumerate(states, 1):
            if not st.lowered:
                first.setdefault(id(st.facts), i)
        todo = list(first.values())
        processes = self.lowering_processes if sum(
            len(states[i - 1].module.ops) for i in todo) >= PARALLEL_MIN_OPS else 1

        def work(i: int) -> tuple[int, dict[str, Any], Counter, bool]:
            st = states[i - 1]
            before = self.lowerings
            self._lower(st)
            return self._key(st)[1], st.facts.lowered, st.facts.attribution, \
                self.lowerings > before

        def done(i: int, result: tuple[int, dict[str, Any], Counter, bool]) -> None:
            facts = states[i - 1].facts
            if facts.lowered is None:  # lowered by a forked process
                key, facts.lowered, facts.attribution, made = result
                facts.key = key
                if made:
                    self.programs.put((facts.trace_key, key), facts, 1)
                    self.lowerings += 1
            # here, not in `work`: a forked process must not write to this one's pipes
            progress(f"collectives after tactic {i}/{len(states)}", i, len(states))
            analysis.timings.metadata_s = time.perf_counter() - t0
            if lowered is not None:
                lowered(i)

        with self._counting_cancel(), cancellable(token):
            run_forked(todo, work, done, processes)
        analysis.timings.metadata_s = time.perf_counter() - t0

    def ir(self, analysis: Analysis, level: str = "core", after: int | None = None,
           token: CancellationToken | None = None) -> str:
        """The program after tactic `after` (0: the traced one; None: the last) at
        `level` ("core", "spmd" or "hlo"). ValueError for an `after` out of range."""
        n = len(analysis.states)
        after = n if after is None else after
        if analysis.initial is None or not 0 <= after <= n:
            raise ValueError(f"after={after}: the schedule has {n} applied tactics (0 is "
                             f"the traced program)")
        state = analysis.initial if after == 0 else analysis.states[after - 1]
        if level == "core":
            return print_core(state.program)
        with self._counting_cancel(), cancellable(token):
            return self._lowered(state).text(level)

    def explain(self, analysis: Analysis, *, name: str | None = None,
                file: str | None = None, line: int | None = None,
                progress: Progress = _no_progress,
                token: CancellationToken | None = None) -> Explanation:
        """The values named `name` (an input, output or tag, or a prefix of one's path), or
        the values defined at `file`:`line`, with their sharding history; the
        collectives of the final program that concern them, each with the tactic that
        introduced it."""
        if name is None and file is None:
            raise ValueError("explain needs a `name`, or a `file` (and `line`)")
        result = Explanation([], [])
        if analysis.trace is None or not analysis.states:
            return result
        traced = analysis.program
        states = analysis.states
        if name is not None:
            result.values = [v for v in _values(traced, states, self._definitions(
                analysis.trace, analysis.schedule_file)) if _matches(v.name, name)]
        elif line is not None:
            result.values = _explain_line(file, line, states)
        attributions = []
        with self._counting_cancel(), cancellable(token):
            for i, state in enumerate(states, 1):
                if token is not None:
                    token.check()
                facts = state.facts
                if facts.attribution is None:
                    progress(f"lowering the program after tactic {i}", i, len(states))
                    facts.attribution = self._lowered(state).collective_sites()
                attributions.append(facts.attribution)
        result.collectives = [c for c in _introductions(attributions, states)
                              if _concerns(c, name, file, line)]
        return result

    def values(self, analysis: Analysis) -> list[R.ExplainedValue]:
        """Every input, output and tagged value with its sharding after each tactic (the
        analysis's, made once)."""
        if analysis.trace is None:
            return []
        if analysis.values is None:
            analysis.values = _values(analysis.program, analysis.states,
                                      self._definitions(analysis.trace, analysis.schedule_file))
        return analysis.values

    @staticmethod
    def collectives(analysis: Analysis) -> list[R.AttributedCollective] | None:
        """The final program's collectives attributed to tactics, once every state is
        lowered (else None)."""
        states = analysis.states
        if states and all(st.facts.attribution is not None for st in states):
            return _introductions([st.facts.attribution for st in states], states)
        return None

    @staticmethod
    def core_ir(state: State) -> str:
        facts = state.facts
        if facts.core_ir is None:
            facts.core_ir = print_core(state.program)
        return facts.core_ir

    def _definitions(self, trace: TraceEntry, sf: ScheduleFile
                     ) -> dict[tuple[str, str], list[R.SourceLocation]]:
        if trace.definitions is None:
            # The function's own modules first: they build its inputs more often than
            # the schedule's helpers (which name leaves too, to partition them).
            trace.definitions = definitions(trace.traced, sf.program.fn,
                                            [*sorted(trace.files), *sf.dependencies])
        return trace.definitions

    def invalidate(self, paths: Iterable[str]) -> Invalidation:
        """Drop the traces (and their states) that depend on a changed file, confirmed by
        its content hash (an editor that rewrites a file unchanged invalidates nothing).
        Returns the files whose content differs from what a trace or an import saw (the
        user's modules are imported again at the next load that needs them)."""
        changed = {os.path.realpath(p) for p in paths}
        current = {p: content_hash(p) for p in changed}
        known: dict[str, set[str | None]] = {}
        for file, digest in USER_MODULES.digests().items():
            known.setdefault(os.path.realpath(file), set()).add(digest)
        doomed: dict[str, list[str]] = {}
        for key, entry in self.traces.items():
            for f, digest in entry.files.items():
                known.setdefault(os.path.realpath(f), set()).add(digest)
            stale = sorted(f for f in entry.files if os.path.realpath(f) in changed
                           and current[os.path.realpath(f)] != entry.files[f])
            if stale:
                doomed[key] = stale
        for key, stale in doomed.items():
            self._drop_trace(key)
            for path, last in self._last_trace.items():
                if last == key:
                    self._invalidated_by[path] = stale
        differ = sorted(p for p in changed if p in known and known[p] != {current[p]})
        return Invalidation(differ, len(doomed))

    def stats(self) -> SessionStats:
        return SessionStats(
            len(self.traces), len(self.states), self.traces.counters.hits,
            self.traces.counters.misses, self.states.counters.hits,
            self.states.counters.misses, self.invalidations,
            self.traces.counters.evictions + self.states.counters.evictions,
            self.traces.cost + self.states.cost, self.states.max_cost,
            self.states.max_entries, self.cancelled, self.lowerings, self.tactics_applied)

    @contextmanager
    def _counting_cancel(self):
        try:
            yield
        except Cancelled:
            self.cancelled += 1
            raise

    def _lower(self, state: State) -> None:
        facts = state.facts
        key = self._key(state)
        known = self.programs.get(key)
        if known is not None and known.lowered is not None:  # an equal program's
            facts.lowered, facts.attribution = known.lowered, known.attribution
            return
        # the lowered program stays cached for `ir` and `explain`, which need it next;
        # the facts are set only once everything is made (cancellable)
        with paused_gc():
            lowered = self._lowered(state)
            made = tactic_metadata(state.record, core_ir=False, lowered=lowered, defer=True)
            fields = {name: getattr(made, name) for name in LOWERED_FIELDS}
            attribution = lowered.collective_sites()
        facts.lowered, facts.attribution = fields, attribution
        self.programs.put(key, facts, 1)
        self.lowerings += 1

    def release(self) -> None:
        """Free the programs the caches dropped. Between requests: freeing one lowered
        program's objects takes some 50 ms that the request evicting it need not wait."""
        self._dropped.clear()

    def _drop_trace(self, key: str) -> None:
        self.traces.pop(key)
        self.states.drop_where(lambda _, s: s.trace_key == key)
        self.programs.drop_where(lambda _, facts: facts.trace_key == key)
        for program in [k for k in self.lowered if k[0] == key]:
            self._dropped.append(self.lowered.pop(program))
        self.invalidations += 1

    def _lowered(self, state: State) -> Lowered:
        key = self._key(state)
        found = self.lowered.get(key)
        if found is None:
            trace = self.traces.peek(state.trace_key)
            found = self.lowered[key] = lower(
                state.program, trace.fragments if trace is not None else None)
            while len(self.lowered) > MAX_LOWERED:
                self._dropped.append(self.lowered.popitem(last=False))
        self.lowered.move_to_end(key)
        return found

    @staticmethod
    def _facts(trace_key: str, program: CoreProgram, before: State | None) -> ProgramFacts:
        """The facts of `program` (of the trace `trace_key`): those of the state `before`
        it when its tactic changed nothing, else new ones."""
        if before is not None and same_program(before.program, program):
            return before.facts
        return ProgramFacts(trace_key)

    @staticmethod
    def _key(state: State) -> tuple[str, int]:
        """The state's program by content (among those of its trace): a walk over its
        ops, made once, only for a program to lower (not for the first answer to an
        edit)."""
        facts = state.facts
        if facts.key is None:
            with paused_gc():
                facts.key = program_key(state.program)
        return facts.trace_key, facts.key

    # -- the incremental pipeline --------------------------------------------------------
    def analyse(self, path: str, text: str | None = None, progress: Progress = _no_progress,
                token: CancellationToken | None = None) -> Analysis:
        """Load, trace and apply the schedule file at `path` (relative to the workspace,
        or absolute; `text`: its unsaved contents), from the longest cached prefix of its
        schedule, again while a file it read changed during the analysis. Raises
        `Cancelled` when `token` is cancelled (between tactics, inside propagation)."""
        path = os.path.abspath(os.path.join(self.workspace, path))
        with self._counting_cancel(), cancellable(token):
            for attempt in range(MAX_STALE_RERUNS + 1):
                digest = None
                source = text
                if text is None:  # read (and hashed) here: the text executed is this one
                    try:
                        with open(path, "rb") as f:
                            data = f.read()
                        digest = hashlib.sha256(data).hexdigest()
                        source = importlib.util.decode_source(data)
                    except (OSError, SyntaxError, UnicodeDecodeError):
                        source = None  # reported by load_schedule_file
                analysis = self._analyse(path, source, progress, token)
                changed = self._changed_since(analysis, path, digest)
                if not changed:
                    return analysis
                self.stale_reruns += 1
                if analysis.trace is not None:
                    self._drop_trace(analysis.trace.key)
                self._loaded.pop(path, None)
                log.info("%s: %s changed while it was analysed (run %d); analysing again",
                         path, ", ".join(changed), attempt + 1)
        return analysis

    def _changed_since(self, analysis: Analysis, path: str, digest: str | None
                       ) -> list[str]:
        """The files the analysis read whose content differs now from when it read them:
        the schedule file (read here when not given as text), the workspace modules the
        trace was keyed by, and the user's modules the schedule file imported."""
        read = dict(analysis.trace.files) if analysis.trace is not None else {}
        imported = _imported_digests(os.path.dirname(path))
        for f in analysis.dependencies:
            if f in imported:
                read.setdefault(f, imported[f])
        if digest is not None:
            read[path] = digest
        return sorted(f for f, h in read.items() if content_hash(f) != h)

    def _analyse(self, path: str, text: str | None, progress: Progress,
                 token: CancellationToken | None) -> Analysis:
        timings = R.Timings()
        start = time.perf_counter()
        progress("loading the schedule file", None, None)
        try:
            sf = self._load(path, text)
        except ScheduleFileError as e:
            return Analysis(path, None, [_file_diagnostic(e)], timings=timings,
                            dependencies=e.dependencies)
        timings.load_s = time.perf_counter() - start
        # The daemon measures the load timeout until this message, then the compile one.
        progress("loaded", None, None)
        analysis = Analysis(path, sf, [], timings=timings, dependencies=sf.dependencies)

        fp = Fingerprinter([self.workspace, os.path.dirname(path)],
                           _imported_digests(os.path.dirname(path)), self.tool_dirs)
        trace_key = fp.trace_key(sf.program)
        files = dict(fp.files)
        self._check_previous_trace(path, trace_key)
        analysis.invalidated_by = self._invalidated_by.pop(path, [])
        self._last_trace[path] = trace_key
        entry = self.traces.get(trace_key)
        analysis.trace_cached = entry is not None
        if entry is None:
            if token is not None:
                token.check()
            progress("tracing", None, None)
            t0 = time.perf_counter()
            try:
                traced = trace(sf.program.fn, *sf.program.args,
                               static_argnums=sf.program.static_argnums)
            except Exception as e:  # TracingError, or the user's function raising
                analysis.diagnostics.append(_tracing_diagnostic(e, sf, self.tool_dirs))
                return analysis
            entry = TraceEntry(trace_key, traced, files, traced.function.name,
                               time.perf_counter() - t0)
            self._put_trace(entry)
            timings.trace_s = entry.elapsed_s
        analysis.trace = entry

        key = chain(trace_key, mesh_key(sf.mesh))
        # The program the tactics rewrite depends on the schedule's pipeline tactic too.
        rewrites = [t for t in sf.schedule if isinstance(t, PipelinePartition)]
        for t in rewrites:
            key = chain(key, fp.tactic_key(t))
        state = self.states.get(key)
        if state is None:
            try:
                traced = pipelined(entry.traced, sf.mesh, rewrites)
            except Cancelled:
                raise
            except Exception as e:
                # At the pipeline tactic (the second one, where a schedule has two).
                at = [k for k, t in enumerate(sf.schedule, 1)
                      if isinstance(t, PipelinePartition)]
                i = at[1] if len(at) > 1 else at[0]
                inputs = {n: [v] for n, v in zip(entry.traced.input_names,
                                                  entry.traced.function.args, strict=True)}
                analysis.diagnostics.append(
                    _tactic_diagnostic(e, sf, i, inputs, self.tool_dirs))
                return analysis
            module = CoreModule(traced, sf.mesh)
            initial = module.snapshot()
            state = State(key, trace_key, module, None, self._facts(trace_key, initial, None),
                          _initial=initial)
            self._put_state(state)
        analysis.initial = state
        names = named_values(state.module, state.module.traced)
        n = len(sf.schedule)
        t0 = time.perf_counter()
        for i, tactic in enumerate(sf.schedule, 1):
            if token is not None:
                token.check()
            key = chain(key, fp.tactic_key(tactic))
            found = self.states.get(key)
            analysis.reused.append(found is not None)
            if found is not None and found.record.name != tactic.label:
                # Renamed: the same program, under the name the schedule gives it now.
                found = found.renamed(tactic.label)
                self._put_state(found)
            if found is None:
                progress(f"tactic {i}/{n}: {tactic.label}", i, n)
                # A fork: a cancelled (or failing) tactic leaves the cached state intact.
                module = state.module.fork()

                def within(message: str, step: int | None, total: int | None,
                           i: int = i, label: str = tactic.label) -> None:
                    progress(f"tactic {i}/{n}: {label}: {message}", i, n)

                try:
                    with reporting(within):
                        record = apply_tactic(module, tactic, names)
                except Cancelled:
                    raise
                except Exception as e:
                    analysis.reused.pop()
                    analysis.diagnostics.append(
                        _tactic_diagnostic(e, sf, i, names, self.tool_dirs))
                    break
                self.tactics_applied += 1
                found = State(key, trace_key, module, record,
                              self._facts(trace_key, record.program, state),
                              previous=state.facts)
                self._put_state(found)
            analysis.states.append(found)
            state = found
        timings.tactics_s = time.perf_counter() - t0
        return analysis

    def _check_previous_trace(self, path: str, trace_key: str) -> None:
        """A new trace key for a schedule file whose previous trace depended on files that
        changed on disk: drop that trace now, even if the watcher has not reported yet."""
        previous = self._last_trace.get(path)
        if previous is None or previous == trace_key:
            return
        entry = self.traces.peek(previous)
        if entry is None:
            return
        stale = sorted(f for f, h in entry.files.items() if content_hash(f) != h)
        if stale:
            self._drop_trace(previous)
            self._invalidated_by[path] = stale

    def _load(self, path: str, text: str | None) -> ScheduleFile:
        if text is None:
            try:
                with open(path, "rb") as f:
                    text = importlib.util.decode_source(f.read())
            except (OSError, SyntaxError, UnicodeDecodeError):
                pass  # reported by load_schedule_file
        last = self._loaded.get(path)
        if last is not None and last.text == text and \
                not USER_MODULES.stale(os.path.dirname(path)):
            return last.schedule_file
        self._loaded.pop(path, None)
        try:
            with _time_limit(self.load_timeout_s):
                try:
                    sf = load_schedule_file(path, text, abstract_args=True)
                    if text is not None:
                        self._loaded[path] = Loaded(text, sf)
                    return sf
                except ScheduleExecutionError as e:
                    if e.exc_type == LoadInterrupted.__name__:
                        raise Cancelled from None
                    if e.exc_type == ScheduleLoadTimeout.__name__:
                        # Where the loop is, below the schedule file: the deepest user frame
                        # of the interrupted code (the alarm handler's own frame is ours).
                        original = e.__context__
                        inner = _user_frame(original) if original is not None else None
                        inner = inner if inner is not None and inner.file != path else None
                        e.inner = inner and Location(inner.file, inner.line, inner.function)
                        e.message = (f"executing the schedule file did not finish within "
                                     f"{self.load_timeout_s:g} s (an infinite loop?); it was "
                                     f"running this line" + (
                                         f" (and {inner.file}:{inner.line} in "
                                         f"{inner.function or 'module'})" if inner else ""))
                    raise
        except LoadInterrupted:
            # The interrupt landed outside the schedule's own code (in the loader, or as
            # the limit was lifted), so nothing wrapped it: cancelled all the same.
            raise Cancelled from None

def _imported_digests(directory: str) -> dict[str, str | None]:
    """The user's modules a schedule file of `directory` has imported, with their content
    hashes taken before the import read them."""
    d = getattr(USER_MODULES, "_dirs", {}).get(directory)
    if d is None:
        return USER_MODULES.digests()
    return {s.file: s.digest for s in d.sources.values()}


def _range(span: SourceRange | None) -> R.Range | None:
    return R.Range(span.line, span.col, span.end_line, span.end_col) if span else None


@contextmanager
def _time_limit(seconds: float):
    """Raise ScheduleLoadTimeout in the running code after `seconds` (SIGALRM), and
    LoadInterrupted on INTERRUPT_SIGNAL. Signals reach only the main thread: elsewhere no
    limit, and the daemon's hard deadline still applies."""
    if seconds <= 0 or threading.current_thread() is not threading.main_thread():
        yield
        return

    def expired(signum: int, frame: Any) -> None:
        raise ScheduleLoadTimeout(f"the schedule file ran for more than {seconds:g} s")

    def interrupted(signum: int, frame: Any) -> None:
        raise LoadInterrupted("superseded by a newer revision")

    previous = signal.signal(signal.SIGALRM, expired)
    previous_interrupt = signal.signal(INTERRUPT_SIGNAL, interrupted)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        signal.signal(INTERRUPT_SIGNAL, previous_interrupt)


# --- diagnostics ----------------------------------------------------------------------------


def _file_diagnostic(e: ScheduleFileError) -> R.Diagnostic:
    kind: R.DiagnosticKind = "read"
    exc_type = inner = None
    if isinstance(e, ScheduleSyntaxError):
        kind = "syntax"
    elif isinstance(e, ScheduleExecutionError):
        kind = "timeout" if e.exc_type == ScheduleLoadTimeout.__name__ else "execution"
        exc_type = e.exc_type
        if e.inner is not None:
            inner = R.SourceLocation(e.inner.file, e.inner.line, e.inner.function)
    elif isinstance(e, ScheduleMissingError):
        kind = "missing"
    elif isinstance(e, ScheduleTypeError):
        kind = "type"
    message = e.message
    return R.Diagnostic(kind, message, e.file, e.line, _range(e.span), None, exc_type, inner)


def _user_frame(e: BaseException, tool_dirs: tuple[str, ...] = ()
                ) -> R.SourceLocation | None:
    """The deepest frame of the user's code where `e` (or the exception it was raised
    from, e.g. the TypeError inside a TracingError) was raised."""
    seen = set()
    chain = []
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        chain.append(e)
        e = e.__cause__ or e.__context__
    for exc in reversed(chain):  # the original exception first
        frames = []
        tb = exc.__traceback__
        while tb is not None:
            code = tb.tb_frame.f_code
            if is_user_file(code.co_filename) and not os.path.abspath(
                    code.co_filename).startswith((_SESSION_DIR, *tool_dirs)):
                frames.append(R.SourceLocation(code.co_filename, tb.tb_lineno, code.co_name))
            tb = tb.tb_next
        if frames:
            return frames[-1]
    return None


def _tracing_diagnostic(e: Exception, sf: ScheduleFile, tool_dirs: tuple[str, ...] = ()
                        ) -> R.Diagnostic:
    span = sf.program_span
    text = e.message if isinstance(e, PartitionError) else str(e)
    return R.Diagnostic("tracing", f"tracing the program raised {type(e).__name__}: {text}",
                        sf.path, span.line if span else 0, _range(span), None,
                        type(e).__name__, _user_frame(e, tool_dirs))


def _tactic_diagnostic(e: Exception, sf: ScheduleFile, index: int,
                       names: dict[str, Any], tool_dirs: tuple[str, ...] = ()
                       ) -> R.Diagnostic:
    source = sf.tactics[index - 1]
    span = source.span or sf.schedule_span
    tactic = sf.schedule[index - 1]
    if isinstance(e, UnknownInputError):
        # Point at the key that names nothing, when the tactic's dict is written out.
        for key in tactic.inputs:
            if not any(n == key or n.startswith(key + "/") for n in names) and \
                    key in source.inputs:
                span = source.inputs[key]
                break
    inner = None
    if isinstance(e, PartitionError):
        kind: R.DiagnosticKind = "tactic"
        message = f"tactic {index} ({tactic.label}): {e.message}"
        if e.loc is not None and e.loc.line and os.path.abspath(e.loc.file) != sf.path:
            inner = R.SourceLocation(e.loc.file, e.loc.line, e.loc.function)
    else:  # a bug in a rule callable of the user's, or in partir itself
        inner = _user_frame(e, tool_dirs)
        kind = "tactic" if inner is not None else "internal"
        message = f"tactic {index} ({tactic.label}) raised {type(e).__name__}: {e}"
        if kind == "internal":
            log.error("internal error applying tactic %d of %s:\n%s", index, sf.path,
                      "".join(traceback.format_exception(e)))
    return R.Diagnostic(kind, message, sf.path, span.line if span else 0, _range(span),
                        index, type(e).__name__, inner)


# --- explain --------------------------------------------------------------------------------


def _matches(name: str, key: str) -> bool:
    return name == key or name.startswith(key + "/")


def _local_shape(shape: tuple[int, ...], dims: list[list[str]], mesh: Any) -> list[int]:
    """Each device's tile of a value of this shape sharded on `dims` (padded tiles where
    the axes do not divide a dimension)."""
    return [tile_size(n, math.prod(mesh.check_axis(a) for a in axes))
            for n, axes in zip(shape, dims, strict=True)]


def _history(shardings: list[list[list[str]]], states: list[State],
             shape: tuple[int, ...]) -> list[R.ShardingStep]:
    """The steps of the tactics that changed the sharding, and the last tactic's: a step
    per tactic would make a schedule's values quadratic in its length (200 tactics of a
    small transformer: 67,000 steps, 8 MB for every edit), though each tactic changes
    few of them."""
    steps = []
    previous = [[] for _ in shape]
    last = len(states)
    for i, (dims, st) in enumerate(zip(shardings, states, strict=True), 1):
        changed = dims != previous
        if changed or i == last:
            steps.append(R.ShardingStep(i, st.record.name, dims,
                                        _local_shape(shape, dims, st.program.mesh),
                                        changed))
        previous = dims
    return steps


def _value_shardings(state: State, traced: TracedProgram
                     ) -> dict[tuple[str, str], list[list[list[str]]]]:
    facts = state.facts
    if facts.value_shardings is None:
        facts.value_shardings = _shardings_of_values(state.program, traced)
    return facts.value_shardings


def _shardings_of_values(program: CoreProgram, traced: TracedProgram
                         ) -> dict[tuple[str, str], list[list[list[str]]]]:
    with paused_gc():
        out: dict[tuple[str, str], list[list[list[str]]]] = {}
        for kind, shardings in (("input", program.input_shardings()),
                                ("output", program.output_shardings())):
            for name, s in shardings.items():
                out[(kind, name)] = [[list(a) for a in s.dims]]
        for tag, tagged in traced.tags.items():
            out[("tag", tag)] = [[list(a) for a in program.sharding(v).dims] for v in tagged]
    return out


def _values(traced: TracedProgram, states: list[State],
            found: dict[tuple[str, str], list[R.SourceLocation]]) -> list[R.ExplainedValue]:
    """Every input, output and tagged value with its sharding after each state."""
    per_state = [_value_shardings(st, traced) for st in states]
    named = [*(("input", n, t) for n, t in zip(traced.input_names, traced.in_types,
                                               strict=True)),
             *(("output", n, v.type) for n, v in zip(traced.output_names,
                                                     traced.function.results, strict=True))]
    values = []
    for kind, name, t in named:
        if states and (kind, name) not in per_state[0]:
            continue
        dims = [s[(kind, name)][0] for s in per_state]
        values.append(R.ExplainedValue(name, kind, list(t.shape), str(t.dtype),
                                       _history(dims, states, t.shape),
                                       found.get((kind, name), [])))
    tagged = {tag: [v.type for v in values] for tag, values in traced.tags.items()}
    for tag, types in tagged.items():
        for k, t in enumerate(types):
            dims = [s[("tag", tag)][k] for s in per_state]
            values.append(R.ExplainedValue(tag, "tag", list(t.shape), str(t.dtype),
                                           _history(dims, states, t.shape),
                                           found.get(("tag", tag), [])))
    return values


def _same_file(a: str, b: str) -> bool:
    return os.path.realpath(a) == os.path.realpath(b) or \
        (os.path.basename(a) == os.path.basename(b) and (
            not os.path.isabs(a) or not os.path.isabs(b)))


def _explain_line(file: str, line: int, states: list[State]) -> list[R.ExplainedValue]:
    first = states[0].program
    chosen = [op for op in first.ops if not op.is_identity and op.loc.line == line
              and _same_file(op.loc.file, file)]
    values = []
    for op in chosen:
        for k, r in enumerate(op.results):
            dims = []
            for st in states:
                found = next((o for o in st.program.ops if o.uid == op.uid), op)
                s = sharding_of(st.program.nest(found), k, r.type.rank)
                dims.append([list(a) for a in s.dims])
            label = f"{op.name}" + (f" result {k}" if len(op.results) > 1 else "")
            values.append(R.ExplainedValue(r.name or label, "op:" + op.name,
                                           list(r.type.shape), str(r.type.dtype),
                                           _history(dims, states, r.type.shape)))
    return values


def _concerns(c: R.AttributedCollective, name: str | None, file: str | None,
              line: int | None) -> bool:
    if name is not None:
        return c.value is not None and _matches(c.value, name)
    return (line is None or c.loc.line == line) and _same_file(c.loc.file, file or "")


def _introductions(attributions: list[Counter],
                   states: list[State]) -> list[R.AttributedCollective]:
    """The collectives of the final program, each attributed to the tactic after which
    its count first reached the final count's share."""
    final = attributions[-1]
    out = []
    for sig, count in sorted(final.items(), key=lambda kv: tuple(map(str, kv[0]))):
        kind, axes, name, file, line, function = sig
        previous = 0
        for i, counts in enumerate(attributions, 1):
            now = min(counts.get(sig, 0), count)
            if now > previous:
                out.append(R.AttributedCollective(
                    kind, list(axes), now - previous, name,
                    R.SourceLocation(file, line, function), i, states[i - 1].record.name))
                previous = now
    return out
