"""The pipeline runs one way (DESIGN.md section 2): no stage imports a later one.

Every module of `partir/` is parsed with `ast`; its imports (module level and inside
functions, `import partir` included) must name only modules of its own layer or of an
earlier one. Layers, earliest first: base (ir, errors, mesh, registry, gcpause, and rules, the
primitive catalogue every stage reads) <
frontend < core < tactics < spmd < hlo < runtime, with sim after hlo beside runtime (the
two do not import each other); the tools/API modules at the top of the package may
import everything. Besides, `partir/hlo` and `partir/runtime` never import the TMR
(`partir.core.tmr`): index-dependent code reaches them as ordinary ops. The library never
imports the daemon, the language server or what only they need (pygls, lsprotocol,
watchfiles), which are built on it.

The tools have rules of their own: the daemon never imports the language server built on
its client; in the language server only the protocol layer speaks LSP (lsprotocol, and
pygls in the server alone); the language server and the daemon's own processes start
without JAX. And JAX's private modules (`jax._src`) are imported only by the files of
`JAX_PRIVATE`, each for a reason. docs/architecture.md states these invariants.
"""

from __future__ import annotations

import ast
import pathlib
from collections.abc import Iterator, Mapping

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "partir"

RANK = {"base": 0, "frontend": 1, "core": 2, "tactics": 3, "spmd": 4, "hlo": 5,
        "runtime": 6, "sim": 6, "tools": 7}

# The layer of every subpackage and top-level module: a new one must be placed here.
LAYERS = {
    "ir": "base", "errors": "base", "mesh": "base", "registry": "base", "gcpause": "base",
    "cancel": "base", "lazy": "base", "forked": "base",
    "rules": "base",
    "frontend": "frontend",
    "core": "core",
    "tactics": "tactics",
    "spmd": "spmd",
    "hlo": "hlo",
    "runtime": "runtime",
    "sim": "sim",
    "__init__": "tools", "api": "tools", "cli": "tools", "jitted": "tools",
    "jit_options": "tools", "metadata": "tools", "pipeline": "tools", "program": "tools",
    "schedule_file": "tools", "user_modules": "tools", "session": "tools",
    "conflict_groups": "tools", "launch": "tools",
}

# The tools and the third-party packages only they use (pyproject: "the library never
# imports its tools").
OUTSIDE_LIBRARY = ("partir_daemon", "partir_lsp", "lsp", "pygls", "lsprotocol", "watchfiles")
NO_TMR = ("hlo", "runtime")

# The folder holding the language server's package (pyproject's package roots: the
# repository and lsp/).
LSP_ROOT = "lsp"
# The folders of the repository's Python code, as ruff checks it.
SOURCE_DIRS = ("partir", "partir_daemon", "lsp", "tests", "examples", "benchmarks", "scripts")

# The files that import JAX's private modules, each for a reason JAX's public API does not
# cover; the control-flow ones go with issue 28 (bodies as IR regions).
JAX_PRIVATE = {
    "partir/frontend/source.py":
        "source_info_util: the user's frame and the transpose marker of a traced equation",
    "partir/core/materialize.py":
        "partial_eval.dce_jaxpr: which loop indices a traced TMR `apply` reads",
    "tests/rules/test_windows.py":
        "_select_and_gather_add: the only way to bind the primitive",
}

# The language server's protocol layer: the modules that build LSP's types (lsprotocol),
# and of them the server itself, the only one on pygls. The others (the daemon link, the
# names a tactic can use, the settings) know nothing of LSP. DESIGN section 8's `ide`
# layer would leave only the server here.
LSP_TYPES = ("partir_lsp.actions", "partir_lsp.completion", "partir_lsp.literals",
             "partir_lsp.navigation", "partir_lsp.positions", "partir_lsp.render",
             "partir_lsp.server", "partir_lsp.symbols")
PYGLS = ("partir_lsp.server",)

# Importing JAX takes seconds: the language server and the daemon's processes start
# without it. These modules import it: the compiler, which the worker process imports
# inside its main (the job runner, too, imports JAX inside functions).
JAX = ("jax", "jaxlib")
IMPORT_JAX = ("partir_daemon.engine",)


