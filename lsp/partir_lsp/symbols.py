"""The outline of a schedule file, from the last analysis that traced its program (never
waiting for one): the `program`, `mesh` and `schedule` definitions, and under `schedule`
one symbol per tactic ("1. BP", its axis and input keys), at the ranges of the text that
analysis read moved onto the current text; a symbol whose first or last line changed
since is left out until the next analysis, rather than shown at a wrong place."""

from __future__ import annotations

from lsprotocol import types as lsp

from partir_daemon import protocol as P
from partir_lsp.positions import LineMap, Lines, to_range


def outline(result: P.PartitionResult, lines: Lines,
            moved: LineMap) -> list[lsp.DocumentSymbol]:
    """`lines` are those of the analysed text, `moved` maps them to the current text's."""
    tactics = [s for s in (_tactic(t, lines, moved) for t in result.tactics) if s is not None]
    mesh = result.mesh
    top = [_definition("program", result.program_range, lsp.SymbolKind.Function,
                       result.function or "", lines, moved),
           _definition("mesh", result.mesh_range, lsp.SymbolKind.Object,
                       ", ".join(f"{axis}: {n}" for axis, n in mesh.items()) if mesh else "",
                       lines, moved)]
    schedule = _definition("schedule", result.schedule_range, lsp.SymbolKind.Array,
                           f"{len(result.tactics)} tactics", lines, moved)
    if schedule is not None:
        schedule.children = [t for t in tactics if _inside(t.range, schedule.range)]
        tactics = [t for t in tactics if not _inside(t.range, schedule.range)]
    symbols = [s for s in [*top, schedule, *tactics] if s is not None]
    return sorted(symbols, key=lambda s: (s.range.start.line, s.range.start.character))


def _tactic(t: P.TacticResult, lines: Lines, moved: LineMap) -> lsp.DocumentSymbol | None:
    r = _place(t.range, lines, moved)
    if r is None:
        return None
    detail = f"axis {t.axis}" + (f" · {', '.join(t.inputs)}" if t.inputs else "")
    return lsp.DocumentSymbol(f"{t.index}. {t.name}", lsp.SymbolKind.Event, r, r,
                              detail=detail)


def _definition(name: str, r: P.Range | None, kind: lsp.SymbolKind, detail: str,
                lines: Lines, moved: LineMap) -> lsp.DocumentSymbol | None:
    full = _place(r, lines, moved)
    if r is None or full is None:
        return None
    # The name where the statement starts with it (`mesh = ...`), else the statement.
    written = lines.line(r.line - 1)[r.col:r.col + len(name)]
    selection = lsp.Range(full.start, lsp.Position(full.start.line, full.start.character
                                                   + len(name))) if written == name else full
    return lsp.DocumentSymbol(name, kind, full, selection, detail=detail or None)


def _place(r: P.Range | None, lines: Lines, moved: LineMap) -> lsp.Range | None:
    """A daemon range in the current text, when its first and last lines are unchanged
    (lines between them may have changed: the symbol still spans them)."""
    if r is None:
        return None
    full = to_range(r, lines)
    start, end = moved.to_new(full.start.line), moved.to_new(full.end.line)
    if start is None or end is None:
        return None
    return lsp.Range(lsp.Position(start, full.start.character),
                     lsp.Position(end, full.end.character))


def _inside(inner: lsp.Range, outer: lsp.Range) -> bool:
    return (outer.start.line, outer.start.character) <= (
        inner.start.line, inner.start.character) and (inner.end.line, inner.end.character) <= (
        outer.end.line, outer.end.character)
