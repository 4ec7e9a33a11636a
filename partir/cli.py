"""The `partir` command line.

    partir --version                    the installed version
    partir partition FILE               per-tactic table and the inputs each tactic sharded
    partir partition FILE --ir core [--after N]
                                        the PartIR:Core program after tactic N (default:
                                        the last; 0 is the traced program)
    partir partition FILE --json        the per-tactic records as JSON
    partir partition FILE --ir spmd|hlo [--after N]
                                        the program lowered to PartIR:SPMD or PartIR:HLO
    partir partition FILE --device h100 the simulator's cost columns for this device spec
                                        (default: cpu; see partir.sim.registered_devices)
    partir partition FILE --emit-schedule
                                        the schedule as source, each AutomaticPartition
                                        replaced by the ManualPartitions it found
    partir run FILE [--steps N] [--seed S] [--no-check] [--json] [--processes N]
                                        run the partitioned program on the local devices,
                                        check it against the unpartitioned function (inputs
                                        drawn with seed S) and report the step time; with
                                        --processes, as N processes under jax.distributed
                                        (`partir.launch`)
    partir daemon start|stop|status [--workspace DIR] [--json]
                                        the compiler daemon of a workspace (default: the
                                        current directory), see `partir_daemon`
    partir jobs [list|show ID|cancel ID|logs ID] [--workspace DIR]
                                        the jobs the workspace's daemon runs
    partir lsp                          the language server over stdio, see `partir_lsp`

FILE is a schedule file (`*.partir.py`, see `partir.schedule_file`). Bad schedule files
and bad tactics are reported as `partir: error: FILE:LINE: ...` with exit status 2.

Long work (loading the schedule file, each tactic, a search, lowering, compiling, the
steps) shows its progress on one line of stderr when stderr is a terminal; `--progress`
writes it to any stderr (one message a line, no carriage returns), `--no-progress` never.

The tools built on the library add their commands (`daemon`, `lsp`) through the
`partir.commands` entry points: each is a function given the subparsers that adds its
parser with a `run(args) -> int` default. The library itself never imports them.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from collections import Counter
from collections.abc import Callable, Sequence
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

from partir import __version__, launch
from partir.api import CorePartition, tactic_metadata
from partir.cancel import Progress, reporting
from partir.conflict_groups import group_conflicts
from partir.core.program import Sharding
from partir.errors import PartitionError
from partir.launch import LOCAL_DEVICES
from partir.pipeline import Lowered, lower
from partir.schedule_file import ScheduleFile, load_schedule_file
from partir.sim import DEFAULT_DEVICE, get_device, registered_devices
from partir.tactics import TacticRecord
from partir.tactics.search import manual_source

# Sharded inputs (outputs) listed per tactic in the text report; the rest are counted.
MAX_SHOWN = 12
# The table's collective columns: AG, AR, RS, A2A, CP.
_COLLECTIVES = ("all_gather", "all_reduce", "reduce_scatter", "all_to_all", "collective_permute")


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.command == "partition" and args.after is not None and args.ir is None:
        parser.error("--after needs --ir")
    run = getattr(args, "run", None)
    if run is not None:
        return run(args)
    progress = ProgressLine.of(args.progress)
    try:
        return _partition(args, progress) if args.command == "partition" else \
            _run(args, progress)
    except PartitionError as e:
        return _fail(str(e))
    except _Failed as e:
        return _fail(str(e))
    except BrokenPipeError:
        # The reader stopped early (`partir partition FILE | head`): not an error. Python
        # would report the failed flush of stdout at exit, so it is pointed at devnull.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


class _Failed(Exception):
    """The schedule file could not be analysed: its first diagnostic, as the message."""


def _fail(message: str) -> int:
    print(f"partir: error: {message}", file=sys.stderr)
    return 2


_NO_DIGITS = str.maketrans("", "", "0123456789")


class ProgressLine:
    """Progress messages on stderr. On a terminal: one line, rewritten in place and
    cleared at the end. Elsewhere (forced with `--progress`): one message a line, never a
    carriage return, and messages of one stage (a search's evaluations, the steps) at
    most one a second, so that logs stay short."""

    def __init__(self, enabled: bool, terminal: bool) -> None:
        self.enabled = enabled
        self.terminal = terminal
        self._shown = False
        self._last: tuple[str, float] = ("", 0.0)

    @classmethod
    def of(cls, flag: bool | None) -> ProgressLine:
        """`flag`: --progress (True), --no-progress (False), else whether stderr is a
        terminal."""
        terminal = sys.stderr.isatty()
        return cls(terminal if flag is None else flag, terminal)

    def __call__(self, message: str, step: int | None = None,
                 total: int | None = None) -> None:
        if not self.enabled:
            return
        if self.terminal:
            width = max(20, shutil.get_terminal_size().columns - 1)
            sys.stderr.write("\r\033[K" + message[:width])
            sys.stderr.flush()
            self._shown = True
            return
        # Messages differing in their numbers only (steps, evaluations) are one stage.
        stage, now = message.translate(_NO_DIGITS), time.monotonic()
        if stage == self._last[0] and now - self._last[1] < 1.0:
            return
        self._last = (stage, now)
        print(message, file=sys.stderr, flush=True)

    def done(self) -> None:
        """Clear the terminal's progress line, before the results are printed."""
        if self._shown:
            sys.stderr.write("\r\033[K")
            sys.stderr.flush()
            self._shown = False


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="partir", description="Partition JAX programs with PartIR schedules.")
    parser.add_argument("--version", action="version", version=f"partir {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    partition = commands.add_parser(
        "partition", help="apply a schedule file and report what each tactic did",
        description="Apply the schedule of a schedule file (*.partir.py) to its program "
                    "and report, per tactic, the actions, conflicts, sharded inputs and time.")
    partition.add_argument("file", metavar="FILE", help="a schedule file (*.partir.py)")
    output = partition.add_mutually_exclusive_group()
    output.add_argument("--ir", choices=["core", "spmd", "hlo"],
                        help="print the program in this IR instead of the report")
    output.add_argument("--json", action="store_true",
                        help="print the per-tactic records as JSON instead of the report")
    output.add_argument("--emit-schedule", action="store_true",
                        help="print the schedule as Python source, each AutomaticPartition "
                             "replaced by ManualPartitions of the decisions it found")
    partition.add_argument("--after", type=int, metavar="N",
                           help="with --ir: the program after tactic N (1-based; 0 is the "
                                "traced program; default: the last tactic)")
    partition.add_argument("--device", default=DEFAULT_DEVICE, metavar="NAME",
                           help="device spec of the estimated cost columns (default "
                                f"{DEFAULT_DEVICE}; one of {', '.join(registered_devices())})")
    _progress_flag(partition)
    run = commands.add_parser(
        "run", help="run the partitioned program on the local devices",
        description="Partition the schedule file's program, run it on the local devices "
                    "(8 virtual CPU devices when there is no accelerator), compare it with "
                    "the unpartitioned function and report the step time.")
    run.add_argument("file", metavar="FILE", help="a schedule file (*.partir.py)")
    run.add_argument("--steps", type=_at_least(0), default=10, metavar="N",
                     help="timed steps after the first (compiling) one (default 10)")
    run.add_argument("--seed", type=_at_least(0), default=0, metavar="S",
                     help="seed of the random values of the example arguments' abstract "
                          "leaves (default 0)")
    run.add_argument("--no-check", dest="check", action="store_false",
                     help="do not run the unpartitioned function to compare with")
    run.add_argument("--json", action="store_true",
                     help="print the results as one JSON object instead of text")
    run.add_argument("--processes", type=_at_least(1), default=1, metavar="N",
                     help="run as N processes of this machine under jax.distributed, with "
                          f"a local coordinator, each with {LOCAL_DEVICES}/N of the "
                          f"{LOCAL_DEVICES} virtual CPU devices: one program on one global "
                          "mesh, as on a cluster (default 1)")
    _progress_flag(run)
    for command in entry_points(group="partir.commands"):
        command.load()(commands)
    return parser


