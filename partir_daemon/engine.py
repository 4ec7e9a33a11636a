"""The daemon's side of the compiler core: a `partir.session.Session` whose calls take
and return the protocol's types (`partir_daemon.protocol`). It runs in the worker
process (`partir_daemon.worker`), one request at a time, each with a cancellation token
that the worker cancels when a newer revision of its document arrives or the client
cancels it; the daemon can still kill that process when a request hangs.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable
from typing import Any

from partir.api import LOWERED_FIELDS
from partir.cancel import CancellationToken, Cancelled
from partir.metadata import TacticMetadata
from partir.session import Analysis, Session
from partir.session.core import (  # noqa: F401  (the worker's, re-exported)
    INTERRUPT_SIGNAL,
    MAX_STALE_RERUNS,
    Progress,
    ignore_interrupts,
)
from partir.user_modules import content_hash  # noqa: F401  (tests patch it here)
from partir_daemon import protocol as P

__all__ = ["INTERRUPT_SIGNAL", "Cancelled", "Engine", "ignore_interrupts"]

_DAEMON_DIR = os.path.dirname(os.path.abspath(__file__))
# While a partition's states are lowered, its result with the tactics lowered so far is
# sent once the first is (the edited tactic's), then after this long, then after twice as
# long each time: an editor shows the lenses of the first tactics (those it shows first)
# before the last one is lowered.
PARTIAL_AFTER_S = 1.0


def _no_progress(message: str, step: int | None, total: int | None) -> None:
    pass


class Engine:
    """A `Session` answering the protocol's requests. `token` (optional) cancels one."""

    def __init__(self, workspace: str, **options: Any) -> None:
        self.session = Session(workspace, tool_dirs=[_DAEMON_DIR], **options)

    @property
    def traces(self) -> Any:
        return self.session.traces

    @property
    def stale_reruns(self) -> int:
        return self.session.stale_reruns

    def release(self) -> None:
        self.session.release()

    def partition(self, params: P.PartitionParams, progress: Progress = _no_progress,
                  token: CancellationToken | None = None,
                  partial: Callable[[P.PartitionResult], None] | None = None
                  ) -> P.PartitionResult:
        """Apply the schedule; with `params.metadata`, lower and simulate each applied
        state not lowered before, after handing the result short of that to `partial`
        (when the request asks for it and there is lowering to do), and again the result
        with the tactics lowered so far while the lowering goes on (see
        `PartitionParams.partial`)."""
        start = time.perf_counter()
        analysis = self.session.analyse(params.path, params.text, progress, token)
        if params.metadata and any(not st.lowered for st in analysis.states):
            lowered = None
            if params.partial and partial is not None:
                def send(values: bool = True) -> None:
                    analysis.timings.total_s = time.perf_counter() - start
                    partial(self._partition_result(params, analysis, values))

                # The first answer is for the diagnostics: the values' shardings after
                # each tactic (hovers, hints), a fifth of its making and encoding on a
                # long schedule, come with the next.
                send(values=False)
                lowered = _every(PARTIAL_AFTER_S, send, analysis)
            self.session.lower(analysis, progress, token, lowered)
        analysis.timings.total_s = time.perf_counter() - start
        return self._partition_result(params, analysis)

    def ir(self, params: P.IrParams, progress: Progress = _no_progress,
           token: CancellationToken | None = None) -> P.IrResult:
        analysis = self.session.analyse(params.path, params.text, progress, token)
        n = len(analysis.states)
        after = n if params.after is None else params.after
        if analysis.initial is None or not 0 <= after <= n:
            if analysis.initial is not None:
                analysis.diagnostics.append(P.Diagnostic(
                    "internal", f"after={after}: the schedule has {n} applied tactics (0 is "
                    f"the traced program)", params.path, 0))
            return P.IrResult(params.path, params.version, params.level, after, None, "",
                              analysis.diagnostics)
        text = self.session.ir(analysis, params.level, after, token)
        state = analysis.initial if after == 0 else analysis.states[after - 1]
        name = state.record.name if state.record is not None else None
        return P.IrResult(params.path, params.version, params.level, after, name, text,
                          analysis.diagnostics)

    def explain(self, params: P.ExplainParams, progress: Progress = _no_progress,
                token: CancellationToken | None = None) -> P.ExplainResult:
        if params.name is None and params.file is None:
            raise ValueError("explain needs a `name`, or a `file` (and `line`)")
        analysis = self.session.analyse(params.path, params.text, progress, token)
        found = self.session.explain(analysis, name=params.name, file=params.file,
                                line=params.line, progress=progress, token=token)
        return P.ExplainResult(params.path, params.version, found.values, found.collectives,
                               analysis.diagnostics)

    def invalidate(self, params: P.InvalidateParams) -> P.InvalidatedParams:
        found = self.session.invalidate(params.paths)
        return P.InvalidatedParams(found.paths, found.traces)

    def stats(self, params: P.WorkerStatsParams | None = None) -> dict[str, Any]:
        return dataclasses.asdict(self.session.stats())

    def _partition_result(self, params: P.PartitionParams, analysis: Analysis,
                          values: bool = True) -> P.PartitionResult:
        sf = analysis.schedule_file
        result = P.PartitionResult(params.path, params.version, analysis.ok,
                                   analysis.diagnostics,
                                   timings=dataclasses.replace(analysis.timings),
                                   dependencies=list(analysis.dependencies))
        if sf is None:
            return result
        result.mesh = dict(sf.mesh)
        result.program_range = _range(sf.program_span)
        result.mesh_range = _range(sf.mesh_span)
        result.schedule_range = _range(sf.schedule_span)
        if analysis.trace is not None:
            t = analysis.trace
            result.function = t.function
            result.trace = P.TraceInfo(t.key[:16], analysis.trace_cached, t.function,
                                       len(t.traced.function.ops),
                                       0.0 if analysis.trace_cached else t.elapsed_s,
                                       sorted(t.files), analysis.invalidated_by)
        for tactic, st in zip(analysis.tactics(), analysis.states, strict=True):
            metadata = _plain(tactic.metadata, lowered=tactic.lowered)
            if params.include_ir:
                metadata["core_ir"] = self.session.core_ir(st)
            result.tactics.append(P.TacticResult(
                tactic.index, tactic.name, tactic.axis, tactic.range, tactic.inputs,
                tactic.reused, tactic.state, metadata))
            (result.reused if tactic.reused else result.reapplied).append(tactic.index)
        if values:
            result.values = self.session.values(analysis)
        result.collectives = self.session.collectives(analysis) or []
        return result


