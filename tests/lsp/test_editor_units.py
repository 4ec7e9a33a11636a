"""The pure parts of completion, go to definition, the outline and quick fixes, on schedule
texts and hand-made daemon results (no server, no daemon)."""

from __future__ import annotations

from pathlib import Path

import pytest
from lsprotocol import types as T
from partir_lsp import actions, completion, navigation, symbols
from partir_lsp.literals import AXIS, KEY, Slot, mesh_axes, parse, slot_at, slots
from partir_lsp.names import Names
from partir_lsp.positions import LineMap, Lines

from partir_daemon import protocol as P
from tests.lsp.support import MLP_BP_MP_Z3

MLP_LINES = MLP_BP_MP_Z3.splitlines()
BP_LINE = next(i for i, line in enumerate(MLP_LINES) if 'name="BP"' in line)


def at(text: str, marked: str) -> tuple[str, T.Position]:
    """`text`, and the position of the "|" in `marked` where `marked` without it first
    occurs in `text`."""
    before, after = marked.split("|")
    start = text.index(before + after)
    line = text.count("\n", 0, start)
    col = start - (text.rfind("\n", 0, start) + 1) + len(before)
    return text, T.Position(line, col)


def value(name: str, kind: str = "input", shape: tuple[int, ...] = (4, 8),
          definitions: tuple[tuple[str, int], ...] = ()) -> P.ExplainedValue:
    return P.ExplainedValue(name, kind, list(shape), "float32", [],
                            [P.SourceLocation(f, line) for f, line in definitions])


TRANSFORMER_VALUES = [
    value("params/embed", shape=(64, 32)),
    value("params/layers/0/w_up", shape=(32, 128)),
    value("params/layers/0/b_up", shape=(128,)),
    value("params/layers/1/w_up", shape=(32, 128)),
    value("opt_state/0/mu/embed", shape=(64, 32)),
    value("batch/tokens", shape=(8, 16)),
    value("y", kind="tag"),
    value("out/0", kind="output", shape=()),
    value("out/1", kind="output", shape=(4, 8)),
]


def result(values: list[P.ExplainedValue] | None = None,
           mesh: dict[str, int] | None = None) -> P.PartitionResult:
    return P.PartitionResult("/w/s.partir.py", 1, True, [], mesh=mesh,
                             values=values if values is not None else TRANSFORMER_VALUES)


# --- literals -------------------------------------------------------------------------------


def test_slots_of_a_parsed_schedule_are_its_keys_and_axes() -> None:
    lines = Lines.of(MLP_BP_MP_Z3)
    found = slots(parse(MLP_BP_MP_Z3), lines)
    assert [(s.role, s.value) for s in found] == [
        (KEY, "x"), (AXIS, "batch"), (KEY, "w1"), (AXIS, "model"), (KEY, "w1"), (KEY, "w2"),
        (AXIS, "batch")]
    bp = MLP_LINES[BP_LINE]
    assert found[0] == Slot(KEY, "x", BP_LINE, bp.index('"x"') + 1, bp.index('"x"') + 2)
    # name="BP" is no slot; the range is the contents, in UTF-16 units.
    assert found[1].range(lines) == T.Range(T.Position(BP_LINE, bp.index("batch")),
                                            T.Position(BP_LINE, bp.index("batch") + 5))


def test_slot_columns_count_characters_and_ranges_utf16() -> None:
    text = 'import partir\n# é\nt = partir.ManualPartition({"\U0001f600é": 0}, axis="b")\n'
    lines = Lines.of(text)
    (key, axis) = slots(parse(text), lines)
    assert key.value == "\U0001f600é" and (key.start, key.end) == (29, 31)
    assert key.range(lines).end.character == 32  # the emoji is two UTF-16 units
    assert axis.value == "b"


