"""A decoder-only transformer and its Adam training step, in plain JAX.

Every block has exactly nine parameter tensors and the embedding is tied (input lookup and
output logits), so a model of L layers has 9 L + 1 parameter tensors: 289 for T32, as in
the PartIR paper. The parameter names are what the Megatron rule in `schedules.py` keys on,
and the layouts keep the dims that rule shards (heads, d_ff) as separate tensor dims:

    ln1_scale [D], ln1_bias [D], w_qkv [D, 3, H, Dh], w_o [H, Dh, D],
    ln2_scale [D], ln2_bias [D], w_up [D, F], b_up [F], w_down [F, D];  embed [V, D]

The final layer norm has no learnt scale/bias: that keeps the count at 9 L + 1.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

LEARNING_RATE = 1e-3
LAYER_PARAMS = ("ln1_scale", "ln1_bias", "w_qkv", "w_o", "ln2_scale", "ln2_bias", "w_up",
                "b_up", "w_down")


@dataclasses.dataclass(frozen=True)
class Config:
    layers: int
    batch: int
    seq: int
    heads: int
    d_model: int
    vocab: int
    d_ff: int | None = None

    @property
    def ff(self) -> int:
        return 4 * self.d_model if self.d_ff is None else self.d_ff

    @property
    def head_dim(self) -> int:
        return self.d_model // self.heads

    def __post_init__(self) -> None:
        if self.d_model % self.heads:
            raise ValueError(f"d_model {self.d_model} is not a multiple of heads {self.heads}")


# The paper's 32-layer transformer; only ever used abstractly (it does not fit in memory here).
T32 = Config(layers=32, batch=48, seq=1024, heads=32, d_model=4096, vocab=32000)
# For the sequential Core interpreter on CPU. Every dim the schedules shard is divisible by
# the mesh {"batch": 4, "model": 2}, including after Megatron took a factor 2 of it.
TINY = Config(layers=4, batch=8, seq=16, heads=4, d_model=32, vocab=64)


# --- model ---------------------------------------------------------------------------------


def layer_norm(x: jax.Array, scale: jax.Array | None = None, bias: jax.Array | None = None,
               eps: float = 1e-5) -> jax.Array:
    mean = jnp.mean(x, axis=-1, keepdims=True)
    var = jnp.mean(jnp.square(x - mean), axis=-1, keepdims=True)
    y = (x - mean) * jax.lax.rsqrt(var + eps)
    if scale is not None:
        y = y * scale + bias
    return y


def attention(x: jax.Array, w_qkv: jax.Array, w_o: jax.Array, causal: jax.Array) -> jax.Array:
    qkv = jnp.einsum("bsd,dthk->tbhsk", x, w_qkv)
    q, k, v = qkv[0], qkv[1], qkv[2]
    scores = jnp.einsum("bhsk,bhtk->bhst", q, k) / np.sqrt(q.shape[-1]).astype(x.dtype)
    scores = jnp.where(causal, scores, jnp.finfo(x.dtype).min)
    probs = jax.nn.softmax(scores, axis=-1)
    out = jnp.einsum("bhst,bhtk->bhsk", probs, v)
    return jnp.einsum("bhsk,hkd->bsd", out, w_o)


def mlp(x: jax.Array, w_up: jax.Array, b_up: jax.Array, w_down: jax.Array) -> jax.Array:
    return jax.nn.gelu(x @ w_up + b_up) @ w_down


def block(x: jax.Array, p: dict[str, jax.Array], causal: jax.Array) -> jax.Array:
    x = x + attention(layer_norm(x, p["ln1_scale"], p["ln1_bias"]), p["w_qkv"], p["w_o"],
                      causal)
    return x + mlp(layer_norm(x, p["ln2_scale"], p["ln2_bias"]), p["w_up"], p["b_up"],
                   p["w_down"])


def forward(params: dict[str, Any], tokens: jax.Array) -> jax.Array:
    """Logits [B, S, V] for int tokens [B, S]."""
    embed = params["embed"]
    x = jnp.take(embed, tokens, axis=0)
    seq = tokens.shape[1]
    # Built once rather than per layer: it is the same [S, S] mask for every block.
    causal = jnp.tril(jnp.ones((seq, seq), dtype=bool))
    for p in params["layers"]:
        x = block(x, p, causal)
    return jnp.einsum("bsd,vd->bsv", layer_norm(x), embed)


def loss_fn(params: dict[str, Any], batch: dict[str, jax.Array], forward=forward) -> jax.Array:
    logits = forward(params, batch["tokens"])
    logp = jax.nn.log_softmax(logits, axis=-1)
    picked = jnp.take_along_axis(logp, batch["labels"][..., None], axis=-1)[..., 0]
    return -jnp.mean(picked)


OPTIMIZER = optax.adam(LEARNING_RATE)


def train_step(params, opt_state, batch):
    """One Adam step: (new_params, new_opt_state, loss)."""
    loss, grads = jax.value_and_grad(loss_fn)(params, batch)
    updates, new_opt_state = OPTIMIZER.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), new_opt_state, loss


# --- inputs ----------------------------------------------------------------------------------


def param_shapes(cfg: Config) -> dict[str, Any]:
    d, h, dh, f = cfg.d_model, cfg.heads, cfg.head_dim, cfg.ff
    layer = {"ln1_scale": (d,), "ln1_bias": (d,), "w_qkv": (d, 3, h, dh), "w_o": (h, dh, d),
             "ln2_scale": (d,), "ln2_bias": (d,), "w_up": (d, f), "b_up": (f,),
             "w_down": (f, d)}
    return {"embed": (cfg.vocab, d), "layers": [dict(layer) for _ in range(cfg.layers)]}


def init_params(cfg: Config, seed: int = 0) -> dict[str, Any]:
    rng = np.random.default_rng(seed)

    def init(path: tuple[Any, ...], shape: tuple[int, ...]) -> jax.Array:
        name = path[-1].key
        if name.endswith("_scale"):
            # Not exactly 1: a scale applied to the wrong slice must change the result.
            x = 1.0 + 0.1 * rng.normal(size=shape)
        elif name.startswith("b") or name.endswith("_bias"):
            x = 0.1 * rng.normal(size=shape)
        else:
            fan_in = shape[-1] if name == "embed" else int(np.prod(shape)) // shape[-1]
            x = rng.normal(0.0, fan_in ** -0.5, shape)
        return jnp.asarray(x.astype(np.float32))

    return jax.tree_util.tree_map_with_path(init, param_shapes(cfg), is_leaf=_is_shape)


def make_batch(cfg: Config, seed: int = 0) -> dict[str, jax.Array]:
    rng = np.random.default_rng(seed + 1)
    shape = (cfg.batch, cfg.seq)
    return {"tokens": jnp.asarray(rng.integers(0, cfg.vocab, shape, dtype=np.int32)),
            "labels": jnp.asarray(rng.integers(0, cfg.vocab, shape, dtype=np.int32))}


def make_inputs(cfg: Config, seed: int = 0) -> tuple[Any, Any, dict[str, jax.Array]]:
    """Concrete (params, opt_state, batch), seeded. Adam's moments are made non-zero by one
    training step first, so that a mis-partitioned optimizer update shows in the results."""
    params = init_params(cfg, seed)
    opt_state = OPTIMIZER.init(params)
    params, opt_state, _ = jax.jit(train_step)(params, opt_state, make_batch(cfg, seed + 100))
    return params, opt_state, make_batch(cfg, seed)


def abstract_inputs(cfg: Config) -> tuple[Any, Any, dict[str, jax.ShapeDtypeStruct]]:
    """(params, opt_state, batch) as `jax.ShapeDtypeStruct`s: nothing is allocated."""
    params = jax.tree_util.tree_map(lambda s: jax.ShapeDtypeStruct(s, jnp.float32),
                                    param_shapes(cfg), is_leaf=_is_shape)
    opt_state = jax.eval_shape(OPTIMIZER.init, params)
    shape = (cfg.batch, cfg.seq)
    batch = {"tokens": jax.ShapeDtypeStruct(shape, jnp.int32),
             "labels": jax.ShapeDtypeStruct(shape, jnp.int32)}
    return params, opt_state, batch


def _is_shape(x: Any) -> bool:
    return isinstance(x, tuple) and all(isinstance(d, int) for d in x)


# --- the scan-over-layers variant ---------------------------------------------------------


def stack_layers(params: dict[str, Any]) -> dict[str, Any]:
    """The per-layer parameter dicts stacked into one dict of [L, ...] arrays."""
    return {"embed": params["embed"],
            "layers": jax.tree_util.tree_map(lambda *xs: jnp.stack(xs), *params["layers"])}


def forward_scanned(params: dict[str, Any], tokens: jax.Array) -> jax.Array:
    """`forward` with the layers' parameters stacked (`stack_layers`) and the blocks run by
    `lax.scan`, as production JAX models are written."""
    embed = params["embed"]
    x = jnp.take(embed, tokens, axis=0)
    seq = tokens.shape[1]
    causal = jnp.tril(jnp.ones((seq, seq), dtype=bool))
    x, _ = jax.lax.scan(lambda x, p: (block(x, p, causal), None), x, params["layers"])
    return jnp.einsum("bsd,vd->bsv", layer_norm(x), embed)


def train_step_scanned(params, opt_state, batch):
    """`train_step` of the scan-over-layers model."""
    loss, grads = jax.value_and_grad(loss_fn)(params, batch, forward_scanned)
    updates, new_opt_state = OPTIMIZER.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), new_opt_state, loss


def make_scanned_inputs(cfg: Config, seed: int = 0) -> tuple[Any, Any, dict[str, jax.Array]]:
    """`make_inputs` for `train_step_scanned`: the same values, the layers stacked."""
    params, opt_state, batch = make_inputs(cfg, seed)
    stacked = jax.tree_util.tree_map(
        lambda x: stack_layers(x) if isinstance(x, dict) and "layers" in x else x, opt_state,
        is_leaf=lambda x: isinstance(x, dict) and "layers" in x)
    return stack_layers(params), stacked, batch
