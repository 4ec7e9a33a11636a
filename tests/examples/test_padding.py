"""The padding examples (examples/padding): a batch of 6 on a 4-device axis and a
vocabulary of 50 on an 8-device axis, run on 8 CPU devices equal to the unpartitioned
functions, with their padding reported and the divisible case's collectives."""

from __future__ import annotations

import pathlib

import jax
import pytest

import partir
from partir.schedule_file import load_schedule_file
from tests.oracles import assert_tree_close

EXAMPLE = pathlib.Path(__file__).parents[2] / "examples" / "padding"
# (padded value, dim, size, padded size), and the collectives, per schedule file
EXPECTED = {
    "batch6": (("x", 0, 6, 8), {"all_gather": 0, "all_reduce": 4}),
    "vocab50": (("params/embed", 0, 50, 56), {"all_gather": 0, "all_reduce": 6}),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", EXPECTED)
def test_padded_schedule_runs_equal_to_the_unpartitioned_function(name):
    sf = load_schedule_file(EXAMPLE / f"{name}.partir.py")
    args = sf.program.args
    expected = jax.jit(sf.program.fn)(*args)
    fn, meta = partir.jit(sf.program.fn, sf.mesh, sf.schedule)
    assert_tree_close(fn(*args), expected)
    result = partir.core_partition(sf.program.fn, sf.mesh, sf.schedule, *args)
    assert_tree_close(result.interpret(*args), expected)
    (value, dim, size, padded), collectives = EXPECTED[name]
    found = {(p["value"], p["dim"]): p for p in meta.padding}
    assert (found[(value, dim)]["size"], found[(value, dim)]["padded"]) == (size, padded)
    assert all(t.conflicts == [] for t in meta.tactics)
    assert {k: meta.collectives[k] for k in collectives} == collectives
