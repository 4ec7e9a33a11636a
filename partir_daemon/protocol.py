"""The daemon's protocol: JSON-RPC 2.0 messages, one JSON object per line (UTF-8, no
embedded newlines: `json.dumps` escapes them), over a Unix domain socket.

Every method has a params dataclass and a result dataclass below; `METHODS` declares
each method once (its types, which process serves it, its checks), for the server, the
compiler process and the client. The records of the compiler core (`partir.session.
results`: diagnostics, ranges, timings, explained values and collectives) are sent as
they are: this module imports them (that module imports nothing heavy, so the language
server decodes them without importing JAX). `to_json`/`from_json` convert between these
dataclasses and the plain JSON on the wire, so the server, the client and the language
server share one definition.

Positions follow `partir.schedule_file.SourceRange`: 1-based lines, 0-based columns in
characters, end exclusive. Tactic indexes are 1-based, like `partir partition --after`.

Errors in the *user's* schedule file (syntax error, exception at import, timeout, missing
definitions, a tactic that raises) are not JSON-RPC errors: they are `Diagnostic`s in the
result, next to whatever could be computed (e.g. the tactics before the failing one).
JSON-RPC errors are for the protocol itself (malformed JSON, unknown method, bad params),
cancelled requests and internal failures.

Notifications from the daemon:
    `$/progress`           ProgressParams: partition phases, tactics, job steps
    `partir/invalidated`   InvalidatedParams: a watched model file changed on disk
    `partir/partial`       PartialResultParams: a partition's tactics applied, before
                           their lowering, then with those lowered so far while it goes
                           on (requests with `partial`)
Notifications to the daemon:
    `$/cancelRequest`      CancelRequestParams: cancel an in-flight request of this client
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import math
import os
import sys
import types
import typing
from dataclasses import dataclass, field
from typing import Any, BinaryIO, Literal

# Re-exported: clients read every record of the protocol from this module.
from partir.session.results import (
    AttributedCollective,
    Diagnostic,
    ExplainedValue,
    Range,
    Timings,
)
from partir.session.results import (
    DiagnosticKind as DiagnosticKind,
)
from partir.session.results import (
    ShardingStep as ShardingStep,
)
from partir.session.results import (
    SourceLocation as SourceLocation,
)

PROTOCOL_VERSION = 1
JSONRPC = "2.0"

# --- JSON-RPC error codes ---------------------------------------------------------------
PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603
# Server-defined (the range -32000..-32099 is reserved for implementations).
WORKER_CRASHED = -32001  # the compiler child process died while serving the request
NOT_FOUND = -32002  # e.g. an unknown job id
# The daemon is stopping: requests that were running, and requests (also on connections
# made) while it stops, are answered with this instead of being dropped.
SHUTTING_DOWN = -32003
REQUEST_CANCELLED = -32800  # as in LSP: superseded by a newer revision, or $/cancelRequest

PROGRESS = "$/progress"
INVALIDATED = "partir/invalidated"
PARTIAL = "partir/partial"
CANCEL_REQUEST = "$/cancelRequest"

IrLevel = Literal["core", "spmd", "hlo"]
# "damaged": a job whose record an earlier daemon left unreadable (e.g. truncated).
JobState = Literal["queued", "running", "succeeded", "failed", "crashed", "timeout",
                   "cancelled", "interrupted", "damaged"]
# States a job never leaves.
FINAL_JOB_STATES = ("succeeded", "failed", "crashed", "timeout", "cancelled", "interrupted",
                    "damaged")
# Metadata of a params field naming a file: it may not hold a NUL byte (no file can).
FILE = {"file": True}


class ProtocolError(Exception):
    """A message that is not valid JSON-RPC 2.0 (or not valid params for its method)."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


# --- shared records ---------------------------------------------------------------------


@dataclass
class TraceInfo:
    key: str  # cache key: function fingerprint, argument shapes/dtypes, static args, JAX
    cached: bool  # the traced program came from the cache
    function: str
    ops: int
    elapsed_s: float  # tracing time (0 when cached)
    # Workspace files the fingerprint covers (the function's module and what it imports).
    dependencies: list[str] = field(default_factory=list)
    # Set when a trace of this program was dropped since the last partition because one
    # of these files changed on disk (watcher + content hash).
    invalidated_by: list[str] = field(default_factory=list)