@pytest.mark.parametrize(("text", "marked", "expected"), [
    # A new key typed after the others, the quote not closed and the rest of the line code.
    (MLP_BP_MP_Z3.replace('{"w1": 1}', '{"w1": 1, "w'), '{"w1": 1, "w|', (KEY, "w")),
    # The same with the quote closed by the editor: a syntax error (`{"w1": 1, "w"}`).
    (MLP_BP_MP_Z3.replace('{"w1": 1}', '{"w1": 1, "w"}'), '{"w1": 1, "w|"}', (KEY, "w")),
    (MLP_BP_MP_Z3.replace('{"w1": 1}', '{"w1": 1, ""}'), '{"w1": 1, "|"}', (KEY, "")),
    # A set literal parses: the key of a dict being written.
    (MLP_BP_MP_Z3.replace('{"w1": 1}', '{"w"}'), '{"w|"}', (KEY, "w")),
    (MLP_BP_MP_Z3.replace('axis="model"', 'axis="mo'), 'axis="mo|', (AXIS, "mo")),
    (MLP_BP_MP_Z3.replace('axis="model"', 'axis="mo"'), 'axis="mo|"', (AXIS, "mo")),
    # Unfinished elsewhere in the file: the literal is still read from the text.
    (MLP_BP_MP_Z3 + "oops = (", '"w2|"', (KEY, "w2")),
    (MLP_BP_MP_Z3.replace('{"x": 0}', 'inputs={"x": 0}') + "oops = (", '{"x|"', (KEY, "x")),
])
def test_slot_at_the_cursor_also_in_unfinished_code(text: str, marked: str,
                                                    expected: tuple[str, str]) -> None:
    text, position = at(text, marked)
    lines = Lines.of(text)
    found = slot_at(text, lines, position.line, position.character)
    assert found is not None and (found.role, found.value) == expected
    assert found.start <= position.character <= found.end


@pytest.mark.parametrize("marked", [
    'name="B|P"',  # a string argument that is neither
    'mesh = {"bat|ch"',  # a dict that is not a tactic's
    '{"do|c"',  # a docstring
    '{"comm|ent"',  # a comment
])
@pytest.mark.parametrize("suffix", ["", "oops = ("])
def test_no_slot_outside_tactic_keys_and_axes(marked: str, suffix: str) -> None:
    text = ('"""ManualPartition({"doc": 0})"""\n# ManualPartition({"comment": 0})\n'
            + MLP_BP_MP_Z3 + suffix)
    text, position = at(text, marked)
    assert slot_at(text, Lines.of(text), position.line, position.character) is None


def test_mesh_axes_from_the_text() -> None:
    assert mesh_axes(MLP_BP_MP_Z3) == ["batch", "model"]
    assert mesh_axes(MLP_BP_MP_Z3 + "oops = (") == ["batch", "model"]
    assert mesh_axes('mesh = partir.Mesh({"data": 8})\n') == ["data"]
    assert mesh_axes("from schedules import MESH\nmesh = MESH\n") == []


# --- names ----------------------------------------------------------------------------------


def test_names_are_inputs_outputs_and_tags_with_their_prefixes() -> None:
    names = Names.of(TRANSFORMER_VALUES)
    assert names.paths()[:5] == ["params", "params/embed", "params/layers",
                                 "params/layers/0", "params/layers/0/w_up"]
    assert names.paths()[-3:] == ["out", "out/0", "out/1"]
    assert names.children("") == ["params", "opt_state", "batch", "y", "out"]
    assert names.children("out/") == ["out/0", "out/1"]
    assert names.children("params/l") == ["params/embed", "params/layers"]
    assert names.children("params/layers/") == ["params/layers/0", "params/layers/1"]
    assert [v.name for v in names.under("params/layers/0")] == [
        "params/layers/0/w_up", "params/layers/0/b_up"]
    assert names.under("params/lay") == []


# --- completion -----------------------------------------------------------------------------


def complete(text: str, marked: str, res: P.PartitionResult | None) -> T.CompletionList:
    text, position = at(text, marked)
    found = completion.complete(text, position, res)
    assert found is not None
    return found


