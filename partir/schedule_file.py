"""Schedule files: Python modules (`*.partir.py`) that define what to partition and how.

A schedule file defines three names (DESIGN §6):

    program = partir.Program(fn, *example_args)
    mesh = {"batch": 4, "model": 2}            # or a partir.Mesh / jax.sharding.Mesh
    schedule = [partir.ManualPartition({"x": 0}, axis="batch", name="BP"), ...]

`load_schedule_file` executes it, possibly from unsaved editor text, and returns these
values with the source ranges tools need for diagnostics, hovers and code lenses: each
element of the `schedule` list literal, each key of a tactic's inputs dict, and the
three assignments. Every problem with the file is a `ScheduleFileError` at a line of it.
"""

from __future__ import annotations

import ast
import difflib
import importlib
import importlib.util
import os
import sys
import types
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from partir.errors import PartitionError
from partir.ir.location import Location
from partir.mesh import Mesh
from partir.program import Program
from partir.tactics.base import Tactic
from partir.tactics.driver import as_schedule
from partir.user_modules import USER_MODULES, imported_names, is_library

# The name the file runs under while it executes: not "__main__", so that an
# `if __name__ == "__main__":` block (e.g. a training loop) does not run.
MODULE_NAME = "__partir_schedule__"

_EXPECTED = {
    "program": "the function to partition with example arguments: "
               "`program = partir.Program(fn, *example_args)`",
    "mesh": "the device mesh: `mesh = {\"batch\": 4, \"model\": 2}` "
            "(a dict of axis sizes, a partir.Mesh or a jax.sharding.Mesh)",
    "schedule": "the tactics to apply in order: "
                "`schedule = [partir.ManualPartition({\"x\": 0}, axis=\"batch\"), ...]`",
}


@dataclass(frozen=True)
class SourceRange:
    """A span of the schedule file: 1-based lines, 0-based columns counted in characters,
    the end exclusive (like Python's `ast`, but in characters rather than UTF-8 bytes)."""

    line: int
    col: int
    end_line: int
    end_col: int

    def to_json(self) -> dict[str, int]:
        return {"line": self.line, "col": self.col, "end_line": self.end_line,
                "end_col": self.end_col}


@dataclass(frozen=True)
class TacticSource:
    """Where a tactic of the schedule is written. `span` is its element of the `schedule`
    list literal (None when `schedule` is not bound to a list literal of one element per
    tactic); `inputs` holds each string key of its inputs dict, when the tactic is a call
    with a dict literal there, written in the list or in a module-level assignment to the
    name the list refers to."""

    span: SourceRange | None
    inputs: dict[str, SourceRange] = field(default_factory=dict)


@dataclass
class ScheduleFile:
    path: str
    program: Program
    mesh: Mesh
    schedule: list[Tactic]
    # The last module-level statements binding each name (None if none binds it visibly).
    program_span: SourceRange | None
    mesh_span: SourceRange | None
    schedule_span: SourceRange | None
    # One per tactic of `schedule`.
    tactics: list[TacticSource]
    # The user's module files the file imported, directly or through each other.
    dependencies: list[str] = field(default_factory=list)


class ScheduleFileError(PartitionError):
    """A problem with a schedule file, at `span` of `file` (None: the file as a whole)."""

    def __init__(self, message: str, file: str, span: SourceRange | None = None) -> None:
        self.file = file
        self.span = span
        # The user's module files the schedule file imported before the problem (with the
        # one that failed to import, if any): fixing one of them may fix the file.
        self.dependencies: list[str] = []
        super().__init__(message, loc=Location(file, span.line if span else 0))

    @property
    def line(self) -> int:
        """1-based line of the problem, 0 when it concerns the whole file."""
        return self.span.line if self.span else 0

    def _format(self) -> str:
        where = f"{self.file}:{self.span.line}:{self.span.col + 1}" if self.span else self.file
        return f"{where}: {self.message}"


class ScheduleSyntaxError(ScheduleFileError):
    """The file is not valid Python."""


class ScheduleExecutionError(ScheduleFileError):
    """Executing the file raised. `span` is the line of the schedule file that was running;
    `inner` is where the exception was raised when that is in another file (e.g. the
    user's model module)."""

    def __init__(self, message: str, file: str, span: SourceRange | None, *,
                 exc_type: str, inner: Location | None) -> None:
        self.exc_type = exc_type
        self.inner = inner
        super().__init__(message, file, span)


