"""The daemon's analysis core in-process: what a partition result carries for editors
(values with their definitions, attributed collectives, dependencies), and that an
unchanged schedule file is not executed again."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from partir_daemon import engine as engine_module
from partir_daemon import protocol as P
from partir_daemon.engine import Engine

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "mlp"

ES = """\
from model import example_args, mlp_tagged_output

import partir

with open(__file__ + ".runs", "a") as f:
    f.write("run\\n")

program = partir.Program(mlp_tagged_output, *example_args())
mesh = {"batch": 4, "model": 2}
schedule = [
    partir.ManualPartition({"x": 0}, axis="batch", name="BP"),
    partir.ManualPartition({"w1": 1, "y": 1}, axis="model", name="ES"),
]
"""


def noop(*_: object) -> None:
    return None


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    shutil.copy(EXAMPLES / "model.py", tmp_path / "model.py")
    (tmp_path / "es.partir.py").write_text(ES)
    return tmp_path


def partition(engine: Engine, path: Path, text: str | None = None,
              metadata: bool = True) -> P.PartitionResult:
    return engine.partition(P.PartitionParams(str(path), text, metadata=metadata), noop)


def runs(path: Path) -> int:
    return len(Path(str(path) + ".runs").read_text().split())


def test_result_carries_values_definitions_collectives_and_dependencies(ws):
    engine = Engine(str(ws))
    result = partition(engine, ws / "es.partir.py")
    assert result.ok, result.diagnostics
    assert result.dependencies == [str(ws / "model.py")]
    values = {(v.kind, v.name): v for v in result.values}
    x = values[("input", "x")]
    assert x.shape == [256, 8] and x.dtype == "float32"
    assert [s.sharding for s in x.history] == [[["batch"], []], [["batch"], []]]
    assert [s.local_shape for s in x.history] == [[64, 8], [64, 8]]
    model = (ws / "model.py").read_text().splitlines()
    # x is a parameter of mlp_tagged_output; y is tagged in its body.
    assert model[x.definitions[0].line - 1].lstrip().startswith("def mlp_tagged_output(")
    y = values[("tag", "y")]
    assert [s.sharding for s in y.history][-1] == [["batch"], ["model"]]
    assert 'partir.tag(' in model[y.definitions[0].line - 1]
    assert result.collectives, "the ES schedule moves data"
    assert {c.tactic for c in result.collectives} <= {1, 2}
    assert all(c.loc.file == str(ws / "model.py") for c in result.collectives)


def test_partial_results_have_values_but_no_collectives(ws):
    engine = Engine(str(ws))
    result = partition(engine, ws / "es.partir.py", metadata=False)
    assert result.values and not result.collectives


@pytest.mark.parametrize("after_s, lowered", [(3600.0, [0, 1]), (0.0, [0, 1, 2])])
def test_a_lowering_sends_the_tactics_lowered_so_far(ws, monkeypatch, after_s, lowered):
    """The partial results of one request: the tactics applied (without the values'
    shardings, which come with the next: the first answer is for the diagnostics), then
    with the first (edited) tactic lowered at once, then as the lowering goes on, every
    `after_s` (then doubling), never with every tactic lowered (the result is the
    complete one)."""
    monkeypatch.setattr(engine_module, "PARTIAL_AFTER_S", after_s)
    text = ES.replace('name="ES"),', 'name="ES"),\n    partir.ManualPartition({"w2": 1}, '
                      'axis="batch", name="Z"),')
    partials: list[P.PartitionResult] = []
    result = Engine(str(ws)).partition(
        P.PartitionParams(str(ws / "es.partir.py"), text, partial=True), noop, None,
        partials.append)
    assert result.ok and len(result.tactics) == 3
    assert [sum(P.is_lowered(t.metadata) for t in p.tactics) for p in partials] == lowered
    assert all(P.is_lowered(t.metadata) for t in result.tactics)
    assert [p.values == result.values for p in partials] == [False] + [True] * (
        len(partials) - 1) and result.values


def test_an_unchanged_text_is_not_executed_again(ws):
    engine = Engine(str(ws))
    path = ws / "es.partir.py"
    partition(engine, path)
    partition(engine, path, ES)  # the same text, from the editor
    engine.explain(P.ExplainParams(str(path), ES, name="x"), noop)
    assert runs(path) == 1
    partition(engine, path, ES + "\n# edited\n")
    assert runs(path) == 2
    (ws / "model.py").write_text((ws / "model.py").read_text() + "\n# edited\n")
    partition(engine, path, ES + "\n# edited\n")
    assert runs(path) == 3


def test_invalidate_reports_only_files_whose_content_changed(ws):
    engine = Engine(str(ws))
    partition(engine, ws / "es.partir.py")
    model = ws / "model.py"
    unrelated = ws / "notes.py"
    unrelated.write_text("x = 1\n")
    assert engine.invalidate(P.InvalidateParams([str(model), str(unrelated)])).paths == []
    model.write_text(model.read_text() + "\n# edited\n")
    assert engine.invalidate(P.InvalidateParams([str(model), str(unrelated)])).paths == [str(model)]


def test_a_failed_load_still_reports_the_module_that_failed(ws):
    engine = Engine(str(ws))
    model = ws / "model.py"
    model.write_text(model.read_text() + "\ndef broken(:\n")
    result = partition(engine, ws / "es.partir.py")
    assert not result.ok and result.diagnostics[0].kind == "execution"
    assert result.dependencies == [str(model)]
    # the watcher's report of the fix is a change the editor must act on
    model.write_text(model.read_text().replace("\ndef broken(:\n", ""))
    assert engine.invalidate(P.InvalidateParams([str(model)])).paths == [str(model)]
    assert partition(engine, ws / "es.partir.py").ok