# Fields of `partir.metadata.TacticMetadata` a `TacticResult` leaves out: every input's
# and output's sharding after every tactic is quadratic in a schedule's length (200
# tactics of a small transformer: 3 MB in each result), and `PartitionResult.values`
# has them, by the tactics that changed them.
UNSENT_METADATA = ("shardings",)


@dataclass
class TacticResult:
    """One tactic of the schedule: where it is written, whether its state came from the
    cache, and its `partir.metadata.TacticMetadata` as a dict, less `UNSENT_METADATA`
    (`core_ir` is "" unless the request asked for IR). The fields lowering fills
    (`collectives`, `executed_collectives`, `cost`) are there once its program is lowered
    and simulated (not in a partial result's tactics not lowered yet: `is_lowered`)."""

    index: int
    name: str
    axis: str
    range: Range | None
    inputs: dict[str, Range]  # each key of the tactic's inputs dict -> its source range
    reused: bool
    state: str  # hash-chain key of the state after this tactic
    metadata: dict[str, Any]


def is_lowered(metadata: dict[str, Any]) -> bool:
    """Whether the program after a tactic (of this `TacticResult.metadata`) was lowered."""
    return "collectives" in metadata


# --- methods ----------------------------------------------------------------------------


@dataclass
class DocumentParams:
    """A schedule file, with the editor's unsaved text and revision if any. A request for
    a newer `version` of the same path cancels work still pending for older ones."""

    path: str = field(metadata=FILE)
    text: str | None = None
    version: int | None = None


@dataclass
class PartitionParams(DocumentParams):
    include_ir: bool = False  # fill each tactic's metadata["core_ir"]
    # Lower and simulate each tactic's program for its `collectives` and `cost`. Without
    # it only the tactics are applied (shardings, conflicts, diagnostics: what an editor
    # shows first); asking again with it then costs only the lowering, as the states are
    # cached. Tactics already lowered keep their collectives and cost either way.
    metadata: bool = True
    # With `metadata`: once the tactics are applied, and before any lowering, send that
    # result (as `metadata=False` would return it, but for its `values`, which come with
    # the next) in a `partir/partial` notification, so that one request serves both an
    # editor's first answer (its diagnostics) and its complete one; then,
    # while the lowering goes on, the result with the tactics lowered so far
    # (`is_lowered`): once the first is, a second later, then after twice as long each
    # time (`engine.PARTIAL_AFTER_S`). The tactics are lowered in order: an editor shows
    # the edited one's counts, and those after it, before the last is lowered.
    partial: bool = False


@dataclass
class PartitionResult:
    path: str
    version: int | None
    ok: bool  # no diagnostics
    diagnostics: list[Diagnostic]
    function: str | None = None
    mesh: dict[str, int] | None = None
    trace: TraceInfo | None = None
    tactics: list[TacticResult] = field(default_factory=list)
    reused: list[int] = field(default_factory=list)  # 1-based indexes taken from the cache
    reapplied: list[int] = field(default_factory=list)  # applied by this request
    program_range: Range | None = None
    mesh_range: Range | None = None
    schedule_range: Range | None = None
    timings: Timings = field(default_factory=Timings)
    # Every input, output and tagged value of the traced program, with its sharding after
    # each applied tactic and where it is defined: what editors need to answer hovers,
    # completions and go-to-definition from this result alone, without another request.
    values: list[ExplainedValue] = field(default_factory=list)
    # The final program's collectives, attributed to the value they move, the model line
    # they serve and the tactic that introduced them (empty until the states are lowered:
    # a partial result has none).
    collectives: list[AttributedCollective] = field(default_factory=list)
    # The user's modules (files) the schedule file imported while it ran, also when it
    # failed: a change of any of them calls for analysing the schedule file again.
    dependencies: list[str] = field(default_factory=list)


