"""A small CNN (two convs, an average pool and a dense layer, NHWC, batch 8) under batch
parallelism on 8 devices: the images are split, not gathered, through the convs and the
pool, forward and backward."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

import partir
from tests.oracles import assert_same

MESH = partir.Mesh({"batch": 8})
BP = [partir.ManualPartition({"x": 0}, axis="batch", name="BP")]
DN = ("NHWC", "HWIO", "NHWC")
rng = np.random.default_rng(0)


def _normal(*shape, scale=1.0):
    return (scale * rng.normal(size=shape)).astype(np.float32)


X = _normal(8, 8, 8, 3)
PARAMS = {"c1": _normal(3, 3, 3, 8, scale=0.3), "c2": _normal(3, 3, 8, 8, scale=0.2),
          "dense": _normal(4 * 4 * 8, 10, scale=0.1)}


def cnn(x, params):
    h = jax.nn.relu(lax.conv_general_dilated(x, params["c1"], (1, 1), "SAME",
                                             dimension_numbers=DN))
    h = jax.nn.relu(lax.conv_general_dilated(h, params["c2"], (1, 1), "SAME",
                                             dimension_numbers=DN))
    h = lax.reduce_window(h, 0.0, lax.add, (1, 2, 2, 1), (1, 2, 2, 1), "VALID") / 4
    return h.reshape(h.shape[0], -1) @ params["dense"]


def loss(x, params):
    return jnp.mean(jax.nn.logsumexp(cnn(x, params), axis=-1))


def test_cnn_batch_parallel_splits_the_images():
    fn, meta = partir.jit(cnn, MESH, BP)
    assert_same(fn(X, PARAMS), jax.jit(cnn)(X, PARAMS), "executed")
    # Nothing is gathered or reduced: every device runs the whole CNN on its images.
    assert sum(meta.collectives.values()) == 0, meta.collectives
    assert meta.tactics[0].conflicts == []
    hlo = meta.hlo_ir
    conv = hlo.index("conv")
    assert "all_gather" not in hlo[:conv]
    # The first conv reads a batch of 1 image per device.
    assert "tensor<1x8x8x3xf32>" in hlo


def test_cnn_gradient_under_batch_parallelism_only_reduces_weight_gradients():
    grad = jax.grad(loss, argnums=1)
    fn, meta = partir.jit(grad, MESH, BP)
    assert_same(fn(X, PARAMS), jax.jit(grad)(X, PARAMS), "executed")
    assert meta.collectives["all_gather"] == 0, meta.collectives
    assert meta.collectives["all_reduce"] >= 1
    assert meta.tactics[0].conflicts == []


def test_depthwise_conv_shards_on_its_feature_groups():
    x, w = _normal(4, 8, 8, 8), _normal(3, 3, 1, 16)

    def depthwise(x, w):
        return lax.conv_general_dilated(x, w, (1, 1), "SAME", dimension_numbers=DN,
                                        feature_group_count=8)

    mesh = partir.Mesh({"batch": 2, "model": 4})
    fn, meta = partir.jit(depthwise, mesh, [
        partir.ManualPartition({"x": 0}, axis="batch", name="BP"),
        partir.ManualPartition({"w": 3}, axis="model", name="channels")])
    assert_same(fn(x, w), jax.jit(depthwise)(x, w), "executed")
    assert sum(meta.collectives.values()) == 0, meta.collectives
    # Each device convolves 2 of the 8 channel groups of its 2 images.
    assert "feature_group_count=2" in meta.hlo_ir
    assert "tensor<2x8x8x2xf32>" in meta.hlo_ir
