"""Go to definition in a schedule file: from a key of a tactic's inputs dict to where the
values it selects are defined (the function's parameter, the places in the user's
modules that create each pytree leaf, a tag's `partir.tag` call: the daemon's
`ExplainedValue.definitions`), and from a tactic named in the `schedule` list to the
statement that binds it, following `from module import name` statically (no code runs in
the server)."""

from __future__ import annotations

import ast
import os
from collections.abc import Iterator
from dataclasses import dataclass

from lsprotocol import types as lsp

from partir_daemon import protocol as P
from partir_lsp import render
from partir_lsp.literals import KEY, parse, slot_at
from partir_lsp.names import Names
from partir_lsp.positions import Lines, byte_to_char_col, line_range, node_range

SCHEDULE = "schedule"
# How many `from a import b` a name may go through before its definition.
MAX_IMPORTS = 8


@dataclass(frozen=True)
class Module:
    path: str
    lines: Lines
    tree: ast.Module

    @classmethod
    def read(cls, path: str) -> Module | None:
        try:
            with open(path, encoding="utf-8") as f:
                text = f.read()
        except (OSError, UnicodeDecodeError):
            return None
        tree = parse(text)
        return cls(path, Lines.of(text), tree) if tree is not None else None


def definitions(path: str, text: str, position: lsp.Position, result: P.PartitionResult | None,
                root: str) -> list[lsp.Location]:
    """Where what is at `position` of the schedule file `path` (with the editor's `text`)
    is defined, best first; `root` is the workspace folder, where imports are also looked
    up."""
    lines = Lines.of(text)
    col = lines.char_col(position.line, position.character)
    slot = slot_at(text, lines, position.line, col)
    if slot is not None:
        if slot.role != KEY or result is None:
            return []
        return _value_locations(Names.of(result.values).under(slot.value))
    tree = parse(text)
    if tree is None:
        return []
    node = _schedule_element_at(tree, lines, position)
    if node is None:
        return []
    found = _resolve(Module(path, lines, tree), node, root, MAX_IMPORTS)
    return [found] if found is not None else []


def _value_locations(values: list[P.ExplainedValue]) -> list[lsp.Location]:
    """The definitions of the values, deduplicated, in the order of the values' best
    first (for a prefix, the shared parameter comes first)."""
    seen: set[tuple[str, int]] = set()
    files: dict[str, Lines | None] = {}
    out = []
    for v in values:
        for d in v.definitions:
            if (d.file, d.line) in seen:
                continue
            seen.add((d.file, d.line))
            if d.file not in files:
                module = Module.read(d.file)
                files[d.file] = module.lines if module is not None else None
            out.append(lsp.Location(render.uri_of(d.file), line_range(d.line, files[d.file])))
    return out


def _schedule_element_at(tree: ast.Module, lines: Lines,
                         position: lsp.Position) -> ast.Name | ast.Attribute | None:
    stmt = _bindings(tree).get(SCHEDULE)
    value = getattr(stmt, "value", None)
    if not isinstance(value, ast.List | ast.Tuple):
        return None
    for elt in value.elts:
        if isinstance(elt, ast.Name | ast.Attribute) and _within(node_range(elt, lines),
                                                                position):
            return elt
    return None


def _within(r: lsp.Range, p: lsp.Position) -> bool:
    return (r.start.line, r.start.character) <= (p.line, p.character) <= (
        r.end.line, r.end.character)


def _resolve(module: Module, node: ast.expr, root: str, budget: int) -> lsp.Location | None:
    """The binding of a Name (or of `module.name` for an imported module) of `module`."""
    found = _resolve_binding(module, node, root, budget)
    if found is None:
        return None
    where, stmt, name = found
    target = next((t for t in _targets(stmt) if t.id == name), stmt)
    return lsp.Location(render.uri_of(where.path), node_range(target, where.lines))


def _resolve_binding(module: Module, node: ast.expr, root: str,
                     budget: int) -> tuple[Module, ast.stmt, str] | None:
    """The module and statement binding a Name (or `module.name`) of `module`, and the
    name it binds there."""
    if isinstance(node, ast.Name):
        return _binding(module, node.id, root, budget)
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
        stmt = _bindings(module.tree).get(node.value.id)
        if isinstance(stmt, ast.Import):
            alias = next(a for a in stmt.names if (a.asname or a.name.split(".")[0])
                         == node.value.id)
            target = _import(alias.name if alias.asname else alias.name.split(".")[0], 0,
                             module.path, root)
            if target is not None:
                return _binding(target, node.attr, root, budget)
    return None