@dataclass
class IrParams(DocumentParams):
    level: IrLevel = "core"
    after: int | None = None  # 1-based tactic; 0: the traced program; None: the last


@dataclass
class IrResult:
    path: str
    version: int | None
    level: str
    after: int
    tactic: str | None  # the tactic's name (None for after=0)
    text: str
    diagnostics: list[Diagnostic] = field(default_factory=list)


@dataclass
class ExplainParams(DocumentParams):
    """What to explain: an input or tagged `name` (a pytree prefix selects every leaf under
    it), or a model source `line` of `file` (no `line`: the collectives of every line of
    `file`, and no values)."""

    name: str | None = None
    file: str | None = field(default=None, metadata=FILE)
    line: int | None = None


@dataclass
class ExplainResult:
    path: str
    version: int | None
    values: list[ExplainedValue]
    collectives: list[AttributedCollective]
    diagnostics: list[Diagnostic] = field(default_factory=list)


@dataclass
class RunParams:
    """Run the partitioned program of a schedule file as a job. `inputs`: "example" (the
    schedule file's example arguments, abstract leaves filled with seeded random values),
    "random" (every leaf random), or a path to an .npz file whose keys are input names."""

    path: str = field(metadata=FILE)
    steps: int = field(default=10, metadata={"min": 0})
    inputs: str = field(default="example", metadata=FILE)
    seed: int = field(default=0, metadata={"min": 0})
    timeout_s: float = field(default=1800.0, metadata={"min": 0, "exclusive": True})
    check: bool = True  # compare against the unpartitioned function
    # Processes of one run under jax.distributed (`partir.launch`), sharing the mesh's
    # devices evenly; 1: one process.
    processes: int = field(default=1, metadata={"min": 1})


@dataclass
class JobProcess:
    """One process of a multi-process job: how it ended and its own log."""

    process: int
    exit_code: int | None
    log_path: str


@dataclass
class JobMetrics:
    platform: str
    devices: int
    steps: int
    compile_s: float  # partitioning + first (compiling) step
    step_time_median_s: float | None
    step_time_min_s: float | None
    peak_memory_bytes: int | None  # per device, from XLA's memory analysis
    max_abs_error: float | None
    check_ok: bool | None
    collectives: dict[str, int] = field(default_factory=dict)
    processes: int = 1


@dataclass
class JobInfo:
    id: str
    state: JobState
    path: str
    steps: int
    created: float
    started: float | None = None
    finished: float | None = None
    pid: int | None = None
    exit_code: int | None = None
    error: str | None = None
    steps_done: int = 0
    metrics: JobMetrics | None = None
    record_path: str = ""
    log_path: str = ""
    # Output past the log's cap (`jobs.LOG_LIMIT_BYTES`), dropped.
    log_dropped_bytes: int = 0
    processes: list[JobProcess] = field(default_factory=list)  # of a multi-process job


@dataclass
class RunResult:
    job: JobInfo


@dataclass
class JobsParams:
    pass


@dataclass
class JobsResult:
    jobs: list[JobInfo]


@dataclass
class JobParams:
    id: str
    log_tail: int = field(default=200, metadata={"min": 0})  # last lines of the log (0: none)


@dataclass
class JobResult:
    job: JobInfo
    log: str


@dataclass
class CancelParams:
    id: str  # a job id


@dataclass
class CancelResult:
    cancelled: bool  # False when the job had already finished
    job: JobInfo


@dataclass
class CacheStatsParams:
    pass


@dataclass
class CacheStats:
    traces: int
    states: int
    trace_hits: int
    trace_misses: int
    state_hits: int
    state_misses: int
    invalidations: int  # traces dropped because a model file changed
    evictions: int  # entries dropped by the LRU bound
    held_ops: int  # ops held by cached entries: the LRU's memory measure
    max_ops: int
    max_entries: int
    worker_pid: int | None
    worker_restarts: int
    cancelled_requests: int
    lowered: int = 0  # tactic programs lowered and simulated for their metadata
    worker_pids: list[int] = field(default_factory=list)  # every running compiler process


