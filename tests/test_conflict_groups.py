"""Conflicts grouped as users read them (`partir.conflict_groups`), the same in the editor
and in `partir partition`."""

from __future__ import annotations

from partir.conflict_groups import ADVICE, MEANING, group_conflicts
from partir.core import conflicts as C


def _conflict(kind: str, op: str, line: int, axis: str = "batch", **kw) -> dict:
    return {"kind": kind, "op": op, "loc": {"file": "/m/model.py", "line": line},
            "axis": axis, "choices": [], "detail": "", **kw}


def test_every_kind_of_conflict_has_a_meaning():
    kinds = {v for k, v in vars(C).items() if k.isupper() and isinstance(v, str)}
    assert kinds == set(MEANING)


def test_every_kind_of_conflict_says_what_it_costs_and_the_usual_fix():
    assert set(ADVICE) == set(MEANING)
    for kind, text in ADVICE.items():
        assert any(w in text for w in ("unsharded", "all_gather", "collective_permute")), \
            kind  # what it costs
        assert ";" in text, kind  # then what to do


def test_groups_are_kind_op_and_model_line_in_the_order_met():
    groups = group_conflicts([
        _conflict("axis_in_scope", "mul", 3),
        _conflict("multiple_matches", "dot_general", 5, choices=["a", "b"]),
        _conflict("axis_in_scope", "mul", 3, axis="model"),
        _conflict("multiple_matches", "dot_general", 5, choices=["a", "b"]),
        _conflict("multiple_matches", "dot_general", 6, choices=["c", "d"], detail="why"),
        _conflict("unsupported", "sort", 7, detail="no rule: sorts its dimension"),
    ])
    assert [(g.kind, g.op, g.line, len(g.conflicts)) for g in groups] == [
        ("axis_in_scope", "mul", 3, 2), ("multiple_matches", "dot_general", 5, 2),
        ("multiple_matches", "dot_general", 6, 1), ("unsupported", "sort", 7, 1)]
    first, second, third, blocked = groups
    assert first.message("tactic 2 (MP)") == (
        "conflict in tactic 2 (MP) at `mul` on axes 'batch', 'model', 2 times: "
        + MEANING["axis_in_scope"])
    assert first.site == "model.py:3" and first.occurrences() == []
    assert second.occurrences() == ["on axis 'batch': a vs b"]  # repeats said once
    assert third.occurrences() == ["on axis 'batch': c vs d (why)"]
    assert blocked.blocked and blocked.message("tactic 1 (BP)") == (
        "propagation of tactic 1 (BP) on axis 'batch' is blocked at `sort`: "
        + MEANING["unsupported"] + " (no rule: sorts its dimension)")
