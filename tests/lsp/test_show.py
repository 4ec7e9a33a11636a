"""`partir show FILE VALUE [--after N]`: a value's sharding in both notations and its
tiles over the mesh, drawn by the renderer the editor's hover uses."""

from __future__ import annotations

import argparse
import tomllib

import pytest
from partir_lsp import pictures, show

from tests.lsp.support import ROOT

MLP = str(ROOT / "examples" / "mlp" / "bp_mp_z3.partir.py")


def run(*argv: str) -> int:
    parser = argparse.ArgumentParser(prog="partir")
    show.add_command(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["show", *argv])
    return args.run(args)


def test_show_draws_the_tiles_after_each_tactic(capsys: pytest.CaptureFixture[str]) -> None:
    assert run(MLP, "w1", "--color", "never") == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "w1 · input · tensor<8x16xf32> (512 B) after tactic 3 (Z3)"
    assert out[1] == '  [{"batch"}, {"model"}]  P(\'batch\', \'model\')  local [2, 8] (64 B/device)'
    mesh = pictures.Mesh.of({"batch": 4, "model": 2})
    # The hover's layout, drawn for a terminal.
    assert "\n".join(out[2:]) == pictures.terminal(
        pictures.tiling([8, 16], [["batch"], ["model"]], mesh), False)
    assert "🟥 0" in out[4] and "🟦 1" in out[4]

    assert run(MLP, "w1", "--after", "2", "--color", "always") == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].endswith("after tactic 2 (MP)")
    assert "P(None, 'model')" in out[1]
    assert "\x1b[48;5;" in out[4]  # coloured cells


def test_show_reports_an_unknown_value_or_tactic(capsys: pytest.CaptureFixture[str]) -> None:
    assert run(MLP, "w9") == 2
    assert "no input, output or tag named 'w9'" in capsys.readouterr().err
    assert run(MLP, "w1", "--after", "7") == 2
    assert "the schedule has 3 applied tactics" in capsys.readouterr().err


def test_show_is_a_partir_command() -> None:
    with open(ROOT / "pyproject.toml", "rb") as f:
        commands = tomllib.load(f)["project"]["entry-points"]["partir.commands"]
    assert commands["show"] == "partir_lsp.show:add_command"