def _base(path: pathlib.Path, root: pathlib.Path) -> pathlib.Path:
    """The folder a file's module name is relative to: lsp/ for the language server."""
    return root / LSP_ROOT if root / LSP_ROOT in path.parents else root


def _module_name(path: pathlib.Path, root: pathlib.Path) -> str:
    parts = path.relative_to(_base(path, root)).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _source(name: str, root: pathlib.Path) -> pathlib.Path | None:
    """The file of a module of the repository, None for others."""
    for base in (root, root / LSP_ROOT):
        p = base.joinpath(*name.split("."))
        for f in (p.with_suffix(".py"), p / "__init__.py"):
            if f.is_file():
                return f
    return None


def _is_module(name: str, root: pathlib.Path) -> bool:
    return _source(name, root) is not None


def _is_type_checking(test: ast.expr) -> bool:
    return ((isinstance(test, ast.Name) and test.id == "TYPE_CHECKING")
            or (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"))


def _nodes(tree: ast.Module, at_import: bool) -> Iterator[ast.AST]:
    """Every node of a module; with `at_import` only those run when it is imported: none
    inside a function or under `if TYPE_CHECKING:`."""
    if not at_import:
        yield from ast.walk(tree)
        return
    todo: list[ast.AST] = list(tree.body)
    while todo:
        node = todo.pop()
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            todo.extend(node.orelse)
            continue
        yield node
        todo.extend(ast.iter_child_nodes(node))


def imports(path: pathlib.Path, root: pathlib.Path = ROOT, *, at_import: bool = False
            ) -> set[str]:
    """The absolute names of the modules a file imports, anywhere in it, or with
    `at_import` only when it is imported."""
    module = _module_name(path, root)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    out: set[str] = set()
    for node in _nodes(ast.parse(path.read_text(), str(path)), at_import):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - (node.level - 1)]
                name = ".".join([*base, node.module] if node.module else base)
            else:
                name = node.module or ""
            out.add(name)
            # `from partir.core import tmr` imports the submodule partir.core.tmr
            out.update(f"{name}.{a.name}" for a in node.names
                       if _is_module(f"{name}.{a.name}", root))
    return out


def layer_of(module: str) -> str | None:
    """The layer of a module of `partir`, None when it is not placed in LAYERS."""
    parts = module.split(".")
    return LAYERS.get(parts[1] if len(parts) > 1 else "__init__")


def _files(root: pathlib.Path) -> list[pathlib.Path]:
    return sorted((root / "partir").rglob("*.py"))


def test_every_top_level_module_has_a_layer():
    unplaced = sorted({p.relative_to(PACKAGE).parts[0].removesuffix(".py")
                       for p in _files(ROOT)} - set(LAYERS))
    assert not unplaced, f"place these modules of partir/ in a layer in LAYERS: {unplaced}"


def violations(root: pathlib.Path = ROOT) -> list[str]:
    found = []
    for path in _files(root):
        module = _module_name(path, root)
        layer = layer_of(module)
        stage = module.split(".")[1] if "." in module else ""
        for name in sorted(imports(path, root)):
            top = name.split(".")[0]
            if top in OUTSIDE_LIBRARY:
                found.append(f"{module} imports {name}: the library must not import its "
                             "tools (the daemon, the language server) or what only they use")
                continue
            if top != "partir":
                continue
            target = layer_of(name)
            if layer is None or target is None:
                continue  # reported by test_every_top_level_module_has_a_layer
            if target != layer and RANK[target] >= RANK[layer]:
                found.append(f"{module} ({layer}) imports {name} ({target}), a later stage")
            if stage in NO_TMR and (name == "partir.core.tmr"
                                    or name.startswith("partir.core.tmr.")):
                found.append(f"{module} imports {name}: {stage} must not call back into the "
                             "TMR")
    return found


def test_no_stage_imports_a_later_one():
    assert violations() == []


@pytest.mark.parametrize("source, module, want", [
    ("import partir\n", "partir/frontend/x.py", "imports partir (tools)"),
    ("def f():\n    from partir.hlo import ops\n", "partir/core/x.py",
     "imports partir.hlo (hlo)"),
    ("from ..spmd import ops\n", "partir/core/x.py", "imports partir.spmd.ops (spmd)"),
    ("from partir.core import tmr\n", "partir/runtime/x.py", "must not call back"),
    ("import partir.runtime\n", "partir/sim/x.py", "imports partir.runtime (runtime)"),
    ("import partir_daemon.client\n", "partir/api.py", "must not import its tools"),
    ("def f():\n    import watchfiles\n", "partir/session/x.py", "must not import its tools"),
])
def test_the_check_sees_each_kind_of_import(tmp_path, source, module, want):
    for pkg in ("partir", "partir/core", "partir/core/tmr", "partir/sim", "partir/spmd"):
        (tmp_path / pkg).mkdir(parents=True, exist_ok=True)
        (tmp_path / pkg / "__init__.py").write_text("")
    (tmp_path / "partir" / "spmd" / "ops.py").write_text("")
    (tmp_path / module).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / module).write_text(source)
    found = violations(tmp_path)
    assert any(want in v for v in found), found


