"""The pipeline runs one way (DESIGN.md section 2): no stage imports a later one.

Every module of `partir/` is parsed with `ast`; its imports (module level and inside
functions, `import partir` included) must name only modules of its own layer or of an
earlier one. Layers, earliest first: base (ir, errors, mesh, registry, gcpause, and rules, the
primitive catalogue every stage reads) <
frontend < core < tactics < spmd < hlo < runtime, with sim after hlo beside runtime (the
two do not import each other); the tools/API modules at the top of the package may
import everything. Besides, `partir/hlo` and `partir/runtime` never import the TMR
(`partir.core.tmr`): index-dependent code reaches them as ordinary ops. The library never
imports the daemon or the language server, which are built on it.
"""

from __future__ import annotations

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "partir"

RANK = {"base": 0, "frontend": 1, "core": 2, "tactics": 3, "spmd": 4, "hlo": 5,
        "runtime": 6, "sim": 6, "tools": 7}

# The layer of every subpackage and top-level module: a new one must be placed here.
LAYERS = {
    "ir": "base", "errors": "base", "mesh": "base", "registry": "base", "gcpause": "base",
    "cancel": "base", "lazy": "base",
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
    "conflict_groups": "tools",
}

OUTSIDE_LIBRARY = ("partir_daemon", "partir_lsp", "lsp")
NO_TMR = ("hlo", "runtime")


def _module_name(path: pathlib.Path, root: pathlib.Path) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_module(name: str, root: pathlib.Path) -> bool:
    p = root.joinpath(*name.split("."))
    return p.with_suffix(".py").is_file() or (p / "__init__.py").is_file()


def imports(path: pathlib.Path, root: pathlib.Path = ROOT) -> set[str]:
    """The absolute names of the modules a file imports, anywhere in it."""
    module = _module_name(path, root)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
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
                found.append(f"{module} imports {name}: the library must not import the "
                             "daemon or the language server")
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
    ("import partir_daemon.client\n", "partir/api.py", "must not import the daemon"),
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
