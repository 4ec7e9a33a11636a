"""Hovers, code lenses, inlay hints and the `partir/ir` request, end to end, checked
against `partir.partition`'s Metadata and the CLI computed in this process."""

from __future__ import annotations

import re

import pytest
from lsprotocol import types as T
from pygls.exceptions import JsonRpcException

import partir
from partir.schedule_file import load_schedule_file
from tests.lsp.support import MLP_BP_MP_Z3, ROOT, TINY_BP_MP_Z3, Session

pytestmark = pytest.mark.asyncio(loop_scope="session")

COUNTS = re.compile(r"\+(A2A|AG|AR|RS) (\d+)")
KINDS = {"AG": "all_gather", "AR": "all_reduce", "RS": "reduce_scatter", "A2A": "all_to_all"}


def metadata_of(path: str) -> partir.Metadata:
    sf = load_schedule_file(path)
    return partir.partition(sf.program.fn, sf.mesh, sf.schedule, *sf.program.args)


def position_of(text: str, needle: str, occurrence: int = 0) -> T.Position:
    """The position of the middle of the `occurrence`-th `needle` in `text`."""
    start = -1
    for _ in range(occurrence + 1):
        start = text.index(needle, start + 1)
    line = text.count("\n", 0, start)
    col = start - (text.rfind("\n", 0, start) + 1)
    return T.Position(line, col + len(needle) // 2)


def tactic_lines(text: str) -> list[int]:
    return [i for i, line in enumerate(text.splitlines())
            if line.lstrip().startswith("partir.ManualPartition(")]


async def open_analysed(session: Session, name: str, text: str | None = None) -> str:
    """Open a schedule file and wait for its complete analysis (the lenses refreshed):
    lenses, hints and hovers answer from it, and before it from nothing."""
    refreshes = session.lens_refreshes
    uri = session.open(name, text)
    await session.diagnostics_for(uri)
    await session.lowered_lenses(uri, refreshes)
    return uri


async def check_lenses_against_metadata(session: Session, name: str, text: str) -> None:
    uri = await open_analysed(session, name, text)
    lenses = await session.lenses(uri)
    meta = metadata_of(str(session.workspace.path(name)))
    lines = tactic_lines(text)
    assert len(lines) == len(meta.tactics)
    for index, (line, tactic) in enumerate(zip(lines, meta.tactics, strict=True), 1):
        on_line = [lens for lens in lenses if lens.range.start.line == line]
        summary = [lens for lens in on_line if COUNTS.search(lens.command.title)]
        assert len(summary) == 1, [lens.command.title for lens in on_line]
        title = summary[0].command.title
        counts = {KINDS[k]: int(n) for k, n in COUNTS.findall(title)}
        assert counts == {k: tactic.collectives[k] for k in KINDS.values()}, title
        assert re.search(r" · [\d.]+ (ms|s) · [\d.]+ (B|KiB|MiB|GiB)/device$", title), title
        # The counts show the HLO-level program, where those collectives are.
        assert summary[0].command.command == "partir.showIr"
        assert list(summary[0].command.arguments) == [
            {"uri": uri, "tactic": index, "level": "hlo"}]
        show = [lens.command for lens in on_line if lens.command.title.startswith("Show IR")]
        assert [(c.command, list(c.arguments)) for c in show] == [
            ("partir.showIr", [{"uri": uri, "tactic": index}])]
        assert title.startswith(f"{tactic.name}: "), title
    # One job lens, above the schedule.
    run = [lens for lens in lenses if lens.command.command == "partir.runJob"]
    assert [(lens.range.start.line, list(lens.command.arguments)) for lens in run] == [
        (text.splitlines().index("schedule = ["), [{"uri": uri}])]
    session.close(uri)


async def test_mlp_lens_counts_equal_metadata(session: Session) -> None:
    await check_lenses_against_metadata(session, "mlp/bp_mp_z3.partir.py", MLP_BP_MP_Z3)


async def test_transformer_lens_counts_equal_metadata(session: Session) -> None:
    await check_lenses_against_metadata(session, "transformer/tiny.partir.py", TINY_BP_MP_Z3)


async def test_lenses_refresh_after_an_edit(session: Session) -> None:
    uri = await open_analysed(session, "mlp/bp_mp_z3.partir.py")
    refreshes = session.lens_refreshes
    edited = MLP_BP_MP_Z3.replace('{"w1": 0, "w2": 1}', '{"w1": 0}')
    session.change(uri, edited)
    await session.diagnostics_for(uri)
    titles = [lens.command.title for lens in await session.lowered_lenses(uri, refreshes)
              if COUNTS.search(lens.command.title)
              and lens.range.start.line == tactic_lines(edited)[2]]
    assert titles and titles[0].startswith("Z3: +AG 1 +AR 1 +RS 0 +A2A 0"), titles
    session.close(uri)


async def test_hover_on_input_key(session: Session) -> None:
    uri = await open_analysed(session, "mlp/bp_mp_z3.partir.py")
    # w1 in Z3: sharded [batch, model] at the end, 8x16 -> 2x8 per device.
    text = await session.hover(uri, *_pos(position_of(MLP_BP_MP_Z3, '"w1"', 1)))
    assert text is not None
    assert "`tensor<8x16xf32>`" in text
    assert ('| after tactic 3 (Z3) | `[{"batch"}, {"model"}]` | `P(\'batch\', \'model\')` | '
            '`[2, 8]` | 64 B |') in text
    assert "| dim 0: 1/4 | 🟥 0 | 🟦 1 |" in text  # devices 0 and 1 hold the first row tiles
    # w1 in MP: after tactic 2 and at the end differ.
    text = await session.hover(uri, *_pos(position_of(MLP_BP_MP_Z3, '"w1"', 0)))
    assert '| after tactic 2 (MP) | `[{}, {"model"}]` | `P(None, \'model\')` | `[8, 8]` | 256 B |' \
        in text
    assert ('| at the end (tactic 3, Z3) | `[{"batch"}, {"model"}]` | `P(\'batch\', \'model\')` | '
            '`[2, 8]` | 64 B |') in text
    session.close(uri)


async def test_hover_on_transformer_input_key(session: Session) -> None:
    uri = await open_analysed(session, "transformer/tiny.partir.py")
    text = await session.hover(uri, *_pos(position_of(TINY_BP_MP_Z3, '"batch": 0')))
    # batch/tokens and batch/labels: 8 x 16 int32 split over "batch" 4 -> 2 x 16.
    assert "selects 2 values" in text
    assert '| `batch/tokens` | `tensor<8x16xi32>` | `[{"batch"}, {}]` | `[2, 16]` |' in text
    text = await session.hover(uri, *_pos(position_of(TINY_BP_MP_Z3, '"params"', 1)))
    assert "selects 37 values" in text  # 9 per layer x 4 layers + the embedding
    session.close(uri)


async def test_hover_on_tactic(session: Session) -> None:
    uri = await open_analysed(session, "mlp/bp_mp_z3.partir.py")
    text = await session.hover(uri, *_pos(position_of(MLP_BP_MP_Z3, 'name="Z3"')))
    assert "**Tactic 3 · Z3** on axis `batch`" in text
    assert '`tile<%w1,0,"batch">`' in text
    assert "| all_gather (AG) | 2 | +2 |" in text
    assert "| all_reduce (AR) | 1 | +0 |" in text
    assert re.search(r"step time [\d.]+ ms \(\+[\d.]+ ms\)", text), text
    session.close(uri)


async def test_hover_on_model_line(session: Session) -> None:
    uri = await open_analysed(session, "mlp/bp_mp_z3.partir.py")
    model = session.workspace.path("mlp/model.py")
    model_uri = session.open("mlp/model.py")
    line = model.read_text().splitlines().index("    return jax.nn.relu(x @ w1) @ w2")
    text = await session.hover(model_uri, line, 10)
    assert "after tactic 3 (Z3)" in text
    assert '| `dot_general` | `tensor<256x16xf32>` | `[{"batch"}, {"model"}]` | `[64, 8]` |' \
        in text
    assert await session.hover(model_uri, 0, 0) is None  # the docstring computes nothing
    session.close(model_uri)
    session.close(uri)


async def test_inlay_hints_at_tactic_line_ends(session: Session) -> None:
    uri = await open_analysed(session, "mlp/bp_mp_z3.partir.py")
    hints = await session.client.text_document_inlay_hint_async(T.InlayHintParams(
        T.TextDocumentIdentifier(uri), T.Range(T.Position(0, 0), T.Position(100, 0))))
    lines = MLP_BP_MP_Z3.splitlines()
    got = {(h.position.line, h.position.character): h.label for h in hints}
    bp, mp, z3 = tactic_lines(MLP_BP_MP_Z3)
    assert list(got) == [(bp, len(lines[bp])), (mp, len(lines[mp])), (z3, len(lines[z3]))]
    assert got[(bp, len(lines[bp]))].startswith("no collectives · ")
    assert got[(z3, len(lines[z3]))].startswith("AG 2 AR 1 · ")
    assert got[(z3, len(lines[z3]))].endswith("· 2 conflicts")
    session.close(uri)


async def test_ir_request_matches_the_cli(session: Session) -> None:
    uri = session.open("mlp/bp_mp_z3.partir.py")
    path = str(session.workspace.path("mlp/bp_mp_z3.partir.py"))
    sf = load_schedule_file(path)
    result = sf.program.core_partition(sf.mesh, sf.schedule)
    for tactic in (0, 2):
        got = await session.client.protocol.send_request_async(
            "partir/ir", {"uri": uri, "tactic": tactic, "level": "core"})
        assert got.text.strip() == result.core_ir(after=tactic).strip()
    with pytest.raises(JsonRpcException) as e:
        await session.client.protocol.send_request_async(
            "partir/ir", {"uri": uri, "tactic": 9, "level": "hlo"})
    assert e.value.code == -32602
    # The request is for the text of the last analysis (that of the lenses): the broken
    # one once its analysis has landed.
    session.change(uri, MLP_BP_MP_Z3.replace("schedule = [", "schedule = [[["))
    # Published as the analysis lands (a text that does not load has no partial result);
    # a lens refresh could be the first analysis's, still in flight when the text changed.
    await session.diagnostics_for(uri)
    with pytest.raises(JsonRpcException) as e:
        await session.client.protocol.send_request_async(
            "partir/ir", {"uri": uri, "tactic": 1, "level": "core"})
    assert e.value.code == -32803 and "does not load" in e.value.message
    session.close(uri)


def _pos(p: T.Position) -> tuple[int, int]:
    return p.line, p.character


async def test_a_pipeline_tactic_shows_its_stages_microbatches_and_bubble(
        session: Session) -> None:
    text = (ROOT / "examples" / "transformer" / "pp.partir.py").read_text()
    uri = await open_analysed(session, "transformer/pp.partir.py", text)
    line = text.splitlines().index("schedule = [PP]")
    titles = [lens.command.title for lens in await session.lenses(uri)
              if lens.range.start.line == line and COUNTS.search(lens.command.title)]
    assert len(titles) == 1 and titles[0].startswith("PP: +AG 0 +AR 2 +RS 0 +A2A 0 +CP 2 · "), \
        titles
    assert titles[0].endswith(" · 4 stages × 4 microbatches, bubble 43%"), titles
    hover = await session.hover(uri, line, text.splitlines()[line].index("PP") + 1)
    assert hover is not None
    assert "Pipeline: 4 stages of 1 layer(s), 4 microbatches in 7 steps; each stage idles 3" \
        in hover, hover
    session.close(uri)