@dataclass
class StatusParams:
    pass


@dataclass
class DaemonStatus:
    pid: int
    version: str
    protocol: int
    workspace: str
    socket: str
    config_hash: str
    started: float
    uptime_s: float
    clients: int
    worker_pid: int | None
    log_path: str


@dataclass
class ShutdownParams:
    pass


@dataclass
class ShutdownResult:
    ok: bool


@dataclass
class ProgressParams:
    """`token` is the request id (for partition/ir/explain) or the job id."""

    token: str | int
    kind: Literal["partition", "job"]
    message: str
    step: int | None = None
    total: int | None = None
    path: str | None = None
    version: int | None = None


@dataclass
class InvalidatedParams:
    paths: list[str]
    traces: int  # how many cached traces were dropped


@dataclass
class PartialResultParams:
    """`token` is the id of the partition request this partial result belongs to."""

    token: str | int
    result: PartitionResult


@dataclass
class CancelRequestParams:
    id: int | str


@dataclass
class InvalidateParams:
    """Daemon -> compiler process: files changed on disk."""

    paths: list[str]


@dataclass
class WorkerStatsParams:
    pass


def _check_explain(params: ExplainParams) -> None:
    if params.name is None and params.file is None:
        raise ProtocolError(INVALID_PARAMS, "explain needs `name`, or `file` (and `line`)")


# What `RunParams.inputs` names besides an .npz file.
RUN_INPUTS = ("example", "random")


def _check_run(params: RunParams) -> None:
    if params.inputs not in RUN_INPUTS and not params.inputs.endswith(".npz"):
        raise ProtocolError(INVALID_PARAMS, f"RunParams.inputs: expected "
                            f"{' or '.join(map(repr, RUN_INPUTS))} or the path of an .npz "
                            f"file, got {params.inputs!r}")


@dataclass(frozen=True)
class Method:
    """One declaration per method, read by the server (routing, validation, deadlines),
    the compiler process (decoding, dispatch) and the client (decoding results).

    process: "daemon" (answered by the daemon itself) or "compiler" (a compiler process
        serves it: `Engine.<name>`);
    document: its params name a schedule file (`path`, `text`, `version`): the file is
        checked (a regular file of bounded size), the request is routed to the process
        holding the file, a newer version cancels it, and the schedule file it executes
        has the load timeout, then the compile timeout;
    public: clients may call it (else only the daemon sends it, to a compiler process);
    validate: checks of the params beyond their types and number bounds."""

    params: type
    result: type
    process: Literal["daemon", "compiler"] = "daemon"
    document: bool = False
    public: bool = True
    validate: Any = None  # Callable[[params], None], raising ProtocolError


METHODS: dict[str, Method] = {
    "partition": Method(PartitionParams, PartitionResult, "compiler", document=True),
    "ir": Method(IrParams, IrResult, "compiler", document=True),
    "explain": Method(ExplainParams, ExplainResult, "compiler", document=True,
                      validate=_check_explain),
    "invalidate": Method(InvalidateParams, InvalidatedParams, "compiler", public=False),
    "stats": Method(WorkerStatsParams, dict, "compiler", public=False),
    "run": Method(RunParams, RunResult, validate=_check_run),
    "jobs": Method(JobsParams, JobsResult),
    "job": Method(JobParams, JobResult),
    "cancel": Method(CancelParams, CancelResult),
    "cache_stats": Method(CacheStatsParams, CacheStats),
    "status": Method(StatusParams, DaemonStatus),
    "shutdown": Method(ShutdownParams, ShutdownResult),
}


# --- daemon configuration ---------------------------------------------------------------


