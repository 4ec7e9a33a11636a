"""A document's first analysis answers twice: the partial result (published as diagnostics)
and, after the lowering, the complete one (the snapshot). Hovers, code lenses and inlay
hints arriving between the two wait for the complete one rather than answer null (the
gap a client that asks as soon as the diagnostics show fell into), and stop waiting when
the analysis is superseded or the document closes.

In process, with a fake daemon link that hands the partial result at once and holds the
complete one until the test releases it: the gap is as long as the test wants."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from lsprotocol import types as lsp
from partir_lsp.server import PartirServer

from partir_daemon import protocol as P

TEXT = '''\
schedule = [
    partir.ManualPartition({"x": 0}, axis="batch", name="BP"),
]
'''
TACTIC_LINE = 1  # 0-based line of the tactic
TACTIC_RANGE = P.Range(2, 4, 2, 62)  # 1-based lines, 0-based columns


def _result(path: str, version: int, *, complete: bool) -> P.PartitionResult:
    # The partial result has the tactic but not its lowering: no collectives, no cost.
    metadata: dict[str, Any] = {"actions": ["#tile<0>"]}
    if complete:
        metadata["collectives"] = {"all_reduce": 2}
    tactic = P.TacticResult(1, "BP", "batch", TACTIC_RANGE, {}, False, "s1", metadata)
    x = P.ExplainedValue("x", "input", [8], "float32",
                         [P.ShardingStep(1, "BP", [["batch"]], [2], True)])
    return P.PartitionResult(path, version, True, [], mesh={"batch": 4}, tactics=[tactic],
                             values=[x], schedule_range=P.Range(1, 0, 3, 1))


class FakeLink:
    """Stands for `DaemonLink`: each `partition` call delivers its partial result on the
    event loop at once, then waits for `release` before returning the complete one."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.calls: list[int] = []

    async def call(self, method: str, params: Any, *, on_partial: Any = None) -> Any:
        assert method == "partition" and params.partial
        self.calls.append(params.version)
        asyncio.get_running_loop().call_soon(
            on_partial, _result(params.path, params.version, complete=False))
        await self.release.wait()
        return _result(params.path, params.version, complete=True)

    def close(self) -> None:
        pass


class Recorder(PartirServer):
    """The server with its notifications to the client recorded instead of sent."""

    def __init__(self) -> None:
        super().__init__()
        self.published: list[lsp.PublishDiagnosticsParams] = []
        self.settings.debounce_ms = 0
        self.link_ = FakeLink()
        self.daemon = self.link_  # type: ignore[assignment]

    def text_document_publish_diagnostics(self, params: lsp.PublishDiagnosticsParams) -> None:
        self.published.append(params)

    def window_log_message(self, params: lsp.LogMessageParams) -> None:
        pass

    def capability(self, *path: str) -> Any:
        return None  # no refresh support: nothing else to send


async def _until(condition, what: str) -> None:
    for _ in range(1000):
        if condition():
            return
        await asyncio.sleep(0.001)
    raise AssertionError(f"timed out waiting for {what}")


async def _in_the_gap(tmp_path: Path) -> tuple[Recorder, str]:
    """A server whose document got its partial result (diagnostics) and no snapshot."""
    server = Recorder()
    uri = (tmp_path / "s.partir.py").as_uri()
    server.opened(uri, 1, TEXT)
    await _until(lambda: server.published, "the partial result's diagnostics")
    assert server.documents[uri].snapshot is None
    return server, uri


def _hover(server: Recorder, uri: str) -> asyncio.Task:
    return asyncio.get_running_loop().create_task(
        server.hover(uri, lsp.Position(TACTIC_LINE, 10)))


@pytest.mark.asyncio
async def test_a_hover_between_the_partial_and_the_complete_result_waits_for_it(
        tmp_path: Path) -> None:
    server, uri = await _in_the_gap(tmp_path)
    hover = _hover(server, uri)
    await asyncio.sleep(0.05)
    assert not hover.done()  # waiting, not answering null
    server.link_.release.set()
    answer = await asyncio.wait_for(hover, 5)
    assert answer is not None
    assert "**Tactic 1 · BP** on axis `batch`" in answer.contents.value
    assert "| all_reduce (AR) | 2 | +2 |" in answer.contents.value  # the complete result
    # With a snapshot, requests answer at once again.
    assert server.documents[uri].snapshot is not None
    assert await asyncio.wait_for(server.hover(uri, lsp.Position(TACTIC_LINE, 10)), 0.5)
    assert len(server.code_lenses(uri)) == 3


@pytest.mark.asyncio
async def test_lenses_and_hints_wait_for_the_first_analysis_too(tmp_path: Path) -> None:
    server, uri = await _in_the_gap(tmp_path)
    waiting = asyncio.get_running_loop().create_task(server.first_analysis(uri))
    await asyncio.sleep(0.05)
    assert not waiting.done()
    server.link_.release.set()
    await asyncio.wait_for(waiting, 5)
    assert server.code_lenses(uri)
    hints = server.inlay_hints(uri, lsp.Range(lsp.Position(0, 0), lsp.Position(10, 0)))
    assert [h.position.line for h in hints] == [TACTIC_LINE]


@pytest.mark.asyncio
async def test_the_wait_ends_when_a_newer_version_supersedes_the_analysis(
        tmp_path: Path) -> None:
    server, uri = await _in_the_gap(tmp_path)
    hover = _hover(server, uri)
    await asyncio.sleep(0.01)
    server.opened(uri, 2, TEXT + "\n")  # cancels the analysis of version 1
    assert await asyncio.wait_for(hover, 5) is None  # no snapshot to answer from
    await _until(lambda: server.link_.calls == [1, 2], "the analysis of version 2")
    server.link_.release.set()
    await _until(lambda: server.documents[uri].snapshot is not None, "version 2's result")
    assert server.documents[uri].snapshot.version == 2


