"""The pure parts of the server: positions, titles, layout tables and model markers, on
hand-made daemon results (no server, no daemon)."""

from __future__ import annotations

from lsprotocol import types as T
from partir_lsp import render
from partir_lsp.positions import Lines, contains, to_range
from partir_lsp.settings import Settings

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


def test_layout_table_of_a_2d_sharding() -> None:
    mesh = render.Mesh.of({"batch": 4, "model": 2})
    table = render.layout_table([8, 16], [["batch"], ["model"]], mesh)
    rows = table.split("\n\n", 1)[1].splitlines()
    assert rows[0] == "| tile | dim 1: 1/2 | dim 1: 2/2 |"
    assert rows[2:] == ["| dim 0: 1/4 | 0 | 1 |", "| dim 0: 2/4 | 2 | 3 |",
                        "| dim 0: 3/4 | 4 | 5 |", "| dim 0: 4/4 | 6 | 7 |"]
    # Sharded on "model" only: each tile is replicated over the four "batch" devices.
    rows = render.layout_table([8, 16], [[], ["model"]], mesh).split("\n\n", 1)[1]
    assert rows.splitlines()[2] == "| whole | 0 2 4 6 | 1 3 5 7 |"
    # Two axes on one dimension, the first major.
    rows = render.layout_table([8], [["model", "batch"]], mesh).split("\n\n", 1)[1]
    assert rows.splitlines()[2] == "| whole | 0 | 2 | 4 | 6 | 1 | 3 | 5 | 7 |"


def test_collective_markers_group_by_model_line() -> None:
    explained = P.ExplainResult("/ws/s.partir.py", 3, [], [
        P.AttributedCollective("all_reduce", ["model"], 1, None,
                               P.SourceLocation("/ws/model.py", 17, "mlp"), 2, "MP"),
        P.AttributedCollective("all_gather", ["batch"], 2, "w1",
                               P.SourceLocation("/ws/model.py", 17, "mlp"), 3, "Z3"),
        P.AttributedCollective("all_gather", ["batch"], 1, "w2",
                               P.SourceLocation("<unknown>", 0), 3, "Z3"),
    ])
    (marker,) = render.collective_markers(explained, "/ws/s.partir.py")
    assert marker.range.start.line == 16
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