def usable_cpus() -> int:
    """The cores this process may run on (its affinity, which containers and `taskset`
    narrow), not the machine's."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


@dataclass
class DaemonConfig:
    """Settings a daemon is started with (the client passes them on auto-start); their
    hash is in the status file, so tools can tell which settings a running daemon has."""

    idle_timeout_s: float = 3600.0  # exit after this long with no client and no job
    load_timeout_s: float = 30.0  # executing a schedule file (e.g. an infinite loop)
    compile_timeout_s: float = 900.0  # one request in the compiler process
    max_cache_entries: int = 256  # traces + tactic states
    max_cache_ops: int = 4_000_000  # ops held by cached traces and states
    log_level: str = "INFO"
    # Compiler processes: a schedule file that loops holds one of them, not every file's
    # analysis. Each holds JAX and caches of its own; two, or one on a one-core machine.
    compiler_processes: int = field(default_factory=lambda: min(2, usable_cpus()))
    # Processes each compiler process lowers an edit's states in (itself and forks of it,
    # `partir.forked`): the lenses after an early edit of a long schedule come that much
    # sooner; more processes than cores would only take turns.
    lowering_processes: int = field(default_factory=lambda: min(2, usable_cpus()))

    def __post_init__(self) -> None:
        # 300 and 300.0 are one setting: the hash must not tell them apart.
        for f in dataclasses.fields(self):
            if isinstance(f.default, float):
                setattr(self, f.name, float(getattr(self, f.name)))
        for name in ("compiler_processes", "lowering_processes"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, not {getattr(self, name)}")

    def to_args(self) -> list[str]:
        return [f"--{f.name.replace('_', '-')}={getattr(self, f.name)}"
                for f in dataclasses.fields(self)]

    def hash(self) -> str:
        text = json.dumps(to_json(self), sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:16]


# --- conversion -------------------------------------------------------------------------


def to_json(value: Any) -> Any:
    """A dataclass (or list/dict of them) as plain JSON data. (`encode` does not need
    it: it converts dataclasses as the JSON encoder meets them.)"""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_json(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, list | tuple):
        return [to_json(v) for v in value]
    if isinstance(value, dict):
        return {str(k): to_json(v) for k, v in value.items()}
    return value


def from_json(cls: Any, data: Any) -> Any:
    """`data` (plain JSON) as an instance of the annotated type `cls`. Raises
    ProtocolError(INVALID_PARAMS) on a mismatch, so bad params get a JSON-RPC error."""
    try:
        return _converter(cls)(data)
    except _Mismatch as e:
        raise ProtocolError(INVALID_PARAMS, e.text(
            cls.__name__ if isinstance(cls, type) else str(cls))) from None


class _Mismatch(Exception):
    """A value that does not fit its type, at `path` (innermost last) below the root."""

    def __init__(self, message: str, path: tuple[str, ...] = ()) -> None:
        self.message = message
        self.path = path

    def at(self, step: str) -> _Mismatch:
        return _Mismatch(self.message, (step, *self.path))

    def text(self, root: str) -> str:
        return f"{root}{''.join(self.path)}: {self.message}"

    def relative(self) -> str:
        """The message as one option of a union states it, below the union's path."""
        return self.text("") if self.path else self.message


Converter = typing.Callable[[Any], Any]


