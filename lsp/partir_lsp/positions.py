"""Positions: the daemon's ranges (1-based lines, 0-based columns counted in characters,
end exclusive) as LSP ranges (0-based lines, columns in UTF-16 code units, the encoding
VS Code requires), converted against the text the daemon analysed."""

from __future__ import annotations

from dataclasses import dataclass

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
    """The whole of 1-based `line` (its text when known, else an empty range at its
    start); line 0 (unknown) is the first line."""
    index = max(line - 1, 0)
    if lines is None:
        return lsp.Range(lsp.Position(index, 0), lsp.Position(index, 0))
    text = lines.line(index)
    start = len(text) - len(text.lstrip())
    return lsp.Range(lsp.Position(index, lines.utf16_col(index, start)),
                     lines.end_of_line(index))


def contains(r: P.Range, line: int, col: int) -> bool:
    """Whether the daemon range `r` contains the 1-based `line`, character `col`."""
    if line < r.line or line > r.end_line:
        return False
    if line == r.line and col < r.col:
        return False
    return not (line == r.end_line and col > r.end_col)