class ScheduleMissingError(ScheduleFileError):
    """The file does not define some of `program`, `mesh` and `schedule`."""

    def __init__(self, message: str, file: str, span: SourceRange | None, *,
                 missing: list[str]) -> None:
        self.missing = missing
        super().__init__(message, file, span)


class ScheduleTypeError(ScheduleFileError):
    """`program`, `mesh` or `schedule` holds the wrong kind of value."""


def _user_path_index() -> int:
    """Where a directory of user modules goes on `sys.path`: after the standard
    library's entries (its directory, `lib-dynload`, its zip), before installed packages."""
    stdlib = os.path.dirname(os.path.realpath(os.__file__))
    index = 0
    for i, entry in enumerate(sys.path):
        real = os.path.realpath(entry or ".")
        inside = real == stdlib or (real.startswith(stdlib + os.sep) and
                                    not {"site-packages", "dist-packages"} &
                                    set(real.split(os.sep)))
        if inside or (real.endswith(".zip") and
                      os.path.dirname(real) == os.path.dirname(stdlib)):
            index = i + 1
    return index


def load_schedule_file(path: str | os.PathLike[str], text: str | None = None, *,
                       abstract_args: bool = False) -> ScheduleFile:
    """Execute the schedule file at `path` (or `text`, its unsaved contents) and return
    its program, mesh and schedule with their source ranges.

    The file's directory is on `sys.path` while it executes, right after the standard
    library (ahead of installed packages), so it can import the user's modules next to it
    but a `random.py` or `queue.py` there does not replace the standard module. Those
    modules stay imported for the next load of a file of that directory, and are
    imported again once their file, or one they import, changes (`partir.user_modules`).
    Afterwards `sys.path` is as before, and `sys.modules` holds
    the directory's user modules. Loading changes these process-wide tables while the
    file runs, so only one thread at a time may load schedule files.

    With `abstract_args`, the `program = partir.Program(fn, *args)` statement computes
    its example arguments abstractly when it can (under a JAX trace: shapes and dtypes,
    nothing allocated or compiled), for tools that only partition; it runs them
    concretely when they need concrete values (e.g. `int(x)`).
    """
    filename = os.fspath(path)
    if text is None:
        try:
            with open(filename, "rb") as f:
                text = importlib.util.decode_source(f.read())
        except (OSError, SyntaxError, UnicodeDecodeError) as e:
            raise ScheduleFileError(f"cannot read the schedule file: {e}", filename) from None
    source = _Source(filename, text)
    tree = source.parse()
    directory = os.path.dirname(os.path.abspath(filename))
    imports = imported_names(tree, "")
    try:
        namespace = _execute(source, tree, abstract_args)
        schedule_file = _read_definitions(source, tree, namespace)
    except ScheduleFileError as e:
        e.dependencies = USER_MODULES.dependencies(directory, imports)
        raise
    schedule_file.dependencies = USER_MODULES.dependencies(directory, imports)
    return schedule_file


