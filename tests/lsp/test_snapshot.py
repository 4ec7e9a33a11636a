"""Requests answered from the last analysis (never waiting for one, nor asking the daemon
to explain input keys), `partir.showIr` as a server command, and a model fixed on disk
analysing again the schedule files that import it."""

from __future__ import annotations

import time
from collections.abc import Awaitable
from pathlib import Path
from typing import TypeVar

import attrs
import pytest
from lsprotocol import types as T
from pygls.exceptions import JsonRpcException

from partir.schedule_file import load_schedule_file
from tests.lsp import support
from tests.lsp.support import MLP_BP_MP_Z3, TINY_BP_MP_Z3, Session
from tests.lsp.test_features import open_analysed, position_of, tactic_lines

pytestmark = pytest.mark.asyncio(loop_scope="session")

R = TypeVar("R")

# Appended to a schedule file: its analysis takes this long in the daemon (loading it),
# while its earlier lines stay those of the last analysis.
SLOW_SECONDS = 4
SLOW = f"\nimport time\ntime.sleep({SLOW_SECONDS})\n"
# Far below an analysis of the slow text: an answer this quick did not wait for one.
QUICK_S = 1.0

BROKEN_MODEL = '''\
import numpy as np


def project(x, w)
    return x @ w


def example_args():
    return np.ones((16, 8), np.float32), np.ones((8, 4), np.float32)
'''
FIXED_MODEL = BROKEN_MODEL.replace("def project(x, w)", "def project(x, w):")
FIX_SCHEDULE = '''\
from fixme_model import example_args, project

import partir

program = partir.Program(project, *example_args())
mesh = {"batch": 4}
schedule = [
    partir.ManualPartition({"x": 0}, axis="batch", name="BP"),
]
'''


async def timed(request: Awaitable[R]) -> tuple[R, float]:
    """The request's answer, and how long it took."""
    start = time.perf_counter()
    result = await request
    return result, time.perf_counter() - start


def errors(diags: list[T.Diagnostic]) -> list[T.Diagnostic]:
    return [d for d in diags if d.severity == T.DiagnosticSeverity.Error]


@pytest.mark.slow
async def test_requests_answer_from_the_last_analysis_while_one_runs(
        session: Session) -> None:
    uri = await open_analysed(session, "mlp/bp_mp_z3.partir.py")
    refreshes = session.lens_refreshes
    slow = session.change(uri, MLP_BP_MP_Z3 + SLOW)
    # Each answer comes at once from the previous analysis, on the lines that did not
    # change. An `explain` would wait for the daemon, busy loading the slow text.
    text, elapsed = await timed(session.hover(
        uri, *_pos(position_of(MLP_BP_MP_Z3, '"w1"', 1))))
    assert elapsed < QUICK_S, elapsed
    assert ('| after tactic 3 (Z3) | `[{"batch"}, {"model"}]` | `P(\'batch\', \'model\')` | '
            '`[2, 8]` | 64 B |') in text
    assert "Collectives moving it:\n- all_gather ×1 over 'batch' of `w1` (tactic 3, Z3)" \
        in text
    lenses, elapsed = await timed(session.lenses(uri))
    assert elapsed < QUICK_S, elapsed
    schedule = MLP_BP_MP_Z3.splitlines().index("schedule = [")  # the job lens
    assert sorted({lens.range.start.line for lens in lenses}) == [
        schedule, *tactic_lines(MLP_BP_MP_Z3)]
    assert len(lenses) == 7
    hints, elapsed = await timed(session.client.text_document_inlay_hint_async(
        T.InlayHintParams(T.TextDocumentIdentifier(uri),
                          T.Range(T.Position(0, 0), T.Position(100, 0)))))
    assert elapsed < QUICK_S, elapsed
    assert [h.position.line for h in hints] == tactic_lines(MLP_BP_MP_Z3)
    # None of this disturbed the analysis in flight: it lands, and the lenses refresh.
    assert session.lens_refreshes == refreshes
    assert errors(await session.diagnostics_for(uri, slow)) == []
    await session.wait_until("a lens refresh", lambda: session.lens_refreshes > refreshes)
    session.close(uri)


