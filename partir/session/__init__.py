"""The in-process compiler core (DESIGN §8): a `Session` analyses schedule files into
per-tactic `State`s, cached and resumed from the longest unchanged prefix, then lowers,
simulates and explains them; every call cancellable by a `partir.CancellationToken`.
Tools (the daemon, tests) wrap it; it returns plain dataclasses (`results`)."""

from partir.cancel import CancellationToken, Cancelled
from partir.session.core import (
    MAX_STALE_RERUNS,
    Analysis,
    Explanation,
    Invalidation,
    Session,
    SessionStats,
    State,
    TacticResult,
    TraceEntry,
)
from partir.session.results import (
    AttributedCollective,
    Diagnostic,
    ExplainedValue,
    Range,
    ShardingStep,
    SourceLocation,
    Timings,
)

__all__ = [
    "MAX_STALE_RERUNS",
    "Analysis",
    "AttributedCollective",
    "CancellationToken",
    "Cancelled",
    "Diagnostic",
    "ExplainedValue",
    "Explanation",
    "Invalidation",
    "Range",
    "Session",
    "SessionStats",
    "ShardingStep",
    "SourceLocation",
    "State",
    "TacticResult",
    "Timings",
    "TraceEntry",
]
