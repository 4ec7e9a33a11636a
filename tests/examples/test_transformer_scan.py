"""The scan-over-layers transformer (`model.train_step_scanned`, the layers' parameters
stacked and the blocks run by `lax.scan`): batch parallelism goes through the scan, and
its backward, with no gathering, runs on 8 CPU devices equal to the unpartitioned step,
and all-reduces each stacked gradient once: per layer, the same bytes as the unrolled
model's per-layer all-reduces."""

from __future__ import annotations

import jax
import pytest

import partir
from examples.transformer import model, schedules
from tests.oracles import assert_tree_close


@pytest.fixture(scope="module")
def inputs():
    return model.make_scanned_inputs(model.TINY)


def test_batch_parallelism_goes_through_the_layer_scan(inputs):
    fn, meta = partir.jit(model.train_step_scanned, schedules.MESH, [schedules.BP])
    expected = jax.jit(model.train_step_scanned)(*inputs)
    assert_tree_close(fn(*inputs), expected)
    assert meta.tactics[0].conflicts == []
    # no activation (or anything else) is gathered; each gradient is all-reduced once:
    # the 9 stacked layer parameters, the embedding, and the loss
    assert meta.collectives["all_gather"] == 0
    assert meta.collectives["all_reduce"] == len(model.LAYER_PARAMS) + 2
    unrolled = partir.partition(model.train_step, schedules.MESH, [schedules.BP],
                                *model.make_inputs(model.TINY))
    # the unrolled model all-reduces each layer's 9 gradients: the same bytes in total
    assert unrolled.collectives["all_reduce"] == \
        model.TINY.layers * len(model.LAYER_PARAMS) + 2
    assert unrolled.cost.bytes_moved["all_reduce"] == \
        pytest.approx(meta.cost.bytes_moved["all_reduce"])


def test_the_scanned_step_interprets_equal_to_the_unpartitioned_step(inputs):
    result = partir.core_partition(model.train_step_scanned, schedules.MESH, [schedules.BP],
                                   *inputs)
    scans = [op for op in result.program.ops if op.name == "scan"]
    assert len(scans) == 2 and all(result.program.nest(op) for op in scans)
    assert_tree_close(result.interpret(*inputs), model.train_step_scanned(*inputs))
