"""Cache keys: fingerprints of traced functions, their arguments and tactics.

A schedule file is executed afresh for every request, so the function and tactics are
new objects each time; the caches are keyed by what determines their results instead:

- a function defined in a workspace module (the user's `model.py`) by its qualified name
  and the content hashes of that module and of every workspace module it imports,
  transitively (the dependencies the watcher checks when a file changes). A module's
  hash is the one taken *before* it was imported (`partir.user_modules`), never one taken
  after: an edit that lands while the module runs must not key the old program under the
  new content (the engine checks the files again after the analysis);
- any other function (defined in the schedule file itself, a lambda, a closure) by its
  code: bytecode, constants, line table (locations end up in the traced ops), defaults,
  closure cells and the globals it refers to, fingerprinted the same way;
- arguments by pytree structure, shapes and dtypes (not values: the trace depends on
  abstract values only), static arguments by value;
- a tactic by its name, axis and input dict, callable rules fingerprinted like functions.

What cannot be fingerprinted by content (an arbitrary object without a stable repr) is
keyed by identity, which only makes the cache miss more, never return a stale result.
"""

from __future__ import annotations

import functools
import hashlib
import os
import sys
import types
from collections.abc import Iterable
from typing import Any

import jax
import numpy as np

import partir
from partir.core.program import CoreProgram
from partir.mesh import Mesh
from partir.program import Program
from partir.tactics.base import Tactic
from partir.tactics.forms import _Form
from partir.user_modules import content_hash, is_library

# Arrays captured by functions are hashed by content up to this size, by identity above.
_MAX_HASHED_BYTES = 16 << 20


def _h(*parts: str) -> str:
    digest = hashlib.sha256()
    for p in parts:
        digest.update(p.encode())
        digest.update(b"\0")
    return digest.hexdigest()


