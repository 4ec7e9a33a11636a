"""GPipe written as JAX users write it (MaxText's SPMD pipeline): a stack of S x K
layers stored as [S, K, D, D], one stage of K consecutive layers per slice of the first
dimension; at each of M + S - 1 steps every stage applies its layers to the activation it
holds (a vmap over stages), the last stage's result is a finished microbatch, and the
activations move one stage on (a roll along the stage dimension). Microbatch t enters
stage 0 at step t.

Sliced over the stages on a mesh axis, each device holds its stage's layers and its
activation, and partir turns the roll into a collective_permute to the next device, and
the roll the gradient makes back into one to the previous device (README.md). The
pipelined step computes what `sequential_loss` does: every layer applied to every
microbatch in order.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax


def stage(w, x):
    """K layers, x <- tanh(x @ w_k), over the stage's stacked weights w: [K, D, D]."""
    return lax.scan(lambda h, wk: (jnp.tanh(h @ wk), None), x, w)[0]


def pipelined_loss(params, xs):
    """params: [S, K, D, D]; xs: [M, B, D], M microbatches of B rows."""
    stages, microbatches = params.shape[0], xs.shape[0]
    position = jnp.arange(stages)[:, None, None]
    state = jnp.zeros((stages, *xs.shape[1:]), xs.dtype)
    outs = []
    for t in range(microbatches + stages - 1):
        entering = xs[t] if t < microbatches else jnp.zeros(xs.shape[1:], xs.dtype)
        state = jax.vmap(stage)(params, jnp.where(position == 0, entering[None], state))
        if t >= stages - 1:  # the last stage finished microbatch t - (S - 1)
            outs.append(jnp.sum(jnp.where(position == stages - 1, state, 0.0), axis=0))
        state = jnp.roll(state, 1, axis=0)
    return jnp.mean(jnp.stack(outs) ** 2)


def sequential_loss(params, xs):
    """Every layer, in order, on every microbatch: what the pipeline computes."""
    layers = params.reshape(-1, *params.shape[2:])
    return jnp.mean(jax.vmap(lambda x: stage(layers, x))(xs) ** 2)


step = jax.value_and_grad(pipelined_loss)


def example_args(stages: int = 4, layers_per_stage: int = 2, microbatches: int = 4,
                 rows: int = 4, width: int = 16, seed: int = 0):
    rng = np.random.default_rng(seed)
    params = rng.normal(size=(stages, layers_per_stage, width, width)) / np.sqrt(width)
    xs = rng.normal(size=(microbatches, rows, width))
    return jnp.asarray(params, jnp.float32), jnp.asarray(xs, jnp.float32)