def _every(first_s: float, send: Callable[[], None],
           analysis: Analysis) -> Callable[[int], None]:
    """What `Session.lower` calls after each state it lowers: `send` after the first (the
    edited tactic's, which the editor shows), then once `first_s` passed since the last
    result sent, then twice as long each time (each result sent costs its making and
    encoding, and the language server's decoding and rendering), unless every state is
    lowered (the complete result follows)."""
    interval = first_s / 2
    due = time.perf_counter()

    def lowered(index: int) -> None:
        nonlocal interval, due
        if time.perf_counter() >= due and \
                not all(st.lowered for st in analysis.states[index:]):
            send()
            interval *= 2
            due = time.perf_counter() + interval
    return lowered


def _range(span: Any) -> P.Range | None:
    return P.Range(span.line, span.col, span.end_line, span.end_col) if span else None


def _plain(metadata: TacticMetadata, *, lowered: bool) -> dict[str, Any]:
    """The metadata as the dict a `TacticResult` carries, without the fields lowering
    fills when it has not run. Shallow: its values are the cached state's, and are only
    encoded, never changed. The fields not sent are not read (a deferred one is not
    computed)."""
    out = {f.name: getattr(metadata, f.name) for f in dataclasses.fields(metadata)
           if f.name not in P.UNSENT_METADATA and (lowered or f.name not in LOWERED_FIELDS)}
    if out.get("cost") is not None:
        out["cost"] = metadata.cost.to_json()
    return out


