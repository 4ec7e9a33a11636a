"""Language server latency as an editor sees it: the shipped transformer schedule files
(realistic) and the 32-layer transformer step (paper's T32), side by side in one run.

Each mode runs through the real server (`python -m partir_lsp` over stdio, pytest-lsp's
client, as an editor drives it) and a fresh daemon it starts in a private runtime
directory, on a private copy of examples/ (all files as they are shipped).

realistic: the tiny transformer with concrete inputs (`model.make_inputs(model.TINY)`,
  which runs `jax.jit` at every load) and the MLP example:
  - `transformer/bp_mp_z3.partir.py` as shipped (tactics imported from schedules.py):
    cold open (daemon start, first analysis), then edits of its schedule line
    (`schedule = [BP, MP, Z3]` -> `[BP, MP]` and back), then model.py saved on disk (a
    comment line appended, then LEARNING_RATE changed and back): the time from the write
    to the schedule file's diagnostics published again (the daemon's watcher, its
    `partir/invalidated` notification, the server's re-analysis);
  - `transformer/bp_mp_z3_inline.partir.py`, the same file with schedules.py's MEGATRON
    rule and BP, MP and Z3 written out in the schedule list: 20 hovers on BP's "batch"
    input key (unchanged file), then edits of the last tactic's name (a new name each
    edit: only it is applied again) and of BP's input dim (`{"batch": 0}` <-> `{"batch":
    1}`: every tactic applied again, from the daemon's cache after the first round);
  - `mlp/bp_mp_z3.partir.py` as shipped: edits of the last tactic's name (reference).
  Edits are incremental `didChange`s (the changed range only), versions increasing. For
  each: the time to the diagnostics published for that version, and to the refreshed
  code lenses (the server's `workspace/codeLens/refresh`, then the `textDocument/codeLens`
  answer with one summary lens per tactic of the new text). Debounce included. A
  measurement without an answer within 10 s is reported missed, not waited for.
t32: the T32 schedule of t32_edits.py (abstract inputs, tactics written out): open, then
  edits replacing the last tactic by one the daemon has not seen (full-text `didChange`),
  then an edit back to a cached tactic.

Targets: edit -> diagnostics <= 0.8 s, edit -> refreshed lenses <= 1.5 s, hover p95 <=
100 ms, model saved -> diagnostics <= 2 s, MLP edit -> diagnostics no worse than 0.31 s;
t200: a schedule file of 200 tactics (issue 31), built as a user who writes one small
  tactic per parameter would: the tiny transformer (model.TINY with 6 layers, concrete
  inputs) on the shipped mesh {batch: 4, model: 2}; tactic 1 is BP (`{"batch": 0}` on
  "batch"), then, layer by layer, one ManualPartition per leaf of params, Adam's mu and
  nu: the Megatron dimension of w_qkv, w_o, w_up, b_up and w_down on "model", then every
  leaf's FIRST_DIVISIBLE_DIM on "batch" (ZeRO-3, one leaf at a time), cut at 200. Open,
  then edits of the last tactic (its key replaced by a leaf it did not name, a new one
  each edit: one tactic applied and lowered again), edits of tactic 100 (likewise: the
  tactics after it applied again, the programs they change lowered), renames of the first
  tactic (a new name each edit: no program changes), and one edit of BP's input dim
  (`{"batch": 0}` -> `{"batch": 1}`: every state changes; reported, no target). Each edit
  is timed to its diagnostics, to the refreshed lenses holding the edited tactic's counts
  (the daemon lowers from the edited tactic on, and the server refreshes the lenses with
  the tactics lowered so far as it goes), to those holding the counts of the tactics of
  the 40 lines from it (what an editor shows around the edit; reported, no target), and
  to those holding every tactic's. The
  mode runs once per `--lowering-processes` count (default 1 and 2: a fresh server and a
  daemon whose compiler processes lower an edit's states in that many processes,
  `partir.forked`), and prints the ratios of their lens times.

Targets: edit -> diagnostics <= 0.8 s, edit -> refreshed lenses <= 1.5 s, hover p95 <=
100 ms, model saved -> diagnostics <= 2 s, MLP edit -> diagnostics no worse than 0.31 s;
T32 edit of the last tactic < 1.5 s (issue 6); t200 edit of the last, the middle or the
first tactic: diagnostics <= 0.8 s, lenses <= 1.5 s (issue 31). Always exits 0: figures,
not assertions.

    python benchmarks/lsp_latency.py [--mode realistic|t32|t200|all] [--repeat 3]
        [--debounce-ms 300] [--lowering-processes 1,2] [--batch-axis 16]
        [--model-axis 2] [--layers 32]
"""

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import argparse
import ast
import asyncio
import itertools
import math
import re
import shutil
import statistics
import sys
import textwrap
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from lsprotocol import types as T  # noqa: E402
from partir_lsp.render import LOWERING  # noqa: E402
from t32_edits import Z3, add_arguments, edited_tactic, schedule_text  # noqa: E402

