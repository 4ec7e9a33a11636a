"""The user's modules stay imported across schedule-file loads and are imported again
when they (or what they import) change; example arguments are computed abstractly."""

from __future__ import annotations

import os
import sys
import textwrap
from pathlib import Path

import jax
import numpy as np
import pytest

from partir.schedule_file import ScheduleExecutionError, load_schedule_file
from partir.user_modules import USER_MODULES, imported_names

# Each import of `umodel` appends a line to imports.log next to it, so tests can count
# imports; `make_args` records its calls the same way.
MODEL = """\
import os
import jax
import jax.numpy as jnp
import uconfig

_LOG = os.path.join(os.path.dirname(__file__), "imports.log")
with open(_LOG, "a") as f:
    f.write("umodel\\n")

def f(x, w):
    return jnp.tanh(x @ w)

def make_args():
    with open(_LOG, "a") as f:
        f.write("make_args\\n")
    key = jax.random.PRNGKey(0)
    x = jax.random.normal(key, (uconfig.BATCH, 8))
    w = jax.jit(lambda k: jax.random.normal(k, (8, 4)))(key)
    return x, w
"""

CONFIG = "BATCH = 16\n"
HELPERS = """\
import os
with open(os.path.join(os.path.dirname(__file__), "imports.log"), "a") as f:
    f.write("uhelpers\\n")
AXIS = "batch"
"""

SCHEDULE = """\
import partir
from umodel import f, make_args
from uhelpers import AXIS

program = partir.Program(f, *make_args())
mesh = {"batch": 4, "model": 2}
schedule = [partir.ManualPartition({"x": 0}, axis=AXIS, name="BP")]
"""


def workspace(tmp_path: Path, name: str = "ws") -> Path:
    d = tmp_path / name
    d.mkdir()
    (d / "umodel.py").write_text(MODEL)
    (d / "uconfig.py").write_text(CONFIG)
    (d / "uhelpers.py").write_text(HELPERS)
    (d / "s.partir.py").write_text(SCHEDULE)
    return d


def log(d: Path) -> list[str]:
    path = d / "imports.log"
    return path.read_text().split() if path.exists() else []


def load(d: Path, **kw):
    return load_schedule_file(d / "s.partir.py", **kw)


@pytest.mark.slow
def test_modules_stay_imported_and_reload_with_their_dependants(tmp_path):
    d = workspace(tmp_path)
    first = load(d)
    second = load(d)
    assert log(d) == ["umodel", "uhelpers", "make_args", "make_args"]
    assert first.program.fn is second.program.fn  # the same module object
    # uconfig changes: umodel imports it, so both are imported again; uhelpers stays.
    (d / "uconfig.py").write_text("BATCH = 32\n")
    third = load(d)
    assert log(d)[4:] == ["umodel", "make_args"]
    assert third.program.fn is not first.program.fn
    assert third.program.args[0].shape == (32, 8)
    assert sys.modules["uconfig"].BATCH == 32


def test_dependencies_are_the_imported_user_files(tmp_path):
    d = workspace(tmp_path)
    sf = load(d)
    assert sf.dependencies == sorted(str(d / n) for n in ("uconfig.py", "uhelpers.py",
                                                          "umodel.py"))


def test_partirs_own_packages_are_never_user_modules(tmp_path):
    # A partir checkout as the directory: folders named like partir's packages at its
    # root, and the running ones (e.g. the daemon's, imported before) stay as they are.
    import partir_daemon.protocol
    d = workspace(tmp_path)
    for package in ("partir", "partir_daemon", "partir_lsp"):
        (d / package).mkdir()
        (d / package / "__init__.py").write_text("")
    (d / "uconfig.py").write_text("import partir_daemon.protocol\nBATCH = 16\n")
    sf = load(d)
    (d / "uconfig.py").write_text("import partir_daemon.protocol\nBATCH = 32\n")
    assert load(d).program.args[0].shape == (32, 8)
    assert sys.modules["partir_daemon.protocol"] is partir_daemon.protocol
    assert not any("partir" in os.path.basename(os.path.dirname(f))
                   for f in USER_MODULES.digests())
    assert sf.dependencies == sorted(str(d / n) for n in ("uconfig.py", "uhelpers.py",
                                                          "umodel.py"))


