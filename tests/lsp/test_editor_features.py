"""Completion, go to definition, the outline and quick fixes, end to end through the real
server and daemon on the MLP and tiny transformer examples: each answered from the last
analysis and the document's current text, which may be ahead of it and not parse."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
from lsprotocol import types as T

from tests.lsp.support import MLP_BP_MP_Z3, TINY_BP_MP_Z3, Session, apply_edit

pytestmark = pytest.mark.asyncio(loop_scope="session")

MLP = "mlp/bp_mp_z3.partir.py"
TINY = "transformer/tiny.partir.py"
LAYER_PARAMS = ("ln1_scale", "ln1_bias", "w_qkv", "w_o", "ln2_scale", "ln2_bias", "w_up",
                "b_up", "w_down")


def position_of(text: str, marked: str) -> T.Position:
    """The position of the "|" in `marked`, where `marked` without it occurs in `text`."""
    before, after = marked.split("|")
    start = text.index(before + after) + len(before)
    return T.Position(text.count("\n", 0, start), start - (text.rfind("\n", 0, start) + 1))


async def outline(session: Session, uri: str) -> list[T.DocumentSymbol]:
    return await session.client.text_document_document_symbol_async(
        T.DocumentSymbolParams(T.TextDocumentIdentifier(uri))) or []


async def analysed(session: Session, uri: str, timeout: float = 120.0) -> None:
    """Wait until the server holds an analysis of the document (its outline, which never
    waits for one, then has the program)."""
    deadline = time.monotonic() + timeout
    while not any(s.name == "program" for s in await outline(session, uri)):
        assert time.monotonic() < deadline, f"no analysis of {uri}: {session.describe()}"
        await asyncio.sleep(0.1)


async def complete(session: Session, uri: str, text: str, marked: str) -> list[T.CompletionItem]:
    result = await session.client.text_document_completion_async(T.CompletionParams(
        T.TextDocumentIdentifier(uri), position_of(text, marked),
        T.CompletionContext(T.CompletionTriggerKind.TriggerCharacter, trigger_character='"')))
    assert isinstance(result, T.CompletionList)
    return result.items


async def definition(session: Session, uri: str, text: str,
                     marked: str) -> list[tuple[Path, str]]:
    """Each location as its file and the text of its first line."""
    found = await session.client.text_document_definition_async(T.DefinitionParams(
        T.TextDocumentIdentifier(uri), position_of(text, marked)))
    out = []
    for loc in found or []:
        assert isinstance(loc, T.Location)
        path = Path(loc.uri.removeprefix("file://"))
        out.append((path, path.read_text().splitlines()[loc.range.start.line]))
    return out


async def test_completion_of_paths_and_axes_in_unfinished_code(session: Session) -> None:
    uri = session.open(TINY, TINY_BP_MP_Z3)
    await analysed(session, uri)
    # The document moves ahead of the analysis, and does not parse while a key is typed.
    text = TINY_BP_MP_Z3.replace('{"batch": 0}', '{"batch": 0, "params/layers/0/')
    session.change(uri, text)
    items = await complete(session, uri, text, '"params/layers/0/|')
    assert sorted(i.label for i in items) == sorted(f"params/layers/0/{n}"
                                                    for n in LAYER_PARAMS)
    w_up = next(i for i in items if i.label.endswith("/w_up"))
    assert w_up.detail == "input · tensor<32x128xf32>"
    assert w_up.text_edit.new_text == "params/layers/0/w_up"
    line = text.splitlines()[w_up.text_edit.range.start.line]
    r = w_up.text_edit.range
    assert line[r.start.character:r.end.character] == "params/layers/0/"

    # Once the unfinished text's analysis failed, the last traced one still answers.
    assert "SyntaxError" in (await session.diagnostics_for(uri))[0].message
    items = await complete(session, uri, text, '"params/layers/0/|')
    assert len(items) == len(LAYER_PARAMS)

    text = TINY_BP_MP_Z3.replace('{"batch": 0}', '{"batch": 0, ""}')
    session.change(uri, text)
    top = await complete(session, uri, text, '{"batch": 0, "|"}')
    assert [i.label for i in top] == ["params", "opt_state", "batch", "out"]
    assert top[0].kind == T.CompletionItemKind.Module
    assert top[0].detail == f"{9 * 4 + 1} inputs"

    text = TINY_BP_MP_Z3.replace('axis="model"', 'axis=""')
    session.change(uri, text)
    axes = await complete(session, uri, text, 'axis="|"')
    assert [(i.label, i.detail) for i in axes] == [("batch", "mesh axis of size 4"),
                                                   ("model", "mesh axis of size 2")]
    session.close(uri)


async def test_completion_of_inputs_outputs_and_tags(session: Session) -> None:
    uri = session.open("mlp/es.partir.py")
    await analysed(session, uri)
    text = session.workspace.path("mlp/es.partir.py").read_text().replace(
        '{"x": 1, "y": 1}', '{"x": 1, "y": 1, "')
    session.change(uri, text)
    items = await complete(session, uri, text, '"y": 1, "|')
    assert [(i.label, i.detail) for i in items] == [
        ("x", "input · tensor<256x8xf32>"), ("w1", "input · tensor<8x16xf32>"),
        ("w2", "input · tensor<16x8xf32>"), ("out", "output · tensor<256x8xf32>"),
        ("y", "tag · tensor<256x8xf32>")]
    session.close(uri)


async def test_definition_of_input_keys_and_tags(session: Session) -> None:
    uri = session.open(MLP)
    await analysed(session, uri)
    model = session.workspace.path("mlp/model.py")
    assert await definition(session, uri, MLP_BP_MP_Z3, '{"w|1": 1}') == [
        (model, "def mlp(x, w1, w2):")]

    es = session.workspace.path("mlp/es.partir.py").read_text()
    es_uri = session.open("mlp/es.partir.py")
    await analysed(session, es_uri)
    ((path, line),) = await definition(session, es_uri, es, '"|y": 1')
    assert path == model and 'partir.tag(mlp(x, w1, w2), "y")' in line
    session.close(es_uri)
    session.close(uri)


async def test_definition_of_a_pytree_prefix(session: Session) -> None:
    uri = session.open(TINY, TINY_BP_MP_Z3)
    await analysed(session, uri)
    found = await definition(session, uri, TINY_BP_MP_Z3, '{"par|ams": megatron')
    model = session.workspace.path("transformer/model.py")
    assert found[0] == (model, "def train_step(params, opt_state, batch):")
    assert len(set(found)) == len(found) > 1  # leaf-creation sites, each once
    assert any('"w_up"' in line for _, line in found)
    session.close(uri)


async def test_definition_of_an_imported_tactic(session: Session) -> None:
    text = TINY_BP_MP_Z3.replace("from schedules import megatron",
                                 "from schedules import BP, MP, Z3")
    text = text[:text.index("schedule = [")] + "schedule = [BP, MP, Z3]\n"
    uri = session.open(TINY, text)
    schedules = session.workspace.path("transformer/schedules.py")
    ((path, line),) = await definition(session, uri, text, "[BP, M|P")
    assert path == schedules and line.startswith("MP = ManualPartition(")
    session.close(uri)


async def test_outline_of_the_schedule(session: Session) -> None:
    uri = session.open(MLP)
    await analysed(session, uri)
    symbols = await outline(session, uri)
    assert [(s.name, s.detail) for s in symbols] == [
        ("program", "mlp"), ("mesh", "batch: 4, model: 2"), ("schedule", "3 tactics")]
    lines = MLP_BP_MP_Z3.splitlines()
    tactics = symbols[2].children
    assert [(s.name, s.detail) for s in tactics] == [
        ("1. BP", "axis batch · x"), ("2. MP", "axis model · w1"),
        ("3. Z3", "axis batch · w1, w2")]
    for symbol in tactics:
        r = symbol.range
        assert lines[r.start.line][r.start.character:r.end.character].startswith(
            "partir.ManualPartition(") and f'name="{symbol.name[3:]}"' in lines[r.start.line]
    session.close(uri)


async def quick_fixes(session: Session, uri: str,
                      diagnostic: T.Diagnostic) -> list[T.CodeAction]:
    found = await session.client.text_document_code_action_async(T.CodeActionParams(
        T.TextDocumentIdentifier(uri), diagnostic.range,
        T.CodeActionContext([diagnostic], only=[T.CodeActionKind.QuickFix])))
    return [a for a in found or [] if isinstance(a, T.CodeAction)]


def applied(text: str, action: T.CodeAction, uri: str) -> str:
    (edit,) = action.edit.changes[uri]
    return apply_edit(text, edit)


@pytest.mark.parametrize(("typo", "code", "replacement"), [
    ('{"w11": 1}, axis="model"', "UnknownInputError", "w1"),
    ('{"w1": 1}, axis="modle"', "AxisNotInMeshError", "model"),
])
async def test_quick_fix_replaces_an_unknown_name(session: Session, typo: str, code: str,
                                                  replacement: str) -> None:
    text = MLP_BP_MP_Z3.replace('{"w1": 1}, axis="model"', typo)
    uri = session.open(MLP, text)
    (error,) = [d for d in await session.diagnostics_for(uri)
                if d.severity == T.DiagnosticSeverity.Error]
    assert error.code == code
    await analysed(session, uri)
    actions = await quick_fixes(session, uri, error)
    assert actions, f"no quick fix for {error}"
    best = actions[0]
    assert best.title == f"Replace with '{replacement}'"
    assert best.kind == T.CodeActionKind.QuickFix and best.is_preferred
    assert list(best.diagnostics) == [error]
    fixed = applied(text, best, uri)
    assert fixed == MLP_BP_MP_Z3

    # Applied, the file analyses without errors.
    session.change(uri, fixed)
    assert [d for d in await session.diagnostics_for(uri)
            if d.severity == T.DiagnosticSeverity.Error] == []
    session.close(uri)


# Tactics written in a module the schedule file imports, as the shipped examples do
# (`from schedules import BP, MP, Z3`); MP names an input the MLP does not have.
TACTICS = '''\
import partir

BP = partir.ManualPartition({"x": 0}, axis="batch", name="BP")
MP = partir.ManualPartition({"w11": 1}, axis="model", name="MP")
'''
IMPORTING = '''\
from model import example_args, mlp
from tactics import BP, MP

import partir

program = partir.Program(mlp, *example_args())
mesh = {"batch": 4, "model": 2}
schedule = [BP, MP]
'''


async def test_feedback_where_an_imported_tactic_is_written(session: Session) -> None:
    """Diagnostics, hovers, completion and quick fixes in `tactics.py`, where the tactics
    of `schedule = [BP, MP]` are written, not only on their names in the list."""
    session.workspace.path("mlp/tactics.py").write_text(TACTICS)
    uri = session.open("mlp/imported.partir.py", IMPORTING)
    (error,) = await session.diagnostics_for(uri)
    assert error.code == "UnknownInputError"
    assert error.range.start == position_of(IMPORTING, "schedule = [BP, |MP]")
    written = error.related_information[0]  # where MP is written, first
    module_uri = session.workspace.uri("mlp/tactics.py")
    assert written.location.uri == module_uri and written.location.range.start.line == 3
    await analysed(session, uri)

    def there() -> list[T.Diagnostic] | None:
        p = session.latest(module_uri)
        return p.diagnostics if p is not None and p.diagnostics else None

    (typo,) = await session.wait_until("the diagnostics of tactics.py", there)
    assert typo.code == "UnknownInputError" and "did you mean 'w1'" in typo.message
    key = position_of(TACTICS, '{|"w11": 1}')
    assert (typo.range.start, typo.range.end.character) == (key, key.character + 5)

    session.open("mlp/tactics.py", TACTICS)
    (fix, *_) = await quick_fixes(session, module_uri, typo)
    assert applied(TACTICS, fix, module_uri) == TACTICS.replace('"w11"', '"w1"')
    hover = await session.hover(module_uri, *_pos(position_of(TACTICS, '{"|x": 0}')))
    assert hover is not None and "**`x`** · input · `tensor<256x8xf32>`" in hover
    hover = await session.hover(module_uri, *_pos(position_of(TACTICS, "BP = partir.Manual|")))
    assert hover is not None and hover.startswith("**Tactic 1 · BP** on axis `batch`")
    typing = TACTICS.replace('{"x": 0}', '{"x": 0, "w')
    session.change(module_uri, typing)
    items = await complete(session, module_uri, typing, '"x": 0, "w|')
    assert {"w1", "w2"} <= {i.label for i in items}
    session.close(module_uri)
    session.close(uri)


def _pos(p: T.Position) -> tuple[int, int]:
    return p.line, p.character
