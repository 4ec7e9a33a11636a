"""What the editor shows, computed from the daemon's results: diagnostics, code lenses,
inlay hints and hover text. Pure functions of a result and the text it was computed for
(no I/O, no daemon), so that the protocol layer in `partir_lsp.server` stays thin."""

from __future__ import annotations

import ast
import dataclasses
import math
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lsprotocol import types as lsp

from partir.conflict_groups import advice, group_conflicts, meaning
from partir_daemon import protocol as P
from partir_lsp import pictures
from partir_lsp.names import SELECTABLE
from partir_lsp.positions import Lines, line_range, node_range, to_range, visible_range

if TYPE_CHECKING:  # navigation reads files and imports this module
    from partir_lsp.navigation import Site

SOURCE = "partir"
SHOW_IR = "partir.showIr"
RUN_JOB = "partir.runJob"
# The kinds of the lens title, in the order of `partir partition`'s columns; the first four
# always, the others where the program has some (pipelines and shifts are rarer).
COLLECTIVES = (("all_gather", "AG"), ("all_reduce", "AR"), ("reduce_scatter", "RS"),
               ("all_to_all", "A2A"), ("collective_permute", "CP"))
_ALWAYS = 4
_ABBREVIATION = dict(COLLECTIVES)

_ITEMSIZE = {"bool": 1, "int8": 1, "uint8": 1, "float8_e4m3fn": 1, "float8_e5m2": 1,
             "int16": 2, "uint16": 2, "float16": 2, "bfloat16": 2, "int32": 4, "uint32": 4,
             "float32": 4, "int64": 8, "uint64": 8, "float64": 8, "complex64": 8,
             "complex128": 16}
_SHORT_DTYPE = {"bool": "i1", "bfloat16": "bf16", "complex64": "c64", "complex128": "c128"}
# Daemon diagnostics whose range is the whole tactic but that concern one argument of it.
_ON_INPUT_KEY = {"IndivisibleDimensionError", "DimensionOutOfRangeError", "AlreadyTiledError"}
# Placed on its key by the daemon when the key is written in the schedule file.
UNKNOWN_INPUT = "UnknownInputError"
MAX_HOVER_VALUES = 24
# VS Code cuts the inlay hints of a line longer than this in all
# (`editor.inlayHints.maximumLength`): a longer hint says its conflicts with a sign.
MAX_HINT = 43
# A tactic hover lists at most this many of its actions.
MAX_ACTIONS = 12
# Diagnostic messages longer than this are cut, their whole text going to the related
# information: the Problems panel shows a message on one line.
MAX_MESSAGE = 300
# Related entries listing a grouped conflict's occurrences, at most.
MAX_RELATED = 12


# --- formatting -----------------------------------------------------------------------------


def format_time(seconds: float) -> str:
    if seconds < 1.0:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds:.2f} s"


