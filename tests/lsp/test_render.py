"""The pure parts of the server: positions, titles, layout tables and model markers, on
hand-made daemon results (no server, no daemon)."""

from __future__ import annotations

from lsprotocol import types as T
from partir_lsp import pictures, render
from partir_lsp.positions import LineMap, Lines, contains, to_range
from partir_lsp.settings import Settings

from partir.conflict_groups import advice, meaning
from partir_daemon import protocol as P


def test_utf16_columns() -> None:
    lines = Lines.of('x = "\U0001f600é" + y\n')
    # The emoji is one character and two UTF-16 code units.
    assert lines.utf16_col(0, 6) == 7
    assert lines.char_col(0, 7) == 6
    assert to_range(P.Range(1, 5, 1, 8), lines) == T.Range(T.Position(0, 5), T.Position(0, 9))


def test_contains_is_end_inclusive_for_hovers() -> None:
    r = P.Range(3, 4, 3, 8)
    assert contains(r, 3, 4) and contains(r, 3, 8)
    assert not contains(r, 3, 3) and not contains(r, 2, 5) and not contains(r, 3, 9)


def test_lens_title_and_hint() -> None:
    metadata = {"collectives": {"all_gather": 2, "all_reduce": 1, "reduce_scatter": 0,
                                "all_to_all": 0, "all_slice": 3},
                "cost": {"step_time_s": 0.00123, "peak_memory_bytes": 4.5 * 2**20},
                "conflicts": [{"kind": "axis_in_scope"}]}
    assert render.lens_title(metadata) == "+AG 2 +AR 1 +RS 0 +A2A 0 · 1.23 ms · 4.5 MiB/device"
    assert render.hint_label(metadata) == "AG 2 AR 1 · 1.23 ms · 1 conflict"
    assert render.lens_title({"collectives": {}}) == "+AG 0 +AR 0 +RS 0 +A2A 0"
    # collective permutes only where the program has some
    assert render.lens_title({"collectives": {"collective_permute": 2}}) == \
        "+AG 0 +AR 0 +RS 0 +A2A 0 +CP 2"
    assert render.hint_label({"collectives": {"collective_permute": 2}}) == "CP 2"
    # Within what VS Code shows of a hint, the cost and conflicts included.
    busy = {"collectives": {"all_gather": 50, "all_reduce": 21, "reduce_scatter": 8,
                            "all_to_all": 2},
            "cost": {"step_time_s": 0.00407}, "conflicts": [{"kind": "axis_in_scope"}] * 93}
    assert render.hint_label(busy) == "AG 50 AR 21 RS 8 A2A 2 · 4.07 ms · ⚠ 93"
    assert len(render.hint_label(busy)) <= render.MAX_HINT


def test_sharding_picture_of_a_2d_sharding() -> None:
    mesh = pictures.Mesh.of({"batch": 4, "model": 2})
    tiles = pictures.tiling([8, 16], [["batch"], ["model"]], mesh)
    assert tiles.cols == ["dim 1: 1/2", "dim 1: 2/2"]
    assert tiles.rows == [f"dim 0: {i}/4" for i in range(1, 5)]
    assert tiles.cells == [[[0], [1]], [[2], [3]], [[4], [5]], [[6], [7]]]
    rows = pictures.markdown(tiles).split("\n\n", 1)[1].splitlines()
    assert rows[0] == "| tile | dim 1: 1/2 | dim 1: 2/2 |"
    # Each tile's cell is led by its own colour.
    assert rows[2:4] == ["| dim 0: 1/4 | 🟥 0 | 🟦 1 |", "| dim 0: 2/4 | 🟩 2 | 🟨 3 |"]
    # Sharded on "model" only: each tile is replicated over the four "batch" devices.
    tiles = pictures.tiling([8, 16], [[], ["model"]], mesh)
    assert tiles.rows == ["whole"] and tiles.cells == [[[0, 2, 4, 6], [1, 3, 5, 7]]]
    # Two axes on one dimension, the first major.
    tiles = pictures.tiling([8], [["model", "batch"]], mesh)
    assert tiles.cells == [[[0], [2], [4], [6], [1], [3], [5], [7]]]
    # In a terminal: the same cells on ANSI background colours, or squares without.
    drawn = pictures.terminal(pictures.tiling([8, 16], [["batch"], ["model"]], mesh), True)
    assert drawn.splitlines()[2].startswith("dim 0: 1/4 \x1b[48;5;160m")
    assert "🟥 0" in pictures.terminal(tiles, False)