def test_allowed_imports_pass(tmp_path):
    (tmp_path / "partir" / "hlo").mkdir(parents=True)
    (tmp_path / "partir" / "hlo" / "x.py").write_text(
        "from partir.core.dialect import SLICE\nimport partir.ir\nfrom . import ops\n")
    assert violations(tmp_path) == []


# --- the tools and JAX's private modules ------------------------------------------------


def _names_private_jax(node: ast.AST) -> bool:
    """Whether an import statement imports a module of `jax._src`, however spelt."""
    if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
    elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
        names = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
    else:
        return False
    return any(n == "jax._src" or n.startswith("jax._src.") for n in names)


def _jax_chain(module: str, root: pathlib.Path, known: dict[pathlib.Path, set[str]]
               ) -> list[str] | None:
    """The modules through which importing `module` imports JAX, None if it does not.
    Importing a.b.c runs a and a.b too; imports inside functions are not followed.
    `known` keeps each file's imports for the next module's search."""
    parent: dict[str, str | None] = {}
    todo: list[str] = []

    def reach(name: str, by: str | None) -> None:
        parts = name.split(".")
        for k in range(1, len(parts) + 1):
            prefix = ".".join(parts[:k])
            if prefix not in parent:
                parent[prefix] = by
                todo.append(prefix)

    reach(module, None)
    while todo:
        name = todo.pop()
        if name.split(".")[0] in JAX:
            chain = [name]
            while parent[chain[-1]] is not None:
                chain.append(parent[chain[-1]])
            return chain[::-1]
        path = _source(name, root)
        if path is not None:
            if path not in known:
                known[path] = imports(path, root, at_import=True)
            for imported in sorted(known[path]):
                reach(imported, name)
    return None


def tool_violations(root: pathlib.Path = ROOT, *, jax_private: Mapping[str, str] = JAX_PRIVATE,
                    lsp_types: tuple[str, ...] = LSP_TYPES, pygls: tuple[str, ...] = PYGLS,
                    import_jax: tuple[str, ...] = IMPORT_JAX) -> list[str]:
    found = []
    files = set()
    for d in SOURCE_DIRS:
        for path in sorted((root / d).rglob("*.py")):
            rel = path.relative_to(root).as_posix()
            files.add(rel)
            text = path.read_text()
            # Most files do not name it at all: those are not parsed.
            private = "_src" in text and any(_names_private_jax(n)
                                             for n in ast.walk(ast.parse(text, rel)))
            if private and rel not in jax_private:
                found.append(f"{rel} imports jax._src: use JAX's public API, or add the file "
                             "with its reason to JAX_PRIVATE")
            elif rel in jax_private and not private:
                found.append(f"{rel} no longer imports jax._src: remove it from JAX_PRIVATE")
    for rel in sorted(set(jax_private) - files):
        found.append(f"{rel} is gone: remove it from JAX_PRIVATE")
    tools = sorted([*(root / "partir_daemon").rglob("*.py"),
                    *(root / LSP_ROOT / "partir_lsp").rglob("*.py")])
    tops_of = {_module_name(p, root): {name.split(".")[0] for name in imports(p, root)}
               for p in tools}
    for module, tops in tops_of.items():
        if module.startswith("partir_daemon") and "partir_lsp" in tops:
            found.append(f"{module} imports partir_lsp: the daemon must not import the "
                         "language server built on its client")
    for table, listed, package in (("LSP_TYPES", lsp_types, "lsprotocol"),
                                   ("PYGLS", pygls, "pygls")):
        for module, tops in tops_of.items():
            if package in tops and module not in listed:
                found.append(f"{module} imports {package}: only the language server's "
                             f"protocol layer ({table}) may")
        for module in listed:
            if package not in tops_of.get(module, ()):
                found.append(f"{module} does not import {package}: remove it from {table}")
    known: dict[pathlib.Path, set[str]] = {}
    for module in tops_of:
        if module not in import_jax:
            chain = _jax_chain(module, root, known)
            if chain:
                found.append(f"{module} imports JAX when imported (through "
                             f"{' -> '.join(chain)}): its process must start without JAX")
    return found


