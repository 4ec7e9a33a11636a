"""Fixtures of the language server tests: one workspace, daemon and server shared by the
tests that leave them serving; each test opens its own documents."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest
import pytest_asyncio

from tests.lsp.support import Session, Workspace, start_session, stop_session


@pytest.fixture(scope="session")
def workspace() -> Iterator[Workspace]:
    ws = Workspace.create()
    yield ws
    ws.teardown()


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def session(workspace: Workspace) -> AsyncIterator[Session]:
    s = await start_session(workspace)
    yield s
    await stop_session(s)