def test_completion_of_keys_offers_the_next_path_segment() -> None:
    text = MLP_BP_MP_Z3.replace('{"w1": 1}', '{"params/layers/"}')
    items = complete(text, '"params/layers/|"', result()).items
    assert [i.label for i in items] == ["params/layers/0", "params/layers/1"]
    assert items[0].kind == T.CompletionItemKind.Module and items[0].detail == "2 inputs"
    # The whole path replaces the literal's contents.
    line = text.splitlines()[items[0].text_edit.range.start.line]
    r = items[0].text_edit.range
    assert line[r.start.character:r.end.character] == "params/layers/"
    assert items[0].text_edit.new_text == "params/layers/0"

    leaves = complete(text.replace("params/layers/", "params/layers/0/"),
                      '"params/layers/0/|"', result()).items
    assert [(i.label, i.detail) for i in leaves] == [
        ("params/layers/0/w_up", "input · tensor<32x128xf32>"),
        ("params/layers/0/b_up", "input · tensor<128xf32>")]


def test_completion_of_a_new_key_offers_inputs_outputs_and_tags() -> None:
    text = MLP_BP_MP_Z3.replace('{"w1": 1}', '{"w1": 1, "')
    items = complete(text, '{"w1": 1, "|', result()).items
    assert [(i.label, i.kind) for i in items] == [
        ("params", T.CompletionItemKind.Module), ("opt_state", T.CompletionItemKind.Module),
        ("batch", T.CompletionItemKind.Module), ("y", T.CompletionItemKind.Reference),
        ("out", T.CompletionItemKind.Module)]
    assert items[3].detail == "tag · tensor<4x8xf32>"
    assert items[4].detail == "2 outputs"
    items = complete(text.replace('"w1": 1, "', '"w1": 1, "out/'), '"out/|', result()).items
    assert [(i.label, i.detail) for i in items] == [("out/0", "output · tensor<f32>"),
                                                     ("out/1", "output · tensor<4x8xf32>")]


def test_completion_of_axes_from_the_result_else_the_text() -> None:
    text = MLP_BP_MP_Z3.replace('axis="model"', 'axis=""')
    items = complete(text, 'axis="|"', result(mesh={"batch": 4, "model": 2})).items
    assert [(i.label, i.detail) for i in items] == [("batch", "mesh axis of size 4"),
                                                    ("model", "mesh axis of size 2")]
    items = complete(text + "oops = (", 'axis="|"', None).items
    assert [i.label for i in items] == ["batch", "model"]


def test_no_completion_outside_slots_or_without_values() -> None:
    text, position = at(MLP_BP_MP_Z3, "program = part|ir")
    assert completion.complete(text, position, result()) is None
    text, position = at(MLP_BP_MP_Z3, '{"w|1"')
    assert completion.complete(text, position, None) is None


# --- go to definition -----------------------------------------------------------------------


def test_definitions_of_a_prefix_are_those_of_its_values_deduplicated(tmp_path: Path) -> None:
    model = tmp_path / "model.py"
    model.write_text("def step(params):\n    return dict(\n        w_up=1, b_up=2)\n")
    m = str(model)
    values = [value("params/w_up", definitions=((m, 1), (m, 3))),
              value("params/b_up", definitions=((m, 1), (m, 3), (m, 2)))]
    text = MLP_BP_MP_Z3.replace('{"w1": 1}', '{"params": 1}')
    text, position = at(text, '"par|ams"')
    found = navigation.definitions(str(tmp_path / "s.partir.py"), text, position,
                                   result(values), str(tmp_path))
    assert [(loc.uri, loc.range.start.line) for loc in found] == [
        (model.as_uri(), 0), (model.as_uri(), 2), (model.as_uri(), 1)]
    # The whole line, without its indentation.
    assert found[1].range == T.Range(T.Position(2, 8), T.Position(2, 23))


