"""PRNG keys (typed `jax.random.key` and raw `PRNGKey`) under batch parallelism, as
dropout in a training step uses them: the sequential Core interpreter and the executed
program draw the same bits as the unpartitioned function, each device only its part."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import partir
from tests.oracles import check_oracles

MESH = partir.Mesh({"batch": 4, "model": 2})
KEYS = {"typed": jax.random.key, "raw": jax.random.PRNGKey}
rng = np.random.default_rng(0)
X = rng.normal(size=(8, 4)).astype(np.float32)
W = rng.normal(size=(4, 6)).astype(np.float32)


def dropout(params, x, key):
    mask = jax.random.bernoulli(key, 0.9, (x.shape[0], params.shape[1]))
    return mask, jnp.where(mask, x @ params, 0) / 0.9


def noisy_step(params, x, key):
    key, sub = jax.random.split(key)
    noise = jax.random.normal(jax.random.fold_in(sub, 7), x.shape)
    keep = jax.random.uniform(sub, (x.shape[0], params.shape[1])) < 0.5
    return keep, jnp.where(keep, (x + noise) @ params, 0), jax.random.key_data(key)


def rewrapped(params, x, key):
    key = jax.random.wrap_key_data(jax.random.key_data(key))
    bits = jax.random.bits(key, (x.shape[0], params.shape[1]))
    return bits, (x @ params) * (bits % 3)


def per_example_keys(params, x, keys):
    # one key per example, as a vmapped dropout draws: the keys shard like the batch
    mask = jax.vmap(lambda k: jax.random.bernoulli(k, 0.8, (params.shape[1],)))(keys)
    return mask, jnp.where(mask, x @ params, 0)


def _check(fn, args, schedule):
    return check_oracles(fn, MESH, schedule, *args)


@pytest.mark.slow
@pytest.mark.parametrize("kind", KEYS)
@pytest.mark.parametrize("fn", [dropout, noisy_step, rewrapped])
def test_one_key_under_batch_parallelism(fn, kind):
    schedule = [partir.ManualPartition({"x": 0}, axis="batch", name="BP")]
    meta = _check(fn, (W, X, KEYS[kind](3)), schedule)
    assert meta.in_specs[1] == jax.sharding.PartitionSpec("batch", None)
    assert meta.cost.unknown_ops == []
    # each device draws only its rows' bits (partitionable threefry): nothing is sliced
    assert sum(meta.collectives.values()) == 0


@pytest.mark.slow
@pytest.mark.parametrize("kind", KEYS)
def test_a_batch_of_keys_is_tiled_with_the_batch(kind):
    keys = jax.random.split(KEYS[kind](5), X.shape[0])
    schedule = [partir.ManualPartition({"x": 0, "keys": 0}, axis="batch", name="BP")]
    meta = _check(per_example_keys, (W, X, keys), schedule)
    # no bits drawn for other devices' examples: nothing is sliced or gathered
    assert sum(meta.collectives.values()) == 0
    assert meta.in_specs[2][0] == "batch"


def test_a_raw_keys_implementation_prints_as_its_tag():
    def draw(key, x):
        return jax.random.uniform(jax.random.wrap_key_data(key), x.shape) * x

    key = jax.random.key_data(jax.random.key(0))
    meta = partir.partition(draw, {"b": 2}, partir.ManualPartition({"x": 0}, axis="b"),
                            key, np.ones((4,), np.float32))
    assert "random_wrap(%key) {impl=fry}" in meta.core_ir


def test_a_key_on_a_sub_axis_draws_in_a_loop_whose_carry_is_tiled_on_the_whole_axis():
    # the Core interpreter runs the loop in lockstep over both parts of "a": the draw's
    # own batching rule must serve both vmaps, not only the inner one (fuzz seed 10160)
    def loop(x, key):
        def body(state):
            i, c = state
            return i + 1, jax.random.uniform(key, (4,)) + jnp.mean(c)
        return lax.while_loop(lambda s: s[0] < 2, body, (jnp.int32(0), x))[1]

    schedule = [partir.ManualPartition({"x": 0}, axis="a"),
                partir.ManualPartition({"key": 0}, axis="a:(2)2")]
    check_oracles(loop, partir.Mesh({"a": 8}), schedule,
                  np.arange(4, dtype=np.float32), jax.random.PRNGKey(1))
