"""The outline of a schedule file, from the last analysis (never waiting for one): the
`program`, `mesh` and `schedule` definitions, and under `schedule` one symbol per tactic
("1. BP", its axis and input keys), at the ranges of the text that analysis read."""

from __future__ import annotations

from lsprotocol import types as lsp

from partir_daemon import protocol as P
from partir_lsp.positions import Lines, to_range


def outline(result: P.PartitionResult, lines: Lines) -> list[lsp.DocumentSymbol]:
    tactics = [_tactic(t, lines) for t in result.tactics if t.range is not None]
    mesh = result.mesh
    top = [_definition("program", result.program_range, lsp.SymbolKind.Function,
                       result.function or "", lines),
           _definition("mesh", result.mesh_range, lsp.SymbolKind.Object,
                       ", ".join(f"{axis}: {n}" for axis, n in mesh.items()) if mesh else "",
                       lines)]
    schedule = _definition("schedule", result.schedule_range, lsp.SymbolKind.Array,
                           f"{len(result.tactics)} tactics", lines)
    if schedule is not None:
        schedule.children = [t for t in tactics if _inside(t.range, schedule.range)]
        tactics = [t for t in tactics if not _inside(t.range, schedule.range)]
    symbols = [s for s in [*top, schedule, *tactics] if s is not None]
    return sorted(symbols, key=lambda s: (s.range.start.line, s.range.start.character))


def _tactic(t: P.TacticResult, lines: Lines) -> lsp.DocumentSymbol:
    r = to_range(t.range, lines)
    detail = f"axis {t.axis}" + (f" · {', '.join(t.inputs)}" if t.inputs else "")
    return lsp.DocumentSymbol(f"{t.index}. {t.name}", lsp.SymbolKind.Event, r, r,
                              detail=detail)


def _definition(name: str, r: P.Range | None, kind: lsp.SymbolKind, detail: str,
                lines: Lines) -> lsp.DocumentSymbol | None:
    if r is None:
        return None
    full = to_range(r, lines)
    # The name where the statement starts with it (`mesh = ...`), else the statement.
    written = lines.line(full.start.line)[r.col:r.col + len(name)]
    selection = lsp.Range(full.start, lsp.Position(full.start.line, full.start.character
                                                   + len(name))) if written == name else full
    return lsp.DocumentSymbol(name, kind, full, selection, detail=detail or None)


def _inside(inner: lsp.Range, outer: lsp.Range) -> bool:
    return (outer.start.line, outer.start.character) <= (
        inner.start.line, inner.start.character) and (inner.end.line, inner.end.character) <= (
        outer.end.line, outer.end.character)
