"""The user's modules that schedule files import, kept imported across loads.

Importing a model module can take seconds (JAX traces and compiles what it runs at import
and what the schedule file calls on it), so a process that loads schedule files again and
again (the daemon's compiler) keeps those modules, and everything they hold, and reloads
only what changed on disk: a module whose file's content hash differs from the one taken
*before* its import read it (so an edit made while it was importing is never cached under
the new hash), and every module that imports it, directly or through others.

User modules are those outside the interpreter's and partir's own directories, and never
partir's own packages (`OWN_PACKAGES`), wherever they were imported from: a workspace that
is a partir checkout has folders named like them at its root, and the process loading
its schedule files (the daemon's compiler) runs on those packages. Each
directory of schedule files has its own set: two example directories may each have a
`model.py`, and a schedule file must get the one next to it, as a fresh interpreter
started there would. Before a load, `UserModules.enter` puts the directory's set in
`sys.modules` (and takes the previous one's out); afterwards `leave` records what the load
imported.
"""

from __future__ import annotations

import ast
import hashlib
import importlib.abc
import importlib.machinery
import os
import sys
import sysconfig
import types
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

_PARTIR_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep
# Where the interpreter's own and installed packages live: frames and modules there are
# libraries, not the user's code.
_LIBRARY_DIRS = tuple(sorted({os.path.abspath(p) + os.sep for key, p in
                              sysconfig.get_paths().items()
                              if key in ("stdlib", "platstdlib", "purelib", "platlib")}))


# partir's packages: the compiler library, its daemon and its language server.
OWN_PACKAGES = frozenset({"partir", "partir_daemon", "partir_lsp"})


def is_own(name: str) -> bool:
    """Whether module `name` belongs to one of partir's own packages."""
    return name.partition(".")[0] in OWN_PACKAGES


def is_library(file: str) -> bool:
    file = os.path.abspath(file)
    return file.startswith(_PARTIR_DIR) or file.startswith(_LIBRARY_DIRS)


def content_hash(path: str) -> str | None:
    """sha256 of the file's bytes; None when it cannot be read (e.g. deleted)."""
    try:
        with open(path, "rb") as f:
            return hashlib.sha256(f.read()).hexdigest()
    except OSError:
        return None


def _user_file(name: str, module: types.ModuleType) -> str | None:
    file = getattr(module, "__file__", None)
    if is_own(name) or not isinstance(file, str) or file.startswith("<") or \
            is_library(file):
        return None
    return os.path.abspath(file)


@dataclass(frozen=True)
class ModuleSource:
    """A user module as it was imported: its file, the file's content hash taken before
    the import read it, and the modules its source imports (anywhere in it, absolute
    names; `from a import b` counts `a` and `a.b`)."""

    name: str
    file: str
    digest: str | None
    imports: frozenset[str]

    def imports_module(self, name: str) -> bool:
        # A package's submodules depend on the package.
        return _reaches(self.imports, name) or self.name.startswith(name + ".")


def _reaches(imports: frozenset[str], name: str) -> bool:
    """Whether importing `imports` runs module `name` (importing `a.b` runs `a` too)."""
    return name in imports or any(i.startswith(name + ".") for i in imports)


