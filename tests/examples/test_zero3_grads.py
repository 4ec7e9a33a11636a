"""The ZeRO-3 gradients example (examples/zero3_grads): the step's gradients come back
replicated under BP+Z3, and sharded like their parameters, each reduce-scattered, once a
tactic names them (`out/1`) or `out_shardings` asks; both equal to the unpartitioned
step."""

from __future__ import annotations

import pathlib
import runpy
import sys

import pytest
from jax.sharding import PartitionSpec as P

import partir
from partir.schedule_file import load_schedule_file
from tests.oracles import check_oracles

EXAMPLE = pathlib.Path(__file__).parents[2] / "examples" / "zero3_grads"
REPLICATED, SHARDED = P(None, None), P("batch", None)


@pytest.mark.parametrize("name, grad_spec, reduce_scatters, all_reduces", [
    ("bp_z3", REPLICATED, 0, 3),
    ("bp_z3_grads", SHARDED, 2, 1),
])
@pytest.mark.slow
def test_schedule_files(name, grad_spec, reduce_scatters, all_reduces):
    sf = load_schedule_file(EXAMPLE / f"{name}.partir.py")
    meta = check_oracles(sf.program.fn, partir.Mesh(sf.mesh), sf.schedule, *sf.program.args)
    assert meta.in_specs[0] == {"w1": SHARDED, "w2": SHARDED}
    assert meta.out_specs[1] == {"w1": grad_spec, "w2": grad_spec}
    assert (meta.collectives["reduce_scatter"], meta.collectives["all_reduce"]) == \
        (reduce_scatters, all_reduces)


def test_demo_returns_the_gradients_sharded_like_the_parameters(capsys, monkeypatch):
    monkeypatch.setattr(sys, "path", list(sys.path))  # the demo puts its directory first
    # The demo imports its own `model` and `schedules`, which other examples also have.
    saved = {m: sys.modules.pop(m, None) for m in ("model", "schedules")}
    try:
        runpy.run_path(str(EXAMPLE / "demo.py"), run_name="__main__")
    finally:
        for m, module in saved.items():
            sys.modules.pop(m, None)
            if module is not None:
                sys.modules[m] = module
    out = capsys.readouterr().out
    for name in ("w1", "w2"):
        assert f"grad {name}: {SHARDED} (param: {SHARDED})" in out
    assert "reduce_scatter 2" in out
