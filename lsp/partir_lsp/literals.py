"""The string literals of tactics in a schedule file's current text: each key of a
`ManualPartition` inputs dict and its `axis` argument, where completion, go to definition
and quick fixes act; and the axes of a `mesh = {...}` literal.

They are read from the text the editor has now, which may be ahead of the daemon's last
analysis and, while the user types, may not parse: then the literal around the cursor is
found by scanning the text before it (strings, comments and open brackets) instead.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from typing import Literal

from lsprotocol import types as lsp

from partir_lsp.positions import Lines, byte_to_char_col

Role = Literal["key", "axis"]
KEY: Role = "key"
AXIS: Role = "axis"
TACTIC = "ManualPartition"

_OPENING = re.compile(r"[rRuU]?('''|\"\"\"|'|\")")
_CALLEE = re.compile(r"([A-Za-z_][\w.]*)\s*$")
_AXIS_KEYWORD = re.compile(r"\baxis\s*=\s*$")
_INPUTS_KEYWORD = re.compile(r"\binputs\s*=\s*$")
_NAME_CHARS = re.compile(r"[\w./-]*")
_MESH_LINE = re.compile(r"mesh\s*(?::[^=]*)?=\s*(?:[\w.]+\()?(\{[^{}]*\})")


@dataclass(frozen=True)
class Slot:
    """A single-line string literal of a tactic: its contents as written (between the
    quotes) on 0-based `line`, from character `start` to `end` (exclusive; the cursor when
    the literal is not closed yet)."""

    role: Role
    value: str
    line: int
    start: int
    end: int

    def contains(self, line: int, col: int) -> bool:
        return line == self.line and self.start <= col <= self.end

    def range(self, lines: Lines) -> lsp.Range:
        return lsp.Range(lsp.Position(self.line, lines.utf16_col(self.line, self.start)),
                         lsp.Position(self.line, lines.utf16_col(self.line, self.end)))


def parse(text: str) -> ast.Module | None:
    try:
        return ast.parse(text)
    except (SyntaxError, ValueError):  # ValueError: null bytes
        return None


def slots(tree: ast.Module, lines: Lines) -> list[Slot]:
    """Every tactic literal of a parsed text, in source order."""
    out = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and _is_tactic(node.func)):
            continue
        keywords = {kw.arg: kw.value for kw in node.keywords}
        inputs = node.args[0] if node.args else keywords.get("inputs")
        # A set literal is a dict whose key is still being typed: `{"w1"}`.
        keys = inputs.keys if isinstance(inputs, ast.Dict) else \
            inputs.elts if isinstance(inputs, ast.Set) else []
        found = [_slot(KEY, key, lines) for key in keys if key is not None]
        axis = node.args[1] if len(node.args) > 1 else keywords.get("axis")
        if axis is not None:
            found.append(_slot(AXIS, axis, lines))
        out += [s for s in found if s is not None]
    return sorted(out, key=lambda s: (s.line, s.start))


def slot_at(text: str, lines: Lines, line: int, col: int) -> Slot | None:
    """The tactic literal containing 0-based `line`, character `col` of `text`."""
    tree = parse(text)
    if tree is not None:
        return next((s for s in slots(tree, lines) if s.contains(line, col)), None)
    return _scan_slot(lines, line, col)


def mesh_axes(text: str) -> list[str]:
    """The axes of the text's module-level `mesh = {...}` (or `mesh = Mesh({...})`) dict
    literal, for when the daemon could not load the file and so has no mesh."""
    tree = parse(text)
    if tree is None:
        for line in reversed(text.splitlines()):
            m = _MESH_LINE.match(line)
            if m is not None:
                try:
                    value = ast.literal_eval(m.group(1))
                except (SyntaxError, ValueError):
                    continue
                return [k for k in value if isinstance(k, str)]
        return []
    for stmt in reversed(tree.body):
        if isinstance(stmt, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "mesh" for t in stmt.targets):
            value = stmt.value
            if isinstance(value, ast.Call) and value.args:
                value = value.args[0]
            if isinstance(value, ast.Dict):
                return [k.value for k in value.keys
                        if isinstance(k, ast.Constant) and isinstance(k.value, str)]
            return []
    return []


def _is_tactic(func: ast.expr) -> bool:
    return (isinstance(func, ast.Name) and func.id == TACTIC) or (
        isinstance(func, ast.Attribute) and func.attr == TACTIC)


def _slot(role: Role, node: ast.expr, lines: Lines) -> Slot | None:
    if not (isinstance(node, ast.Constant) and isinstance(node.value, str)
            and node.lineno == node.end_lineno):
        return None
    index = node.lineno - 1
    text = lines.line(index)
    start = byte_to_char_col(text, node.col_offset)
    end = byte_to_char_col(text, node.end_col_offset or 0)
    written = text[start:end]
    m = _OPENING.match(written)
    if m is None:
        return None
    quote = m.group(1)
    contents = written[m.end():len(written) - len(quote)]
    # Implicit concatenation ("a" "b") and escaped quotes: not one plain literal to edit.
    if len(written) < m.end() + len(quote) or not written.endswith(quote) or quote in contents:
        return None
    return Slot(role, contents, index, start + m.end(), end - len(quote))


def _scan_slot(lines: Lines, line: int, col: int) -> Slot | None:
    """The literal at the cursor of a text that does not parse: the string open at the
    cursor on its line, if it is a key of a tactic's inputs dict or its `axis=`."""
    current = lines.line(line)[:col]
    prefix = "\n".join((*lines.lines[:line], current))
    brackets, opened = _scan(prefix)
    if opened is None:
        return None
    contents_at, quote = opened
    line_start = len(prefix) - len(current)
    if len(quote) != 1 or contents_at < line_start:
        return None
    start = contents_at - line_start
    end = _closing(lines.line(line), quote, col)
    slot_text = lines.line(line)[start:end]
    before = prefix[:contents_at - 1]
    if len(before) and before[-1] in "rRuU":
        before = before[:-1]
    innermost = brackets[-1] if brackets else None
    if innermost is None:
        return None
    if prefix[innermost] == "(" and _AXIS_KEYWORD.search(before) and \
            _calls_tactic(prefix, innermost):
        return Slot(AXIS, slot_text, line, start, end)
    if prefix[innermost] == "{" and before.rstrip()[-1:] in ("{", ",") and \
            len(brackets) > 1 and _calls_tactic(prefix, brackets[-2]):
        lead = prefix[brackets[-2] + 1:innermost]
        if not lead.strip() or _INPUTS_KEYWORD.search(lead):
            return Slot(KEY, slot_text, line, start, end)
    return None