from partir_daemon import protocol as P  # noqa: E402
from partir_daemon.client import start_daemon  # noqa: E402
from tests.lsp.support import Session, Workspace, start_session, stop_session  # noqa: E402

# A summary lens, named after its tactic ("Z3: +AG 2 ..."; not a stale one).
COUNTS = re.compile(r"^(?:[^\s:]+: )?\+AG \d+ \+AR \d+ \+RS \d+ \+A2A \d+")
TIMEOUT_S = 10.0  # no answer within this: the measurement is reported missed
OPEN_TIMEOUT_S = 600.0  # the first analysis (daemon start, JAX import, trace)
SETTLE_TIMEOUT_S = 120.0  # waiting, untimed, for the server to finish before the next step
HOVERS = 20
SCREEN_LINES = 40  # what an editor shows of a schedule file around the edited line
MLP_REFERENCE_S = 0.31  # last recorded MLP edit -> diagnostics

SHIPPED = "transformer/bp_mp_z3.partir.py"
INLINE = "transformer/bp_mp_z3_inline.partir.py"
MLP = "mlp/bp_mp_z3.partir.py"
MODEL = "transformer/model.py"


# -- results -----------------------------------------------------------------------------

@dataclass
class Row:
    mode: str
    what: str
    target: float | None = None  # seconds; None: reported, no target
    p95: bool = False  # the target is on the p95 rather than the median
    times: list[float] = field(default_factory=list)
    missed: list[str] = field(default_factory=list)  # why each missing sample is missing

    def add(self, seconds: float | None, why: str = "") -> None:
        if seconds is None:
            self.missed.append(why)
        else:
            self.times.append(seconds)

    def verdict(self) -> str:
        if self.missed:
            return f"MISSED: {len(self.missed)} of {self.n} {self.missed[0]}"
        if self.target is None or not self.times:
            return "-"
        value = percentile(self.times, 95) if self.p95 else statistics.median(self.times)
        return "met" if value <= self.target else "MISSED"

    @property
    def n(self) -> int:
        return len(self.times) + len(self.missed)


def percentile(times: list[float], q: float) -> float:
    """Nearest rank."""
    ordered = sorted(times)
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]


def print_table(rows: list[Row]) -> None:
    def seconds(x: float | None) -> str:
        return "-" if x is None else f"{x:.3f}s" if x >= 0.1 else f"{x * 1000:.1f}ms"

    table = [("mode", "measurement", "n", "median", "p95", "target", "result")]
    for r in rows:
        median = statistics.median(r.times) if r.times else None
        p95 = percentile(r.times, 95) if r.p95 and r.times else None
        target = "-" if r.target is None else \
            f"{'p95 ' if r.p95 else ''}<= {seconds(r.target)}"
        table.append((r.mode, r.what, str(r.n), seconds(median), seconds(p95), target,
                      r.verdict()))
    widths = [max(len(line[i]) for line in table) for i in range(len(table[0]) - 1)]
    for line in table:
        print("  ".join(cell.ljust(w) if i < 2 else cell.rjust(w)
                        for i, (cell, w) in enumerate(zip(line, widths, strict=False)))
              + "  " + line[-1])


# -- driving the server ------------------------------------------------------------------