def test_partition_spec_notation() -> None:
    assert pictures.partition_spec([["batch"], []]) == "P('batch', None)"
    assert pictures.partition_spec([["model", "batch"]]) == "P(('model', 'batch'))"
    assert pictures.partition_spec([]) == "P()"


def test_collective_markers_group_by_model_line() -> None:
    collectives = [
        P.AttributedCollective("all_reduce", ["model"], 1, None,
                               P.SourceLocation("/ws/model.py", 17, "mlp"), 2, "MP"),
        P.AttributedCollective("all_gather", ["batch"], 2, "w1",
                               P.SourceLocation("/ws/model.py", 17, "mlp"), 3, "Z3"),
        P.AttributedCollective("all_gather", ["batch"], 1, "w2",
                               P.SourceLocation("<unknown>", 0), 3, "Z3"),
        P.AttributedCollective("all_to_all", ["model"], 1, "h",
                               P.SourceLocation("/ws/layers.py", 3, "f"), 2, "MP"),
    ]
    markers = render.collective_markers(collectives, "/ws/s.partir.py")
    assert list(markers) == ["/ws/layers.py", "/ws/model.py"]
    (marker,) = markers["/ws/model.py"]
    assert (marker.range.start.line, marker.range.end.line) == (16, 17)  # the whole line
    assert marker.severity == T.DiagnosticSeverity.Information
    assert marker.message == ("s.partir.py: all_reduce ×1 over 'model' (tactic 2, MP); "
                              "all_gather ×2 over 'batch' of `w1` (tactic 3, Z3)")


def test_settings_from_options_and_configuration() -> None:
    s = Settings()
    assert s.update({"collectiveMarkersInModel": True, "debounceMs": 120})
    assert (s.collective_markers_in_model, s.debounce_ms) == (True, 120)
    assert s.update({"partir": {"debounceMs": 99999, "pythonPath": "/x"}})
    assert s.debounce_ms == 5000
    assert not s.update({"debounceMs": "fast", "collectiveMarkersInModel": 1})
    assert not s.update(None)


SCHEDULE = '''\

import partir

program = partir.Program(f, x)
mesh = {"batch": 4}
schedule = [
    partir.ManualPartition({"x": 0}, axis="batch", name="BP"),
]
'''
TACTIC = P.Range(7, 4, 7, 61)  # the call, without the comma after it


def tactic(conflicts: list[dict], reused: bool = False) -> P.TacticResult:
    return P.TacticResult(1, "BP", "batch", TACTIC, {"x": P.Range(7, 28, 7, 31)}, reused,
                          "s1", {"collectives": {"all_gather": 1}, "conflicts": conflicts,
                                 "actions": ['tile<%x,0,"batch">', "propagate"]})


def result(*tactics: P.TacticResult, diagnostics: list[P.Diagnostic] | None = None,
           **fields: object) -> P.PartitionResult:
    return P.PartitionResult("/ws/s.partir.py", 1, not diagnostics, diagnostics or [],
                             mesh={"batch": 4}, tactics=list(tactics), **fields)


