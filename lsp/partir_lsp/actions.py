"""Quick fixes for the daemon's diagnostics of a name a tactic cannot resolve: an input
key that names no input, tag or prefix of one (`UnknownInputError`), and an axis the mesh
does not have (`AxisNotInMeshError`). Each close match (difflib, among the last analysis's
names and prefixes, or the mesh's axes) is offered as "Replace with 'x'", an edit of the
string literal's contents in the editor's current text.

Besides, on an `AutomaticPartition(...)` element of the schedule list that the last
analysis searched, the refactoring "Replace with the manual tactics found" rewrites it
into the `ManualPartition`s of the decisions found (their source is its metadata's
`search["source"]`), so the next edit is applied at once and the strategy can be
reviewed and changed by hand."""

from __future__ import annotations

import difflib
from collections.abc import Sequence

from lsprotocol import types as lsp

from partir_daemon import protocol as P
from partir_lsp import render
from partir_lsp.literals import AXIS, KEY, Role, Slot, mesh_axes, parse, slot_at, slots
from partir_lsp.names import Names
from partir_lsp.positions import Lines, to_range

# The diagnostics' `code` is the daemon's `Diagnostic.exc_type`.
FIXABLE: dict[str, Role] = {render.UNKNOWN_INPUT: KEY, "AxisNotInMeshError": AXIS}
MAX_FIXES = 3
# As partir's own "did you mean" suggestion for unknown inputs.
CUTOFF = 0.5
REPLACE_AUTOMATIC = "Replace with the manual tactics found"


def manual_replacements(uri: str, text: str, result: P.PartitionResult | None,
                        at: lsp.Range) -> list[lsp.CodeAction]:
    """"Replace with the manual tactics found" for each searched automatic tactic whose
    list element overlaps `at` and still reads `AutomaticPartition(...)` in `text`."""
    if result is None:
        return []
    lines = Lines.of(text)
    out = []
    for t in result.tactics:
        search = (t.metadata or {}).get("search")
        if not search or not search.get("source") or t.range is None:
            continue
        r = to_range(t.range, lines)
        if not _overlaps(r, at) or "AutomaticPartition" not in _text(lines, t.range):
            continue
        indent = " " * t.range.col
        source = f",\n{indent}".join(s.replace("\n", "\n" + indent)
                                       for s in search["source"])
        out.append(lsp.CodeAction(
            REPLACE_AUTOMATIC, kind=lsp.CodeActionKind.RefactorRewrite,
            edit=lsp.WorkspaceEdit(changes={uri: [lsp.TextEdit(r, source)]})))
    return out


def _text(lines: Lines, r: P.Range) -> str:
    rows = lines.lines[r.line - 1:r.end_line]
    if not rows:
        return ""
    if len(rows) == 1:
        return rows[0][r.col:r.end_col]
    return "\n".join([rows[0][r.col:], *rows[1:-1], rows[-1][:r.end_col]])


def quick_fixes(uri: str, text: str, result: P.PartitionResult | None,
                diagnostics: Sequence[lsp.Diagnostic]) -> list[lsp.CodeAction]:
    lines = Lines.of(text)
    tree = parse(text)
    every = slots(tree, lines) if tree is not None else None
    actions = []
    for d in diagnostics:
        role = FIXABLE.get(str(d.code)) if d.source == render.SOURCE else None
        if role is None:
            continue
        known = _known(role, text, result)
        for slot in _targets(d.range, role, known, text, lines, every):
            matches = _close_matches(slot.value, known)
            actions += [lsp.CodeAction(
                f"Replace with '{match}'", kind=lsp.CodeActionKind.QuickFix, diagnostics=[d],
                is_preferred=i == 0,
                edit=lsp.WorkspaceEdit(changes={uri: [lsp.TextEdit(slot.range(lines),
                                                                   match)]}))
                for i, match in enumerate(matches)]
    return actions


def _close_matches(word: str, known: list[str]) -> list[str]:
    """As `difflib.get_close_matches`, but equal scores keep the order of `known` (the
    program's order) rather than the reverse alphabetical one."""
    matcher = difflib.SequenceMatcher(b=word)
    scored = []
    for index, candidate in enumerate(known):
        matcher.set_seq1(candidate)
        if matcher.ratio() >= CUTOFF:
            scored.append((-matcher.ratio(), index, candidate))
    return [candidate for _, _, candidate in sorted(scored)[:MAX_FIXES]]


def _known(role: Role, text: str, result: P.PartitionResult | None) -> list[str]:
    if role == KEY:
        return Names.of(result.values).paths() if result is not None else []
    return list(result.mesh) if result is not None and result.mesh else mesh_axes(text)


def _targets(r: lsp.Range, role: Role, known: list[str], text: str, lines: Lines,
             every: list[Slot] | None) -> list[Slot]:
    """The literals of `role` within the diagnostic's range that name nothing known (the
    range is the literal itself, or the tactic when it could not be narrowed). A text that
    does not parse has only the literal where the range starts."""
    if every is None:
        line = r.start.line
        slot = slot_at(text, lines, line, lines.char_col(line, r.start.character) + 1)
        candidates = [slot] if slot is not None else []
    else:
        candidates = [s for s in every if _overlaps(s.range(lines), r)]
    return [s for s in candidates if s.role == role and s.value not in known]


def _overlaps(a: lsp.Range, b: lsp.Range) -> bool:
    return (a.start.line, a.start.character) <= (b.end.line, b.end.character) and (
        b.start.line, b.start.character) <= (a.end.line, a.end.character)
