"""`partir partition` reports the padding of dimensions an axis does not divide."""

from __future__ import annotations

import json

from partir.cli import main

SCHEDULE = '''
import jax
import jax.numpy as jnp
import partir

def f(x, w):
    return jnp.mean(jnp.tanh(x @ w))

program = partir.Program(f, jax.ShapeDtypeStruct((6, 8), jnp.float32),
                         jax.ShapeDtypeStruct((8, 5), jnp.float32))
mesh = {"batch": 4, "model": 2}
schedule = [partir.ManualPartition({"x": 0}, axis="batch", name="BP")]
'''


def test_table_and_json_report_padding(capsys, tmp_path):
    path = tmp_path / "pad.partir.py"
    path.write_text(SCHEDULE)
    assert main(["partition", str(path)]) == 0
    out = capsys.readouterr().out
    assert "padding: 3 padded dimensions" in out
    assert "    padding: x dim 0: 6 -> 8 on {batch} (128 B, 0 FLOP wasted)" in out
    assert main(["partition", str(path), "--json"]) == 0
    (bp,) = json.loads(capsys.readouterr().out)["tactics"]
    assert {"value": "x", "dim": 0, "size": 6, "padded": 8, "axes": ["batch"],
            "padded_by": "batch", "wasted_bytes": 128, "wasted_flops": 0.0} in bp["padding"]


def test_divisible_schedules_print_no_padding(capsys, tmp_path):
    path = tmp_path / "pad.partir.py"
    path.write_text(SCHEDULE.replace("(6, 8)", "(8, 8)"))
    assert main(["partition", str(path)]) == 0
    assert "padding" not in capsys.readouterr().out


def test_padding_by_a_later_axis_is_its_tactics(capsys, tmp_path):
    """12 on "model" (2) divides; "batch" (4) then pads the tiles of 6 to 8: the padding
    is the second tactic's, in the JSON records and in the table."""
    path = tmp_path / "pad.partir.py"
    path.write_text(SCHEDULE.replace("(6, 8)", "(12, 8)").replace(
        'schedule = [partir.ManualPartition({"x": 0}, axis="batch", name="BP")]',
        'schedule = [partir.ManualPartition({"x": 0}, axis="model", name="MP"),\n'
        '            partir.ManualPartition({"x": 0}, axis="batch", name="BP")]'))
    assert main(["partition", str(path), "--json"]) == 0
    mp, bp = json.loads(capsys.readouterr().out)["tactics"]
    assert mp["padding"] == []
    (x,) = [p for p in bp["padding"] if p["value"] == "x"]
    assert (x["axes"], x["padded"], x["padded_by"]) == (["model", "batch"], 16, "batch")
    assert main(["partition", str(path)]) == 0
    out = capsys.readouterr().out
    mp_section, bp_section = out.split("\n[1] MP")[1].split("\n[2] BP")
    assert "padding:" not in mp_section
    assert "    padding: x dim 0: 12 -> 16 on {model, batch}" in bp_section
