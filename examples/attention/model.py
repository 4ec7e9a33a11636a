"""A self-attention block as most JAX code writes it, and its SGD training step.

The projections are plain [D, D] matrices and the heads are made by a reshape,
`q.reshape(B, S, H, Dh)`, rather than being a dimension of the weights (compare the
transformer example's `w_qkv [D, 3, H, Dh]`). Megatron-style model parallelism shards the
projections' output dimension D = H * Dh over the "model" axis; when the axis is larger
than the number of heads (here 4 devices and 2 heads), the reshape cannot give each device
whole heads, and partir splits the axis: `model:(1)2` shards the heads and `model:(2)2`
the head dimension (see README.md).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

LEARNING_RATE = 0.1


@dataclasses.dataclass(frozen=True)
class Config:
    batch: int
    seq: int
    heads: int
    d_model: int

    @property
    def head_dim(self) -> int:
        return self.d_model // self.heads


SMALL = Config(batch=4, seq=8, heads=2, d_model=16)


def attention(p: dict[str, jax.Array], x: jax.Array, heads: int) -> jax.Array:
    b, s, d = x.shape

    def split(w: jax.Array) -> jax.Array:  # [B, S, D] -> [B, H, S, Dh]
        return (x @ w).reshape(b, s, heads, d // heads).transpose(0, 2, 1, 3)

    q, k, v = split(p["w_q"]), split(p["w_k"]), split(p["w_v"])
    scores = jnp.einsum("bhsk,bhtk->bhst", q, k) / np.sqrt(d // heads).astype(x.dtype)
    probs = jax.nn.softmax(scores, axis=-1)
    out = jnp.einsum("bhst,bhtk->bhsk", probs, v).transpose(0, 2, 1, 3).reshape(b, s, d)
    return x + out @ p["w_o"]


def loss_fn(p: dict[str, jax.Array], x: jax.Array, target: jax.Array, heads: int
            ) -> jax.Array:
    return jnp.mean(jnp.square(attention(p, x, heads) - target))


def train_step(params: dict[str, jax.Array], x: jax.Array, target: jax.Array,
               heads: int = SMALL.heads) -> tuple[dict[str, jax.Array], jax.Array]:
    """One SGD step: (new_params, loss)."""
    loss, grads = jax.value_and_grad(loss_fn)(params, x, target, heads)
    return jax.tree_util.tree_map(lambda w, g: w - LEARNING_RATE * g, params, grads), loss


def make_inputs(cfg: Config = SMALL, seed: int = 0) -> tuple[Any, jax.Array, jax.Array]:
    rng = np.random.default_rng(seed)
    d = cfg.d_model
    params = {name: jnp.asarray(rng.normal(0.0, d ** -0.5, (d, d)).astype(np.float32))
              for name in ("w_q", "w_k", "w_v", "w_o")}
    shape = (cfg.batch, cfg.seq, d)
    x = jnp.asarray(rng.normal(size=shape).astype(np.float32))
    target = jnp.asarray(rng.normal(size=shape).astype(np.float32))
    return params, x, target