def test_the_tools_keep_their_layers():
    assert tool_violations() == []


def _write(root: pathlib.Path, files: Mapping[str, str]) -> None:
    for rel, source in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(source)


@pytest.mark.parametrize("files, want", [
    ({"partir/x.py": "from jax._src import core\n"}, "partir/x.py imports jax._src"),
    ({"benchmarks/x.py": "def f():\n    from jax import _src\n"}, "x.py imports jax._src"),
    ({"partir_daemon/x.py": "import partir_lsp.server\n"}, "must not import the language"),
    ({"lsp/partir_lsp/x.py": "from lsprotocol import types\n"}, "x imports lsprotocol"),
    ({"lsp/partir_lsp/render.py": "from lsprotocol import types\nimport pygls.server\n"},
     "render imports pygls"),
    ({"lsp/partir_lsp/x.py": "import jax.numpy as jnp\n"},
     "partir_lsp.x imports JAX when imported (through partir_lsp.x -> jax"),
    # through a package's __init__ and a `from` import of a submodule
    ({"partir/session/__init__.py": "", "partir/session/core.py": "import numpy, jax\n",
      "partir_daemon/x.py": "from partir.session import core\n"},
     "through partir_daemon.x -> partir.session.core -> jax"),
    ({"partir/__init__.py": "from partir import api\n", "partir/api.py": "import jaxlib\n",
      "partir_daemon/x.py": "import partir.mesh\n", "partir/mesh.py": ""},
     "through partir_daemon.x -> partir -> partir.api -> jaxlib"),
])
def test_the_tool_checks_see_each_violation(tmp_path, files, want):
    _write(tmp_path, files)
    found = tool_violations(tmp_path, jax_private={}, lsp_types=("partir_lsp.render",),
                            pygls=())
    assert any(want in v for v in found), found


@pytest.mark.parametrize("jax_private, lsp_types, want", [
    ({"partir/x.py": "why"}, (), "partir/x.py no longer imports jax._src"),
    ({"partir/gone.py": "why"}, (), "partir/gone.py is gone"),
    ({}, ("partir_lsp.x",), "partir_lsp.x does not import lsprotocol: remove it"),
    ({}, ("partir_lsp.gone",), "partir_lsp.gone does not import lsprotocol: remove it"),
])
def test_the_allow_lists_name_only_current_imports(tmp_path, jax_private, lsp_types, want):
    _write(tmp_path, {"partir/x.py": "import jax\n", "lsp/partir_lsp/x.py": ""})
    found = tool_violations(tmp_path, jax_private=jax_private, lsp_types=lsp_types, pygls=())
    assert any(want in v for v in found), found


def test_allowed_tool_imports_pass(tmp_path):
    _write(tmp_path, {
        "partir/x.py": "import jax._src.core\n",
        "lsp/partir_lsp/server.py": "from lsprotocol import types\nfrom pygls import server\n",
        "lsp/partir_lsp/names.py": "from partir_daemon import protocol\n",
        # JAX imported on first use, or only for type checkers
        "partir_daemon/protocol.py": "from typing import TYPE_CHECKING\n"
                                     "if TYPE_CHECKING:\n    import jax\n",
        "partir_daemon/worker.py": "def main():\n    from partir_daemon import engine\n",
        "partir_daemon/engine.py": "import jax\n",
    })
    assert tool_violations(tmp_path, jax_private={"partir/x.py": "why"},
                           lsp_types=("partir_lsp.server",), pygls=("partir_lsp.server",),
                           import_jax=("partir_daemon.engine",)) == []
