"""Running cases and classifying them, in watchdogged worker processes.

A case's rendered module is executed; its `reference(args)` (jax.jit of the function) is
compared with `partitioned(args)` (and, when asked, `core(args)`: the sequential Core
interpreter). Classes:
  OK       same result
  WRONG    a result differs (float tolerance scaled to the output's magnitude)
  CRASH    any exception that is not a partir.PartitionError (JAX's errors from partir's
           generated code included), or a worker that died
  REFUSED  a partir.PartitionError: partir's deliberate refusal (not a ProgramError, the
           runtime finding the program unlike what it declares: a CRASH)
  TIMEOUT  the watchdog killed the worker
  INVALID  the reference itself failed (a generator bug, not partir's), or JAX computes it
           in several ways (jitted, op by op) with different results where partir differs
  SKIPPED  the mode does not apply (a gradient with no float input)
Workers are long-lived processes (importing JAX costs seconds), replaced when one times
out, dies, or has run many cases (compilation caches grow)."""

from __future__ import annotations

import linecache
import multiprocessing as mp
import os
import re
import time
import traceback
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from typing import Any

from tests.fuzz.program import Case, float_argnums, render, walk_ops

FAILURES = ("WRONG", "CRASH", "TIMEOUT")
RTOL = ATOL = 1e-4
CORE_EVERY = 5  # the Core interpreter is also checked on every 5th seed, in plain mode


@dataclass
class Outcome:
    cls: str
    error: str = ""  # exception class (REFUSED/CRASH) or what differs (WRONG)
    message: str = ""  # first line of the message
    where: str = ""  # innermost partir frame (CRASH), to group crashes by place
    trace: str = ""
    elapsed: float = 0.0
    # Whether the partitioned program shards anything (a tiled input or output, or a
    # collective): a case that shards nothing tests little.
    sharded: bool | None = None

    @property
    def signature(self) -> str:
        """What must stay the same while a failure is minimized: its class and error
        class (and for WRONG, which oracle disagreed)."""
        return f"{self.cls}:{self.error}"

    def reason(self) -> str:
        """The error with names and numbers normalized, to group refusals and crashes."""
        return f"{self.error}: {normalize(self.message)}"


@dataclass
class Task:
    seed: int
    mode: str
    core: bool = False
    case: Case | None = None  # None: generate from the seed (in the worker)
    tag: Any = None  # the caller's, passed back


@dataclass
class Result:
    task: Task
    outcome: Outcome
    case: Case | None = None  # the case that ran (generated in the worker)
    families: list[str] = field(default_factory=list)


def normalize(message: str) -> str:
    text = message.splitlines()[0] if message else ""
    text = re.sub(r" \(at [^)]*\)", "", text)
    text = re.sub(r"<fuzz [^>]*>(:\d+)?", "<f>", text)
    text = re.sub(r"tactic (ManualPartition\('[^']*'\)|[\w-]+)", "tactic T", text)
    text = re.sub(r"'[^'\s]*'|\"[^\"\s]*\"", "'…'", text)
    text = re.sub(r"%[\w.#-]+", "%v", text)
    text = re.sub(r"\b(v|x|w|u|i|c|seg|key|rkey|t|T)\d+\b", "NAME", text)
    text = re.sub(r"\d+", "N", text)
    return text[:200]


# --- comparing ---------------------------------------------------------------------------------

def compare(got: Any, want: Any) -> str | None:
    """None if `got` is `want` up to float tolerance, else what differs."""
    import jax
    import numpy as np
    g_leaves, g_tree = jax.tree_util.tree_flatten(got)
    w_leaves, w_tree = jax.tree_util.tree_flatten(want)
    if len(g_leaves) != len(w_leaves):
        return f"output structure {g_tree} != {w_tree}"
    for k, (g, w) in enumerate(zip(g_leaves, w_leaves, strict=True)):
        g, w = np.asarray(g), np.asarray(w)
        if g.shape != w.shape:
            return f"output {k}: shape {g.shape} != {w.shape}"
        if g.dtype != w.dtype:
            return f"output {k}: dtype {g.dtype} != {w.dtype}"
        if np.issubdtype(w.dtype, np.floating):
            # Partitioned sums are reassociated: tolerate rounding against the output's scale.
            finite = np.abs(w[np.isfinite(w)])
            scale = max(1.0, float(finite.max())) if finite.size else 1.0
            close = np.isclose(g, w, rtol=RTOL, atol=ATOL * scale, equal_nan=True)
        else:
            close = g == w
        if not close.all():
            bad = np.argwhere(~close)
            i = tuple(int(j) for j in bad[0])
            return (f"output {k} (shape {w.shape}): {len(bad)} of {w.size} elements differ, "
                    f"first at {i}: got {g[i]!r}, expected {w[i]!r}")
    return None