class Fingerprinter:
    """Fingerprints for one request: remembers module hashes, and collects the workspace
    files (path -> content hash) that the fingerprinted objects depend on."""

    def __init__(self, roots: Iterable[str],
                 imported: dict[str, str | None] | None = None,
                 tool_dirs: Iterable[str] = ()) -> None:
        self.roots = tuple(sorted({os.path.abspath(r) + os.sep for r in roots}))
        # The code of the tools running the session (e.g. the daemon) is never the user's.
        self.tool_dirs = tuple(os.path.abspath(d) + os.sep for d in tool_dirs)
        # file -> content hash taken before the module was imported, when known
        self.imported = imported or {}
        self.files: dict[str, str | None] = {}
        self._modules: dict[str, str] = {}

    # -- workspace modules ---------------------------------------------------------------
    def is_workspace_file(self, file: str | None) -> bool:
        if not file or file.startswith("<"):
            return False
        file = os.path.abspath(file)
        return (file.startswith(self.roots) and not is_library(file)
                and not (self.tool_dirs and file.startswith(self.tool_dirs)))

    def _workspace_module(self, name: str | None) -> types.ModuleType | None:
        module = sys.modules.get(name) if name else None
        file = getattr(module, "__file__", None)
        return module if self.is_workspace_file(file) else None

    def module(self, module: types.ModuleType) -> str:
        """Hash of a workspace module's file and, transitively, of the workspace modules
        it imports (as modules, or functions and classes taken from them)."""
        return self._module_closure(module, set())

    def _module_closure(self, module: types.ModuleType, active: set[str]) -> str:
        name = module.__name__
        if name in self._modules:
            return self._modules[name]
        if name in active:  # an import cycle: the file hash is counted once
            return _h("cycle", name)
        active.add(name)
        file = os.path.abspath(module.__file__)
        content = self.files.setdefault(
            file, self.imported[file] if file in self.imported else content_hash(file))
        deps = set()
        for value in list(vars(module).values()):
            dep = value if isinstance(value, types.ModuleType) else \
                self._workspace_module(getattr(value, "__module__", None)) if isinstance(
                    value, type | types.FunctionType) else None
            if dep is not None and dep is not module and self.is_workspace_file(
                    getattr(dep, "__file__", None)):
                deps.add(dep.__name__)
        parts = [file, content or "missing"]
        parts += [self._module_closure(sys.modules[d], active) for d in sorted(deps)]
        active.discard(name)
        digest = self._modules[name] = _h("module", *parts)
        return digest

    # -- values --------------------------------------------------------------------------
    def value(self, v: Any, depth: int = 0, seen: frozenset[int] = frozenset()) -> str:
        if depth > 12 or id(v) in seen:
            return _h("deep", type(v).__qualname__)
        if v is None or isinstance(v, bool | int | float | complex | str | bytes):
            return _h("lit", repr(v))
        if isinstance(v, _Form):
            return _h("form", repr(v))
        seen = seen | {id(v)}
        if isinstance(v, list | tuple | set | frozenset):
            items = [self.value(x, depth + 1, seen) for x in v]
            if isinstance(v, set | frozenset):
                items.sort()
            return _h(type(v).__name__, *items)
        if isinstance(v, dict):
            items = sorted(_h(self.value(k, depth + 1, seen), self.value(x, depth + 1, seen))
                           for k, x in v.items())
            return _h("dict", *items)
        if isinstance(v, types.ModuleType):
            if self.is_workspace_file(getattr(v, "__file__", None)):
                return self.module(v)
            return _h("libmodule", v.__name__)
        if isinstance(v, np.ndarray | jax.Array | np.generic):
            arr = np.asarray(v)
            if arr.nbytes <= _MAX_HASHED_BYTES:
                return _h("array", str(arr.shape), arr.dtype.str,
                          hashlib.sha256(np.ascontiguousarray(arr).tobytes()).hexdigest())
            return _h("bigarray", str(arr.shape), arr.dtype.str, str(id(v)))
        if isinstance(v, jax.ShapeDtypeStruct):
            return _h("abstract", str(v.shape), str(v.dtype))
        if callable(v) or isinstance(v, type):
            return self.callable(v, depth + 1, seen)
        if hasattr(v, "__dataclass_fields__") or hasattr(v, "__dict__"):
            try:
                fields = vars(v)
            except TypeError:
                fields = None
            if fields is not None:
                return _h("object", type(v).__module__, type(v).__qualname__,
                          self.value(dict(fields), depth + 1, seen))
        return _h("opaque", type(v).__qualname__, str(id(v)))

    def callable(self, fn: Any, depth: int = 0, seen: frozenset[int] = frozenset()) -> str:
        if isinstance(fn, functools.partial):
            return _h("partial", self.callable(fn.func, depth + 1, seen),
                      self.value(fn.args, depth + 1, seen),
                      self.value(fn.keywords, depth + 1, seen))
        if isinstance(fn, types.MethodType):
            return _h("method", self.callable(fn.__func__, depth + 1, seen),
                      self.value(fn.__self__, depth + 1, seen))
        module = self._workspace_module(getattr(fn, "__module__", None))
        qualname = getattr(fn, "__qualname__", None)
        if module is not None and qualname and "<locals>" not in qualname and \
                _lookup(module, qualname) is fn:
            # A named function or class of a workspace module: its module's content
            # covers it (and what it refers to).
            return _h("named", self.module(module), qualname)
        wrapped = getattr(fn, "__wrapped__", None)  # jax.jit, functools.wraps
        if wrapped is not None and wrapped is not fn:
            return _h("wrapped", type(fn).__qualname__, self.callable(wrapped, depth + 1, seen))
        if isinstance(fn, types.FunctionType):
            return self._function(fn, depth, seen | {id(fn)})
        if isinstance(fn, type):
            return _h("class", getattr(fn, "__module__", ""), fn.__qualname__)
        if isinstance(fn, types.BuiltinFunctionType) or _is_library_object(fn):
            return _h("library", getattr(fn, "__module__", "") or "", qualname or repr(fn))
        return _h("callable-object", type(fn).__module__, type(fn).__qualname__,
                  self.value(getattr(fn, "__dict__", {}), depth + 1, seen))

    def _function(self, fn: types.FunctionType, depth: int, seen: frozenset[int]) -> str:
        parts = [fn.__qualname__, _code(fn.__code__)]
        parts.append(self.value(fn.__defaults__, depth + 1, seen))
        parts.append(self.value(fn.__kwdefaults__, depth + 1, seen))
        for cell in fn.__closure__ or ():
            try:
                parts.append(self.value(cell.cell_contents, depth + 1, seen))
            except ValueError:  # an empty cell
                parts.append("empty")
        for name in sorted(_global_names(fn.__code__)):
            if name in fn.__globals__:
                parts.append(name + "=" + self.value(fn.__globals__[name], depth + 1, seen))
        return _h("function", *parts)

    # -- keys ----------------------------------------------------------------------------
    def trace_key(self, program: Program) -> str:
        dynamic = [a for i, a in enumerate(program.args) if i not in program.static_argnums]
        leaves, tree = jax.tree_util.tree_flatten(tuple(dynamic))
        signature = [f"{tuple(np.shape(x))}:{_dtype(x)}" for x in leaves]
        static = [self.value(program.args[i]) for i in program.static_argnums
                  if i < len(program.args)]
        return _h("trace", self.callable(program.fn), str(tree), *signature,
                  str(program.static_argnums), *static, jax.__version__, partir.__version__)

    def tactic_key(self, tactic: Tactic) -> str:
        # The source location and the name are left out: they only label what the tactic
        # does (in records and error messages), and moving or renaming a tactic must not
        # apply it again. Keys in order: the order of the actions follows them.
        inputs = [_h(str(k), self.value(v)) for k, v in tactic.key_items()]
        return _h("tactic", type(tactic).__qualname__, tactic.axis_label, *inputs)


