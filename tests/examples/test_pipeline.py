"""The pipeline example (examples/pipeline): GPipe written with vmap and roll, sliced over
"stage" and "batch", moves activations and their gradients by collective_permutes alone,
on both oracles, and equals the sequential model."""

from __future__ import annotations

import pathlib

import jax
import pytest
from jax.sharding import PartitionSpec as P

import partir
from examples.pipeline import model
from examples.pipeline.schedules import BP, MESH, PP
from partir.schedule_file import load_schedule_file
from tests.examples import counts
from tests.oracles import assert_tree_close, check_oracles

EXAMPLE = pathlib.Path(__file__).parents[2] / "examples" / "pipeline"


@pytest.mark.parametrize("microbatches", [1, pytest.param(2, marks=pytest.mark.slow),
                                          pytest.param(4, marks=pytest.mark.slow)])
def test_collectives_are_the_readmes(microbatches):
    stages = MESH["stage"]
    args = model.example_args(stages, 2, microbatches)
    meta = check_oracles(model.step, partir.Mesh(MESH), [PP, BP], *args)
    steps = microbatches + stages - 1
    # the finished microbatches' sums over "stage", the loss's mean and the gradients'
    # sum over "batch", once for every step and layer
    assert meta.collectives == meta.executed_collectives == counts(
        ar=microbatches + 2, cp=2 * (steps - 1))
    assert meta.in_specs[0] == P("stage", None, None, None)  # each device: its stage's


@pytest.mark.slow
def test_the_pipeline_computes_the_sequential_model():
    args = model.example_args()
    assert_tree_close(jax.value_and_grad(model.sequential_loss)(*args), model.step(*args))


@pytest.mark.slow
def test_schedule_file():
    sf = load_schedule_file(EXAMPLE / "pp_bp.partir.py")
    meta = check_oracles(sf.program.fn, partir.Mesh(sf.mesh), sf.schedule, *sf.program.args)
    assert meta.collectives["collective_permute"] == 12
    assert meta.collectives["all_gather"] == 0
