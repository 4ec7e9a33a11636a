"""Two models whose natural sizes the mesh does not divide: an MLP training step on a
batch of 6 (on a 4-device axis) and a language model's loss gradient with a vocabulary
of 50 (on an 8-device axis). partir pads the sharded dimension to the next multiple
(8 and 56), masks the padding out of every reduction, and reports it (see README.md)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np


def mlp_loss(params, x, y):
    h = jnp.tanh(x @ params["w1"])
    out = h @ params["w2"]
    return jnp.mean((out - y) ** 2)


def mlp_step(params, x, y):
    """One SGD step: (loss, new_params)."""
    loss, grads = jax.value_and_grad(mlp_loss)(params, x, y)
    return loss, jax.tree.map(lambda p, g: p - 0.1 * g, params, grads)


def mlp_inputs(batch: int = 6, seed: int = 0):
    rng = np.random.default_rng(seed)
    params = {"w1": jnp.asarray(rng.normal(size=(8, 16)), jnp.float32),
              "w2": jnp.asarray(rng.normal(size=(16, 4)), jnp.float32)}
    x = jnp.asarray(rng.normal(size=(batch, 8)), jnp.float32)
    y = jnp.asarray(rng.normal(size=(batch, 4)), jnp.float32)
    return params, x, y


def lm_loss(params, ids, labels):
    h = params["embed"][ids]  # [B, D]
    h = jnp.tanh(h @ params["w"])
    logits = h @ params["embed"].T  # [B, V], tied embedding
    logp = jax.nn.log_softmax(logits, axis=-1)
    onehot = jax.nn.one_hot(labels, logits.shape[-1])
    return -jnp.mean(jnp.sum(onehot * logp, axis=-1))


def lm_step(params, ids, labels):
    """(loss, gradients)."""
    return jax.value_and_grad(lm_loss)(params, ids, labels)


def lm_inputs(vocab: int = 50, seed: int = 1):
    rng = np.random.default_rng(seed)
    params = {"embed": jnp.asarray(rng.normal(size=(vocab, 16)), jnp.float32),
              "w": jnp.asarray(rng.normal(size=(16, 16)) / 4, jnp.float32)}
    ids = jnp.asarray(rng.integers(0, vocab, (4,)), jnp.int32)
    labels = jnp.asarray(rng.integers(0, vocab, (4,)), jnp.int32)
    return params, ids, labels