class _Source:
    """The file's text, and conversions from `ast` positions to `SourceRange`s."""

    def __init__(self, filename: str, text: str) -> None:
        self.filename = filename
        self.text = text
        self.lines = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")

    def parse(self) -> ast.Module:
        try:
            return ast.parse(self.text, self.filename)
        except SyntaxError as e:
            raise self.syntax_error(e) from None
        except ValueError as e:  # e.g. null bytes, which have no position
            raise ScheduleSyntaxError(str(e), self.filename) from None

    def syntax_error(self, e: SyntaxError) -> ScheduleSyntaxError:
        # SyntaxError columns are 1-based and already in characters.
        line = e.lineno or 1
        col = max((e.offset or 1) - 1, 0)
        end_line = e.end_lineno or line
        end_col = max((e.end_offset or 0) - 1, col) if e.end_lineno else col
        return ScheduleSyntaxError(f"SyntaxError: {e.msg}", self.filename,
                                   SourceRange(line, col, end_line, end_col))

    def span(self, node: ast.AST) -> SourceRange:
        return SourceRange(node.lineno, self._chars(node.lineno, node.col_offset),
                           node.end_lineno, self._chars(node.end_lineno, node.end_col_offset))

    def position(self, code: types.CodeType, line: int, lasti: int) -> SourceRange:
        """The expression a frame of this file was running (a statement's line when Python
        recorded no columns for it)."""
        positions = list(code.co_positions())
        index = lasti // 2  # one position per 2-byte code unit
        if 0 <= index < len(positions) and None not in positions[index]:
            start, end, col, end_col = positions[index]
            return SourceRange(start, self._chars(start, col), end, self._chars(end, end_col))
        return self.line_span(line)

    def line_span(self, line: int) -> SourceRange:
        text = self.lines[line - 1] if 0 < line <= len(self.lines) else ""
        indent = len(text) - len(text.lstrip())
        return SourceRange(line, indent, line, len(text.rstrip()))

    def _chars(self, line: int, byte_col: int) -> int:
        # `ast` columns count UTF-8 bytes; editors count characters.
        if not 0 < line <= len(self.lines):
            return byte_col
        return len(self.lines[line - 1].encode()[:byte_col].decode(errors="ignore"))


def _execute(source: _Source, tree: ast.Module, abstract_args: bool) -> dict[str, Any]:
    try:
        code = compile(_with_abstract_program(source) if abstract_args else tree,
                       source.filename, "exec", dont_inherit=True)
    except SyntaxError as e:  # errors only the compiler finds, e.g. `return` at top level
        raise source.syntax_error(e) from None
    module = types.ModuleType(MODULE_NAME)
    module.__file__ = os.path.abspath(source.filename)
    module.__dict__[_ABSTRACTLY] = _abstractly
    directory = os.path.dirname(module.__file__)
    saved_path = list(sys.path)
    saved_module = sys.modules.get(MODULE_NAME)
    importlib.invalidate_caches()  # the user may just have created a module there
    sys.path.insert(_user_path_index(), directory)
    # Registered while it runs: dataclasses, typing and pickle look classes up by module.
    sys.modules[MODULE_NAME] = module
    try:
        with USER_MODULES.loading(directory):
            exec(code, module.__dict__)
    except (Exception, SystemExit) as e:
        raise _execution_error(source, e) from None
    finally:
        sys.path[:] = saved_path
        if saved_module is None:
            sys.modules.pop(MODULE_NAME, None)
        else:
            sys.modules[MODULE_NAME] = saved_module
    return module.__dict__


# The name under which the file calls `_abstractly`.
_ABSTRACTLY = "__partir_abstractly__"


def _with_abstract_program(source: _Source) -> ast.Module:
    """The file's tree with each module-level `program = <...>.Program(...)` computing its
    value through `_abstractly(lambda: <...>.Program(...))`. The call keeps its
    positions, so tracebacks point at the user's text. Parsed again, which leaves the
    tree the definitions are read from as written, in a third of a deep copy's time."""
    tree = source.parse()
    for stmt in _module_statements(tree.body):
        if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and \
                isinstance(stmt.targets[0], ast.Name) and stmt.targets[0].id == "program" \
                and isinstance(stmt.value, ast.Call) and _called_name(stmt.value) == "Program":
            call = stmt.value
            thunk = ast.Lambda(ast.arguments([], [], None, [], [], None, []), call)
            stmt.value = ast.Call(ast.Name(_ABSTRACTLY, ast.Load()), [thunk], [])
            for node in (thunk, thunk.args, stmt.value, stmt.value.func):
                ast.copy_location(node, call)
    return ast.fix_missing_locations(tree)


def _called_name(call: ast.Call) -> str | None:
    func = call.func
    return func.id if isinstance(func, ast.Name) else \
        func.attr if isinstance(func, ast.Attribute) else None


def _abstractly(make: Callable[[], Any]) -> Any:
    """`make()`, a `Program`, with its example arguments computed under a JAX trace so that
    they are shapes and dtypes only: nothing is allocated on devices, and what the user's
    code jits is traced, not compiled. Code that needs concrete values fails under the
    trace (e.g. `int(x)`, `np.asarray(x)`); then, as for any other failure there, `make`
    runs again concretely, and its own error, if any, is the one reported."""
    import jax

    made: list[Program] = []

    def run() -> tuple[()]:
        program = make()
        if isinstance(program, Program):
            made.append(program.abstract())
        return ()

    try:
        jax.make_jaxpr(run)()
    except Exception:
        made.clear()
    return made[0] if made else make()