def _progress_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                        help="show progress on stderr (default: when it is a terminal)")


def _at_least(low: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        value = int(text)
        if value < low:
            raise argparse.ArgumentTypeError(f"must be >= {low}, got {value}")
        return value
    return parse


def _partition(args: argparse.Namespace, progress: ProgressLine) -> int:
    device = get_device(args.device)  # an unknown name fails before any work
    schedule_file, result = analyse(args.file, progress)
    if args.ir is not None:
        if args.after is not None and not 0 <= args.after <= len(result.tactics):
            return _fail(f"--after {args.after}: the schedule has {len(result.tactics)} "
                         f"tactics (0 is the traced program)")
        if args.ir == "core":
            text = result.core_ir(after=args.after)
        else:
            progress(f"lowering to PartIR:{args.ir.upper()}")
            text = lower(result.program_after(args.after)).text(args.ir)
    elif args.json:
        text = json.dumps(_json(schedule_file, result, device.name, progress), indent=2)
    elif args.emit_schedule:
        text = emit_schedule(schedule_file, result)
    else:
        text = _report(schedule_file, result, device.name, progress)
    progress.done()
    print(text)
    return 0


def analyse(path: str, progress: Progress) -> tuple[ScheduleFile, CorePartition]:
    """Load the schedule file and apply its tactics, reporting each stage (a search's
    too) to `progress`: the daemon's pipeline (`partir.session`), run once, with the
    example arguments' shapes only. Raises _Failed with the first diagnostic."""
    from partir.session import Session

    session = Session(os.getcwd(), load_timeout_s=0)  # no limit: the user is watching
    analysis = session.analyse(path, progress=progress)
    if analysis.diagnostics:
        d = analysis.diagnostics[0]
        where = f"{d.file}:{d.line}" if d.line else d.file
        inner = f" (at {d.inner.file}:{d.inner.line})" if d.inner is not None else ""
        raise _Failed(f"{where}: {d.message}{inner}")
    sf, trace = analysis.schedule_file, analysis.trace
    assert sf is not None and trace is not None and analysis.initial is not None
    records = [st.record for st in analysis.states if st.record is not None]
    return sf, CorePartition(trace.traced, sf.mesh, analysis.initial.module.snapshot(),
                             records, trace.elapsed_s)


def emit_schedule(schedule_file: ScheduleFile, result: CorePartition) -> str:
    """`schedule = [...]` with each automatic tactic's decisions as ManualPartition source
    and the other tactics as written in the file (by name when the file does not show
    them in a list literal)."""
    lines = schedule_file.path and _source_lines(schedule_file.path)
    out = [f"# {schedule_file.path}: the schedule with the decisions of its automatic "
           "tactics", "schedule = ["]
    for t, source in zip(result.tactics, schedule_file.tactics, strict=True):
        if t.search is not None:
            out.append(f"    # {t.name}: {t.search['evaluations']} evaluations in "
                       f"{t.search['elapsed_s']:.2f} s, {len(t.search['decisions'])} "
                       "decision(s)")
            out += [f"    {s}," for s in manual_source(t.search, t.name, "    ")]
        elif source.span is not None and lines:
            out.append(f"    {_span_text(lines, source.span)},")
        else:
            out.append(f"    {t.name},  # as in the schedule file")
    out.append("]")
    return "\n".join(out)


def _source_lines(path: str) -> list[str]:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read().split("\n")
    except OSError:
        return []


def _span_text(lines: list[str], span: Any) -> str:
    if span.line == span.end_line:
        return lines[span.line - 1][span.col:span.end_col]
    text = [lines[span.line - 1][span.col:], *lines[span.line:span.end_line - 1],
            lines[span.end_line - 1][:span.end_col]]
    return "\n".join(text)


def _value_actions(t: TacticRecord) -> int:
    # Every tactic ends with `propagate`; the table counts the tile/atomic actions it chose.
    return sum(a != "propagate" for a in t.actions)


def _conflict_counts(t: TacticRecord) -> str:
    kinds = Counter(c.kind for c in t.conflicts)
    return ", ".join(f"{n} {k}" for k, n in sorted(kinds.items())) or "none"


def _sharded(shardings: dict[str, Sharding]) -> list[tuple[str, str]]:
    return [(n, str(s)) for n, s in shardings.items() if any(s.dims) or s.partial]


def _bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def _flops(n: float) -> str:
    for unit in ("", "K", "M", "G", "T"):
        if n < 1000 or unit == "T":
            return f"{n:.0f}" if not unit else f"{n:.1f}{unit}"
        n /= 1000
    raise AssertionError("unreachable")


def _seconds(s: float) -> str:
    return f"{s * 1e3:.2f} ms" if s < 1 else f"{s:.2f} s"


def _report(schedule_file: ScheduleFile, result: CorePartition,
            device: str = DEFAULT_DEVICE, progress: Progress | None = None) -> str:
    lines = [f"{schedule_file.path}: {result.traced.function.name} on mesh {result.mesh}, "
             f"traced {len(result.initial.ops)} ops in {result.frontend_s * 1e3:.1f} ms",
             *(f"note: {note}" for note in result.notes), ""]
    shardings = [(t.program.input_shardings(), t.program.output_shardings())
                 for t in result.tactics]
    header = ("#", "tactic", "axis", "actions", "AG", "AR", "RS", "A2A", "CP", "conflicts",
              "sharded inputs", "time (ms)", "FLOP/dev", "est. step", "peak mem/dev")
    rows = [header]
    paddings = []
    n = len(result.tactics)
    if progress is not None and n:
        progress(f"lowering the program after tactic {n}", n, n)
    final = lower(result.tactics[-1].program) if result.tactics else None
    for i, (t, (inputs, _)) in enumerate(zip(result.tactics, shardings, strict=True), 1):
        if progress is not None:
            progress(f"lowering and simulating tactic {i}/{n}: {t.name}", i, n)
        meta = tactic_metadata(t, device, core_ir=False,
                               lowered=final if i == len(result.tactics) else None)
        # The padding each tactic introduces: that of the dimensions its axis pads.
        paddings.append([p for p in meta.padding if p["padded_by"] == t.axis])
        counts, cost = meta.collectives, meta.cost
        rows.append((str(i), t.name, t.axis, str(_value_actions(t)),
                     *(str(counts[k]) for k in _COLLECTIVES), _conflict_counts(t),
                     f"{len(_sharded(inputs))} of {len(inputs)}", f"{t.elapsed_s * 1e3:.1f}",
                     _flops(cost.flops), _seconds(cost.step_time_s),
                     _bytes(cost.peak_memory_bytes)))
    widths = [max(len(row[c]) for row in rows) for c in range(len(header))]
    numeric = {0, 3, 4, 5, 6, 7, 10, 11, 12, 13}  # right-aligned columns
    for row in rows:
        cells = [cell.rjust(w) if c in numeric else cell.ljust(w)
                 for c, (cell, w) in enumerate(zip(row, widths, strict=True))]
        lines.append("  ".join(cells).rstrip())
    lines.append(f"(estimated per device on {device}: step time = compute + communication, "
                 "peak memory = arguments + results + live temporaries)")
    padded = [p for ps in paddings for p in ps]
    if padded:
        lines.append(f"padding: {len(padded)} padded dimension{'s' if len(padded) > 1 else ''}"
                     f", {_bytes(sum(p['wasted_bytes'] for p in padded))} and "
                     f"{_flops(sum(p['wasted_flops'] for p in padded))} FLOP wasted "
                     "(all devices)")
    for i, (t, (inputs, outputs)) in enumerate(zip(result.tactics, shardings, strict=True), 1):
        lines += ["", f"[{i}] {t.name}: " + "; ".join(t.actions)]
        lines += _conflict_lines(t, i)
        lines += [f"    padding: {p['value']} dim {p['dim']}: {p['size']} -> {p['padded']} on "
                  f"{{{', '.join(p['axes'])}}} ({_bytes(p['wasted_bytes'])}, "
                  f"{_flops(p['wasted_flops'])} FLOP wasted)"
                  for p in paddings[i - 1][:MAX_SHOWN]]
        if len(paddings[i - 1]) > MAX_SHOWN:
            lines.append(f"    padding: ... {len(paddings[i - 1]) - MAX_SHOWN} more")
        lines += [f"    note: {note}" for note in t.notes]
        sections = [(what, _sharded(s), len(s)) for what, s in (("inputs", inputs),
                                                                ("outputs", outputs))]
        width = max((len(n) for _, sharded, _ in sections for n, _ in sharded[:MAX_SHOWN]),
                    default=0)
        for what, sharded, total in sections:
            if sharded:
                lines.append(f"    sharded {what} ({len(sharded)} of {total}):")
                lines += [f"      {n.ljust(width)}  {s}" for n, s in sharded[:MAX_SHOWN]]
            if len(sharded) > MAX_SHOWN:
                lines.append(f"      ... {len(sharded) - MAX_SHOWN} more")
    if final is not None:
        lines += _sites(final)
    return "\n".join(lines)


def _conflict_lines(t: TacticRecord, index: int) -> list[str]:
    """The tactic's conflicts grouped as the editor shows them (`partir.conflict_groups`):
    their count, what they mean for the program, and one line per group."""
    if not t.conflicts:
        return []
    groups = group_conflicts(c.to_json() for c in t.conflicts)
    count = len(t.conflicts)
    out = [f"    {count} conflict{'s' if count > 1 else ''} at {len(groups)} "
           f"place{'s' if len(groups) > 1 else ''}: propagation stopped there and left "
           f"those ops as they were on {t.axis!r} (each line says why; a tactic on their "
           f"inputs, or a tag, decides them)"]
    for group in groups[:MAX_SHOWN]:
        site = f" [{group.site}]" if group.site else ""
        out.append(f"    {group.message(f'tactic {index} ({t.name})')}{site}")
        # the first occurrence says why (a dimension's reason, the choices), as the
        # editor's related information does; the advice, what it costs and the fix
        occurrences = group.occurrences()
        if occurrences:
            more = f" (and {len(occurrences) - 1} more)" if len(occurrences) > 1 else ""
            out.append(f"      {occurrences[0]}{more}")
        if group.advice:
            out.append(f"      {group.advice}")
    if len(groups) > MAX_SHOWN:
        out.append(f"    ... conflicts at {len(groups) - MAX_SHOWN} more places")
    return out


def _sites(final: Lowered) -> list[str]:
    """The final program's collectives at the model lines they serve (whatever values
    they move), with how often those inside loop bodies run per call."""
    held: Counter = Counter()
    runs: Counter = Counter()
    for counts, executed in ((held, False), (runs, True)):
        for (kind, axes, _, file, line, function), n in final.collective_sites(
                executed).items():
            if line:
                counts[(file, line, function, kind, axes)] += n
    by_line: dict[tuple, list[str]] = {}
    for key, n in sorted(held.items(), key=lambda kv: (str(kv[0][0]), kv[0][1],
                                                          str(kv[0][2:]))):
        file, line, function, kind, axes = key
        by_line.setdefault((file, line, function), []).append(
            f"{kind} {{{', '.join(axes)}}} x{n}" + (f" (runs {runs[key]}x per call)"
                                                    if runs[key] != n else ""))
    if not by_line:
        return []
    out = ["", "collectives of the final program by model line:"]
    for (file, line, function), what in list(by_line.items())[:MAX_SHOWN]:
        out.append(f"  {os.path.basename(file)}:{line} ({function}): {'; '.join(what)}")
    if len(by_line) > MAX_SHOWN:
        out.append(f"  ... {len(by_line) - MAX_SHOWN} more lines")
    return out


def _json(schedule_file: ScheduleFile, result: CorePartition,
          device: str = DEFAULT_DEVICE, progress: Progress | None = None) -> dict[str, Any]:
    tactics = []
    for i, (t, source) in enumerate(zip(result.tactics, schedule_file.tactics, strict=True),
                                    1):
        if progress is not None:
            progress(f"lowering and simulating tactic {i}/{len(result.tactics)}: {t.name}",
                     i, len(result.tactics))
        span = source.span.to_json() if source.span else None
        meta = tactic_metadata(t, device, core_ir=False)
        tactics.append({
            "index": i,
            "name": t.name,
            "axis": t.axis,
            "source": {"file": schedule_file.path, **span} if span else None,
            "actions": t.actions,
            "conflicts": [c.to_json() for c in t.conflicts],
            "notes": t.notes,
            "input_shardings": {n: str(s) for n, s in t.program.input_shardings().items()},
            "output_shardings": {n: str(s) for n, s in t.program.output_shardings().items()},
            "collectives": meta.collectives,
            "cost": meta.cost.to_json(),
            "elapsed_s": t.elapsed_s,
            "propagation_s": t.propagation_s,
            "search": t.search,
            "padding": meta.padding,
        })
    return {"file": schedule_file.path, "function": result.traced.function.name,
            "mesh": dict(result.mesh), "frontend_s": result.frontend_s, "notes": result.notes,
            "tactics": tactics}


def _run(args: argparse.Namespace, progress: ProgressLine) -> int:
    place = launch.current()
    if args.processes > 1 and place is None:
        return _run_processes(args)
    # Without an accelerator, run on 8 virtual CPU devices; this must precede JAX's backend
    # initialisation, which happens on first use below.
    if place is not None:
        # Libraries write to this process's stdout from their own threads (gloo's
        # transport logs its connections): the report keeps a private copy of it, and
        # everything else goes to stderr, the process's log.
        sys.stdout = os.fdopen(os.dup(1), "w", buffering=1)
        os.dup2(2, 1)
        launch.initialize(place)
    elif "--xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                                   " --xla_force_host_platform_device_count=8").strip()
    import jax
    import numpy as np

    import partir

    progress("loading the schedule file")
    schedule_file = load_schedule_file(args.file)
    program = schedule_file.program
    inputs = _concrete_inputs(program.args, args.seed)
    fn, meta = partir.jit(program.fn, schedule_file.mesh, schedule_file.schedule,
                          static_argnums=program.static_argnums)
    devices = jax.devices()
    report = {"file": schedule_file.path, "platform": devices[0].platform,
              "devices": len(devices), "processes": jax.process_count(),
              "mesh": dict(schedule_file.mesh), "seed": args.seed}
    if not args.json:
        progress.done()
        print(f"{schedule_file.path}: {len(devices)} {devices[0].platform} devices"
              + (f" in {jax.process_count()} processes" if jax.process_count() > 1 else "")
              + f", mesh {schedule_file.mesh}")
    progress(f"partitioning ({len(schedule_file.schedule)} tactics) and compiling")
    start = time.perf_counter()
    with reporting(progress):  # a search's progress
        out = jax.block_until_ready(fn(*inputs))
    report |= {"compile_s": time.perf_counter() - start,
               "collectives": {k: v for k, v in meta.collectives.items() if v}}
    if not args.json:
        progress.done()
        print(f"partitioned and compiled in {report['compile_s']:.2f} s; collectives "
              + ", ".join(f"{k} {v}" for k, v in report["collectives"].items()))
    ok = True
    if args.check:
        progress("running the unpartitioned function to compare with")
        worst, ok = compare_with_unpartitioned(program, inputs, out)
        report |= {"max_abs_error": worst, "check_ok": ok}
        if not args.json:
            progress.done()
            print(f"check against the unpartitioned function: max |error| {worst:.2e} "
                  f"{'OK' if ok else 'MISMATCH'}")
    times = []
    for step in range(args.steps):
        progress(f"step {step + 1}/{args.steps}", step + 1, args.steps)
        start = time.perf_counter()
        jax.block_until_ready(fn(*inputs))
        times.append(time.perf_counter() - start)
    progress.done()
    report |= {"steps": len(times),
               "step_time_median_s": float(np.median(times)) if times else None,
               "step_time_min_s": min(times) if times else None}
    if args.json:
        print(json.dumps(report, indent=2))
    elif times:
        print(f"step time: median {np.median(times) * 1e3:.2f} ms, "
              f"min {min(times) * 1e3:.2f} ms over {len(times)} steps")
    return 0 if ok else 1


def _run_processes(args: argparse.Namespace) -> int:
    """`partir run --processes N`: the same command as N processes of one run; process
    0's output is the run's."""
    import tempfile

    argv = ["run", args.file, "--steps", str(args.steps), "--seed", str(args.seed),
            *([] if args.check else ["--no-check"]), *(["--json"] if args.json else []),
            "--no-progress"]
    try:
        logs = Path(tempfile.mkdtemp(prefix="partir-run-"))
        finished = launch.launch([sys.executable, "-m", "partir.cli", *argv],
                                 args.processes, logs)
    except ValueError as e:
        return _fail(str(e))
    report = finished[0].stdout.read_text()
    failed = [f for f in finished if f.returncode != 0]
    if not failed:
        sys.stdout.write(report)
        shutil.rmtree(logs, ignore_errors=True)
        return 0
    first = failed[0]
    # A check that found a mismatch exits 1 with its report; anything else is a crash.
    if first.returncode == 1 and all(f.returncode == 1 for f in finished):
        sys.stdout.write(report)
        return 1
    tail = first.stderr.read_text()[-4000:]
    return _fail(f"process {first.process_id} of {args.processes} exited with "
                 f"{first.returncode} (logs of every process in {logs}):\n{tail}")


def compare_with_unpartitioned(program: Any, inputs: tuple[Any, ...],
                               out: Any) -> tuple[float, bool]:
    """The partitioned program's result `out` against the unpartitioned function's on
    `inputs` (a `partir.Program`'s): the largest absolute difference, and whether every
    leaf is close (rtol = atol = 1e-4). Under `jax.distributed` every process calls it:
    each holds only its devices' tiles of `out`, gathered first."""
    import jax
    import numpy as np
    from jax.experimental import multihost_utils

    if jax.process_count() > 1:
        out = multihost_utils.process_allgather(out, tiled=True)

    want = jax.jit(program.fn, static_argnums=program.static_argnums)(*inputs)
    pairs = list(zip(jax.tree.leaves(out), jax.tree.leaves(want), strict=True))
    worst = max((float(np.max(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64))))
                 for a, b in pairs if np.size(a)), default=0.0)
    return worst, all(np.allclose(a, b, rtol=1e-4, atol=1e-4) for a, b in pairs)


def _concrete_inputs(args: tuple[Any, ...], seed: int = 0) -> tuple[Any, ...]:
    """The example arguments, with abstract leaves replaced by random values drawn with
    `seed` (integers in [0, 2) so that they are valid indices)."""
    import jax
    import numpy as np

    rng = np.random.default_rng(seed)

    def make(x: Any) -> Any:
        if not isinstance(x, jax.ShapeDtypeStruct):
            return x
        if np.issubdtype(x.dtype, np.integer):
            return rng.integers(0, 2, size=x.shape).astype(x.dtype)
        return rng.normal(size=x.shape).astype(x.dtype)

    return tuple(jax.tree.map(make, a) for a in args)


if __name__ == "__main__":  # `partir.launch` starts its processes as `python -m partir.cli`
    sys.exit(main())