def test_definition_of_a_tactic_follows_imports(tmp_path: Path) -> None:
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("from .tactics import BP as DP\n")
    (tmp_path / "pkg" / "tactics.py").write_text(
        "import partir\n\nBP = partir.ManualPartition({'x': 0}, axis='batch')\n")
    (tmp_path / "local.py").write_text("MP = 1\n")
    text = ("import local\nfrom pkg import DP\nimport partir\n"
            "Z3 = partir.ManualPartition({'w': 0}, axis='batch')\n"
            "schedule = [DP, local.MP, Z3]\n")
    path = str(tmp_path / "s.partir.py")

    def goto(marked: str) -> list[tuple[str, int, int]]:
        t, position = at(text, marked)
        return [(loc.uri, loc.range.start.line, loc.range.start.character)
                for loc in navigation.definitions(path, t, position, None, str(tmp_path))]

    assert goto("[D|P") == [((tmp_path / "pkg" / "tactics.py").as_uri(), 2, 0)]
    assert goto("local.M|P") == [((tmp_path / "local.py").as_uri(), 0, 0)]
    assert goto("Z|3]") == [(Path(path).as_uri(), 3, 0)]
    assert goto("sched|ule") == []


def test_definition_of_an_import_the_workspace_lacks_is_the_import(tmp_path: Path) -> None:
    text = "from elsewhere import BP\nschedule = [BP]\n"
    path = str(tmp_path / "s.partir.py")
    t, position = at(text, "[B|P]")
    (loc,) = navigation.definitions(path, t, position, None, str(tmp_path))
    assert (loc.uri, loc.range.start.line) == (Path(path).as_uri(), 0)


# --- outline --------------------------------------------------------------------------------


def test_outline_nests_the_tactics_under_the_schedule() -> None:
    lines = Lines.of(MLP_BP_MP_Z3)

    def rng(line: int, start: str, end: str) -> P.Range:
        text = MLP_LINES[line]
        return P.Range(line + 1, text.index(start), line + 1, text.rindex(end) + len(end))

    schedule_line = MLP_LINES.index("schedule = [")
    res = result(mesh={"batch": 4, "model": 2})
    res.function = "mlp"
    res.program_range = rng(MLP_LINES.index("program = partir.Program(mlp, *example_args())"),
                            "program", ")")
    res.mesh_range = rng(MLP_LINES.index('mesh = {"batch": 4, "model": 2}'), "mesh", "}")
    res.schedule_range = P.Range(schedule_line + 1, 0, schedule_line + 5, 1)
    res.tactics = [P.TacticResult(i, name, axis, rng(BP_LINE + i - 1, "partir", ")"),
                   keys, False, "", {})
                   for i, name, axis, keys in [(1, "BP", "batch", {"x": P.Range(1, 0, 1, 1)}),
                                               (2, "MP", "model", {}),
                                               (3, "Z3", "batch", {"w1": P.Range(1, 0, 1, 1),
                                                                   "w2": P.Range(1, 0, 1, 1)})]]
    out = symbols.outline(res, lines, LineMap(lines, lines))
    assert [(s.name, s.detail, s.kind) for s in out] == [
        ("program", "mlp", T.SymbolKind.Function),
        ("mesh", "batch: 4, model: 2", T.SymbolKind.Object),
        ("schedule", "3 tactics", T.SymbolKind.Array)]
    assert out[1].selection_range.end.character == 4  # the name "mesh"
    assert [(s.name, s.detail) for s in out[2].children] == [
        ("1. BP", "axis batch · x"), ("2. MP", "axis model"), ("3. Z3", "axis batch · w1, w2")]
    assert out[2].children[0].range.start == T.Position(BP_LINE, 4)

    # The text moved on: a line inserted above the mesh, the MP line being edited.
    edited = MLP_BP_MP_Z3.replace("mesh =", "# comment\nmesh =").replace('name="MP"', 'name="M')
    moved = symbols.outline(res, lines, LineMap(lines, Lines.of(edited)))
    assert [(s.name, s.range.start.line) for s in moved] == [
        ("program", out[0].range.start.line), ("mesh", out[1].range.start.line + 1),
        ("schedule", schedule_line + 1)]
    assert [(s.name, s.range.start.line) for s in moved[2].children] == [
        ("1. BP", BP_LINE + 1), ("3. Z3", BP_LINE + 3)]