def _execution_error(source: _Source, e: BaseException) -> ScheduleExecutionError:
    frames = []  # (code, line, instruction offset), outermost first
    tb = e.__traceback__
    while tb is not None:
        frames.append((tb.tb_frame.f_code, tb.tb_lineno, tb.tb_lasti))
        tb = tb.tb_next
    here = [i for i, (code, _, _) in enumerate(frames) if code.co_filename == source.filename]
    span = source.position(*frames[here[-1]]) if here else None
    # The deepest frame of the user's own code below the schedule file, if any: where the
    # exception came from in their model (frames in libraries would not help them).
    below = frames[here[-1] + 1:] if here else frames
    user = [Location(code.co_filename, line, code.co_name) for code, line, _ in below
            if not code.co_filename.startswith("<") and not is_library(code.co_filename)]
    inner = user[-1] if user else None
    if isinstance(e, SyntaxError) and e.filename and e.filename != source.filename:
        inner = Location(e.filename, e.lineno or 0)  # a user module that does not parse
    message = "executing the schedule file raised " + _describe(
        e, source.filename, span.line if span else 0)
    if inner is not None:
        function = inner.function if inner.function not in ("", "<module>") else ""
        message += f" (raised at {inner}" + (f", in {function})" if function else ")")
    return ScheduleExecutionError(message, source.filename, span, exc_type=type(e).__name__,
                                  inner=inner)


def _describe(e: BaseException, filename: str, line: int) -> str:
    if isinstance(e, PartitionError) and e.loc is not None and (e.loc.file, e.loc.line) == (
            filename, line):
        # A tactic rejected where it is written: its location is the line reported.
        text = f"tactic {e.tactic}: {e.message}" if e.tactic else e.message
    else:
        text = str(e)
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


def _read_definitions(source: _Source, tree: ast.Module,
                      namespace: dict[str, Any]) -> ScheduleFile:
    bindings = _module_bindings(tree)
    missing = [name for name in _EXPECTED if name not in namespace]
    if missing:
        raise _missing_error(source, missing, namespace)

    def span_of(name: str) -> SourceRange | None:
        node = bindings.get(name)
        return source.span(node) if node is not None else None

    program, mesh, schedule = (namespace[n] for n in _EXPECTED)
    if not isinstance(program, Program):
        hint = (" (wrap the function: `program = partir.Program(fn, *example_args)`)"
                if callable(program) else "")
        raise ScheduleTypeError(f"`program` must be a partir.Program, got "
                                f"{type(program).__name__}{hint}", source.filename,
                                span_of("program"))
    if not isinstance(mesh, Mesh):
        try:
            mesh = Mesh(mesh)
        except PartitionError as e:
            raise ScheduleTypeError(f"`mesh` is not a valid mesh: {e.message}",
                                    source.filename, span_of("mesh")) from None
    single = isinstance(schedule, Tactic)  # one tactic, as `partir.jit` takes it
    if not (single or isinstance(schedule, list | tuple)):
        raise ScheduleTypeError(f"`schedule` must be a list of tactics such as "
                                f"partir.ManualPartition, or one tactic, got "
                                f"{type(schedule).__name__}", source.filename,
                                span_of("schedule"))
    schedule = as_schedule(schedule)
    tactics = _tactic_sources(source, bindings, len(schedule), single)
    for i, tactic in enumerate(schedule):
        if not isinstance(tactic, Tactic):
            raise ScheduleTypeError(f"`schedule[{i}]` must be a tactic such as "
                                    f"partir.ManualPartition, got {type(tactic).__name__} "
                                    f"(tactics: partir.ManualPartition, "
                                    f"partir.AutomaticPartition, partir.PipelinePartition)",
                                    source.filename, tactics[i].span or span_of("schedule"))
    return ScheduleFile(source.filename, program, mesh, list(schedule), span_of("program"),
                        span_of("mesh"), span_of("schedule"), tactics)