def test_conflicts_are_grouped_by_kind_op_and_model_line() -> None:
    layers = [{"kind": "axis_in_scope", "op": "dot_general", "axis": "batch",
               "loc": {"file": "/ws/model.py", "line": 12},
               "choices": [f"loop 'batch' [%r{i}]", "operand 1 tiled #tile<0>"],
               "detail": "the op is already inside a loop over this axis"}
              for i in range(30)]
    other = {"kind": "multiple_matches", "op": "add", "axis": "batch",
             "loc": {"file": "/ws/model.py", "line": 14}, "choices": ["a", "b"], "detail": ""}
    diags = render.schedule_diagnostics(result(tactic([*layers, other])),
                                        Lines.of(SCHEDULE))
    assert [d.code for d in diags] == ["conflict/axis_in_scope", "conflict/multiple_matches"]
    grouped = diags[0]
    # What it costs and the usual fix follow what it means.
    assert grouped.message == ("conflict in tactic 1 (BP) at `dot_general` on axis 'batch', "
                               "30 times: the op is already inside a loop over this axis. "
                               + advice("axis_in_scope"))
    assert "all_gather" in grouped.message and "ZeRO-3" in grouped.message
    # On the tactic's callee, not the whole call: hovers on its keys are not led by it.
    assert grouped.range == T.Range(T.Position(6, 4), T.Position(6, 26))
    site, *occurrences = grouped.related_information
    assert site.location.uri == "file:///ws/model.py"
    assert site.location.range.start.line == 11 and site.location.range.end.line == 12
    assert len(occurrences) == render.MAX_RELATED + 1
    assert occurrences[0].message == \
        "on axis 'batch': loop 'batch' [%r0] vs operand 1 tiled #tile<0>"
    assert occurrences[-1].message == f"… and {30 - render.MAX_RELATED} more"
    assert diags[1].message.endswith("several shardings of the op fit and none was chosen. "
                                     + advice("multiple_matches"))


def test_a_dimension_that_needs_replication_says_why() -> None:
    why = {"kind": "needs_replication", "op": "sort", "axis": "batch",
           "loc": {"file": "/ws/model.py", "line": 9}, "choices": [],
           "detail": "dimension 1 of operand 0 needs replication"}
    (d,) = render.schedule_diagnostics(result(tactic([why])), Lines.of(SCHEDULE))
    assert d.code == "conflict/needs_replication"
    assert d.message.endswith(f"{meaning('needs_replication')}. "
                              + advice("needs_replication"))
    _, occurrence = d.related_information
    assert occurrence.message == "on axis 'batch': dimension 1 of operand 0 needs replication"


def test_long_messages_are_cut_with_the_whole_text_related() -> None:
    long = "tracing the program raised TypeError: " + "shapes (8, 16) and (4, 2) " * 40
    diags = render.schedule_diagnostics(result(diagnostics=[P.Diagnostic(
        "tracing", long, "/ws/s.partir.py", 4, P.Range(4, 10, 4, 33))]), Lines.of(SCHEDULE))
    (d,) = diags
    assert len(d.message) <= render.MAX_MESSAGE and d.message.endswith("…")
    assert d.message[:-1] in long
    (whole,) = d.related_information
    assert whole.message == long and whole.location.range == d.range


def test_diagnostics_never_have_empty_ranges() -> None:
    lines = Lines.of(SCHEDULE)
    at_a_point = P.Diagnostic("syntax", "invalid syntax", "/ws/s.partir.py", 5,
                              P.Range(5, 7, 5, 7))
    whole_file = P.Diagnostic("missing", "no `schedule`", "/ws/s.partir.py", 0)
    conflict = {"kind": "unsupported", "op": "fft", "axis": "batch",
                "loc": {"file": "/ws/m.py", "line": 3}, "choices": [], "detail": ""}
    unplaced = P.TacticResult(1, "BP", "batch", None, {}, False, "s1",
                              {"conflicts": [conflict]})
    diags = render.schedule_diagnostics(result(
        unplaced, diagnostics=[at_a_point, whole_file],
        schedule_range=P.Range(6, 11, 6, 11)), lines)
    # The point's line, the first line with text (line 1 is blank), the schedule's line.
    assert [(d.range.start, d.range.end) for d in diags] == [
        (T.Position(4, 0), T.Position(4, 19)), (T.Position(1, 0), T.Position(1, 13)),
        (T.Position(5, 0), T.Position(5, 12))]
    (site,) = diags[2].related_information  # no choices: nothing more to say
    assert site.location.range == T.Range(T.Position(2, 0), T.Position(3, 0))


