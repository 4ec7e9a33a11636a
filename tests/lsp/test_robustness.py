"""Jobs with work-done progress, broken schedule files, stale versions, settings, and a
daemon that cannot start: the server keeps serving through all of them."""

from __future__ import annotations

import asyncio
import sys

import pytest
from lsprotocol import types as T

from tests.lsp.support import (
    MLP_BP_MP_Z3,
    ROOT,
    Session,
    Workspace,
    start_session,
    stop_session,
)

pytestmark = pytest.mark.asyncio(loop_scope="session")

BROKEN_TEXTS = [
    "",  # nothing defined
    "schedule = [",  # a syntax error
    "\x00\x01 not python \udcff".encode("utf-8", "surrogatepass").decode("utf-8", "replace"),
    "import does_not_exist\n",
    "raise SystemExit(3)\n",
    "import sys\nsys.exit(0)\n",
    MLP_BP_MP_Z3.replace("schedule = [", "schedule = 42 or ["),  # not a list of tactics
    MLP_BP_MP_Z3.replace('{"x": 0}', '{"x": "zero"}'),  # a malformed tactic
    MLP_BP_MP_Z3.replace("example_args()", "example_args()[:1]"),  # the wrong arguments
    MLP_BP_MP_Z3.replace('name="MP"', 'name="MP"' + "\u00e9" * 3 + '\U0001f600'),
]


@pytest.mark.slow
async def test_run_job_reports_a_finished_job(session: Session) -> None:
    uri = session.open("mlp/bp_mp_z3.partir.py")
    before = set(session.client.progress_reports)
    result = await session.client.workspace_execute_command_async(T.ExecuteCommandParams(
        "partir.runJob", [{"uri": uri, "steps": 2}]))
    assert result["status"] == "finished", result
    assert result["step_time_s"] > 0 and result["steps"] == 2
    assert result["max_abs_error"] is not None and result["max_abs_error"] < 1e-3
    assert result["devices"] == 8 and result["job_id"]
    assert result["collectives"]["all_gather"] == 2
    (token,) = set(session.client.progress_reports) - before
    kinds = [r.kind for r in session.client.progress_reports[token]]
    assert kinds[0] == "begin" and kinds[-1] == "end", kinds
    messages = [m.message for m in session.client.log_messages]
    assert any(f"PartIR job {result['job_id']} (bp_mp_z3.partir.py) finished" in m
               for m in messages), messages
    session.close(uri)


@pytest.mark.slow
async def test_run_job_reports_on_the_clients_progress_token(session: Session) -> None:
    """The extension shows a job in its own cancellable notification: the server reports
    on the token it passes, and creates none (vscode-languageclient would show that one in
    the status bar, without Cancel)."""
    uri = session.open("mlp/bp_mp_z3.partir.py")
    before = set(session.client.progress_reports)
    result = await session.client.workspace_execute_command_async(T.ExecuteCommandParams(
        "partir.runJob", [{"uri": uri, "steps": 1, "progressToken": "the-extensions"}]))
    assert result["status"] == "finished", result
    assert set(session.client.progress_reports) - before == {"the-extensions"}
    kinds = [r.kind for r in session.client.progress_reports["the-extensions"]]
    assert kinds[0] == "begin" and kinds[-1] == "end", kinds
    session.close(uri)


async def test_run_job_of_a_broken_file_fails(session: Session) -> None:
    path = session.workspace.path("mlp/broken.partir.py")
    path.write_text(MLP_BP_MP_Z3.replace('{"x": 0}', '{"y": 0}'))
    result = await session.client.workspace_execute_command_async(T.ExecuteCommandParams(
        "partir.runJob", [{"uri": path.as_uri(), "steps": 1}]))
    assert result["status"] == "failed" and "'y'" in result["error"], result
    assert result["step_time_s"] is None


async def test_broken_schedule_files_never_crash_the_server(session: Session) -> None:
    uri = session.open("mlp/bp_mp_z3.partir.py")
    await session.diagnostics_for(uri)
    for text in BROKEN_TEXTS:
        version = session.change(uri, text)
        diags = await session.diagnostics_for(uri, version)
        assert any(d.severity == T.DiagnosticSeverity.Error for d in diags), (text, diags)
        assert all(d.range.start.line >= 0 for d in diags)
        # Requests on the broken file still get answers.
        lenses = await session.lenses(uri)
        assert all(lens.range.start.line >= 0 for lens in lenses)
        await session.hover(uri, 0, 0)
    refreshes = session.lens_refreshes
    session.change(uri, MLP_BP_MP_Z3)
    diags = await session.diagnostics_for(uri)
    assert not [d for d in diags if d.severity == T.DiagnosticSeverity.Error]
    assert len(await session.lowered_lenses(uri, refreshes)) == 7  # two per tactic, one job
    session.close(uri)