def test_outline_without_ranges_is_empty() -> None:
    lines = Lines.of("")
    assert symbols.outline(result(), lines, LineMap(lines, lines)) == []


# --- quick fixes ----------------------------------------------------------------------------


def diagnostic(text: str, needle: str, code: str) -> T.Diagnostic:
    start = text.index(needle)
    line = text.count("\n", 0, start)
    col = start - (text.rfind("\n", 0, start) + 1)
    return T.Diagnostic(T.Range(T.Position(line, col), T.Position(line, col + len(needle))),
                        "...", code=code, source="partir")


def fixes(text: str, res: P.PartitionResult | None,
          diags: list[T.Diagnostic]) -> list[tuple[str, str, bool]]:
    out = []
    for action in actions.quick_fixes("file:///s.partir.py", text, res, diags):
        assert action.kind == T.CodeActionKind.QuickFix
        (edit,) = action.edit.changes["file:///s.partir.py"]
        line = text.splitlines()[edit.range.start.line]
        replaced = line[edit.range.start.character:edit.range.end.character]
        out.append((action.title, f"{replaced}->{edit.new_text}", bool(action.is_preferred)))
        assert action.diagnostics == diags[:1] or action.diagnostics == diags[1:]
    return out


MLP_VALUES = [value("x"), value("w1"), value("w2")]


def test_quick_fix_of_an_unknown_input_replaces_the_key() -> None:
    text = MLP_BP_MP_Z3.replace('{"w1": 1}', '{"w11": 1}')
    d = diagnostic(text, '"w11"', "UnknownInputError")
    assert fixes(text, result(MLP_VALUES), [d]) == [("Replace with 'w1'", "w11->w1", True)]
    text = MLP_BP_MP_Z3.replace('{"w1": 1}', '{"w": 1}')
    d = diagnostic(text, '"w"', "UnknownInputError")
    assert fixes(text, result(MLP_VALUES), [d]) == [
        ("Replace with 'w1'", "w->w1", True), ("Replace with 'w2'", "w->w2", False)]
    # Prefixes too, and a range over the whole tactic finds the key that names nothing.
    text = MLP_BP_MP_Z3.replace('{"x": 0}', '{"batch/tokens": 0, "param": 0}')
    d = diagnostic(text, 'partir.ManualPartition({"batch', "UnknownInputError")
    d.range.end = T.Position(d.range.end.line, len(text.splitlines()[d.range.end.line]))
    assert fixes(text, result(), [d])[0] == ("Replace with 'params'", "param->params", True)


def test_quick_fix_of_an_unknown_axis_replaces_the_axis() -> None:
    text = MLP_BP_MP_Z3.replace('axis="model"', 'axis="modle"')
    d = diagnostic(text, '"modle"', "AxisNotInMeshError")
    assert fixes(text, result(MLP_VALUES, {"batch": 4, "model": 2}), [d]) == [
        ("Replace with 'model'", "modle->model", True)]
    # Without an analysis (or while the text does not parse): the text's mesh.
    assert fixes(text + "oops = (", None, [d]) == [
        ("Replace with 'model'", "modle->model", True)]


def test_no_quick_fix_for_other_diagnostics_or_without_matches() -> None:
    text = MLP_BP_MP_Z3.replace('{"w1": 1}', '{"w11": 1}')
    d = diagnostic(text, '"w11"', "IndivisibleDimensionError")
    assert fixes(text, result(MLP_VALUES), [d]) == []
    d = diagnostic(text, '"w11"', "UnknownInputError")
    assert fixes(text, result([value("completely_different")]), [d]) == []