# --- running one case in this process ----------------------------------------------------------

def _partir_frame(tb: traceback.StackSummary) -> str:
    for fr in reversed(tb):
        if "/partir/" in fr.filename and "/tests/" not in fr.filename:
            return f"{fr.filename.split('/partir/', 1)[1]}:{fr.name}"
    return ""


def _failure(cls: str, exc: BaseException, prefix: str = "") -> Outcome:
    tb = traceback.extract_tb(exc.__traceback__)
    text = str(exc).strip()
    first = text.splitlines()[0] if text else ""
    return Outcome(cls, type(exc).__name__, prefix + first, _partir_frame(tb),
                   "".join(traceback.format_exception(exc)))


def load(source: str, name: str) -> dict:
    """Execute a rendered case as a module named `name` (registered with linecache so
    tracebacks show its lines)."""
    filename = f"<fuzz {name}>"
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    ns: dict = {"__name__": f"fuzz_{name}"}
    exec(compile(source, filename, "exec"), ns)
    return ns


def execute(case: Case, mode: str, core: bool = False) -> Outcome:
    import partir
    from partir.errors import ProgramError
    start = time.perf_counter()
    if mode in ("grad", "vg"):
        if not float_argnums(case.program):
            return Outcome("SKIPPED", message="no float input to differentiate")
        if any(op.family == "while" for op in walk_ops(case.program.ops)):
            return Outcome("SKIPPED", message="JAX cannot reverse-differentiate while_loop")
    source = render(case, mode, core)
    try:
        ns = load(source, f"seed{case.seed}_{mode}")
        args = ns["make_args"]()
        want = ns["reference"](args)
    except Exception as e:
        return _failure("INVALID", e)
    oracles = [("executed", "partitioned")] + ([("core", "core")] if core else [])
    for what, fn in oracles:
        try:
            got = ns[fn](args)
        except ProgramError as e:  # partir's program is not what it declares: a bug
            out = _failure("CRASH", e)
        except partir.PartitionError as e:
            out = _failure("REFUSED", e)
        except Exception as e:
            out = _failure("CRASH", e, "core interpreter: " if what == "core" else "")
        else:
            diff = compare(got, want)
            if diff is None:
                continue
            out = Outcome("WRONG", what, diff)
            # The reference computed other ways (op by op; for a derivative, also compiled
            # as one program): where JAX gives different results (NaN propagation, a fused
            # gather's fill value, an XLA miscompilation), the program has no one result
            # to compare with.
            unstable = next((d for alt in ns["reference_alts"](args)
                             if (d := compare(alt, want)) is not None), None)
            if unstable is not None:
                out = Outcome("INVALID", "unstable reference",
                              f"JAX computes it two ways ({unstable}); partir: {diff}")
            elif what == "executed":
                out.message += f"; {_op_by_op(ns, args, want)}"
        out.elapsed = time.perf_counter() - start
        return out
    return Outcome("OK", elapsed=time.perf_counter() - start, sharded=_shards(ns.get("meta")))


def _op_by_op(ns: dict[str, Any], args: Any, want: Any) -> str:
    """Whether the partitioned program itself, run op by op (each op compiled alone),
    equals the reference: then it is XLA's compilation of partir's program that differs
    (fuzzer seeds 236 and 8472), which the report says, still as WRONG."""
    import jax
    try:
        with jax.disable_jit():
            got = ns["partitioned"](args)
    except Exception as e:
        return f"run op by op it fails ({type(e).__name__})"
    diff = compare(got, want)
    if diff is None:
        return "run op by op it equals the reference: XLA's compilation of it differs"
    return "run op by op it differs too"


def _shards(meta: Any) -> bool | None:
    import jax
    if meta is None:
        return None
    try:
        specs = jax.tree.leaves((meta.in_specs, meta.out_specs),
                                is_leaf=lambda x: isinstance(x, jax.sharding.PartitionSpec))
        tiled = any(any(p is not None for p in spec) for spec in specs)
        return tiled or any(meta.collectives.values())
    except Exception:
        return None