@functools.cache
def _converter(tp: Any) -> Converter:
    """A function from plain JSON to `tp`, made once per type: results of thousands of
    values (their sharding after every tactic) are decoded on every edit. The path of a
    mismatch is only made when there is one."""
    origin = typing.get_origin(tp)
    if tp is Any:
        return _identity
    if origin in (typing.Union, types.UnionType):
        options = [_converter(o) for o in typing.get_args(tp) if o is not type(None)]
        nullable = type(None) in typing.get_args(tp)

        def union(data: Any) -> Any:
            if data is None and nullable:
                return None
            errors = []
            for option in options:
                try:
                    return option(data)
                except _Mismatch as e:
                    errors.append(e)
            raise _Mismatch("; ".join(e.relative() for e in errors) or "bad value")
        return union
    if origin is Literal:
        allowed = typing.get_args(tp)

        def literal(data: Any) -> Any:
            if data not in allowed:
                raise _Mismatch(f"expected one of {list(allowed)}, got {data!r}")
            return data
        return literal
    if origin is list:
        (item_type,) = typing.get_args(tp) or (Any,)
        item = _converter(item_type)

        def listed(data: Any) -> list[Any]:
            if not isinstance(data, list):
                raise _Mismatch("expected a list")
            try:
                return [item(v) for v in data]
            except _Mismatch:
                pass
            for i, v in enumerate(data):  # again, to say which item
                try:
                    item(v)
                except _Mismatch as e:
                    raise e.at(f"[{i}]") from None
            raise AssertionError("unreachable: a converter failed once only")
        return listed
    if origin is dict:
        _, item_type = typing.get_args(tp) or (str, Any)
        item = _converter(item_type)

        def mapping(data: Any) -> dict[str, Any]:
            if not isinstance(data, dict):
                raise _Mismatch("expected an object")
            out = {}
            for k, v in data.items():
                try:
                    out[k] = item(v)
                except _Mismatch as e:
                    raise e.at(f".{k}") from None
            return out
        return mapping
    if dataclasses.is_dataclass(tp):
        hints = typing.get_type_hints(tp)
        fields = {f.name: _converter(hints[f.name]) for f in dataclasses.fields(tp)}

        def instance(data: Any) -> Any:
            if data is None:
                data = {}
            if not isinstance(data, dict):
                raise _Mismatch("expected an object")
            kwargs = {}
            for k, v in data.items():
                convert = fields.get(k)
                if convert is None:
                    unknown = sorted(set(data) - set(fields))
                    raise _Mismatch(f"unknown field(s) {unknown}")
                try:
                    kwargs[k] = convert(v)
                except _Mismatch as e:
                    raise e.at(f".{k}") from None
            try:
                return tp(**kwargs)
            except TypeError as e:  # a required field is missing
                raise _Mismatch(str(e)) from None
        return instance
    if tp is float:
        def number(data: Any) -> float:
            if isinstance(data, int | float) and not isinstance(data, bool):
                return float(data)
            raise _Mismatch(f"expected a number, got {data!r}")
        return number
    if tp in (int, str, bool):
        def scalar(data: Any) -> Any:
            if type(data) is not tp:
                raise _Mismatch(f"expected {tp.__name__}, got {data!r}")
            return data
        return scalar
    if tp is type(None):
        def null(data: Any) -> None:
            if data is not None:
                raise _Mismatch("expected null")
        return null
    raise TypeError(f"protocol type {tp!r} is not supported")


def _identity(data: Any) -> Any:
    return data


# --- JSON-RPC framing -------------------------------------------------------------------

MAX_MESSAGE_BYTES = 256 * 1024 * 1024  # a line longer than this is refused
# A schedule file named by a request (`path`) must be a regular file of at most this
# many bytes, else the request gets INVALID_PARAMS (not /dev/zero, a FIFO, a directory).
MAX_SOURCE_FILE_BYTES = 16 * 1024 * 1024


def encode(message: dict[str, Any]) -> bytes:
    """One message as a line of the stream (also of the daemon's own line protocol with
    its compiler process and job runners). Dataclasses in it are encoded as objects of
    their fields, by the encoder as it meets them: a walk in Python over a large result
    (the shardings of every input after every tactic) first would cost more than the
    encoding itself."""
    return json.dumps(message, separators=(",", ":"), default=_fields).encode() + b"\n"


def _fields(value: Any) -> dict[str, Any]:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def child_stream() -> BinaryIO:
    """In a child process: a private duplicate of stdout for its messages to the daemon,
    with stdout itself sent to stderr (the log), so that nothing the user's code or a
    library prints can corrupt them."""
    out = os.fdopen(os.dup(1), "wb", buffering=0)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return out


def child_message(line: bytes) -> dict[str, Any] | None:
    """A line the daemon and its child processes exchange, as its JSON object; None for
    anything else (a library printing to the child's stdout)."""
    try:
        message = json.loads(line)
    except (ValueError, RecursionError):
        return None
    return message if isinstance(message, dict) else None


