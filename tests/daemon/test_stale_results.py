"""Stale results (issue 15.3): a model or schedule file edited while it runs is analysed
again, and what was made from the old content is never cached under the new one. The
edit is injected deterministically: the file rewrites itself while it executes, from a
file the test wrote next to it."""

from __future__ import annotations

from pathlib import Path

import pytest

from partir_daemon import engine as engine_module
from partir_daemon import protocol as P
from partir_daemon.engine import Engine

MODEL = '''\
import pathlib

import jax.numpy as jnp

ROWS = {rows}


def f(x):
    return jnp.tanh(x) * 2


def example_args():
    return (jnp.zeros((ROWS, 16), jnp.float32),)


with open(__file__ + ".runs", "a") as _f:
    _f.write("run\\n")
# The edit lands while the module runs: after Python read it, before the daemon is done.
_edit = pathlib.Path(__file__).with_name("model.next")
if _edit.exists():
    pathlib.Path(__file__).write_text(_edit.read_text())
    {consume}
'''

SCHEDULE = '''\
import pathlib

from model import example_args, f

import partir

program = partir.Program(f, *example_args())
mesh = {{"batch": {batch}}}
schedule = [partir.ManualPartition({{"x": 0}}, axis="batch", name="BP")]
_edit = pathlib.Path(__file__).with_name("schedule.next")
if _edit.exists():
    pathlib.Path(__file__).write_text(_edit.read_text())
    _edit.unlink()
'''


def model(rows: int, consume: bool = True) -> str:
    return MODEL.format(rows=rows, consume="_edit.unlink()" if consume else "pass")


def noop(*_: object) -> None:
    return None


def partition(engine: Engine, path: Path) -> P.PartitionResult:
    return engine.partition(P.PartitionParams(str(path), metadata=False), noop)


def x_shape(result: P.PartitionResult) -> list[int]:
    assert result.ok, result.diagnostics
    (x,) = [v for v in result.values if (v.kind, v.name) == ("input", "x")]
    return x.shape


def runs(path: Path) -> int:
    return len(Path(str(path) + ".runs").read_text().split())


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    # A directory of its own: the user's modules are cached per directory of schedules.
    (tmp_path / "model.py").write_text(model(8))
    (tmp_path / "s.partir.py").write_text(SCHEDULE.format(batch=4))
    return tmp_path


def test_a_model_edited_during_its_import_is_analysed_again(ws):
    engine = Engine(str(ws))
    assert x_shape(partition(engine, ws / "s.partir.py")) == [8, 16]
    # The next import of model.py (8 rows) rewrites it to 32 rows while it runs.
    (ws / "model.next").write_text(model(32))
    (ws / "model.py").write_text(model(8) + "\n# touched: imported again\n")
    assert x_shape(partition(engine, ws / "s.partir.py")) == [32, 16]
    assert engine.stale_reruns == 1
    assert runs(ws / "model.py") == 3  # first load, the edited import, the re-run
    # Nothing of the 8-row program was cached under the 32-row file's hash.
    assert x_shape(partition(engine, ws / "s.partir.py")) == [32, 16]
    fresh = Engine(str(ws))  # agrees with an engine that never saw the edit
    assert x_shape(partition(fresh, ws / "s.partir.py")) == [32, 16]


def test_an_edit_on_the_first_import_is_not_served_from_the_cache_later(ws):
    (ws / "model.next").write_text(model(32))
    engine = Engine(str(ws))
    assert x_shape(partition(engine, ws / "s.partir.py")) == [32, 16]
    assert x_shape(partition(engine, ws / "s.partir.py")) == [32, 16]
    assert all(set(t.files.values()) <= {engine_module.content_hash(f) for f in t.files}
               for _, t in engine.traces.items())


def test_a_schedule_file_edited_while_it_runs_is_analysed_again(ws):
    (ws / "schedule.next").write_text(SCHEDULE.format(batch=2))
    engine = Engine(str(ws))
    result = partition(engine, ws / "s.partir.py")
    assert result.ok and result.mesh == {"batch": 2}
    assert engine.stale_reruns == 1


def test_a_file_that_keeps_changing_is_analysed_a_bounded_number_of_times(ws):
    # Every import of the model appends to it: each analysis sees a change.
    (ws / "model.py").write_text(model(8).replace(
        "if _edit.exists():",
        "pathlib.Path(__file__).write_text(pathlib.Path(__file__).read_text() + '#\\n')\n"
        "if _edit.exists():"))
    engine = Engine(str(ws))
    result = partition(engine, ws / "s.partir.py")
    assert x_shape(result) == [8, 16]  # an answer all the same
    assert engine.stale_reruns == engine_module.MAX_STALE_RERUNS + 1
    assert runs(ws / "model.py") == engine_module.MAX_STALE_RERUNS + 1
    # None of them was kept under a content it was not made from.
    assert not list(engine.traces.items())