@pytest.mark.asyncio
async def test_the_wait_ends_when_the_document_closes(tmp_path: Path) -> None:
    server, uri = await _in_the_gap(tmp_path)
    hover = _hover(server, uri)
    await asyncio.sleep(0.01)
    server.closed(uri)
    assert await asyncio.wait_for(hover, 5) is None


@pytest.mark.asyncio
async def test_the_outline_waits_for_the_first_analysis(tmp_path: Path) -> None:
    """VS Code asks for the outline (and breadcrumbs) once on opening, not again until an
    edit: answering [] before the first analysis left them empty."""
    server, uri = await _in_the_gap(tmp_path)
    outline = asyncio.get_running_loop().create_task(server.outline(uri))
    await asyncio.sleep(0.05)
    assert not outline.done()
    server.link_.release.set()
    symbols = await asyncio.wait_for(outline, 5)
    assert [s.name for s in symbols] == ["schedule"]
    assert [c.name for c in symbols[0].children] == ["1. BP"]


class BrokenLink(FakeLink):
    """Answers a text that does not parse as the daemon does: an error, no tactics."""

    async def call(self, method: str, params: Any, *, on_partial: Any = None) -> Any:
        if "partir.Manual(" not in params.text:
            return await super().call(method, params, on_partial=on_partial)
        self.calls.append(params.version)
        return P.PartitionResult(params.path, params.version, False, [P.Diagnostic(
            "syntax", "invalid syntax", params.path, 2, P.Range(2, 4, 2, 10))])


@pytest.mark.asyncio
async def test_lenses_stay_marked_stale_while_the_text_does_not_parse(
        tmp_path: Path) -> None:
    server = Recorder()
    server.link_ = server.daemon = BrokenLink()  # type: ignore[assignment]
    server.link_.release.set()
    uri = (tmp_path / "s.partir.py").as_uri()
    server.opened(uri, 1, TEXT)
    await _until(lambda: server.documents[uri].snapshot is not None, "the first analysis")
    fresh = [lens.command.title for lens in server.code_lenses(uri)]
    assert fresh[0] == "BP: +AG 0 +AR 2 +RS 0 +A2A 0"
    typing = TEXT.replace("schedule = [", "schedule = [\n    partir.Manual(")
    server.opened(uri, 2, typing)
    await _until(lambda: server.documents[uri].snapshot.version == 2, "the broken version")
    stale = server.code_lenses(uri)
    assert [lens.command.title for lens in stale] == [
        "(stale) " + fresh[0], *fresh[1:]]
    assert stale[0].range.start.line == TACTIC_LINE + 1  # moved down with its line
    (hint,) = server.inlay_hints(uri, lsp.Range(lsp.Position(0, 0), lsp.Position(10, 0)))
    assert hint.label.startswith("(stale) ")
    server.opened(uri, 3, TEXT)  # fixed: fresh again
    await _until(lambda: server.documents[uri].snapshot.version == 3, "the fixed version")
    assert [lens.command.title for lens in server.code_lenses(uri)] == fresh


TWO = '''\
schedule = [
    partir.ManualPartition({"x": 0}, axis="batch", name="BP"),
    partir.ManualPartition({"y": 0}, axis="batch", name="BP2"),
]
'''


class LoweringLink(FakeLink):
    """Sends, before the complete result, a partial one with no tactic lowered, then one
    with the first of two lowered (as the daemon does during a long lowering)."""

    async def call(self, method: str, params: Any, *, on_partial: Any = None) -> Any:
        def two(lowered: int) -> P.PartitionResult:
            result = _result(params.path, params.version, complete=False)
            first, second = result.tactics[0], P.TacticResult(
                2, "BP2", "batch", P.Range(3, 4, 3, 63), {}, False, "s2", {"actions": []})
            for t in (first, second)[:lowered]:
                t.metadata["collectives"] = {"all_reduce": t.index}
            result.tactics = [first, second]
            return result

        self.calls.append(params.version)
        loop = asyncio.get_running_loop()
        loop.call_soon(on_partial, two(0))
        loop.call_soon(on_partial, two(1))
        await self.release.wait()
        return two(2)


@pytest.mark.asyncio
async def test_a_partial_result_with_tactics_lowered_is_shown_before_the_rest(
        tmp_path: Path) -> None:
    server = Recorder()
    server.link_ = server.daemon = LoweringLink()  # type: ignore[assignment]
    uri = (tmp_path / "s.partir.py").as_uri()
    server.opened(uri, 1, TWO)
    await _until(lambda: server.documents[uri].snapshot is not None, "the lowered partial")
    titles = [lens.command.title for lens in server.code_lenses(uri)][:4:2]
    assert titles == ["BP: +AG 0 +AR 1 +RS 0 +A2A 0", "BP2: lowering…"]
    hints = server.inlay_hints(uri, lsp.Range(lsp.Position(0, 0), lsp.Position(10, 0)))
    assert [h.label for h in hints] == ["AR 1", "lowering…"]
    hover = await asyncio.wait_for(server.hover(uri, lsp.Position(2, 10)), 0.5)
    assert "Collectives and cost: lowering…" in hover.contents.value
    server.link_.release.set()
    await _until(lambda: server.documents[uri].task.done(), "the complete result")
    titles = [lens.command.title for lens in server.code_lenses(uri)][:4:2]
    assert titles == ["BP: +AG 0 +AR 1 +RS 0 +A2A 0", "BP2: +AG 0 +AR 2 +RS 0 +A2A 0"]
