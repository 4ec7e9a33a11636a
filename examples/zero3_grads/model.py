"""A training step that returns its gradients: `(loss, grads)` of a two-layer MLP, the
repro of issue 27 (item 4) with one more layer. Under ZeRO-3 its parameters are sharded
over "batch"; nothing in the program ties the gradients it returns to them, so they come
back replicated unless a tactic names them (`out/1`) or `out_shardings` asks (README.md).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np


def loss(params, x):
    h = jnp.tanh(x @ params["w1"])
    return jnp.mean(jnp.tanh(h @ params["w2"]) ** 2)


def step(params, x):
    """(loss, grads): the gradients are the output `out/1`, `out/1/w1` and `out/1/w2`."""
    return jax.value_and_grad(loss)(params, x)


def example_args(seed: int = 0):
    rng = np.random.default_rng(seed)
    params = {"w1": jnp.asarray(rng.normal(size=(16, 32)), jnp.float32),
              "w2": jnp.asarray(rng.normal(size=(32, 8)), jnp.float32)}
    return params, jnp.asarray(rng.normal(size=(64, 16)), jnp.float32)
