"""The refactoring "Replace with the manual tactics found", end to end through the real
server and daemon: on an AutomaticPartition the last analysis searched, it rewrites the
element into ManualPartitions, and the file then gives the same shardings and
collectives as the automatic tactic did."""

from __future__ import annotations

import asyncio

import pytest
from lsprotocol import types as T

import partir
from partir.schedule_file import load_schedule_file
from tests.lsp.support import Session, apply_edit
from tests.lsp.test_editor_features import analysed

pytestmark = pytest.mark.asyncio(loop_scope="session")

AUTO = "transformer/auto.partir.py"
TEXT = '''\
import model

import partir

program = partir.Program(model.train_step, *model.abstract_inputs(model.TINY))
mesh = {"batch": 4, "model": 2}
schedule = [
    partir.ManualPartition({"batch": 0}, axis="batch", name="BP"),
    partir.AutomaticPartition(axis="model", objective="memory", max_evaluations=12, name="AutoMP"),
]
'''


def partitioned(path) -> partir.Metadata:
    sf = load_schedule_file(path, abstract_args=True)
    return partir.partition(sf.program.fn, sf.mesh, sf.schedule, *sf.program.args)


@pytest.mark.slow
async def test_replace_with_the_manual_tactics_found(session: Session) -> None:
    uri = session.open(AUTO, TEXT)
    await analysed(session, uri)
    line = TEXT.splitlines().index(next(s for s in TEXT.splitlines()
                                        if "AutomaticPartition" in s))
    at = T.Range(T.Position(line, 10), T.Position(line, 10))
    found = []
    for _ in range(100):  # the analysis with the search's metadata may still be on its way
        found = [a for a in await session.client.text_document_code_action_async(
            T.CodeActionParams(T.TextDocumentIdentifier(uri), at, T.CodeActionContext([])))
            or [] if isinstance(a, T.CodeAction)
            and a.title == "Replace with the manual tactics found"]
        if found:
            break
        await asyncio.sleep(0.2)
    (action,) = found
    assert action.kind == T.CodeActionKind.RefactorRewrite
    (edit,) = action.edit.changes[uri]
    new = apply_edit(TEXT, edit)
    assert "AutomaticPartition" not in new and "partir.ManualPartition({" in new
    # Quick-fix-only requests do not get it.
    only = await session.client.text_document_code_action_async(T.CodeActionParams(
        T.TextDocumentIdentifier(uri), at,
        T.CodeActionContext([], only=[T.CodeActionKind.QuickFix])))
    assert not only
    directory = session.workspace.path(AUTO).parent
    (directory / "auto.partir.py").write_text(TEXT)
    (directory / "kept.partir.py").write_text(new)
    automatic, kept = (partitioned(directory / f) for f in ("auto.partir.py",
                                                             "kept.partir.py"))
    assert kept.tactics[-1].shardings == automatic.tactics[-1].shardings
    assert kept.collectives == automatic.collectives
    session.close(uri)