def format_bytes(n: float) -> str:
    sign = "-" if n < 0 else ""
    n = abs(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{sign}{n:.0f} {unit}" if unit == "B" else f"{sign}{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def signed_time(delta: float) -> str:
    return ("+" if delta >= 0 else "-") + format_time(abs(delta))


def signed_bytes(delta: float) -> str:
    return ("+" if delta >= 0 else "-") + format_bytes(abs(delta))


def format_sharding(dims: Sequence[Sequence[str]]) -> str:
    """Per-dim mesh axes as in the IR: `[{"batch"}, {"model"}]`."""
    return "[" + ", ".join("{" + ", ".join(f'"{a}"' for a in axes) + "}"
                           for axes in dims) + "]"


def itemsize(dtype: str) -> int:
    if dtype in _ITEMSIZE:
        return _ITEMSIZE[dtype]
    bits = re.search(r"(\d+)", dtype)
    return max(int(bits.group(1)) // 8, 1) if bits else 4


def tensor_type(shape: Sequence[int], dtype: str) -> str:
    short = _SHORT_DTYPE.get(dtype)
    if short is None:
        m = re.fullmatch(r"(float|int|uint|complex)(\d+)", dtype)
        short = {"float": "f", "int": "i", "uint": "ui", "complex": "c"}[m.group(1)] + \
            m.group(2) if m else dtype
    return "tensor<" + "".join(f"{n}x" for n in shape) + short + ">"


def nbytes(shape: Sequence[int], dtype: str) -> int:
    return math.prod(shape) * itemsize(dtype)


def uri_of(path: str) -> str:
    return Path(os.path.abspath(path)).as_uri()


def collective_counts(metadata: dict[str, Any]) -> dict[str, int]:
    counts = metadata.get("collectives") or {}
    return {kind: int(counts.get(kind, 0)) for kind, _ in COLLECTIVES}


def cost_of(metadata: dict[str, Any]) -> dict[str, Any] | None:
    cost = metadata.get("cost")
    return cost if isinstance(cost, dict) else None


# --- diagnostics of a schedule file ---------------------------------------------------------


def schedule_diagnostics(result: P.PartitionResult, lines: Lines,
                         sites: Sequence[Site] = ()) -> list[lsp.Diagnostic]:
    """The errors of a partition result, and the conflicts and blocked propagations of its
    tactics as warnings on the tactic, with the model line of the op as related info; an
    error of a tactic written in another module (`sites`) points there first."""
    uri = uri_of(result.path)
    out = []
    for d in result.diagnostics:
        written = _written_at(d, sites)
        if written is not None:
            d = dataclasses.replace(d, inner=None)  # raised there: said by `written`
        diagnostic = _error(d, result, lines, uri)
        if written is not None:
            diagnostic.related_information = [written, *(diagnostic.related_information
                                                         or [])]
        out.append(diagnostic)
    for tactic in result.tactics:
        if tactic.range is not None:
            r = tactic_head(tactic.range, lines)
        elif result.schedule_range is not None:
            r = to_range(result.schedule_range, lines)
        else:
            r = line_range(0, lines)
        out += _conflicts(tactic, visible_range(r, lines), uri)
        out += _padding(tactic, visible_range(r, lines), uri)
    return out


def written_diagnostics(result: P.PartitionResult,
                        sites: Sequence[Site]) -> dict[str, list[lsp.Diagnostic]]:
    """The diagnostics of the tactics written in another module (`from schedules import
    Z3`), by that module's path, there: an error on the key or axis it concerns (else the
    call), conflicts and padding on the callee. Quick fixes then act where the typo is."""
    out: dict[str, list[lsp.Diagnostic]] = {}
    for site in sites:
        uri = uri_of(site.path)
        found = out.setdefault(site.path, [])
        for d in result.diagnostics:
            if d.range == site.element:
                # As if raised at the call: `_error` narrows it to the key or axis.
                there = dataclasses.replace(d, file=result.path, range=site.call, inner=None)
                diagnostic = _error(there, result, site.lines, uri)
                if d.exc_type == UNKNOWN_INPUT:  # on the key in the list: here, the call's
                    diagnostic.range = _narrow_to_key(site.call, d.message, site.lines) \
                        or diagnostic.range
                found.append(diagnostic)
        if site.index <= len(result.tactics):
            tactic = result.tactics[site.index - 1]
            head = visible_range(tactic_head(site.call, site.lines), site.lines)
            found += _conflicts(tactic, head, uri) + _padding(tactic, head, uri)
    return out


def _written_at(d: P.Diagnostic, sites: Sequence[Site]) -> lsp.DiagnosticRelatedInformation | None:
    """Where the tactic of an error on a list element naming it is written, if elsewhere."""
    site = next((s for s in sites if d.range == s.element), None)
    if site is None:
        return None
    r = to_range(site.call, site.lines)
    return lsp.DiagnosticRelatedInformation(
        lsp.Location(uri_of(site.path), r),
        f"written in {os.path.basename(site.path)}:{site.call.line}")


def _padding_text(p: dict[str, Any]) -> str:
    axes = ", ".join(f"'{a}'" for a in p.get("axes") or [])
    return (f"`{p.get('value', '?')}` dim {p.get('dim', '?')}: {p.get('size', '?')} → "
            f"{p.get('padded', '?')} on {axes} ({format_bytes(float(p.get('wasted_bytes', 0)))}"
            f" of padding)")


def _padding(tactic: P.TacticResult, r: lsp.Range, uri: str) -> list[lsp.Diagnostic]:
    """An information on the tactic naming the dimensions its axis pads (an axis that does
    not divide the tiles it splits pads them to the next multiple: the record's
    `padded_by`)."""
    axis = tactic.metadata.get("axis")
    mine = [p for p in tactic.metadata.get("padding") or [] if p.get("padded_by") == axis]
    if not mine:
        return []
    message = f"tactic {tactic.index} ({tactic.name}) pads {_padding_text(mine[0])}"
    if len(mine) > 1:
        message += f", and {len(mine) - 1} more value{'s' if len(mine) > 2 else ''}"
    site = lsp.Location(uri, r)
    related = [lsp.DiagnosticRelatedInformation(site, _padding_text(p))
               for p in mine[:MAX_RELATED]]
    if len(mine) > MAX_RELATED:
        related.append(lsp.DiagnosticRelatedInformation(
            site, f"… and {len(mine) - MAX_RELATED} more"))
    return [_diagnostic(r, message, lsp.DiagnosticSeverity.Information, "padding",
                        related if len(mine) > 1 else [], uri)]


def _same_path(a: str, b: str) -> bool:
    return os.path.realpath(a) == os.path.realpath(b)


def _diagnostic(r: lsp.Range, message: str, severity: lsp.DiagnosticSeverity, code: str,
                related: list[lsp.DiagnosticRelatedInformation], uri: str) -> lsp.Diagnostic:
    """A diagnostic whose message is at most MAX_MESSAGE characters: a longer one is cut
    at a word, and its whole text is the first related information."""
    if len(message) > MAX_MESSAGE:
        related = [lsp.DiagnosticRelatedInformation(lsp.Location(uri, r), message), *related]
        cut = message[:MAX_MESSAGE - 1]
        message = (cut.rsplit(" ", 1)[0] if " " in cut else cut) + "…"
    return lsp.Diagnostic(r, message, severity=severity, code=code, source=SOURCE,
                          related_information=related or None)


def _error(d: P.Diagnostic, result: P.PartitionResult, lines: Lines,
           uri: str) -> lsp.Diagnostic:
    related: list[lsp.DiagnosticRelatedInformation] = []
    if d.file and not _same_path(d.file, result.path) and d.line:
        # Raised in another file (an imported module): point there, and at the schedule
        # file's program line here.
        related.append(lsp.DiagnosticRelatedInformation(
            lsp.Location(uri_of(d.file), line_range(d.line)),
            f"{os.path.basename(d.file)}:{d.line}"))
        r = to_range(result.program_range, lines) if result.program_range else \
            line_range(0, lines)
    elif d.range is not None:
        r = to_range(d.range, lines)
    else:
        r = line_range(d.line, lines)
    if d.exc_type == "AxisNotInMeshError" and d.range is not None:
        r = _narrow_to_axis(d.range, lines) or r
    elif d.exc_type in _ON_INPUT_KEY and d.range is not None:
        r = _narrow_to_key(d.range, d.message, lines) or r
    if d.inner is not None and d.inner.line:
        where = f"{os.path.basename(d.inner.file)}:{d.inner.line}"
        if d.inner.function:
            where += f" in {d.inner.function}"
        related.append(lsp.DiagnosticRelatedInformation(
            lsp.Location(uri_of(d.inner.file), line_range(d.inner.line)),
            f"raised here ({where})"))
    return _diagnostic(visible_range(r, lines), d.message, lsp.DiagnosticSeverity.Error,
                       d.exc_type or d.kind, related, uri)


def _snippet_call(r: P.Range, lines: Lines) -> tuple[ast.Call, int, int] | None:
    """The tactic call written at `r` (parsed), with the 0-based line and the column of
    the snippet's start."""
    first, last = r.line - 1, r.end_line - 1
    parts = [lines.line(i) for i in range(first, last + 1)]
    if not parts:
        return None
    parts[-1] = parts[-1][:r.end_col]
    parts[0] = parts[0][r.col:]
    try:
        node = ast.parse("\n".join(parts), mode="eval").body
    except SyntaxError:
        return None
    return (node, first, r.col) if isinstance(node, ast.Call) else None


def _narrow_to_axis(r: P.Range, lines: Lines) -> lsp.Range | None:
    found = _snippet_call(r, lines)
    if found is None:
        return None
    call, first, col0 = found
    for kw in call.keywords:
        if kw.arg == "axis":
            return node_range(kw.value, lines, first, col0)
    if len(call.args) >= 2:
        return node_range(call.args[1], lines, first, col0)
    return None


def _narrow_to_key(r: P.Range, message: str, lines: Lines) -> lsp.Range | None:
    """The key of the tactic's inputs dict that the message's value name falls under."""
    found = _snippet_call(r, lines)
    if found is None:
        return None
    call, first, col0 = found
    inputs = call.args[0] if call.args else next(
        (kw.value for kw in call.keywords if kw.arg == "inputs"), None)
    if not isinstance(inputs, ast.Dict):
        return None
    names = re.findall(r"'([^']+)'", message)
    for key in inputs.keys:
        if isinstance(key, ast.Constant) and isinstance(key.value, str):
            k = key.value
            if any(n == k or n.startswith(k + "/") for n in names):
                return node_range(key, lines, first, col0)
    return None


def _conflicts(tactic: P.TacticResult, r: lsp.Range, uri: str) -> list[lsp.Diagnostic]:
    """One warning per group of conflicts (`partir.conflict_groups`: kind, op and model
    line), saying what it costs and the usual fix, with its occurrences as related
    information."""
    out = []
    for group in group_conflicts(tactic.metadata.get("conflicts") or []):
        related = []
        site = lsp.Location(uri, r)
        if group.site and os.path.isabs(group.file):
            site = lsp.Location(uri_of(group.file), line_range(group.line))
            related.append(lsp.DiagnosticRelatedInformation(
                site, f"the {'blocking' if group.blocked else 'conflicting'} op "
                      f"`{group.op}` ({group.site})"))
        occurrences = group.occurrences()
        related += [lsp.DiagnosticRelatedInformation(site, text)
                    for text in occurrences[:MAX_RELATED]]
        if len(occurrences) > MAX_RELATED:
            related.append(lsp.DiagnosticRelatedInformation(
                site, f"… and {len(occurrences) - MAX_RELATED} more"))
        code = "unsupported" if group.blocked else f"conflict/{group.kind}"
        message = group.message(f"tactic {tactic.index} ({tactic.name})")
        if group.advice:
            message += f". {group.advice}"
        out.append(_diagnostic(r, message, lsp.DiagnosticSeverity.Warning, code, related,
                               uri))
    return out


def tactic_head(r: P.Range, lines: Lines) -> lsp.Range:
    """Where a tactic's warnings go: its name, or the callee of a call written in the
    list (`partir.ManualPartition`), not the whole call, so that hovers on its input keys
    are not led by every warning of the tactic."""
    found = _snippet_call(r, lines)
    if found is None:
        return to_range(r, lines)
    call, first, col0 = found
    return node_range(call.func, lines, first, col0)


# --- code lenses and inlay hints ------------------------------------------------------------


# What a lens and a hint show for a tactic whose program is not lowered yet (a result
# sent while the tactics before it are lowered).
LOWERING = "lowering…"


def pipeline_summary(metadata: dict[str, Any]) -> str | None:
    """`4 stages × 4 microbatches, bubble 43%` for a pipeline tactic, else None."""
    p = metadata.get("pipeline")
    if not p:
        return None
    return (f"{p['stages']} stages × {p['microbatches']} microbatches, "
            f"bubble {float(p['bubble']):.0%}")


def lens_title(metadata: dict[str, Any]) -> str:
    """`+AG 2 +AR 1 +RS 0 +A2A 0 · 1.23 ms · 4.5 MiB/device` (`+CP 2` after A2A where the
    program permutes; a pipeline's stages, microbatches and bubble after it)."""
    pipeline = pipeline_summary(metadata)
    if not P.is_lowered(metadata):
        return LOWERING if pipeline is None else f"{pipeline} · {LOWERING}"
    counts = collective_counts(metadata)
    title = " ".join(f"+{abbr} {counts[kind]}" for i, (kind, abbr) in enumerate(COLLECTIVES)
                     if i < _ALWAYS or counts[kind])
    cost = cost_of(metadata)
    if cost is not None:
        title += (f" · {format_time(float(cost['step_time_s']))}"
                  f" · {format_bytes(float(cost['peak_memory_bytes']))}/device")
    if pipeline is not None:
        title += f" · {pipeline}"
    return title


# Leads the lenses of an analysis older than the text, which does not load: they stay
# where they were rather than vanish (and the text jump) while a line is being typed.
STALE = "(stale) "


def code_lenses(uri: str, result: P.PartitionResult, lines: Lines,
                stale: bool = False) -> list[lsp.CodeLens]:
    """Above each tactic, named (a one-line list puts every tactic's lenses on one row):
    its counts (showing the HLO-level program after it, where those collectives are) and
    its Core IR; running the partitioned job once, above the schedule."""
    out = []
    mark = STALE if stale else ""
    for t in result.tactics:
        if t.range is None:
            continue
        r = to_range(t.range, lines)
        after = {"uri": uri, "tactic": t.index}
        out += [
            lsp.CodeLens(r, lsp.Command(title=f"{mark}{t.name}: {lens_title(t.metadata)}",
                                        command=SHOW_IR,
                                        arguments=[{**after, "level": "hlo"}])),
            lsp.CodeLens(r, lsp.Command(title=f"Show IR after {t.name}", command=SHOW_IR,
                                        arguments=[after])),
        ]
    where = result.schedule_range or next((t.range for t in result.tactics if t.range),
                                           None)
    if where is not None:
        # On its first line alone: edits inside a multi-line list keep it in place.
        start = to_range(where, lines).start
        out.append(lsp.CodeLens(lsp.Range(start, start), lsp.Command(
            title="Run partitioned job", command=RUN_JOB, arguments=[{"uri": uri}])))
    return out


def hint_label(metadata: dict[str, Any], compact: bool = False) -> str:
    """The summary after a tactic: the collectives it leaves in the program, the estimated
    step time and the conflicts it hit. `compact` (a line with several tactics, whose
    hints VS Code cuts at MAX_HINT characters in all): the step time and the conflicts
    alone, when there is a time (the tactic's lens, named, has its counts)."""
    counts = collective_counts(metadata)
    cost = cost_of(metadata)
    conflicts = len(metadata.get("conflicts") or [])
    parts = [LOWERING] if not P.is_lowered(metadata) else \
        [] if compact and cost is not None else [
            " ".join(f"{abbr} {counts[k]}" for k, abbr in COLLECTIVES if counts[k])
            or "no collectives"]
    if cost is not None:
        parts.append(format_time(float(cost["step_time_s"])))
    if conflicts:
        parts.append(f"{conflicts} conflict{'s' if conflicts > 1 else ''}")
    if conflicts and (compact or len(" · ".join(parts)) > MAX_HINT):
        parts[-1] = f"⚠ {conflicts}"
    return " · ".join(parts)


def inlay_hints(result: P.PartitionResult, lines: Lines,
                stale: bool = False) -> list[lsp.InlayHint]:
    """At the end of each tactic's line, or right after the tactic where the line holds
    more than one (`schedule = [BP, MP, Z3]`), compact."""
    placed = [t for t in result.tactics if t.range is not None]
    ending = [t.range.end_line for t in placed]
    out = []
    for t in placed:
        line = t.range.end_line - 1
        alone = ending.count(t.range.end_line) == 1
        at = lines.end_of_line(line) if alone else \
            lsp.Position(line, lines.utf16_col(line, t.range.end_col))
        label = (STALE if stale else "") + hint_label(t.metadata, compact=not alone)
        out.append(lsp.InlayHint(at, label, padding_left=True,
                                 tooltip=f"tactic {t.index} ({t.name}): {lens_title(t.metadata)}"))
    return out


# --- model-file markers ---------------------------------------------------------------------


def collective_markers(collectives: Sequence[P.AttributedCollective],
                       schedule: str) -> dict[str, list[lsp.Diagnostic]]:
    """Information markers on the model lines where partitioning inserted collectives, by
    model file (collectives attributed to no line of a file get none)."""
    by_line: dict[tuple[str, int], list[P.AttributedCollective]] = {}
    for c in collectives:
        if c.loc.line > 0 and os.path.isabs(c.loc.file):
            by_line.setdefault((c.loc.file, c.loc.line), []).append(c)
    out: dict[str, list[lsp.Diagnostic]] = {}
    for (file, line), items in sorted(by_line.items()):
        message = f"{os.path.basename(schedule)}: " + "; ".join(
            _collective_text(c) for c in items)
        out.setdefault(file, []).append(_diagnostic(
            line_range(line), message, lsp.DiagnosticSeverity.Information, "collective", [],
            uri_of(file)))
    return out


def _collective_text(c: P.AttributedCollective) -> str:
    axes = ", ".join(f"'{a}'" for a in c.axes) or "no axis"
    text = f"{c.kind} ×{c.count} over {axes}"
    if c.value:
        text += f" of `{c.value}`"
    return text + f" (tactic {c.tactic}, {c.tactic_name})"


# --- hovers ---------------------------------------------------------------------------------


def key_values(result: P.PartitionResult, key: str) -> P.ExplainResult:
    """What the daemon's `explain` answers for an input key, from a partition result
    alone: the inputs, outputs and tags the key selects (itself, or every leaf under it as
    a pytree prefix) and the final program's collectives moving them."""
    values = [v for v in result.values
              if v.kind in SELECTABLE and _selects(key, v.name)]
    collectives = [c for c in result.collectives
                   if c.value is not None and _selects(key, c.value)]
    return P.ExplainResult(result.path, result.version, values, collectives)


def _selects(key: str, name: str) -> bool:
    return name == key or name.startswith(key + "/")


def input_hover(explained: P.ExplainResult, key: str, tactic: int, tactic_name: str,
                mesh: dict[str, int] | None) -> str:
    """Hover text of an input key of tactic `tactic`: each value it selects, its global
    type, its sharding after this tactic and at the end, its device-local shape and
    bytes, and (for a single value) the devices holding each tile."""
    values = explained.values
    if not values:
        return f"`{key}`: no input, output or tag of the program by this name"
    m = pictures.Mesh.of(mesh)
    parts = []
    if len(values) == 1:
        v = values[0]
        parts.append(f"**`{v.name}`** · {v.kind} · `{tensor_type(v.shape, v.dtype)}` "
                     f"({format_bytes(nbytes(v.shape, v.dtype))})")
        rows = ["| | sharding | PartitionSpec | local shape | bytes/device |",
                "|---|---|---|---|---|"]
        steps = [(f"after tactic {tactic} ({tactic_name})", step_after(v, tactic))]
        if v.history and v.history[-1].tactic != tactic:
            last = v.history[-1]
            steps.append((f"at the end (tactic {last.tactic}, {last.tactic_name})", last))
        for label, step in steps:
            if step is None:
                continue
            rows.append(f"| {label} | `{format_sharding(step.sharding)}` | "
                        f"`{pictures.partition_spec(step.sharding)}` | "
                        f"`{list(step.local_shape)}` | "
                        f"{format_bytes(nbytes(step.local_shape, v.dtype))} |")
        parts.append("\n".join(rows))
        final = v.history[-1] if v.history else None
        tiles = pictures.tiling(v.shape, final.sharding, m) if final is not None else None
        if tiles is not None:
            parts.append("At the end, " + pictures.markdown(tiles))
    else:
        total = sum(nbytes(v.shape, v.dtype) for v in values)
        parts.append(f"**`{key}`** selects {len(values)} values "
                     f"({format_bytes(total)} in all)")
        rows = [f"| value | type | after tactic {tactic} | local shape | at the end |",
                "|---|---|---|---|---|"]
        for v in values[:MAX_HOVER_VALUES]:
            step = step_after(v, tactic)
            final = v.history[-1] if v.history else None
            rows.append(
                f"| `{v.name}` | `{tensor_type(v.shape, v.dtype)}` | "
                f"`{format_sharding(step.sharding) if step else '?'}` | "
                f"`{list(step.local_shape) if step else '?'}` | "
                f"`{format_sharding(final.sharding) if final else '?'}` |")
        if len(values) > MAX_HOVER_VALUES:
            rows.append(f"| … and {len(values) - MAX_HOVER_VALUES} more | | | | |")
        parts.append("\n".join(rows))
        local = sum(nbytes(s.local_shape, v.dtype) for v in values
                    if (s := step_after(v, tactic)) is not None)
        parts.append(f"Per device after tactic {tactic}: {format_bytes(local)}.")
    if explained.collectives:
        parts.append("Collectives moving it:\n" + "\n".join(
            f"- {_collective_text(c)}" for c in explained.collectives))
    return "\n\n".join(parts)


def step_after(v: P.ExplainedValue, tactic: int) -> P.ShardingStep | None:
    """The value's sharding after `tactic` (None past the last applied tactic): its
    history holds the steps that changed it, and the last tactic's."""
    if not v.history or tactic > v.history[-1].tactic:
        return None
    before = [s for s in v.history if s.tactic <= tactic]
    if before:
        return before[-1]
    return P.ShardingStep(tactic, "", [[] for _ in v.shape], list(v.shape), False)


def tactic_hover(result: P.PartitionResult, index: int) -> str:
    """Hover text of a tactic, its summary first: its effect on the cost, the collectives
    the program has after it (and how many it added) with the bytes each device sends,
    its conflicts, and last its actions (a model's tactic has dozens)."""
    t = result.tactics[index - 1]
    previous = result.tactics[index - 2].metadata if index > 1 else None
    md = t.metadata
    parts = [f"**Tactic {t.index} · {t.name}** on axis `{t.axis}`"]
    counts = collective_counts(md)
    before = collective_counts(previous) if previous else dict.fromkeys(counts, 0)
    cost, cost_before = cost_of(md), cost_of(previous) if previous else None
    moved = (cost or {}).get("bytes_moved") or {}
    moved_before = (cost_before or {}).get("bytes_moved") or {}
    rows = ["| collective | in the program | added by this tactic | bytes sent/device |",
            "|---|---|---|---|"]
    for kind, abbr in COLLECTIVES:
        if counts[kind] or before[kind]:
            sent = float(moved.get(kind, 0.0))
            delta = sent - float(moved_before.get(kind, 0.0))
            rows.append(f"| {kind} ({abbr}) | {counts[kind]} | "
                        f"{counts[kind] - before[kind]:+d} | "
                        f"{format_bytes(sent)} ({signed_bytes(delta)}) |")
    table = "\n".join(rows) if len(rows) > 2 else "No collectives in the program."
    if not P.is_lowered(md):
        table = f"Collectives and cost: {LOWERING}"
    if cost is not None:
        line = (f"Estimated on `{cost.get('device', '?')}`: step time "
                f"{format_time(float(cost['step_time_s']))}")
        if cost_before is not None:
            dt = float(cost["step_time_s"]) - float(cost_before["step_time_s"])
            line += f" ({signed_time(dt)})"
        line += f", peak memory {format_bytes(float(cost['peak_memory_bytes']))}/device"
        if cost_before is not None:
            dm = float(cost["peak_memory_bytes"]) - float(cost_before["peak_memory_bytes"])
            line += f" ({signed_bytes(dm)})"
        line += (f"; compute {format_time(float(cost['compute_time_s']))}, communication "
                 f"{format_time(float(cost['communication_time_s']))}")
        parts.append(line)
    parts.append(table)
    p = md.get("pipeline")
    if p:
        line = (f"Pipeline: {p['stages']} stages of {p['layers_per_stage']} layer(s), "
                f"{p['microbatches']} microbatches in {p['steps']} steps; each stage idles "
                f"{p['stages'] - 1} of them (the bubble, {float(p['bubble']):.0%})")
        if cost is not None:
            line += (f"; a stage's device holds "
                     f"{format_bytes(float(cost['peak_memory_bytes']))} at its peak")
        parts.append(line)
    conflicts = md.get("conflicts") or []
    if conflicts:
        kinds: dict[str, int] = {}
        for c in conflicts:
            kinds[c.get("kind", "")] = kinds.get(c.get("kind", ""), 0) + 1
        parts.append("Conflicts (warnings on this tactic): " + "; ".join(
            f"{n} where {meaning(k)}" + (f" ({advice(k)})" if advice(k) else "")
            for k, n in kinds.items()))
    for note in md.get("notes") or []:
        parts.append(f"Note: {note}")
    actions = md.get("actions") or []
    if actions:
        shown = ", ".join(f"`{a}`" for a in actions[:MAX_ACTIONS])
        more = f" and {len(actions) - MAX_ACTIONS} more" if len(actions) > MAX_ACTIONS else ""
        parts.append(f"Actions ({len(actions)}): {shown}{more}")
    return "\n\n".join(parts)


def model_line_hover(explained: P.ExplainResult, schedule: str, line: int) -> str | None:
    """Hover text of a model line: the shardings of the values computed there (after the
    schedule's last tactic) and the collectives attributed to it."""
    if not explained.values and not explained.collectives:
        return None
    last = None
    for v in explained.values:
        if v.history:
            last = v.history[-1]
            break
    head = f"**PartIR** · `{os.path.basename(schedule)}`"
    if last is not None:
        head += f" after tactic {last.tactic} ({last.tactic_name})"
    parts = [head]
    if explained.values:
        rows = ["| value | type | sharding | local shape |", "|---|---|---|---|"]
        for v in explained.values[:MAX_HOVER_VALUES]:
            final = v.history[-1] if v.history else None
            rows.append(f"| `{v.name}` | `{tensor_type(v.shape, v.dtype)}` | "
                        f"`{format_sharding(final.sharding) if final else '?'}` | "
                        f"`{list(final.local_shape) if final else '?'}` |")
        if len(explained.values) > MAX_HOVER_VALUES:
            rows.append(f"| … and {len(explained.values) - MAX_HOVER_VALUES} more | | | |")
        parts.append("\n".join(rows))
    if explained.collectives:
        parts.append(f"Collectives attributed to line {line}:\n" + "\n".join(
            f"- {_collective_text(c)}" for c in explained.collectives))
    else:
        parts.append(f"No collectives attributed to line {line}.")
    return "\n\n".join(parts)


def job_message(info: P.JobInfo, name: str) -> str:
    m = info.metrics
    if info.state == "succeeded" and m is not None and m.step_time_median_s is not None:
        text = (f"PartIR job {info.id} ({name}) finished: "
                f"{format_time(m.step_time_median_s)} per step")
        if m.max_abs_error is not None:
            text += f", max abs error {m.max_abs_error:.2g}"
        return text + f" ({m.steps} steps on {m.devices} {m.platform} devices)"
    return f"PartIR job {info.id} ({name}) {info.state}" + (
        f": {info.error}" if info.error else "")