def utf16_position(text: str, offset: int) -> T.Position:
    line_start = text.rfind("\n", 0, offset) + 1
    return T.Position(text.count("\n", 0, offset),
                      len(text[line_start:offset].encode("utf-16-le")) // 2)


def change_incrementally(session: Session, uri: str, old: str, new: str) -> int:
    """Send `new` as the next version of `uri`, as an editor does: the changed range of
    `old` only. Returns the version."""
    prefix = 0
    while prefix < min(len(old), len(new)) and old[prefix] == new[prefix]:
        prefix += 1
    suffix = 0
    while suffix < min(len(old), len(new)) - prefix and old[-1 - suffix] == new[-1 - suffix]:
        suffix += 1
    version = session.versions[uri] = session.versions[uri] + 1
    session.client.text_document_did_change(T.DidChangeTextDocumentParams(
        T.VersionedTextDocumentIdentifier(version, uri),
        [T.TextDocumentContentChangePartial(
            T.Range(utf16_position(old, prefix), utf16_position(old, len(old) - suffix)),
            new[prefix:len(new) - suffix])]))
    return version


@dataclass
class Edit:
    """What one edit took: None where nothing came within the timeout (`why`)."""

    diagnostics: float | None = None
    lenses: float | None = None  # every tactic's summary lens refreshed
    first_lens: float | None = None  # the edited line's summary lens refreshed
    screen: float | None = None  # the summary lenses of a screen from the edited line
    why: str = ""
    summaries: list[T.CodeLens] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


def summaries_of(lenses: list[T.CodeLens]) -> list[T.CodeLens]:
    return [lens for lens in lenses if COUNTS.match(lens.command.title)]


def screen_lowered(lenses: list[T.CodeLens], line: int) -> bool:
    """Whether the tactics of the SCREEN_LINES lines from `line` (what an editor shows
    around the edit) all show their counts, none "lowering…"."""
    shown = [lens for lens in lenses if line <= lens.range.start.line < line + SCREEN_LINES]
    return any(COUNTS.match(lens.command.title) for lens in shown) and \
        not any(lens.command.title.endswith(LOWERING) for lens in shown)


async def timed_edit(session: Session, uri: str, send: Callable[[], int], tactics: int,
                     timeout: float, line: int | None = None) -> Edit:
    """Send an edit (`send` returns its version); time it to the diagnostics published for
    that version, then to the code lenses after the server's lens refreshes: to the first
    whose lenses hold a summary on `line` (the edited tactic's, 0-based), and to the
    first that holds one summary lens per tactic (`tactics`) of the new text (a long
    lowering refreshes them as its first tactics are lowered)."""
    out = Edit()
    refreshes = session.lens_refreshes
    start = time.perf_counter()
    version = send()
    try:
        diags = await session.diagnostics_for(uri, version, timeout)
    except AssertionError:
        out.why = f"(no diagnostics within {timeout:g} s)"
        await settle(session, refreshes, uri, tactics)
        return out
    out.diagnostics = time.perf_counter() - start
    out.errors = [d.message for d in diags if d.severity == T.DiagnosticSeverity.Error]
    while out.lenses is None:
        try:
            await session.wait_until("the code lens refresh",
                                     lambda seen=refreshes: session.lens_refreshes > seen,
                                     max(0.0, start + timeout - time.perf_counter()))
            refreshes = session.lens_refreshes
            lenses = await asyncio.wait_for(session.lenses(uri),
                                            max(0.0, start + timeout - time.perf_counter()))
        except (AssertionError, TimeoutError):
            out.why = f"(lenses for {len(out.summaries)} tactics, not {tactics}, within " \
                      f"{timeout:g} s)"
            await settle(session, refreshes, uri, tactics)
            return out
        elapsed = time.perf_counter() - start
        out.summaries = summaries_of(lenses)
        if out.first_lens is None and any(lens.range.start.line == line
                                          for lens in out.summaries):
            out.first_lens = elapsed
        if out.screen is None and line is not None and screen_lowered(lenses, line):
            out.screen = elapsed
        if len(out.summaries) == tactics:
            out.lenses = elapsed
    return out


async def settle(session: Session, refreshes: int, uri: str | None = None,
                 tactics: int | None = None) -> None:
    """Wait, untimed, for the end of the analysis started after `refreshes` code lens
    refreshes (the server sends one when an analysis is complete, and as a long lowering
    goes on: with `uri`, until its lenses hold `tactics` summaries), so that one
    measurement does not spill into the next."""
    deadline = time.perf_counter() + SETTLE_TIMEOUT_S
    try:
        while True:
            await session.wait_until("the end of the analysis",
                                     lambda seen=refreshes: session.lens_refreshes > seen,
                                     max(0.0, deadline - time.perf_counter()))
            refreshes = session.lens_refreshes
            if uri is None or len(summaries_of(await session.lenses(uri))) == tactics:
                return
    except AssertionError:
        print(f"    (no analysis ended within {SETTLE_TIMEOUT_S:g} s)", flush=True)


def daemon_logs(session: Session, name: str, since: int) -> list[str]:
    return [m.message for m in session.client.log_messages[since:]
            if m.message.startswith(f"PartIR: {Path(name).name} v")]


async def open_document(session: Session, name: str, tactics: int,
                        diag: Row, lens: Row | None = None) -> str:
    """Open `name` (the warm-up, not an edit) and wait for its first analysis: the times
    to its diagnostics and to its code lenses (after the server's lens refresh, one summary
    lens per tactic) go to the rows. Returns its URI."""
    refreshes = session.lens_refreshes
    start = time.perf_counter()
    uri = session.open(name)
    try:
        await session.diagnostics_for(uri, 1, OPEN_TIMEOUT_S)
        diag.add(time.perf_counter() - start)
    except AssertionError:
        diag.add(None, f"(no diagnostics within {OPEN_TIMEOUT_S:g} s)")
    await settle(session, refreshes, uri, tactics)
    summaries = summaries_of(await session.lenses(uri))
    opened = time.perf_counter() - start
    if lens is not None:
        lens.add(opened if len(summaries) == tactics else None,
                 f"(lenses for {len(summaries)} tactics, not {tactics})")
    print(f"  opened {name}: diagnostics "
          f"{f'{diag.times[0]:.3f}s' if diag.times else '-'}, lenses {opened:.3f}s: "
          f"{[lens.command.title for lens in summaries]}", flush=True)
    return uri


def edited_line(old: str, new: str) -> int:
    """The first line (0-based) where `new` differs from `old`."""
    prefix = next((i for i, (a, b) in enumerate(zip(old, new, strict=False)) if a != b),
                  min(len(old), len(new)))
    return new.count("\n", 0, prefix)


async def measure_edits(session: Session, uri: str, name: str, texts: list[str],
                        tactics: Callable[[str], int], diag_row: Row,
                        lens_row: Row | None, timeout: float = TIMEOUT_S,
                        first_row: Row | None = None, screen_row: Row | None = None
                        ) -> None:
    """Edit the open document through `texts` (the first is its current text), one
    incremental change each, recording each edit in the rows (`first_row`: the time to
    the edited tactic's refreshed lens; `screen_row`: to those of a screen from it)."""
    for old, new in itertools.pairwise(texts):
        logs = len(session.client.log_messages)
        edit = await timed_edit(session, uri,
                                lambda old=old, new=new: change_incrementally(session, uri,
                                                                              old, new),
                                tactics(new), timeout, edited_line(old, new))
        diag_row.add(edit.diagnostics, edit.why)
        if lens_row is not None:
            lens_row.add(edit.lenses, edit.why)
        if first_row is not None:
            first_row.add(edit.first_lens, edit.why)
        if screen_row is not None:
            screen_row.add(edit.screen, edit.why)
        shown = "-" if edit.lenses is None else f"{edit.lenses:.3f}s"
        first = "-" if edit.first_lens is None else f"{edit.first_lens:.3f}s"
        print(f"    {diag_row.what}: diagnostics "
              f"{'-' if edit.diagnostics is None else f'{edit.diagnostics:.3f}s'}, edited "
              f"tactic's lens {first}, lenses {shown} {edit.why}"
              f"{' errors: ' + str(edit.errors) if edit.errors else ''}", flush=True)
        for line in daemon_logs(session, name, logs):
            print(f"      {line}", flush=True)


async def timed_save(session: Session, uri: str, path: Path, text: str,
                     timeout: float) -> tuple[float | None, str]:
    """Write `text` to `path` (a model file saved by the editor); the time until the
    server publishes diagnostics for `uri` again."""
    seen, refreshes = len(session.published), session.lens_refreshes
    start = time.perf_counter()
    path.write_text(text)
    try:
        await session.wait_until(
            "diagnostics after the model file was saved",
            lambda: any(p.uri == uri for p in session.published[seen:]), timeout)
    except AssertionError:
        return None, f"(no diagnostics within {timeout:g} s of the save)"
    elapsed = time.perf_counter() - start
    await settle(session, refreshes)
    return elapsed, ""


async def measure_saves(session: Session, uri: str, name: str, path: Path,
                        texts: list[str], row: Row) -> None:
    for text in texts:
        logs = len(session.client.log_messages)
        seconds, why = await timed_save(session, uri, path, text, TIMEOUT_S)
        # The watcher's debounce: let it report this write before the next.
        await asyncio.sleep(0.5)
        row.add(seconds, why)
        print(f"    {row.what}: {'-' if seconds is None else f'{seconds:.3f}s'} {why}",
              flush=True)
        for line in daemon_logs(session, name, logs):
            print(f"      {line}", flush=True)


async def measure_hovers(session: Session, uri: str, position: T.Position, key: str,
                         row: Row) -> None:
    for _ in range(HOVERS):
        start = time.perf_counter()
        try:
            text = await asyncio.wait_for(session.hover(uri, position.line,
                                                        position.character), TIMEOUT_S)
        except TimeoutError:
            row.add(None, f"(no hover within {TIMEOUT_S:g} s)")
            continue
        if text is None:
            row.add(None, "(the hover was empty)")
        elif key not in text:
            row.add(None, f"(the hover does not name {key!r})")
        else:
            row.add(time.perf_counter() - start)
    print(f"    {row.what}: " + " ".join(f"{t * 1000:.0f}" for t in row.times) + " ms"
          + (f"; {len(row.missed)} missed {row.missed[0]}" if row.missed else ""), flush=True)


# -- realistic mode ----------------------------------------------------------------------

def inline_variant(shipped: str, schedules: str) -> str:
    """The shipped schedule file with schedules.py's definitions it needs written out and
    its BP, MP and Z3 written in the schedule list (the same tactics, as text)."""
    tree = ast.parse(schedules)
    assigned = {t.id: node for node in tree.body if isinstance(node, ast.Assign)
                for target in node.targets
                for t in (target.elts if isinstance(target, ast.Tuple) else [target])
                if isinstance(t, ast.Name)}
    functions = {node.name: node for node in tree.body if isinstance(node, ast.FunctionDef)}

    def source(node: ast.AST) -> str:
        return ast.get_source_segment(schedules, node, padded=True) or ""

    def tactic(name: str) -> str:
        node = assigned[name].value
        # Re-indent the call's continuation lines for the list element's 4 columns.
        first, *rest = source(node).lstrip().splitlines()
        shift = 4 - node.col_offset
        return "\n".join([f"    {first}", *(" " * shift + line if shift > 0 else
                                             line[-shift:] for line in rest)]) + ","

    imports = next(source(node) for node in tree.body if isinstance(node, ast.ImportFrom)
                   and node.module == "partir")
    written = "\n".join([source(assigned["BATCH"]), source(assigned["MESH"]), "",
                         source(assigned["MEGATRON_DIMS"]), source(assigned["RANKS"]), "",
                         "", source(functions["megatron"]), "", "",
                         source(functions["zero"])])
    tactics = "\n".join(tactic(name) for name in ("BP", "MP", "Z3"))
    text = shipped.replace("from schedules import BP, MESH, MP, Z3\n", "")
    text = text.replace("import partir\n", f"import partir\n{imports}\n\n{written}\n\n")
    text = text.replace("schedule = [BP, MP, Z3]", f"schedule = [\n{tactics}\n]")
    if text == shipped or "schedule = [\n" not in text:
        raise SystemExit(f"{SHIPPED} is not as this benchmark expects")
    return text


def replaced(text: str, old: str, new: str) -> str:
    if text.count(old) != 1:
        raise SystemExit(f"{old!r} is not written once in the benchmark's file")
    return text.replace(old, new)


def back_and_forth(text: str, old: str, new: str, repeat: int) -> list[str]:
    """`text`, then `repeat` edits: `old` -> `new` and back, alternately."""
    edited = replaced(text, old, new)
    return [text, *([edited, text] * repeat)][:repeat + 1]


def renames(text: str, repeat: int) -> list[str]:
    """`text`, then `repeat` edits, each renaming the last tactic (Z3) to a new name."""
    return [text, *(replaced(text, 'name="Z3"', f'name="Z3e{k + 1}"')
                    for k in range(repeat))]


async def edit_rows(session: Session, uri: str, name: str, texts: list[str], what: str,
                    target: float = 0.8, lenses: bool = True) -> list[Row]:
    """The rows of the edits through `texts`: to diagnostics and to refreshed lenses."""
    diag = Row("realistic", f"{what} -> diagnostics", target)
    lens = Row("realistic", f"{what} -> refreshed lenses", 1.5) if lenses else None
    await measure_edits(session, uri, name, texts, tactics_in, diag, lens)
    return [diag] if lens is None else [diag, lens]


def tactics_in(text: str) -> int:
    """How many tactics the schedule file's `schedule = [...]` lists."""
    return next(len(node.value.elts) for node in ast.parse(text).body
                if isinstance(node, ast.Assign) and isinstance(node.value, ast.List)
                and any(isinstance(t, ast.Name) and t.id == "schedule" for t in node.targets))


def key_position(text: str, key: str) -> T.Position:
    """Inside the first occurrence of `key` (a string literal with its quotes)."""
    return utf16_position(text, text.index(key) + 2)


async def realistic(args: argparse.Namespace, rows: list[Row]) -> None:
    """Append the realistic mode's rows to `rows` as they are measured."""
    mode = "realistic"
    workspace = Workspace.create()
    examples = ROOT / "examples"
    shutil.copytree(examples / "transformer", workspace.path("transformer"),
                    dirs_exist_ok=True, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(examples / MLP, workspace.path(MLP))  # the shipped file, not the tests'
    shipped = workspace.path(SHIPPED).read_text()
    inline = inline_variant(shipped, workspace.path("transformer/schedules.py").read_text())
    workspace.path(INLINE).write_text(inline)
    mlp = workspace.path(MLP).read_text()
    model = workspace.path(MODEL).read_text()
    repeat = args.repeat

    options = {"collectiveMarkersInModel": False, "debounceMs": args.debounce_ms}
    session = await start_session(workspace, options)
    session.client.set_configuration(options, section="partir")
    try:
        # The shipped file (tactics imported): cold open, edits of the schedule line,
        # model.py saved on disk.
        rows.append(Row(mode, "shipped: open -> diagnostics (cold open, daemon start)"))
        uri = await open_document(session, SHIPPED, 3, rows[-1])
        texts = back_and_forth(shipped, "schedule = [BP, MP, Z3]", "schedule = [BP, MP]",
                               repeat)
        rows += await edit_rows(session, uri, SHIPPED, texts,
                                "shipped: [BP, MP, Z3] <-> [BP, MP]")
        if texts[-1] != shipped:
            refreshes = session.lens_refreshes
            change_incrementally(session, uri, texts[-1], shipped)
            await settle(session, refreshes)

        comment = Row(mode, "model.py saved (comment appended) -> diagnostics", 2.0)
        rate = Row(mode, "model.py saved (LEARNING_RATE changed) -> diagnostics", 2.0)
        rows += [comment, rate]
        await measure_saves(session, uri, SHIPPED, workspace.path(MODEL),
                            [model + "".join(f"# saved {j}\n" for j in range(k + 1))
                             for k in range(repeat)],
                            comment)
        lr = replaced(model, "LEARNING_RATE = 1e-3", "LEARNING_RATE = 2e-3")
        await measure_saves(session, uri, SHIPPED, workspace.path(MODEL),
                            [lr if k % 2 == 0 else model for k in range(repeat)], rate)
        workspace.path(MODEL).write_text(model)
        session.close(uri)
        await asyncio.sleep(0.5)  # the model file's last write reported before the next

        # The tactics written out: hovers on an input key, edits of the tactic lines.
        rows.append(Row(mode, "inline: open -> diagnostics (cold open, daemon up)"))
        uri = await open_document(session, INLINE, 3, rows[-1])
        hover = Row(mode, 'inline: hover on BP\'s "batch" key', 0.1, p95=True)
        rows.append(hover)
        await measure_hovers(session, uri, key_position(inline, '{"batch": 0}'), "batch",
                             hover)
        texts = renames(inline, repeat)
        rows += await edit_rows(session, uri, INLINE, texts, "inline: rename the last tactic")
        texts = back_and_forth(texts[-1], '{"batch": 0}', '{"batch": 1}', repeat)
        rows += await edit_rows(session, uri, INLINE, texts,
                                'inline: BP {"batch": 0} <-> 1')
        session.close(uri)

        # The MLP example, as a reference.
        rows.append(Row(mode, "mlp: open -> diagnostics (cold open, daemon up)"))
        uri = await open_document(session, MLP, 3, rows[-1])
        rows += await edit_rows(session, uri, MLP, renames(mlp, repeat),
                                "mlp (last recorded 0.31 s): rename the last tactic",
                                MLP_REFERENCE_S, lenses=False)
        session.close(uri)
    finally:
        await stop_session(session)
        workspace.teardown()


# -- T32 mode ----------------------------------------------------------------------------

async def t32(args: argparse.Namespace, rows: list[Row]) -> None:
    """Append the T32 mode's rows to `rows`."""
    mode = "t32"
    workspace = Workspace.create()
    name = "transformer/t32.partir.py"
    path = workspace.path(name)
    path.write_text(schedule_text(args, Z3))
    last_line = schedule_text(args, Z3).splitlines().index(f"    {Z3},")
    options = {"collectiveMarkersInModel": False, "debounceMs": args.debounce_ms}
    session = await start_session(workspace, options)
    session.client.set_configuration(options, section="partir")

    async def edit(text: str, diag: Row, lens: Row) -> None:
        logs = len(session.client.log_messages)
        result = await timed_edit(session, uri, lambda: session.change(uri, text), 3,
                                  OPEN_TIMEOUT_S)
        titles = [s.command.title for s in result.summaries if s.range.start.line == last_line]
        if result.errors:
            result.lenses, result.why = None, f"(errors: {result.errors})"
        elif result.lenses is not None and len(titles) != 1:
            result.lenses, result.why = None, "(no summary lens on the last tactic's line)"
        diag.add(result.diagnostics, result.why)
        lens.add(result.lenses, result.why)
        print(f"    {diag.what}: diagnostics {result.diagnostics or float('nan'):.3f}s, "
              f"refreshed lenses {result.lenses or float('nan'):.3f}s {result.why}  lens: "
              f"{titles}", flush=True)
        for line in daemon_logs(session, name, logs):
            print(f"      {line}", flush=True)

    what = f"T32 ({args.layers} layers) mesh {{batch: {args.batch_axis}, model: " \
           f"{args.model_axis}}}"
    print(f"  {what}, BP+MP+Z3", flush=True)
    opened = Row(mode, f"{what}: open -> diagnostics (cold open)")
    opened_lenses = Row(mode, f"{what}: open -> lenses (cold open)")
    diag = Row(mode, "T32: edit of the last tactic -> diagnostics", 1.5)
    lens = Row(mode, "T32: edit of the last tactic -> refreshed lenses", 1.5)
    cached_diag = Row(mode, "T32: edit back to a cached tactic -> diagnostics")
    cached_lens = Row(mode, "T32: edit back to a cached tactic -> refreshed lenses")
    rows += [opened, opened_lenses, diag, lens, cached_diag, cached_lens]
    try:
        uri = await open_document(session, name, 3, opened, opened_lenses)
        for k in range(args.repeat):
            await edit(schedule_text(args, edited_tactic(k)), diag, lens)
        await edit(schedule_text(args, Z3), cached_diag, cached_lens)
    finally:
        await stop_session(session)
        workspace.teardown()


# -- t200 mode ---------------------------------------------------------------------------

T200 = "transformer/t200.partir.py"
T200_TACTICS = 200
T200_LAYERS = 6
T200_TREES = ("params", "opt_state/0/mu", "opt_state/0/nu")
T200_SCHEDULE = '''\
import dataclasses

import model
from schedules import MESH

import partir
from partir import FIRST_DIVISIBLE_DIM

config = dataclasses.replace(model.TINY, layers={layers})
program = partir.Program(model.train_step, *model.make_inputs(config))
mesh = MESH
schedule = [
{tactics}]
'''


def t200_leaves(megatron: dict[str, int], leaves: tuple[str, ...]) -> list[str]:
    """Every one-leaf tactic of the t200 schedule, in order (more than 199 of them)."""
    tactics = []
    for layer in range(T200_LAYERS):
        for axis, dims in (("model", megatron), ("batch", dict.fromkeys(leaves, None))):
            for leaf, dim in dims.items():
                for tree in T200_TREES:
                    tag = f"{axis[0]}.{tree.rsplit('/', 1)[-1]}.{layer}.{leaf}"
                    tactics.append(f'partir.ManualPartition({{"{tree}/layers/{layer}/{leaf}": '
                                   f'{"FIRST_DIVISIBLE_DIM" if dim is None else dim}}}, '
                                   f'axis="{axis}", name="{tag}")')
    return tactics


def t200_text(tactics: list[str]) -> str:
    return T200_SCHEDULE.format(layers=T200_LAYERS,
                                tactics="".join(f"    {t},\n" for t in tactics))


async def t200(args: argparse.Namespace, rows: list[Row]) -> None:
    """Append the t200 mode's rows to `rows`, for each `--lowering-processes` count (a
    fresh server and daemon each), then the ratios of their lens times."""
    by_processes: dict[int, list[Row]] = {}
    for processes in args.lowering_processes:
        by_processes[processes] = []
        await t200_with(args, processes, by_processes[processes])
        rows += by_processes[processes]
    (one, ones), *others = by_processes.items()
    for n, measured in others:
        for a, b in zip(ones, measured, strict=True):
            if "lens" in a.what and a.times and b.times:
                print(f"  {a.what.removeprefix('t200: ')}: {n} processes / {one}: "
                      f"{statistics.median(b.times) / statistics.median(a.times):.2f}x")


async def t200_with(args: argparse.Namespace, processes: int, rows: list[Row]) -> None:
    """The t200 rows with a daemon whose compiler processes lower in `processes`."""
    mode = f"t200/{processes}p"
    workspace = Workspace.create()
    shutil.copytree(ROOT / "examples" / "transformer", workspace.path("transformer"),
                    dirs_exist_ok=True, ignore=shutil.ignore_patterns("__pycache__"))
    sys.path.insert(0, str(workspace.path("transformer")))
    try:
        import model
        import schedules
    finally:
        sys.path.pop(0)
    bp = 'partir.ManualPartition({"batch": 0}, axis="batch", name="BP")'
    every = t200_leaves(schedules.MEGATRON_DIMS, model.LAYER_PARAMS)
    tactics = [bp, *every[:T200_TACTICS - 1]]
    spare = every[T200_TACTICS - 1:]  # leaves the schedule does not name yet
    if len(spare) < 2 * args.repeat:
        raise SystemExit(f"t200: {len(spare)} spare leaves for {2 * args.repeat} edits")
    text = t200_text(tactics)
    workspace.path(T200).write_text(text)
    tactics[-1] = spare[args.repeat - 1]
    lasts = [text, *(t200_text([*tactics[:-1], spare[k]]) for k in range(args.repeat))]
    middle = T200_TACTICS // 2
    middles = [lasts[-1], *(t200_text([*tactics[:middle - 1], spare[args.repeat + k],
                                       *tactics[middle:]]) for k in range(args.repeat))]
    firsts = [middles[-1], *(middles[-1].replace('name="BP"', f'name="BP{k + 1}"')
                             for k in range(args.repeat))]
    dim = [firsts[-1], replaced(firsts[-1], '{"batch": 0}', '{"batch": 1}')]
    options = {"collectiveMarkersInModel": False, "debounceMs": args.debounce_ms}
    start_daemon(workspace.root, P.DaemonConfig(lowering_processes=processes),
                 runtime_dir=workspace.runtime)  # the server connects to this one
    session = await start_session(workspace, options)
    session.client.set_configuration(options, section="partir")
    opened = Row(mode, "t200: open -> diagnostics (cold open, daemon start)")
    opened_lenses = Row(mode, "t200: open -> lenses (cold open, daemon start)")
    rows += [opened, opened_lenses]
    try:
        uri = await open_document(session, T200, T200_TACTICS, opened, opened_lenses)
        for what, texts, target in (
                ("t200: edit of the last tactic (a new leaf)", lasts, 0.8),
                (f"t200: edit of tactic {middle} (a new leaf)", middles, 0.8),
                ("t200: rename of the first tactic", firsts, 0.8),
                ("t200: BP {\"batch\": 0} -> 1 (every state changes)", dim, None)):
            diag = Row(mode, f"{what} -> diagnostics", target)
            first = Row(mode, f"{what} -> its own lens refreshed", target and 1.5)
            screen = Row(mode, f"{what} -> the lenses of {SCREEN_LINES} lines from it")
            lens = Row(mode, f"{what} -> every lens refreshed", target and 1.5)
            rows += [diag, first, screen, lens]
            await measure_edits(session, uri, T200, texts, tactics_in, diag, lens,
                                TIMEOUT_S if target else OPEN_TIMEOUT_S, first, screen)
    finally:
        await stop_session(session)
        workspace.teardown()


async def run(args: argparse.Namespace) -> None:
    modes: list[tuple[str, Callable[[argparse.Namespace, list[Row]], Awaitable[None]]]] = [
        ("realistic", realistic), ("t32", t32), ("t200", t200)]
    rows: list[Row] = []
    for mode, measure in modes:
        if args.mode not in (mode, "all"):
            continue
        print(f"{mode}: a fresh server and daemon, debounce {args.debounce_ms} ms, "
              f"{args.repeat} edit(s) per measurement", flush=True)
        try:
            await measure(args, rows)
        except Exception as e:  # a benchmark reports, it does not assert
            print(f"  {mode} failed: {type(e).__name__}: {e}", flush=True)
            rows.append(Row(mode, "the whole mode", missed=[f"({type(e).__name__}: "
                                                            f"{textwrap.shorten(str(e), 60)})"]))
    print()
    print_table(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mode", choices=("realistic", "t32", "t200", "all"), default="all")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--debounce-ms", type=int, default=300)
    parser.add_argument("--lowering-processes", type=lambda t: [int(n) for n in t.split(",")],
                        default=[1, 2], help="t200: each daemon's lowering processes, "
                        "comma-separated (default 1,2: side by side)")
    add_arguments(parser)
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()