def test_a_module_failing_to_import_is_a_dependency_and_its_fix_is_seen(tmp_path):
    d = workspace(tmp_path)
    (d / "umodel.py").write_text(MODEL + "\ndef broken(:\n")
    with pytest.raises(ScheduleExecutionError) as info:
        load(d)
    assert str(d / "umodel.py") in info.value.dependencies
    (d / "umodel.py").write_text(MODEL)
    assert load(d).program.fn.__name__ == "f"


@pytest.mark.slow
def test_an_edit_during_import_is_not_cached_under_the_new_hash(tmp_path):
    d = workspace(tmp_path)
    # The module edits its own file, once, while it is being imported (as an editor
    # saving at that moment would): the next load must import it again.
    (d / "uhelpers.py").write_text(HELPERS + textwrap.dedent("""\
        if not os.path.exists(__file__ + ".edited"):
            open(__file__ + ".edited", "w").close()
            with open(__file__, "a") as f:
                f.write("# edited during import\\n")
        """))
    load(d)
    load(d)
    assert log(d).count("uhelpers") == 2
    load(d)
    assert log(d).count("uhelpers") == 2  # unchanged since its second import


@pytest.mark.slow
def test_same_named_modules_of_two_directories_are_kept_apart(tmp_path):
    a, b = workspace(tmp_path, "a"), workspace(tmp_path, "b")
    (b / "uconfig.py").write_text("BATCH = 8\n")
    for _ in range(2):
        assert load(a).program.args[0].shape == (16, 8)
        assert load(b).program.args[0].shape == (8, 8)
    assert log(a).count("umodel") == 1 and log(b).count("umodel") == 1


def test_abstract_example_arguments_allocate_nothing(tmp_path):
    d = workspace(tmp_path)
    load(d, abstract_args=True)  # imports and traces once
    before = len(jax.live_arrays())
    sf = load(d, abstract_args=True)
    assert all(isinstance(a, jax.ShapeDtypeStruct) for a in sf.program.args)
    assert [a.shape for a in sf.program.args] == [(16, 8), (8, 4)]
    assert len(jax.live_arrays()) == before
    concrete = load(d)
    assert all(isinstance(a, jax.Array) for a in concrete.program.args)


def test_abstract_arguments_fall_back_to_concrete_values_when_the_code_needs_them(tmp_path):
    d = workspace(tmp_path)
    (d / "s.partir.py").write_text(SCHEDULE.replace(
        "*make_args()", "*[np.asarray(a) for a in make_args()]").replace(
        "import partir\n", "import numpy as np\nimport partir\n"))
    sf = load(d, abstract_args=True)
    assert all(isinstance(a, np.ndarray) for a in sf.program.args)


def test_abstract_arguments_report_the_users_error_at_its_line(tmp_path):
    d = workspace(tmp_path)
    (d / "s.partir.py").write_text(SCHEDULE.replace("*make_args()", "*make_args()[5:6], 1 / 0"))
    with pytest.raises(ScheduleExecutionError) as info:
        load(d, abstract_args=True)
    assert info.value.line == 5 and "ZeroDivisionError" in info.value.message


def test_imported_names_resolve_relative_imports():
    import ast

    tree = ast.parse("import a.b\nfrom . import c\nfrom ..d import e\nfrom f import *\n")
    assert imported_names(tree, "pkg.sub") == {"a.b", "pkg.sub", "pkg.sub.c", "pkg.d",
                                               "pkg.d.e", "f"}


def test_cache_counts_reloads(tmp_path):
    d = workspace(tmp_path)
    load(d)
    before = USER_MODULES.reloads
    os.utime(d / "uhelpers.py")  # touched, content unchanged: no reload
    load(d)
    assert USER_MODULES.reloads == before