def _missing_error(source: _Source, missing: list[str],
                   namespace: dict[str, Any]) -> ScheduleMissingError:
    defined = [n for n in namespace if not n.startswith("__")]
    parts = []
    for name in missing:
        close = difflib.get_close_matches(name, defined, n=1, cutoff=0.7)
        hint = f" (is `{close[0]}` a misspelling?)" if close else ""
        parts.append(f"`{name}`{hint}: {_EXPECTED[name]}")
    names = " and ".join(f"`{n}`" for n in missing)
    # Reported on the first line: the problem is the file as a whole, but editors need a
    # line to show it on.
    return ScheduleMissingError(f"the schedule file does not define {names}; it must define "
                                + "; ".join(parts), source.filename, source.line_span(1),
                                missing=missing)


def _module_bindings(tree: ast.Module) -> dict[str, ast.stmt]:
    """The last statement run at module level (also inside if/for/while/with/try) that
    binds each name."""
    bindings: dict[str, ast.stmt] = {}
    for stmt in _module_statements(tree.body):
        for name in _bound_names(stmt):
            bindings[name] = stmt
    return bindings


def _module_statements(body: list[ast.stmt]) -> Iterator[ast.stmt]:
    for stmt in body:
        yield stmt
        if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            continue
        for attr in ("body", "orelse", "finalbody"):
            yield from _module_statements(getattr(stmt, attr, []))
        for handler in getattr(stmt, "handlers", []):
            yield from _module_statements(handler.body)
        for case in getattr(stmt, "cases", []):
            yield from _module_statements(case.body)


def _bound_names(stmt: ast.stmt) -> list[str]:
    if isinstance(stmt, ast.Assign):
        return [n for t in stmt.targets for n in _target_names(t)]
    if (isinstance(stmt, ast.AnnAssign) and stmt.value is not None) or isinstance(
            stmt, ast.AugAssign | ast.For | ast.AsyncFor):
        return _target_names(stmt.target)
    if isinstance(stmt, ast.With | ast.AsyncWith):
        return [n for item in stmt.items if item.optional_vars is not None
                for n in _target_names(item.optional_vars)]
    if isinstance(stmt, ast.Import | ast.ImportFrom):
        return [(a.asname or a.name).partition(".")[0] for a in stmt.names]
    if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
        return [stmt.name]
    return []


def _target_names(target: ast.expr) -> list[str]:
    if isinstance(target, ast.Name):
        return [target.id]
    if isinstance(target, ast.Tuple | ast.List):
        return [n for elt in target.elts for n in _target_names(elt)]
    if isinstance(target, ast.Starred):
        return _target_names(target.value)
    return []


def _tactic_sources(source: _Source, bindings: dict[str, ast.stmt],
                    count: int, single: bool = False) -> list[TacticSource]:
    """Where each tactic is written: the elements of the list `schedule` is assigned, or
    (`single`) the value it is assigned."""
    stmt = bindings.get("schedule")
    value = getattr(stmt, "value", None) if isinstance(stmt, ast.Assign | ast.AnnAssign) \
        else None
    if single and value is not None:
        return [TacticSource(source.span(value), _input_keys(source, bindings, value))]
    if not (isinstance(value, ast.List | ast.Tuple) and len(value.elts) == count
            and not any(isinstance(e, ast.Starred) for e in value.elts)):
        return [TacticSource(None) for _ in range(count)]
    return [TacticSource(source.span(elt), _input_keys(source, bindings, elt))
            for elt in value.elts]


def _input_keys(source: _Source, bindings: dict[str, ast.stmt],
                elt: ast.expr) -> dict[str, SourceRange]:
    if isinstance(elt, ast.Name):  # `schedule = [BP, ...]` with `BP = ManualPartition(...)`
        stmt = bindings.get(elt.id)
        elt = stmt.value if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and \
            isinstance(stmt.targets[0], ast.Name) else None
    if not isinstance(elt, ast.Call):
        return {}
    inputs = elt.args[0] if elt.args else next(
        (k.value for k in elt.keywords if k.arg == "inputs"), None)
    if not isinstance(inputs, ast.Dict):
        return {}
    return {key.value: source.span(key) for key in inputs.keys
            if isinstance(key, ast.Constant) and isinstance(key.value, str)}
