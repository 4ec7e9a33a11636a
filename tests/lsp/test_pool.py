"""Through the real language server: a schedule file that loops holds one of the daemon's
compiler processes until its timeout, and another file's diagnostics arrive meanwhile."""

from __future__ import annotations

import pytest
from lsprotocol import types as T

from partir_daemon import protocol as P
from partir_daemon.client import DaemonClient
from tests.lsp.support import MLP_BP_MP_Z3, Workspace, start_session, stop_session

pytestmark = pytest.mark.asyncio(loop_scope="session")

LOAD_TIMEOUT_S = 20.0
LOOPS = MLP_BP_MP_Z3.replace("import partir\n", "import partir\n\nwhile True:\n    pass\n")


@pytest.mark.slow
async def test_a_looping_file_delays_no_other_file() -> None:
    workspace = Workspace.create()
    try:
        # The language server uses the daemon it finds: start one with a shorter timeout.
        DaemonClient.connect(workspace.root, runtime_dir=workspace.runtime, timeout=60,
                             config=P.DaemonConfig(load_timeout_s=LOAD_TIMEOUT_S)).close()
        session = await start_session(workspace)
        workspace.path("mlp/loops.partir.py").write_text(LOOPS)
        loops = session.open("mlp/loops.partir.py")
        good = session.open("mlp/bp_mp_z3.partir.py")
        # Before the loop's timeout: the good file was not queued behind it.
        diags = await session.diagnostics_for(good, timeout=LOAD_TIMEOUT_S)
        assert not [d for d in diags if d.severity == T.DiagnosticSeverity.Error], diags
        assert session.latest(loops) is None  # still looping
        (d,) = await session.diagnostics_for(loops, timeout=3 * LOAD_TIMEOUT_S)
        assert d.severity == T.DiagnosticSeverity.Error
        assert "did not finish within 20 s" in d.message, d.message
        await stop_session(session)
    finally:
        workspace.teardown()