def _binding(module: Module, name: str, root: str,
             budget: int) -> tuple[Module, ast.stmt, str] | None:
    stmt = _bindings(module.tree).get(name)
    if stmt is None:
        return None
    if isinstance(stmt, ast.ImportFrom) and budget > 0:
        alias = next(a for a in stmt.names if (a.asname or a.name) == name)
        target = _import(stmt.module or "", stmt.level, module.path, root)
        found = _binding(target, alias.name, root, budget - 1) \
            if target is not None else None
        if found is not None:
            return found
    return module, stmt, name


@dataclass(frozen=True)
class Site:
    """A tactic of the schedule list written in another module (`from schedules import
    Z3`): its 1-based index, its element of the list, and its call there, with the ranges
    of its input keys (1-based lines, character columns, as the daemon's)."""

    index: int
    element: P.Range
    path: str
    lines: Lines
    call: P.Range
    keys: dict[str, P.Range]


def written_elsewhere(path: str, text: str, root: str) -> list[Site]:
    """The tactics of the schedule file's list bound, in another module, to a tactic call
    (`Z3 = ManualPartition({...}, axis=..., name="Z3")`): where their diagnostics, hovers,
    completion and quick fixes go there. Read statically, from the modules on disk."""
    tree = parse(text)
    if tree is None:
        return []
    value = getattr(_bindings(tree).get(SCHEDULE), "value", None)
    if not isinstance(value, ast.List | ast.Tuple):
        return []
    module = Module(path, Lines.of(text), tree)
    out = []
    for index, elt in enumerate(value.elts, 1):
        if not isinstance(elt, ast.Name | ast.Attribute):
            continue
        found = _resolve_binding(module, elt, root, MAX_IMPORTS)
        if found is None or os.path.realpath(found[0].path) == os.path.realpath(path):
            continue
        where, stmt, _ = found
        call = getattr(stmt, "value", None)
        if not isinstance(call, ast.Call):
            continue
        inputs = call.args[0] if call.args else next(
            (kw.value for kw in call.keywords if kw.arg == "inputs"), None)
        keys = {k.value: _char_range(k, where.lines) for k in getattr(inputs, "keys", [])
                if isinstance(k, ast.Constant) and isinstance(k.value, str)}
        out.append(Site(index, _char_range(elt, module.lines), where.path, where.lines,
                        _char_range(call, where.lines), keys))
    return out


def _char_range(node: ast.AST, lines: Lines) -> P.Range:
    end_line = node.end_lineno or node.lineno
    return P.Range(node.lineno, byte_to_char_col(lines.line(node.lineno - 1), node.col_offset),
                   end_line, byte_to_char_col(lines.line(end_line - 1),
                                              node.end_col_offset or node.col_offset))


def _import(name: str, level: int, importer: str, root: str) -> Module | None:
    """The module file `from <level dots><name> import ...` in `importer` reads: next to
    the importer (the schedule file's directory is first on its path), then in the
    workspace folder."""
    here = os.path.dirname(os.path.abspath(importer))
    if level > 0:
        for _ in range(level - 1):
            here = os.path.dirname(here)
        bases = [here]
    else:
        bases = [here, root]
    parts = [p for p in name.split(".") if p]
    for base in bases:
        stem = os.path.join(base, *parts)
        package = os.path.join(stem, "__init__.py")
        for candidate in ([stem + ".py", package] if parts else [package]):
            if os.path.isfile(candidate):
                return Module.read(candidate)
    return None


def _bindings(tree: ast.Module) -> dict[str, ast.stmt]:
    """The last module-level statement (also inside if/try/with) binding each name."""
    out: dict[str, ast.stmt] = {}
    for stmt in _statements(tree.body):
        if isinstance(stmt, ast.Import | ast.ImportFrom):
            for a in stmt.names:
                out[a.asname or a.name.split(".")[0]] = stmt
        elif isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            out[stmt.name] = stmt
        else:
            for target in _targets(stmt):
                out[target.id] = stmt
    return out


def _statements(body: list[ast.stmt]) -> Iterator[ast.stmt]:
    for stmt in body:
        yield stmt
        if isinstance(stmt, ast.If | ast.Try | ast.With):
            for attr in ("body", "orelse", "finalbody"):
                yield from _statements(getattr(stmt, attr, []))
            for handler in getattr(stmt, "handlers", []):
                yield from _statements(handler.body)


def _targets(stmt: ast.stmt) -> list[ast.Name]:
    if isinstance(stmt, ast.Assign):
        roots = stmt.targets
    elif isinstance(stmt, ast.AnnAssign | ast.AugAssign):
        roots = [stmt.target]
    else:
        return []
    return [n for r in roots for n in ast.walk(r) if isinstance(n, ast.Name)]