def decode(line: bytes | str) -> dict[str, Any]:
    """A line of the stream as a JSON-RPC message. Raises ProtocolError (PARSE_ERROR or
    INVALID_REQUEST) for what is not one."""
    try:
        message = json.loads(line)
    except (ValueError, UnicodeDecodeError) as e:
        raise ProtocolError(PARSE_ERROR, f"parse error: {e}") from None
    except RecursionError:  # e.g. [[[[...]]]] nested deeper than the decoder's stack
        raise ProtocolError(PARSE_ERROR, "parse error: JSON nested too deeply") from None
    if not isinstance(message, dict) or message.get("jsonrpc") != JSONRPC:
        raise ProtocolError(INVALID_REQUEST, "not a JSON-RPC 2.0 message (an object with "
                            "\"jsonrpc\": \"2.0\")")
    if "method" in message:
        if not isinstance(message["method"], str):
            raise ProtocolError(INVALID_REQUEST, "\"method\" must be a string")
        if "id" in message and not valid_id(message["id"]):
            raise ProtocolError(INVALID_REQUEST, "\"id\" must be a string or an integer")
    elif "id" not in message or not ("result" in message or "error" in message):
        raise ProtocolError(INVALID_REQUEST, "neither a request nor a response")
    return message


def valid_id(value: Any) -> bool:
    return isinstance(value, str) or (isinstance(value, int) and not isinstance(value, bool))


def request(id: int | str, method: str, params: Any) -> dict[str, Any]:
    return {"jsonrpc": JSONRPC, "id": id, "method": method, "params": params}


def notification(method: str, params: Any) -> dict[str, Any]:
    return {"jsonrpc": JSONRPC, "method": method, "params": params}


def response(id: int | str | None, result: Any) -> dict[str, Any]:
    return {"jsonrpc": JSONRPC, "id": id, "result": result}


def error_response(id: int | str | None, code: int, message: str,
                   data: Any = None) -> dict[str, Any]:
    error: dict[str, Any] = {"code": code, "message": message}
    if data is not None:
        error["data"] = data
    return {"jsonrpc": JSONRPC, "id": id, "error": error}


def is_request(message: dict[str, Any]) -> bool:
    return "method" in message and "id" in message


def is_notification(message: dict[str, Any]) -> bool:
    return "method" in message and "id" not in message


def parse_params(method: str, params: Any) -> Any:
    """The params of a request to `method` as its dataclass."""
    spec = METHODS.get(method)
    if spec is None or not spec.public:
        raise ProtocolError(METHOD_NOT_FOUND, f"unknown method {method!r}")
    if params is not None and not isinstance(params, dict):
        raise ProtocolError(INVALID_PARAMS, "params must be an object")
    parsed = from_json(spec.params, params or {})
    check_values(parsed)
    if spec.validate is not None:
        spec.validate(parsed)
    return parsed


def check_values(params: Any) -> None:
    """Raise ProtocolError(INVALID_PARAMS), naming the parameter, for a field of the
    params dataclass `params` that names a file (metadata `FILE`) and holds a NUL byte, or
    a number field that is not finite (NaN and infinities: Python's JSON reads `NaN` and
    `Infinity`) or is below the bound its field's metadata sets (`min`, and `exclusive`
    for a strict bound). Types (e.g. a bool for a number) are checked by `from_json`
    already. Results are not checked: a job's error may well be NaN."""
    for f in dataclasses.fields(params):
        value = getattr(params, f.name)
        where = f"{type(params).__name__}.{f.name}"
        if f.metadata.get("file") and isinstance(value, str) and "\0" in value:
            raise ProtocolError(INVALID_PARAMS, f"{where}: a file name cannot hold a NUL "
                                f"byte, got {value!r}")
        if isinstance(value, bool) or not isinstance(value, int | float):
            continue
        if not math.isfinite(value):
            raise ProtocolError(INVALID_PARAMS, f"{where}: expected a finite number, got "
                                f"{value!r}")
        low = f.metadata.get("min")
        if low is None:
            continue
        if f.metadata.get("exclusive") and not value > low:
            raise ProtocolError(INVALID_PARAMS, f"{where}: must be > {low}, got {value!r}")
        if value < low:
            raise ProtocolError(INVALID_PARAMS, f"{where}: must be >= {low}, got {value!r}")


def parse_result(method: str, result: Any) -> Any:
    return from_json(METHODS[method].result, result)