def run_task(task: Task) -> Result:
    from tests.fuzz.generator import generate
    case = task.case
    if case is None:
        try:
            case = generate(task.seed)
        except Exception as e:
            return Result(task, _failure("INVALID", e, "generator: "))
    outcome = execute(case, task.mode, task.core)
    fams = sorted({op.family for op in walk_ops(case.program.ops)})
    return Result(task, outcome, case if task.case is None else None, fams)


# --- workers -----------------------------------------------------------------------------------

RECYCLE_AFTER = 150


def _worker(conn: Connection) -> None:
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                               " --xla_force_host_platform_device_count=8").strip()
    os.environ["JAX_PLATFORMS"] = "cpu"
    import jax  # noqa: F401  (imported before the first task's clock starts)

    import partir  # noqa: F401
    conn.send("ready")
    while True:
        try:
            task = conn.recv()
        except EOFError:
            return
        if task is None:
            return
        try:
            result = run_task(task)
        except BaseException as e:  # the runner's own bug: report it, do not die
            result = Result(task, _failure("CRASH", e, "runner: "))
        conn.send(result)


class _Proc:
    def __init__(self, ctx) -> None:
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_worker, args=(child,), daemon=True)
        self.proc.start()
        child.close()
        self.ready = False
        self.task: Task | None = None
        self.started = 0.0
        self.done = 0

    def kill(self) -> None:
        if self.proc.is_alive():
            self.proc.kill()  # our own child, by its Process object
        self.proc.join(5)
        self.conn.close()


class Pool:
    """`workers` processes running tasks; `timeout` seconds a task (worker start-up not
    counted). Use as a context manager."""

    def __init__(self, workers: int = 1, timeout: float = 120.0) -> None:
        self.workers = max(1, workers)
        self.timeout = timeout
        self.ctx = mp.get_context("spawn")
        self.procs: list[_Proc] = []

    def __enter__(self) -> Pool:
        self.procs = [_Proc(self.ctx) for _ in range(self.workers)]
        return self

    def __exit__(self, *exc: object) -> None:
        for p in self.procs:
            try:
                if p.proc.is_alive() and p.task is None:
                    p.conn.send(None)
            except OSError:
                pass
            p.kill()
        self.procs = []

    def _replace(self, p: _Proc) -> None:
        p.kill()
        self.procs[self.procs.index(p)] = _Proc(self.ctx)

    def run(self, tasks: Iterable[Task], deadline: float | None = None) -> Iterator[Result]:
        """Results as they finish (not in task order). Past `deadline` (time.monotonic())
        no task starts: those running finish, the rest are not run."""
        pending = list(tasks)[::-1]
        while pending or any(p.task is not None for p in self.procs):
            if deadline is not None and time.monotonic() > deadline:
                pending = []
            for p in list(self.procs):
                if p.ready and p.task is None and pending:
                    if p.done >= RECYCLE_AFTER:
                        self._replace(p)
                        continue
                    p.task = pending.pop()
                    p.started = time.monotonic()
                    p.conn.send(p.task)
            now = time.monotonic()
            waits = [self.timeout - (now - p.started) for p in self.procs if p.task is not None]
            ready = wait([p.conn for p in self.procs], timeout=max(0.05, min(waits, default=1)))
            for p in list(self.procs):
                if p.conn in ready:
                    try:
                        msg = p.conn.recv()
                    except (EOFError, OSError):
                        msg = None
                    if msg == "ready":
                        p.ready = True
                        continue
                    if isinstance(msg, Result):
                        p.task, p.done = None, p.done + 1
                        yield msg
                        continue
                    # the worker died: a hard crash (segfault, abort, out of memory)
                    p.proc.join(5)  # reaped, so its exit code is known
                    task, code = p.task, p.proc.exitcode
                    self._replace(p)
                    if task is not None:
                        yield Result(task, Outcome("CRASH", "WorkerDied",
                                                   f"worker died with exit code {code}"))
                    continue
                if p.task is not None and time.monotonic() - p.started > self.timeout:
                    task = p.task
                    self._replace(p)
                    yield Result(task, Outcome("TIMEOUT", "Timeout",
                                               f"no result after {self.timeout:.0f} s",
                                               elapsed=self.timeout))
