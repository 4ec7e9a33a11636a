"""Completion inside a tactic's string literals: input, output and tag names and pytree
path prefixes in the keys of a `ManualPartition` inputs dict (from the last analysis), and mesh
axes in its `axis` (from the last analysis, else from the text's `mesh = {...}`).

The literal is found in the editor's current text; each item replaces the literal's
contents with a whole path, so that clients filter on what was typed since the quote."""

from __future__ import annotations

from collections import Counter

from lsprotocol import types as lsp

from partir_daemon import protocol as P
from partir_lsp import render
from partir_lsp.literals import AXIS, mesh_axes, slot_at
from partir_lsp.names import Names
from partir_lsp.positions import Lines

TRIGGERS = ('"', "'", "/")


def complete(text: str, position: lsp.Position,
             result: P.PartitionResult | None) -> lsp.CompletionList | None:
    lines = Lines.of(text)
    col = lines.char_col(position.line, position.character)
    slot = slot_at(text, lines, position.line, col)
    if slot is None:
        return None
    edit_range = slot.range(lines)
    if slot.role == AXIS:
        mesh = result.mesh if result is not None and result.mesh else None
        axes = list(mesh) if mesh else mesh_axes(text)
        items = [_item(axis, lsp.CompletionItemKind.EnumMember,
                       f"mesh axis of size {mesh[axis]}" if mesh else "mesh axis",
                       edit_range, i) for i, axis in enumerate(axes)]
    else:
        if result is None:
            return None
        names = Names.of(result.values)
        typed = slot.value[:col - slot.start]
        items = [_path_item(path, names, edit_range, i)
                 for i, path in enumerate(names.children(typed))]
    # Incomplete: the next keystroke may move to another level of the paths, which this
    # list does not hold (and answering again is a lookup in memory).
    return lsp.CompletionList(is_incomplete=True, items=items)


def _path_item(path: str, names: Names, edit_range: lsp.Range, order: int) -> lsp.CompletionItem:
    under = names.under(path)
    if len(under) == 1 and under[0].name == path:
        v = under[0]
        kind = lsp.CompletionItemKind.Variable if v.kind == "input" else \
            lsp.CompletionItemKind.Reference
        return _item(path, kind, f"{v.kind} · {render.tensor_type(v.shape, v.dtype)}",
                     edit_range, order)
    counts = Counter(v.kind for v in under)
    detail = ", ".join(f"{n} {kind}{'s' if n > 1 else ''}" for kind, n in counts.items())
    return _item(path, lsp.CompletionItemKind.Module, detail, edit_range, order)


def _item(label: str, kind: lsp.CompletionItemKind, detail: str, edit_range: lsp.Range,
          order: int) -> lsp.CompletionItem:
    return lsp.CompletionItem(label, kind=kind, detail=detail, filter_text=label,
                              sort_text=f"{order:06d}",
                              text_edit=lsp.TextEdit(edit_range, label))
