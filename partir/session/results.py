"""The plain records the compiler core (`partir.session`) returns: diagnostics with
source ranges, timings, and the sharding history of values and the collectives each
tactic introduced (for `explain`). Tools send them as they are (the daemon's protocol
re-exports them): they hold only plain data.

Positions follow `partir.schedule_file.SourceRange`: 1-based lines, 0-based columns in
characters, end exclusive. Tactic indexes are 1-based.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

DiagnosticKind = Literal["read", "syntax", "execution", "timeout", "missing", "type",
                         "tracing", "tactic", "internal"]


@dataclass
class Range:
    line: int
    col: int
    end_line: int
    end_col: int


@dataclass
class SourceLocation:
    """A place in any file (e.g. the user's model), 1-based line; 0 when unknown."""

    file: str
    line: int
    function: str = ""


@dataclass
class Diagnostic:
    """A problem with the schedule file or a tactic, at `range` of `file` (`line` 0 and no
    range: the file as a whole). `tactic` is the 1-based index of the failing tactic;
    `inner` is where the exception was raised when that is in another user file."""

    kind: DiagnosticKind
    message: str
    file: str
    line: int
    range: Range | None = None
    tactic: int | None = None
    exc_type: str | None = None
    inner: SourceLocation | None = None


@dataclass
class Timings:
    load_s: float = 0.0  # executing the schedule file
    trace_s: float = 0.0
    tactics_s: float = 0.0  # applying the tactics that were not cached
    metadata_s: float = 0.0  # lowering for collective counts (uncached states)
    total_s: float = 0.0  # in the compiler process


@dataclass
class ShardingStep:
    tactic: int  # 1-based
    tactic_name: str
    sharding: list[list[str]]  # per-dim mesh axes after this tactic
    local_shape: list[int]
    changed: bool  # this tactic changed the sharding


@dataclass
class ExplainedValue:
    name: str
    kind: str  # "input", "output" or "tag"
    shape: list[int]
    dtype: str
    # The steps of the tactics that changed its sharding, then the last tactic's (the
    # sharding after any other tactic is its latest step's before it; none: unsharded).
    history: list[ShardingStep]
    # Where the value is defined: for an input, the function's parameter and the places
    # in the user's modules that create the pytree leaf (a dict key or attribute named
    # like its last path component); for a tag, the `partir.tag` call. Best first.
    definitions: list[SourceLocation] = field(default_factory=list)


@dataclass
class AttributedCollective:
    kind: str  # all_gather, all_reduce, reduce_scatter, all_to_all, collective_permute, all_slice
    axes: list[str]
    count: int
    value: str | None  # the input/tag the collective moves (None: an internal value)
    loc: SourceLocation  # the model line the collective serves
    tactic: int  # the tactic that introduced it (1-based)
    tactic_name: str