async def test_stale_versions_are_dropped(session: Session) -> None:
    uri = session.open("mlp/bp_mp_z3.partir.py")
    await session.diagnostics_for(uri)
    first = len(session.published)
    # Quick edits, each a new version, the last a valid file.
    for k in range(6):
        session.change(uri, MLP_BP_MP_Z3.replace('"w1": 1', f'"w{k}": 1'))
        await asyncio.sleep(0.02)
    last = session.change(uri, MLP_BP_MP_Z3)
    diags = await session.diagnostics_for(uri, last)
    assert not [d for d in diags if d.severity == T.DiagnosticSeverity.Error]
    versions = [p.version for p in session.published[first:] if p.uri == uri]
    assert versions == sorted(versions), versions  # never an older result after a newer
    await asyncio.sleep(0.5)  # nothing older arrives later either
    assert session.latest(uri).version == last
    session.close(uri)


async def test_collective_markers_follow_the_setting(session: Session) -> None:
    uri = session.open("mlp/bp_mp_z3.partir.py")
    await session.diagnostics_for(uri)
    model_uri = session.workspace.uri("mlp/model.py")
    session.client.workspace_did_change_configuration(T.DidChangeConfigurationParams(
        {"partir": {"collectiveMarkersInModel": True, "debounceMs": 50}}))
    published = await session.wait_until(
        "markers published for the model file", lambda: session.latest(model_uri))
    assert all(d.severity == T.DiagnosticSeverity.Information and d.source == "partir"
               for d in published.diagnostics)
    # BP+MP+Z3 of `mlp`: the matmul chain's line (0-based 16) gets Z3's two gathers and
    # MP's reduction
    (marker,) = published.diagnostics
    assert marker.range.start.line == 16
    assert "all_gather" in marker.message and "all_reduce" in marker.message
    count = len(session.published)
    session.client.workspace_did_change_configuration(T.DidChangeConfigurationParams(
        {"partir": {"collectiveMarkersInModel": False}}))
    await session.wait_until("markers cleared", lambda: any(
        p.uri == model_uri and p.diagnostics == [] for p in session.published[count:]))
    session.close(uri)


async def test_collectives_inside_a_loop_body_are_marked_at_their_model_line(
        session: Session) -> None:
    """The scan-over-layers transformer under BP+MP: the attention block's sum over
    "model" is in the scan's body, marked at the block's output projection, and so is
    the sum over "batch" of the projection's weight gradient."""
    uri = session.open("transformer/scan.partir.py")
    await session.diagnostics_for(uri)
    model_uri = session.workspace.uri("transformer/model.py")
    lines = session.workspace.path("transformer/model.py").read_text().splitlines()
    at = lines.index('    return jnp.einsum("bhsk,hkd->bsd", out, w_o)')
    session.client.workspace_did_change_configuration(T.DidChangeConfigurationParams(
        {"partir": {"collectiveMarkersInModel": True, "debounceMs": 50}}))
    try:
        (marker,) = await session.wait_until(
            "a marker at the attention's output projection", lambda: [
                d for d in getattr(session.latest(model_uri), "diagnostics", ())
                if d.range.start.line == at])
        assert ("scan.partir.py: all_reduce ×1 over 'batch' (tactic 1, BP); all_reduce ×1 "
                "over 'model' (tactic 2, MP)") in marker.message
    finally:
        session.client.workspace_did_change_configuration(T.DidChangeConfigurationParams(
            {"partir": {"collectiveMarkersInModel": False}}))
        session.close(uri)


@pytest.mark.slow
async def test_daemon_that_cannot_start_is_reported() -> None:
    workspace = Workspace.create()
    try:
        workspace.runtime.chmod(0o755)  # others could reach the socket: the client refuses
        session = await start_session(workspace)
        uri = session.open("mlp/bp_mp_z3.partir.py")
        await session.wait_until("an error message", lambda: [
            m for m in session.client.messages if m.type == T.MessageType.Error])
        (message,) = [m.message for m in session.client.messages]
        assert "daemon" in message and "could not be started" in message
        assert [p for p in session.published if p.diagnostics] == []
        assert await session.lenses(uri) == []
        assert await session.hover(uri, 8, 30) is None
        # The server still runs: another change is handled without a second message.
        session.change(uri, MLP_BP_MP_Z3 + "\n")
        await asyncio.sleep(0.5)
        assert len(session.client.messages) == 1
        await stop_session(session)
    finally:
        workspace.runtime.chmod(0o700)
        workspace.teardown()


@pytest.mark.slow
async def test_partir_lsp_command_is_the_server() -> None:
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-c", "import sys; from partir.cli import main; sys.exit(main())",
        "lsp", "--help", stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        cwd=str(ROOT))
    out, err = await process.communicate()
    assert process.returncode == 0, err.decode()
    assert b"language server" in out and b"stdio" in out