def _calls_tactic(prefix: str, paren: int) -> bool:
    m = _CALLEE.search(prefix[:paren])
    return prefix[paren] == "(" and m is not None and m.group(1).split(".")[-1] == TACTIC


def _closing(text: str, quote: str, col: int) -> int:
    """Where the literal open at `col` of `text` ends: at its closing quote when only a
    name's characters come before it, else at `col`. A quote typed into existing code
    (`{"w1": 0, "w|, axis="batch"}`) makes Python read that code as the string's rest,
    which the user does not mean."""
    end = _NAME_CHARS.match(text, col).end()
    return end if text.startswith(quote, end) else col


def _scan(text: str) -> tuple[list[int], tuple[int, str] | None]:
    """The offsets of the brackets still open at the end of `text`, and the string literal
    open there (the offset of its contents and its quote), skipping comments and closed
    strings. A single-quoted string left open at a line's end ends there, as the user is
    typing on a later line."""
    brackets: list[int] = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c == "#":
            newline = text.find("\n", i)
            i = n if newline < 0 else newline
            continue
        if c in "'\"":
            quote = text[i:i + 3] if text[i:i + 3] in ("'''", '"""') else c
            j = i + len(quote)
            while j < n and not text.startswith(quote, j) and not (
                    len(quote) == 1 and text[j] == "\n"):
                j += 2 if text[j] == "\\" else 1
            if j >= n:
                return brackets, (i + len(quote), quote)
            i = j + (len(quote) if text.startswith(quote, j) else 0)
            continue
        if c in "([{":
            brackets.append(i)
        elif c in ")]}" and brackets:
            brackets.pop()
        i += 1
    return brackets, None