def imported_names(tree: ast.AST, package: str) -> frozenset[str]:
    """The absolute names of the modules `tree` imports; `package` resolves relative
    imports (the module's own name for a package's `__init__`, else its parent)."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".") if package else []
                parts = parts[:len(parts) - (node.level - 1)] if node.level > 1 else parts
                base = ".".join([*parts, *([base] if base else [])])
            if base:
                names.add(base)
            names.update(f"{base}.{a.name}" if base else a.name for a in node.names
                         if a.name != "*")
    return frozenset(names)


def _source_of(name: str, file: str, data: bytes, is_package: bool) -> ModuleSource:
    package = name if is_package else name.rpartition(".")[0]
    try:
        imports = imported_names(ast.parse(data, file), package)
    except (SyntaxError, ValueError):
        imports = frozenset()  # it will fail to import; nothing to follow
    return ModuleSource(name, file, hashlib.sha256(data).hexdigest(), imports)


def local_imports(path: str, text: str | None = None) -> list[str]:
    """The files in the directory of the schedule file `path` (its source: `text`, else
    the file) that it imports, directly or through each other, read from the sources
    alone. For a load that never finished (its process was killed or crashed), which
    recorded nothing: the files whose fix on disk must bring the schedule file back."""
    directory = os.path.dirname(os.path.abspath(path))
    found: set[str] = set()
    # (file, its module name, whether it is a package's __init__, its source if known)
    todo: list[tuple[str, str, bool, str | bytes | None]] = [
        (os.path.abspath(path), "", False, text)]
    while todo:
        file, name, is_package, data = todo.pop()
        try:
            if data is None:
                with open(file, "rb") as f:
                    data = f.read()
            tree = ast.parse(data, file)
        except (OSError, SyntaxError, ValueError):
            continue
        for imported in imported_names(tree, name if is_package else name.rpartition(".")[0]):
            if is_own(imported):
                continue
            parts = imported.split(".")
            for i in range(1, len(parts) + 1):
                base = os.path.join(directory, *parts[:i])
                for candidate, package in ((base + ".py", False),
                                           (os.path.join(base, "__init__.py"), True)):
                    if candidate not in found and os.path.isfile(candidate):
                        found.add(candidate)
                        todo.append((candidate, ".".join(parts[:i]), package, None))
    return sorted(found)


class _Recorder(importlib.abc.MetaPathFinder):
    """First on `sys.meta_path` while a schedule file runs: finds specs with the finders
    after it and, for the user's source files, reads and hashes them before the loader
    does."""

    def __init__(self, found: dict[str, ModuleSource]) -> None:
        self.found = found

    def find_spec(self, name: str, path: Sequence[str] | None, target: types.ModuleType |
                  None = None) -> importlib.machinery.ModuleSpec | None:
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is None:
                continue
            origin = spec.origin
            if isinstance(origin, str) and origin.endswith(".py") and not is_library(origin) \
                    and not is_own(name):
                try:
                    with open(origin, "rb") as f:
                        data = f.read()
                except OSError:
                    return spec
                self.found[name] = _source_of(name, os.path.abspath(origin), data,
                                              spec.submodule_search_locations is not None)
            return spec
        return None


def _local_names(directory: str) -> set[str]:
    """Top-level module names a file run in `directory` imports from there."""
    try:
        entries = os.listdir(directory)
    except OSError:
        return set()
    local = set()
    for entry in entries:
        stem, ext = os.path.splitext(entry)
        if ext == ".py" and stem.isidentifier():
            local.add(stem)
        elif entry.isidentifier() and os.path.isfile(os.path.join(directory, entry,
                                                                  "__init__.py")):
            local.add(entry)
    return local


@dataclass
class _Directory:
    modules: dict[str, types.ModuleType] = field(default_factory=dict)
    sources: dict[str, ModuleSource] = field(default_factory=dict)


class UserModules:
    """The user's modules imported by schedule files, per directory of schedule files."""

    def __init__(self) -> None:
        self._dirs: dict[str, _Directory] = {}
        self._installed: set[str] = set()  # the names this cache put in sys.modules
        self.reloads = 0  # modules dropped because they (or what they import) changed

    def stale(self, directory: str) -> set[str]:
        """Names of the directory's modules to import again: changed on disk, or importing
        one that did."""
        d = self._dirs.get(directory)
        if d is None:
            return set()
        doomed = {n for n, s in d.sources.items() if content_hash(s.file) != s.digest}
        while more := {n for n, s in d.sources.items()
                       if n not in doomed and any(s.imports_module(m) for m in doomed)}:
            doomed |= more
        return doomed

    @contextmanager
    def loading(self, directory: str) -> Iterator[None]:
        """Run a schedule file of `directory` inside: its modules (less the stale ones) are
        in `sys.modules`, and what it imports is recorded for the next load."""
        d = self._dirs.setdefault(directory, _Directory())
        for name in self.stale(directory):
            d.modules.pop(name, None)
            d.sources.pop(name, None)
            self.reloads += 1
        # Out go the previous directory's modules, and user modules named like this
        # directory's files that this cache did not import here (e.g. a script imported
        # them from elsewhere): a fresh interpreter started here would not have them.
        local = _local_names(directory)
        for name in [n for n, m in sys.modules.items()
                     if (n in self._installed or n.partition(".")[0] in local)
                     and _user_file(n, m) is not None and d.modules.get(n) is not m]:
            del sys.modules[name]
        sys.modules.update(d.modules)
        found: dict[str, ModuleSource] = {}
        recorder = _Recorder(found)
        sys.meta_path.insert(0, recorder)
        try:
            yield
        finally:
            sys.meta_path.remove(recorder)
            for name, source in found.items():
                d.sources[name] = source
                module = sys.modules.get(name)
                if module is not None and _user_file(name, module) == source.file:
                    d.modules[name] = module
            self._installed = set(d.modules)

    def dependencies(self, directory: str, imports: frozenset[str]) -> list[str]:
        """Files of the directory's modules reached from `imports` (a schedule file's),
        directly or through each other; a module that failed to import is included (its
        fix on disk must bring the schedule file back)."""
        d = self._dirs.get(directory)
        if d is None:
            return []
        seen: set[str] = set()
        todo = [n for n in d.sources if _reaches(imports, n)]
        while todo:
            name = todo.pop()
            if name in seen:
                continue
            seen.add(name)
            source = d.sources[name]
            todo += [n for n in d.sources if n not in seen and source.imports_module(n)]
        return sorted({d.sources[n].file for n in seen})

    def digests(self) -> dict[str, str | None]:
        """Every recorded module file with its content hash when imported."""
        return {s.file: s.digest for d in self._dirs.values() for s in d.sources.values()}


# One per process: schedule files loaded one after another share what they imported.
USER_MODULES = UserModules()