def test_tactic_hover_speaks_in_user_terms() -> None:
    conflict = {"kind": "axis_in_scope", "op": "dot_general", "axis": "batch",
                "loc": {"file": "/ws/model.py", "line": 12}, "choices": [], "detail": ""}
    text = render.tactic_hover(result(tactic([conflict, conflict], reused=True)), 1)
    assert text.startswith("**Tactic 1 · BP** on axis `batch`\n")
    assert "cache" not in text and "axis_in_scope" not in text
    assert "Conflicts (warnings on this tactic): 2 where the op is already inside a loop " \
           "over this axis" in text


def test_key_values_select_inputs_outputs_and_tags_under_a_prefix() -> None:
    def value(name: str, kind: str) -> P.ExplainedValue:
        return P.ExplainedValue(name, kind, [8], "float32",
                                [P.ShardingStep(1, "BP", [["batch"]], [2], True)])

    def moving(name: str | None) -> P.AttributedCollective:
        return P.AttributedCollective("all_gather", ["batch"], 1, name,
                                      P.SourceLocation("/ws/model.py", 3), 1, "BP")

    values = [value("params/w", "input"), value("params/b", "input"),
              value("params2", "input"), value("out/params/w", "output"),
              value("params", "tag")]
    collectives = [moving("params/w"), moving("params2"), moving(None)]
    explained = render.key_values(result(values=values, collectives=collectives), "params")
    assert [(v.name, v.kind) for v in explained.values] == [
        ("params/w", "input"), ("params/b", "input"), ("params", "tag")]
    assert [c.value for c in explained.collectives] == ["params/w"]
    assert render.key_values(result(values=values), "params/w").values == [values[0]]
    assert render.key_values(result(values=values), "out").values == [values[3]]


def test_every_lens_runs_a_server_command() -> None:
    lenses = render.code_lenses("file:///ws/s.partir.py", result(tactic([])),
                                Lines.of(SCHEDULE))
    assert [(lens.command.command, lens.command.arguments) for lens in lenses] == [
        (render.SHOW_IR, [{"uri": "file:///ws/s.partir.py", "tactic": 1, "level": "hlo"}]),
        (render.SHOW_IR, [{"uri": "file:///ws/s.partir.py", "tactic": 1}]),
        (render.RUN_JOB, [{"uri": "file:///ws/s.partir.py"}])]
    assert lenses[0].command.title == "BP: +AG 1 +AR 0 +RS 0 +A2A 0"
    assert lenses[1].command.title == "Show IR after BP"


def test_line_map_keeps_results_on_unchanged_lines() -> None:
    old = Lines.of(SCHEDULE)
    edited = SCHEDULE.replace("import partir\n", "import partir\nimport jax\n").replace(
        'mesh = {"batch": 4}', 'mesh = {"batch": 2}')
    moved = LineMap(old, Lines.of(edited))
    lenses = render.code_lenses("file:///ws/s.partir.py", result(tactic([])), old)
    assert {moved.lens(lens).range.start.line for lens in lenses} == {7}  # one line down
    (hint,) = render.inlay_hints(result(tactic([])), old)
    assert moved.hint(hint).position == T.Position(7, 62)
    assert moved.to_old(7) == 6 and moved.to_old(1) == 1
    assert moved.to_new(4) is None and moved.to_old(2) is None  # the mesh line, the import
    # A range over a line that changed is dropped.
    assert moved.span(T.Range(T.Position(3, 0), T.Position(4, 5))) is None
    assert LineMap(old, old).to_new(4) == 4


