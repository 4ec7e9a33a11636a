"""Concatenate along a sharded dimension: the result stays
tiled, each operand costs at most one collective (an all_gather where it is tiled, a local
slice where it is replicated), and the work after it stays partitioned (issue 27, repro 6:
jraph's GraphConvolution with add_self_edges)."""

import jax
import jax.numpy as jnp
import pytest
from jax import lax

import partir
from tests.oracles import check_oracles

BP8 = partir.Mesh({"batch": 8})


def bp(**dims):
    return partir.ManualPartition(dims, axis="batch")


def conflicts(meta):
    return [(c["kind"], c["op"]) for t in meta.tactics for c in t.conflicts]


def self_edges(extra: int):
    """jraph's GraphConvolution(add_self_edges=True) aggregation on senders alone."""
    def f(senders, nodes):
        s = jnp.concatenate([senders, jnp.arange(extra)])
        return jax.ops.segment_sum(nodes[s], s, 8)
    return f


def flops_ratio(fn, schedule, *args) -> float:
    """Per-device FLOPs of the partitioned program over those of an empty schedule."""
    return (partir.partition(fn, BP8, schedule, *args).cost.flops
            / partir.partition(fn, BP8, [], *args).cost.flops)


def test_self_edges_gather_the_senders_once_and_stay_partitioned():
    senders, nodes = jnp.arange(64) % 8, jnp.ones((8, 4))
    meta = check_oracles(self_edges(8), BP8, [bp(senders=0)], senders, nodes)
    assert conflicts(meta) == []
    # One all_gather, of the senders; the iota is sliced locally. The segment sum's
    # partial sums are reduced once.
    assert meta.collectives["all_gather"] == 1
    assert meta.hlo_ir.count("all_gather") == 1
    assert 'all_gather [{"batch"}] %senders ' in meta.hlo_ir
    assert meta.collectives["all_reduce"] == 1
    assert sum(meta.collectives.values()) == 2
    assert meta.in_specs[0] == jax.sharding.PartitionSpec("batch")
    assert flops_ratio(self_edges(8), [bp(senders=0)], senders, nodes) <= 0.25
    # The tactic says which collective each operand gets.
    (note,) = meta.tactics[0].notes
    assert note.startswith("concatenate at ") and note.endswith(
        "keeps its result tiled on 'batch' along a dimension an operand is tiled on: "
        "operand 0 (%senders) all_gather<batch>, operand 1 cut out locally"), note


@pytest.mark.parametrize("n, extra", [(60, 4), (60, 5), (64, 3)])
def test_sizes_the_axis_does_not_divide_are_padded(n, extra):
    senders, nodes = jnp.arange(n) % 8, jnp.ones((8, 4))
    meta = check_oracles(self_edges(extra), BP8, [bp(senders=0)], senders, nodes)
    assert conflicts(meta) == []
    assert meta.collectives["all_gather"] == 1
    assert 'all_gather [{"batch"}] %senders ' in meta.hlo_ir
    # The padding masks cost FLOPs of their own on operands this small.
    assert flops_ratio(self_edges(extra), [bp(senders=0)], senders, nodes) <= 0.6


def test_without_padding_an_indivisible_concatenation_is_a_conflict_naming_it():
    senders, nodes = jnp.arange(64) % 8, jnp.ones((8, 4))
    tactic = partir.ManualPartition({"senders": 0}, axis="batch", pad=False)
    meta = check_oracles(self_edges(5), BP8, [tactic], senders, nodes)
    (conflict,) = meta.tactics[0].conflicts
    assert (conflict["kind"], conflict["op"]) == ("indivisible", "concatenate")
    assert "69" in conflict["detail"]


def test_two_tiled_operands_are_gathered_once_each():
    f = lambda a, b: jnp.tanh(jnp.concatenate([a, b], 0)) * 2  # noqa: E731
    a, b = jnp.arange(64.).reshape(16, 4), jnp.arange(32.).reshape(8, 4) + 1
    meta = check_oracles(f, BP8, [bp(a=0, b=0)], a, b)
    assert conflicts(meta) == []
    assert meta.collectives["all_gather"] == 2
    assert sum(meta.collectives.values()) == 2
    assert meta.out_specs[0] == jax.sharding.PartitionSpec("batch", None)


def test_another_dimension_stays_sliced_without_collectives():
    f = lambda a, b: jnp.tanh(jnp.concatenate([a, b], 1))  # noqa: E731
    a, b = jnp.arange(64.).reshape(16, 4), jnp.arange(48.).reshape(16, 3)
    meta = check_oracles(f, BP8, [bp(a=0)], a, b)
    assert conflicts(meta) == []
    assert sum(meta.collectives.values()) == 0
    assert meta.in_specs[1] == meta.out_specs[0] == jax.sharding.PartitionSpec("batch", None)


def test_gradients_through_a_concatenate_are_right_and_its_forward_stays_partitioned():
    def loss(a, b):
        return jnp.sum(jnp.tanh(jnp.concatenate([a, b], 0)) ** 2)

    grad = jax.grad(loss, argnums=(0, 1))
    a, b = jnp.arange(64.).reshape(16, 4) / 64, jnp.arange(32.).reshape(8, 4) / 32
    meta = check_oracles(grad, BP8, [bp(a=0)], a, b)
    # The cotangent's split (concatenate's transpose) still takes its operand whole.
    assert conflicts(meta) == [("needs_replication", "split")]
    assert meta.collectives["all_gather"] == 2
    assert flops_ratio(grad, [bp(a=0)], a, b) <= 0.25


@pytest.mark.slow
def test_in_a_scan_body_only_the_concatenated_dimension_is_kept_whole():
    def rnn(x, h):
        def step(h, x_t):
            h = jnp.tanh(jnp.concatenate([x_t, h], axis=-1)[:, :4])
            return h, h
        return lax.scan(step, h, x)[1]

    x, h = jnp.ones((3, 16, 4)) / 3, jnp.ones((16, 4)) / 4
    meta = check_oracles(rnn, BP8, [bp(x=1, h=0)], x, h)
    assert conflicts(meta) == []
    assert sum(meta.collectives.values()) == 0

    def stacked(x, h):
        def step(h, x_t):
            h = jnp.tanh(jnp.concatenate([x_t, h], axis=0)[:16])
            return h, h
        return lax.scan(step, h, x)[1]

    # The batch is the concatenated dimension inside the body: the scan takes it whole.
    meta = check_oracles(stacked, BP8, [bp(x=1, h=0)], x, h)
    assert [k for k, _ in conflicts(meta)] and sum(meta.collectives.values()) >= 1