async def test_lines_changed_since_the_last_analysis_have_no_lens(session: Session) -> None:
    uri = await open_analysed(session, "mlp/bp_mp_z3.partir.py")
    bp, mp, z3 = tactic_lines(MLP_BP_MP_Z3)
    lines = MLP_BP_MP_Z3.splitlines(keepends=True)
    # A new first line (all lenses move down one) and an edited MP tactic, analysed slowly.
    edited = "# edited\n" + "".join(lines[:mp]) + lines[mp].replace('"w1": 1', '"w1": 0') \
        + "".join(lines[mp + 1:]) + SLOW
    session.change(uri, edited)
    lenses = await session.lenses(uri)
    schedule = MLP_BP_MP_Z3.splitlines().index("schedule = [")
    assert sorted({lens.range.start.line for lens in lenses}) == [schedule + 1, bp + 1, z3 + 1]
    assert await session.hover(uri, mp + 1, 30) is None  # the edited line: nothing known
    assert await session.hover(uri, *_pos(position_of(edited, 'name="Z3"'))) is not None
    session.close(uri)


async def test_input_key_hover_on_the_transformer_is_quick(session: Session) -> None:
    uri = await open_analysed(session, "transformer/tiny.partir.py")
    where = _pos(position_of(TINY_BP_MP_Z3, '"params"', 1))
    times = []
    for _ in range(20):
        text, elapsed = await timed(session.hover(uri, *where))
        times.append(elapsed)
        assert "selects 37 values" in text
    times.sort()
    assert times[18] < 0.1, times  # p95
    session.close(uri)


async def test_show_ir_command_writes_the_ir_file(session: Session) -> None:
    name = "mlp/bp_mp_z3.partir.py"
    uri = await open_analysed(session, name)
    sf = load_schedule_file(str(session.workspace.path(name)))
    expected = sf.program.core_partition(sf.mesh, sf.schedule).core_ir(after=2)
    result = await session.client.workspace_execute_command_async(T.ExecuteCommandParams(
        "partir.showIr", [{"uri": uri, "tactic": 2}]))
    path = Path(result["path"])
    assert path == session.workspace.root.resolve() / ".partir/ir/mlp/bp_mp_z3.after-2.core.mlir"
    assert path.read_text() == result["text"]
    assert result["text"].strip() == expected.strip()
    assert session.client.shown_documents == []  # this client cannot show documents
    with pytest.raises(JsonRpcException) as e:
        await session.client.workspace_execute_command_async(T.ExecuteCommandParams(
            "partir.showIr", [{"uri": uri, "tactic": 9}]))
    assert e.value.code == -32602
    with pytest.raises(JsonRpcException) as e:
        await session.client.workspace_execute_command_async(T.ExecuteCommandParams(
            "partir.showIr", [{"uri": uri, "tactic": 1, "level": "mlir"}]))
    assert e.value.code == -32602
    session.close(uri)


async def test_show_ir_opens_the_file_in_a_client_that_shows_documents(
        session: Session, monkeypatch: pytest.MonkeyPatch) -> None:
    window = attrs.evolve(support.CAPABILITIES.window,
                          show_document=T.ShowDocumentClientCapabilities(support=True))
    monkeypatch.setattr(support, "CAPABILITIES",
                        attrs.evolve(support.CAPABILITIES, window=window))
    shows = await support.start_session(session.workspace)
    try:
        uri = await open_analysed(shows, "mlp/bp_mp_z3.partir.py")
        result = await shows.client.workspace_execute_command_async(T.ExecuteCommandParams(
            "partir.showIr", [{"uri": uri, "tactic": 3, "level": "hlo"}]))
        assert result["path"].endswith("/.partir/ir/mlp/bp_mp_z3.after-3.hlo.mlir")
        assert "all_gather" in result["text"]
        (shown,) = shows.client.shown_documents
        assert shown.uri == Path(result["path"]).as_uri() and shown.take_focus
        shows.close(uri)
    finally:
        await support.stop_session(shows)


async def test_fixing_the_model_on_disk_analyses_the_schedule_file_again(
        session: Session) -> None:
    model = session.workspace.path("mlp/fixme_model.py")
    model.write_text(BROKEN_MODEL)
    session.workspace.path("mlp/fixme.partir.py").write_text(FIX_SCHEDULE)
    uri = session.open("mlp/fixme.partir.py")
    (error,) = errors(await session.diagnostics_for(uri))
    assert error.code == "syntax" or "SyntaxError" in f"{error.code} {error.message}"
    assert any(r.location.uri == model.as_uri() for r in error.related_information or [])
    model.write_text(FIXED_MODEL)
    fixed_at = time.monotonic()
    # The schedule file is not edited: the daemon's notification that the model changed
    # makes the server analyse it again.
    await session.wait_until("the errors cleared", lambda: (
        (p := session.latest(uri)) is not None and not errors(p.diagnostics)), timeout=10)
    assert time.monotonic() - fixed_at < 5
    session.close(uri)


def _pos(p: T.Position) -> tuple[int, int]:
    return p.line, p.character
