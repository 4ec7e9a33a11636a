"""Positions: the daemon's ranges (1-based lines, 0-based columns counted in characters,
end exclusive) as LSP ranges (0-based lines, columns in UTF-16 code units, the encoding
VS Code requires), converted against the text the daemon analysed."""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from difflib import SequenceMatcher

import attrs
from lsprotocol import types as lsp

from partir_daemon import protocol as P


@dataclass(frozen=True)
class Lines:
    """A text split into lines, for column conversions."""

    lines: tuple[str, ...]

    @classmethod
    def of(cls, text: str) -> Lines:
        return cls(tuple(text.splitlines()) or ("",))

    def line(self, index: int) -> str:
        return self.lines[index] if 0 <= index < len(self.lines) else ""

    def utf16_col(self, line: int, col: int) -> int:
        """Column `col` (in characters) of 0-based `line` in UTF-16 code units."""
        prefix = self.line(line)[:max(col, 0)]
        return len(prefix.encode("utf-16-le")) // 2

    def char_col(self, line: int, utf16: int) -> int:
        """The inverse of `utf16_col`: a UTF-16 column of `line` in characters."""
        units = 0
        for i, ch in enumerate(self.line(line)):
            if units >= utf16:
                return i
            units += 2 if ord(ch) > 0xFFFF else 1
        return len(self.line(line))

    def end_of_line(self, line: int) -> lsp.Position:
        return lsp.Position(line, self.utf16_col(line, len(self.line(line))))


def to_range(r: P.Range, lines: Lines) -> lsp.Range:
    start_line, end_line = max(r.line - 1, 0), max(r.end_line - 1, 0)
    return lsp.Range(lsp.Position(start_line, lines.utf16_col(start_line, r.col)),
                     lsp.Position(end_line, lines.utf16_col(end_line, r.end_col)))


def line_range(line: int, lines: Lines | None = None) -> lsp.Range:
    """The whole of 1-based `line`: its text without the indentation when known and not
    blank, else the line up to the start of the next (never an empty range: editors draw
    those as a dot or not at all). Line 0 (unknown) is the first line with text."""
    index = max(line - 1, 0)
    if lines is not None and line <= 0:
        index = next((i for i, text in enumerate(lines.lines) if text.strip()), 0)
    text = lines.line(index) if lines is not None else ""
    if lines is None or not text.strip():
        return lsp.Range(lsp.Position(index, 0), lsp.Position(index + 1, 0))
    start = len(text) - len(text.lstrip())
    return lsp.Range(lsp.Position(index, lines.utf16_col(index, start)),
                     lines.end_of_line(index))


def visible_range(r: lsp.Range, lines: Lines) -> lsp.Range:
    """`r`, or the whole of its line when it is empty (a position, not a span)."""
    if r.start != r.end:
        return r
    return line_range(r.start.line + 1, lines)


def contains(r: P.Range, line: int, col: int) -> bool:
    """Whether the daemon range `r` contains the 1-based `line`, character `col`."""
    if line < r.line or line > r.end_line:
        return False
    if line == r.line and col < r.col:
        return False
    return not (line == r.end_line and col > r.end_col)


@dataclass
class LineMap:
    """The lines of an analysed text matched to those of the document's current text
    (whole lines, by difflib), so that results for an older version still show on the
    lines that did not change while the current version is analysed."""

    old: Lines
    new: Lines
    identity: bool = field(init=False, default=True)
    _forward: dict[int, int] = field(init=False, default_factory=dict)
    _backward: dict[int, int] = field(init=False, default_factory=dict)

    def __post_init__(self) -> None:
        self.identity = self.old == self.new
        if self.identity:
            return
        matcher = SequenceMatcher(None, self.old.lines, self.new.lines, autojunk=False)
        for a, b, size in matcher.get_matching_blocks():
            for k in range(size):
                self._forward[a + k] = b + k
                self._backward[b + k] = a + k

    def to_new(self, line: int) -> int | None:
        return line if self.identity else self._forward.get(line)

    def to_old(self, line: int) -> int | None:
        return line if self.identity else self._backward.get(line)

    def position(self, p: lsp.Position) -> lsp.Position | None:
        """A position of the old text in the new one (the line is unchanged, so is the
        column), or None when its line changed."""
        line = self.to_new(p.line)
        return None if line is None else lsp.Position(line, p.character)

    def span(self, r: lsp.Range) -> lsp.Range | None:
        """A range of the old text in the new one, when the lines it spans are unchanged
        and still consecutive."""
        moved = [self.to_new(k) for k in range(r.start.line, r.end.line + 1)]
        first = moved[0]
        if first is None or moved != list(range(first, first + len(moved))):
            return None
        return lsp.Range(lsp.Position(first, r.start.character),
                         lsp.Position(first + len(moved) - 1, r.end.character))

    def lens(self, lens: lsp.CodeLens) -> lsp.CodeLens | None:
        r = self.span(lens.range)
        return None if r is None else attrs.evolve(lens, range=r)

    def hint(self, hint: lsp.InlayHint) -> lsp.InlayHint | None:
        p = self.position(hint.position)
        return None if p is None else attrs.evolve(hint, position=p)


def byte_to_char_col(line_text: str, byte_col: int) -> int:
    """An `ast` column (UTF-8 bytes) of a line as characters."""
    return len(line_text.encode()[:byte_col].decode(errors="ignore"))


def node_range(node: ast.AST, lines: Lines, first: int = 0, col0: int = 0) -> lsp.Range:
    """The LSP range of an `ast` node of a text whose line 1 is line `first` (0-based) of
    `lines`, starting at character `col0` there (a snippet parsed on its own); the whole
    text by default."""

    def position(line: int, byte_col: int) -> lsp.Position:
        index = first + line - 1
        offset = col0 if line == 1 else 0
        chars = byte_to_char_col(lines.line(index)[offset:], byte_col)
        return lsp.Position(index, lines.utf16_col(index, offset + chars))

    return lsp.Range(position(node.lineno, node.col_offset),
                     position(node.end_lineno or node.lineno,
                              node.end_col_offset or node.col_offset))