def mesh_key(mesh: Mesh) -> str:
    return _h("mesh", *(f"{a}={n}" for a, n in mesh.items()))


def chain(previous: str, step: str) -> str:
    """The hash chain over (trace, mesh, tactic 1..i)."""
    return _h("chain", previous, step)


def _dtype(x: Any) -> str:
    dtype = getattr(x, "dtype", None)
    return str(np.dtype(dtype) if dtype is not None else np.asarray(x).dtype)


def _lookup(module: types.ModuleType, qualname: str) -> Any:
    obj: Any = module
    for part in qualname.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            return None
    return obj


def _is_library_object(fn: Any) -> bool:
    module = sys.modules.get(getattr(fn, "__module__", None) or "")
    file = getattr(module, "__file__", None)
    return bool(file) and is_library(file)


@functools.lru_cache(maxsize=4096)
def _code(code: types.CodeType) -> str:
    consts = [_code(c) if isinstance(c, types.CodeType) else repr(c) for c in code.co_consts]
    return _h("code", code.co_name, code.co_code.hex(), *consts, *code.co_names,
              *code.co_varnames, *code.co_freevars, code.co_linetable.hex(),
              str(code.co_firstlineno), code.co_filename)


def _global_names(code: types.CodeType) -> set[str]:
    names = set(code.co_names)
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            names |= _global_names(c)
    return names


def same_program(a: CoreProgram, b: CoreProgram) -> bool:
    """Whether `b` is `a` unchanged: what a tactic leaves when it changes nothing (what it
    names was sharded so already, by propagation from an earlier tactic). Ops are never
    mutated, so identical ops and nests mean an equal program; checked without a walk
    over the values, and in C: ops compare by identity (`CoreOp` has no `__eq__`)."""
    return a.mesh == b.mesh and a.ops == b.ops and a.nests == b.nests and \
        a.results == b.results and a.out_constraints == b.out_constraints


def program_key(program: CoreProgram) -> int:
    """A fingerprint of a Core program of a given trace, equal for programs with equal
    ops, loop nests and data flow however they were made (a state re-applied after its
    cache entry was evicted, an edit that undoes another), whatever the identities of
    their values and the uids of the ops tactics inserted. Values are numbered in order of
    definition; an op is named by its position (a traced op's in the trace, whose regions
    and location are the trace's; an inserted one's after the value it is on), its kind,
    parameters and types (`CoreOp.signature`)."""
    number = {v: i for i, v in enumerate(program.args)}
    nests = program.nests
    # Every value numbered first: a loop's carry edge reads the yield its body makes later.
    for op in program.ops:
        for r in op.results:
            number[r] = len(number)
    parts = [(op.order, op.name, op.signature, tuple([number[v] for v in op.operands]),
              nests.get(op.uid, ())) for op in program.ops]
    return hash((program.mesh, tuple(parts), tuple([number[v] for v in program.results]),
                 program.out_constraints))