def test_an_input_hover_reads_a_history_of_changes() -> None:
    """A value's history holds the tactics that changed its sharding and the last one:
    after tactic 2 of 4 it is as tactic 1 left it, before that unsharded."""
    w = P.ExplainedValue("w", "input", [8, 4], "float32", [
        P.ShardingStep(2, "MP", [[], ["model"]], [8, 2], True),
        P.ShardingStep(4, "Z3", [["batch"], ["model"]], [2, 2], True)])
    explained = P.ExplainResult("/ws/s.partir.py", 1, [w], [])
    mesh = {"batch": 4, "model": 2}
    before = render.input_hover(explained, "w", 1, "BP", mesh)
    assert "| after tactic 1 (BP) | `[{}, {}]` | `P(None, None)` | `[8, 4]` | 128 B |" in before
    between = render.input_hover(explained, "w", 3, "EMB", mesh)
    assert "| after tactic 3 (EMB) |" in between and "`[8, 2]`" in between
    assert "at the end (tactic 4, Z3)" in between and "`[2, 2]`" in between


ONE_LINE = '''\
mesh = {"batch": 4}
schedule = [BP, MP, Z3]
'''


def test_a_one_line_schedule_names_each_tactic_and_hints_after_it() -> None:
    """`schedule = [BP, MP, Z3]`: VS Code puts the lenses of a line on one row, and the
    hints of a line at its end would pile up there."""
    tactics = [P.TacticResult(i + 1, name, "batch", P.Range(2, col, 2, col + 2), {}, False,
                              f"s{i}", {"collectives": {"all_reduce": i}})
               for i, (name, col) in enumerate([("BP", 12), ("MP", 16), ("Z3", 20)])]
    lines = Lines.of(ONE_LINE)
    one_line = result(*tactics, schedule_range=P.Range(2, 0, 2, 23))
    hints = render.inlay_hints(one_line, lines)
    assert [(h.position.line, h.position.character) for h in hints] == [
        (1, 14), (1, 18), (1, 22)]  # each right after its tactic's name
    assert [h.label for h in hints] == ["no collectives", "AR 1", "AR 2"]
    titles = [lens.command.title for lens in render.code_lenses("file:///ws/s.partir.py",
                                                                one_line, lines)]
    assert titles == ["BP: +AG 0 +AR 0 +RS 0 +A2A 0", "Show IR after BP",
                      "MP: +AG 0 +AR 1 +RS 0 +A2A 0", "Show IR after MP",
                      "Z3: +AG 0 +AR 2 +RS 0 +A2A 0", "Show IR after Z3",
                      "Run partitioned job"]  # once, for the whole schedule
    # With costs, compact: VS Code cuts a line's hints at MAX_HINT characters in all.
    for i, t in enumerate(tactics):
        t.metadata["cost"] = {"step_time_s": 0.003 + i * 1e-3, "peak_memory_bytes": 1024.0}
    tactics[2].metadata["conflicts"] = [{"kind": "axis_in_scope"}] * 93
    labels = [h.label for h in render.inlay_hints(one_line, lines)]
    assert labels == ["3.00 ms", "4.00 ms", "5.00 ms · ⚠ 93"]
    assert sum(len(label) + 1 for label in labels) <= render.MAX_HINT
    stale = render.code_lenses("file:///ws/s.partir.py", one_line, lines, stale=True)
    assert stale[0].command.title.startswith(render.STALE + "BP: ")


def test_a_tactic_hover_leads_with_its_summary() -> None:
    conflict = {"kind": "axis_in_scope", "op": "dot_general", "axis": "batch",
                "loc": {"file": "/ws/model.py", "line": 12}, "choices": [], "detail": ""}
    many = tactic([conflict])
    many.metadata["actions"] = [f'tile<%w{i},0,"batch">' for i in range(60)]
    many.metadata["cost"] = {"step_time_s": 0.002, "peak_memory_bytes": 1024.0,
                             "compute_time_s": 0.001, "communication_time_s": 0.001}
    parts = render.tactic_hover(result(many), 1).split("\n\n")
    assert parts[1].startswith("Estimated on ")
    assert parts[2].startswith("| collective |")
    assert parts[3].startswith("Conflicts (warnings on this tactic): 1 where")
    assert parts[-1].startswith("Actions (60): `tile<%w0,0,\"batch\">`")
    assert parts[-1].endswith(f"and {60 - render.MAX_ACTIONS} more")
