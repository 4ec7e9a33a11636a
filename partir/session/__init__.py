"""The in-process compiler core (DESIGN §8): a `Session` analyses schedule files into
per-tactic `State`s, cached and resumed from the longest unchanged prefix, then lowers,
simulates and explains them; every call cancellable by a `partir.CancellationToken`.
Tools (the daemon, tests) wrap it; it returns plain dataclasses (`results`)."""

from partir.lazy import exports

# The records in `results` are read by tools that must not import JAX, which the
# session's core does: names are imported on first use.
__getattr__, __dir__ = exports(__name__, globals(), {
    "partir.cancel": ("CancellationToken", "Cancelled"),
    "partir.session.core": ("MAX_STALE_RERUNS", "Analysis", "Explanation", "Invalidation",
                            "Session", "SessionStats", "State", "TacticResult",
                            "TraceEntry"),
    "partir.session.results": ("AttributedCollective", "Diagnostic", "ExplainedValue",
                               "Range", "ShardingStep", "SourceLocation", "Timings"),
})

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
