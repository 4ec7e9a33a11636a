"""Diagnostics of schedule files, end to end through the real server and daemon: each
kind of error at its range, conflicts and blocked propagation as warnings on the tactic
with the model line as related information, and a conflict that comes and goes with
edits."""

from __future__ import annotations

import pytest
from lsprotocol import types as T

from tests.lsp.support import MLP_BP_MP_Z3, Session

pytestmark = pytest.mark.asyncio(loop_scope="session")

LINES = MLP_BP_MP_Z3.splitlines()
MESH_LINE = LINES.index('mesh = {"batch": 4, "model": 2}')
BP_LINE = next(i for i, line in enumerate(LINES) if 'name="BP"' in line)
MP_LINE = BP_LINE + 1
Z3_LINE = BP_LINE + 2
Z3_TEXT = LINES[Z3_LINE] + "\n"
BP_MP = MLP_BP_MP_Z3.replace(Z3_TEXT, "")


def errors(diags: list[T.Diagnostic]) -> list[T.Diagnostic]:
    return [d for d in diags if d.severity == T.DiagnosticSeverity.Error]


def warnings(diags: list[T.Diagnostic]) -> list[T.Diagnostic]:
    return [d for d in diags if d.severity == T.DiagnosticSeverity.Warning]


def span_text(text: str, r: T.Range) -> str:
    assert r.start.line == r.end.line
    return text.splitlines()[r.start.line][r.start.character:r.end.character]


async def test_valid_file_has_no_errors(session: Session) -> None:
    uri = session.open("mlp/bp_mp_z3.partir.py")
    diags = await session.diagnostics_for(uri)
    assert errors(diags) == []
    session.close(uri)


async def test_python_syntax_error_at_its_line(session: Session) -> None:
    uri = session.open("mlp/bp_mp_z3.partir.py")
    broken = MLP_BP_MP_Z3.replace('"model": 2}', '"model" 2}')
    session.change(uri, broken)
    (error,) = errors(await session.diagnostics_for(uri))
    assert error.range.start.line == MESH_LINE
    assert error.source == "partir" and error.code == "syntax"
    session.close(uri)


async def test_python_exception_at_its_line(session: Session) -> None:
    uri = session.open("mlp/bp_mp_z3.partir.py")
    text = MLP_BP_MP_Z3.replace('mesh = {"batch": 4, "model": 2}',
                                'mesh = {"batch": 4, "model": 2}\nscale = 1 / 0')
    session.change(uri, text)
    (error,) = errors(await session.diagnostics_for(uri))
    assert error.range.start.line == MESH_LINE + 1
    assert "ZeroDivisionError" in (error.message + str(error.code))
    session.close(uri)


async def test_unknown_input_on_its_key_with_a_suggestion(session: Session) -> None:
    uri = session.open("mlp/bp_mp_z3.partir.py")
    text = MLP_BP_MP_Z3.replace('{"w1": 1}', '{"w11": 1}')
    session.change(uri, text)
    (error,) = errors(await session.diagnostics_for(uri))
    assert error.range.start.line == MP_LINE
    assert span_text(text, error.range) == '"w11"'
    assert "did you mean 'w1'" in error.message
    assert error.code == "UnknownInputError"
    session.close(uri)


async def test_non_divisible_dimension_on_its_key(session: Session) -> None:
    uri = session.open("mlp/bp_mp_z3.partir.py")
    # x is 256 x 8: 3 does not divide 256, an error with pad=False.
    text = MLP_BP_MP_Z3.replace('{"batch": 4, "model": 2}', '{"batch": 3, "model": 2}')
    text = text.replace('name="BP")', 'name="BP", pad=False)')
    session.change(uri, text)
    (error,) = errors(await session.diagnostics_for(uri))
    assert error.code == "IndivisibleDimensionError"
    assert error.range.start.line == BP_LINE
    assert span_text(text, error.range) == '"x"'
    assert "3 does not divide 256" in error.message
    session.close(uri)


async def test_padding_is_an_information_on_the_tactic(session: Session) -> None:
    uri = session.open("mlp/bp_mp_z3.partir.py")
    # x is 256 x 8: 3 does not divide 256, so BP pads it to 258.
    text = MLP_BP_MP_Z3.replace('{"batch": 4, "model": 2}', '{"batch": 3, "model": 2}')
    session.change(uri, text)
    diags = await session.diagnostics_for(uri)
    assert errors(diags) == []
    infos = [d for d in diags if d.severity == T.DiagnosticSeverity.Information
             and d.code == "padding"]
    assert infos and infos[0].range.start.line == BP_LINE
    assert "`x` dim 0: 256 → 258 on 'batch'" in infos[0].message
    session.close(uri)


async def test_axis_not_in_mesh_on_the_axis(session: Session) -> None:
    uri = session.open("mlp/bp_mp_z3.partir.py")
    text = MLP_BP_MP_Z3.replace('axis="model", name="MP"', 'axis="modle", name="MP"')
    session.change(uri, text)
    (error,) = errors(await session.diagnostics_for(uri))
    assert error.code == "AxisNotInMeshError"
    assert error.range.start.line == MP_LINE
    assert span_text(text, error.range) == '"modle"'
    assert "'modle' is not in the mesh" in error.message
    session.close(uri)


async def test_conflict_appears_and_clears_with_edits(session: Session) -> None:
    uri = session.open("mlp/bp_mp_z3.partir.py", BP_MP)
    diags = await session.diagnostics_for(uri)
    assert errors(diags) == [] and warnings(diags) == []

    session.change(uri, MLP_BP_MP_Z3)  # adds Z3: its weights are used in a batch loop
    diags = await session.diagnostics_for(uri)
    assert errors(diags) == []
    (warning,) = warnings(diags)
    assert warning.range.start.line == Z3_LINE
    assert warning.code == "conflict/axis_in_scope"
    assert "tactic 3 (Z3)" in warning.message and "dot_general" in warning.message
    assert "already inside a loop over this axis" in warning.message
    related, *occurrences = warning.related_information
    assert occurrences and all(o.location == related.location for o in occurrences)
    model = session.workspace.path("mlp/model.py")
    assert related.location.uri == model.as_uri()
    model_line = related.location.range.start.line
    assert "@" in model.read_text().splitlines()[model_line]  # the matmul's line

    session.change(uri, BP_MP)
    diags = await session.diagnostics_for(uri)
    assert errors(diags) == [] and warnings(diags) == []
    session.close(uri)


async def test_blocked_propagation_warns_at_the_primitive(session: Session) -> None:
    uri = session.open("mlp/blocked.partir.py")
    diags = await session.diagnostics_for(uri)
    assert errors(diags) == []
    (warning,) = warnings(diags)
    assert warning.code == "unsupported"
    assert "`pure_callback`" in warning.message and "blocked" in warning.message
    (related,) = warning.related_information
    model = session.workspace.path("mlp/blocked.py")
    assert related.location.uri == model.as_uri()
    line = model.read_text().splitlines()[related.location.range.start.line]
    assert "pure_callback" in line
    session.close(uri)


async def test_closing_clears_diagnostics(session: Session) -> None:
    uri = session.open("mlp/bp_mp_z3.partir.py", MLP_BP_MP_Z3.replace('"w1": 1', '"w9": 1'))
    assert errors(await session.diagnostics_for(uri))
    session.close(uri)
    await session.wait_until("diagnostics cleared on close",
                             lambda: (p := session.latest(uri)) and p.diagnostics == [])
