"""Where the values tactics name are defined in the user's code, for go-to-definition.

- An input `params/layers/0/w_up`: the parameter `params` of the partitioned function,
  then the places in the user's modules that create the leaf: a dict key `"w_up"`, a
  keyword `w_up=` or an assignment to an attribute or name `w_up` (how pytrees of
  parameters are built: dict literals, `dict(...)`, dataclasses, flax modules).
- A tagged value: the `partir.tag` call (the location the tracer recorded for it).
"""

from __future__ import annotations

import ast
import functools
import inspect
import os
import textwrap
from collections.abc import Callable, Iterable, Iterator

from partir.frontend import TracedProgram
from partir.ir import Op
from partir.session import results as P

# Leaf-creation sites listed per input, after its parameter.
MAX_SITES = 4


def definitions(traced: TracedProgram, fn: Callable,
                files: Iterable[str]) -> dict[tuple[str, str], list[P.SourceLocation]]:
    """(kind, name) -> locations, best first, for every input and tag of `traced`; `files`
    are the user's module files to search for leaf-creation sites, best first."""
    params = _parameters(fn)
    files = list(dict.fromkeys(f for f in files if f.endswith(".py")))
    out: dict[tuple[str, str], list[P.SourceLocation]] = {}
    for name in traced.input_names:
        head, _, _ = name.partition("/")
        found = [params[head]] if head in params else []
        leaf = name.rsplit("/", 1)[-1]
        if "/" in name and leaf.isidentifier():
            found += [site for f in files for site in _sites(f, leaf)]
        out[("input", name)] = _unique(found)[:MAX_SITES + 1]
    producer = {r: op for op in _all_ops(traced.function.ops) for r in op.results}
    for tag, values in traced.tags.items():
        locs = []
        for v in values:
            op = producer.get(v)
            if op is not None and op.loc.line:
                locs.append(P.SourceLocation(op.loc.file, op.loc.line, op.loc.function))
        out[("tag", tag)] = _unique(locs)
    return out


def _all_ops(ops: Iterable[Op]) -> Iterator[Op]:
    """The ops, and those of their regions (a tag in a loop's body), in program order."""
    for op in ops:
        yield op
        for region in op.regions:
            yield from _all_ops(region.ops)


def _unique(locations: list[P.SourceLocation]) -> list[P.SourceLocation]:
    seen = set()
    return [loc for loc in locations
            if (loc.file, loc.line) not in seen and not seen.add((loc.file, loc.line))]


def _parameters(fn: Callable) -> dict[str, P.SourceLocation]:
    """Each parameter of `fn` (unwrapping `jax.jit` and decorators) at its line."""
    fn = inspect.unwrap(getattr(fn, "__wrapped__", fn))
    try:
        file = inspect.getsourcefile(fn)
        lines, first = inspect.getsourcelines(fn)
    except (OSError, TypeError):
        return {}
    if file is None:
        return {}
    try:
        tree = ast.parse(textwrap.dedent("".join(lines)))
    except SyntaxError:
        return {}
    node = next((n for n in ast.walk(tree)
                 if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda)), None)
    if node is None:
        return {}
    a = node.args
    name = getattr(node, "name", "<lambda>")
    return {arg.arg: P.SourceLocation(os.path.abspath(file),
                                      first + arg.lineno - 1, name)
            for arg in [*a.posonlyargs, *a.args, *a.kwonlyargs]}


@functools.lru_cache(maxsize=256)
def _index(file: str, mtime_ns: int) -> dict[str, list[P.SourceLocation]]:
    """identifier -> where `file` creates a pytree leaf under that name."""
    try:
        with open(file, "rb") as f:
            tree = ast.parse(f.read(), file)
    except (OSError, SyntaxError, ValueError):
        return {}
    index: dict[str, list[P.SourceLocation]] = {}

    def add(name: str, node: ast.AST, function: str) -> None:
        index.setdefault(name, []).append(P.SourceLocation(file, node.lineno, function))

    def visit(node: ast.AST, function: str) -> None:
        for child in ast.iter_child_nodes(node):
            inner = child.name if isinstance(
                child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) else function
            if isinstance(child, ast.Dict):
                for key in child.keys:
                    if isinstance(key, ast.Constant) and isinstance(key.value, str):
                        add(key.value, key, function)
            elif isinstance(child, ast.keyword) and child.arg:
                add(child.arg, child.value, function)
            elif isinstance(child, ast.Attribute) and isinstance(child.ctx, ast.Store):
                add(child.attr, child, function)
            elif isinstance(child, ast.AnnAssign) and isinstance(child.target, ast.Name):
                add(child.target.id, child.target, function)  # dataclass fields
            visit(child, inner)

    visit(tree, "")
    return index


def _sites(file: str, leaf: str) -> list[P.SourceLocation]:
    try:
        mtime = os.stat(file).st_mtime_ns
    except OSError:
        return []
    return _index(file, mtime).get(leaf, [])
