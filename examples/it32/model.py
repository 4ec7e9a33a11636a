"""IT32: an inference-only decoder transformer served with a KV cache, in plain JAX.

`serve(params, prompt)` runs the prompt through every layer once (the *prefill*, which
fills each layer's key/value cache with the prompt's keys and values and predicts the first
new token), then `decode_steps` autoregressive steps in a `lax.scan` (a static trip count):
each step embeds the last predicted token, runs it through all layers against the caches
the scan carries (writing its own key and value at its position) and predicts the next
token greedily. It returns the `1 + decode_steps` new tokens and their logits.

Every block has the T32 training example's layout (`examples/transformer/model.py`), the
dims that Megatron shards (heads, d_ff) kept as separate tensor dims:

    ln1_scale [D], ln1_bias [D], w_qkv [D, 3, H, Dh], w_o [H, Dh, D],
    ln2_scale [D], ln2_bias [D], w_up [D, F], b_up [F], w_down [F, D];  embed [V, D]

The multi-query variant (`Config.multi_query`, Shazeer's multi-query attention, as served
by Pope et al.) has one key/value head shared by all query heads: `w_qkv` becomes
`w_q [D, H, Dh]` and `w_kv [D, 2, Dh]`, and the caches lose their head dim
(`[B, T, Dh]` rather than `[B, T, H, Dh]`).

The caches are named with `partir.tag` (`cache/<layer>/k`, `cache/<layer>/v`) where the
prefill has filled them, so that a tactic can shard them (the MQ tactic of
`schedules.py`); so are the attention's input, queries and output (`attn/x`, `attn/q`,
`attn/out`), where MQ's batch-sharded attention meets the rest of the model.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

import partir

MHA_PARAMS = ("ln1_scale", "ln1_bias", "w_qkv", "w_o", "ln2_scale", "ln2_bias", "w_up",
              "b_up", "w_down")
MQA_PARAMS = ("ln1_scale", "ln1_bias", "w_q", "w_kv", "w_o", "ln2_scale", "ln2_bias",
              "w_up", "b_up", "w_down")


@dataclasses.dataclass(frozen=True)
class Config:
    layers: int
    batch: int
    prompt: int  # prompt tokens per sequence
    decode_steps: int  # autoregressive steps after the prefill
    heads: int
    d_model: int
    vocab: int
    d_ff: int | None = None
    multi_query: bool = False

    @property
    def ff(self) -> int:
        return 4 * self.d_model if self.d_ff is None else self.d_ff

    @property
    def head_dim(self) -> int:
        return self.d_model // self.heads

    @property
    def max_len(self) -> int:
        """The caches' length: the prompt and every decode step's token."""
        return self.prompt + self.decode_steps

    @property
    def passes(self) -> int:
        """Passes through all layers per call: the prefill and every decode step."""
        return 1 + self.decode_steps

    def __post_init__(self) -> None:
        if self.d_model % self.heads:
            raise ValueError(f"d_model {self.d_model} is not a multiple of heads {self.heads}")


# The paper's IT32: T32's widths (examples/transformer/model.py) served for 1536 passes
# through the 32 layers (1 prefill + 1535 decode steps; README, "Table 2, derived"). Only
# ever used abstractly (`abstract_inputs`).
IT32 = Config(layers=32, batch=32, prompt=128, decode_steps=1535, heads=32, d_model=4096,
              vocab=32000)
IT32_MQ = dataclasses.replace(IT32, multi_query=True)
# Runs on 8 CPU devices. Every dim the schedules shard is divisible by the mesh
# {"batch": 4, "model": 2}: the batch by 8 (BP then MQ), heads and d_ff by 2.
TINY = Config(layers=2, batch=8, prompt=4, decode_steps=3, heads=4, d_model=32, vocab=64,
              d_ff=64)
TINY_MQ = dataclasses.replace(TINY, multi_query=True)


# --- model ---------------------------------------------------------------------------------


def layer_norm(x: jax.Array, scale: jax.Array | None = None, bias: jax.Array | None = None,
               eps: float = 1e-5) -> jax.Array:
    mean = jnp.mean(x, axis=-1, keepdims=True)
    var = jnp.mean(jnp.square(x - mean), axis=-1, keepdims=True)
    y = (x - mean) * jax.lax.rsqrt(var + eps)
    if scale is not None:
        y = y * scale + bias
    return y


def _write(cache: jax.Array, new: jax.Array, pos: jax.Array | int) -> jax.Array:
    """`new` [B, s, ...] written into `cache` [B, T, ...] at positions pos..pos+s-1."""
    start = (0, pos) + (0,) * (cache.ndim - 2)
    return jax.lax.dynamic_update_slice(cache, new.astype(cache.dtype), start)


def attention(x: jax.Array, p: dict[str, jax.Array], k_cache: jax.Array, v_cache: jax.Array,
              pos: jax.Array | int) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Attention of the `s` tokens x [B, s, D] at positions pos..pos+s-1 over the cache:
    (output [B, s, D], the caches with the tokens' keys and values written in)."""
    s, t = x.shape[1], k_cache.shape[1]
    x = partir.tag(x, "attn/x")
    if "w_qkv" in p:  # multi-head: caches [B, T, H, Dh]
        qkv = jnp.einsum("bsd,dthk->tbshk", x, p["w_qkv"])
        q, k, v = qkv[0], qkv[1], qkv[2]
    else:  # multi-query: one key/value head, caches [B, T, Dh]
        q = jnp.einsum("bsd,dhk->bshk", x, p["w_q"])
        kv = jnp.einsum("bsd,dtk->tbsk", x, p["w_kv"])
        k, v = kv[0], kv[1]
    k_cache, v_cache = _write(k_cache, k, pos), _write(v_cache, v, pos)
    q = partir.tag(q, "attn/q")
    scale = np.sqrt(q.shape[-1]).astype(x.dtype)
    # Causal over the whole cache: token i (at pos + i) sees positions <= pos + i, which
    # also hides the cache's not yet written tail.
    visible = (jnp.arange(t)[None, :] <= pos + jnp.arange(s)[:, None])
    if k_cache.ndim == 4:
        scores = jnp.einsum("bshk,bthk->bhst", q, k_cache) / scale
    else:
        scores = jnp.einsum("bshk,btk->bhst", q, k_cache) / scale
    scores = jnp.where(visible, scores, jnp.finfo(x.dtype).min)
    probs = jax.nn.softmax(scores, axis=-1)
    if v_cache.ndim == 4:
        out = jnp.einsum("bhst,bthk->bshk", probs, v_cache)
    else:
        out = jnp.einsum("bhst,btk->bshk", probs, v_cache)
    out = partir.tag(out, "attn/out")
    return jnp.einsum("bshk,hkd->bsd", out, p["w_o"]), k_cache, v_cache


def mlp(x: jax.Array, p: dict[str, jax.Array]) -> jax.Array:
    return jax.nn.gelu(x @ p["w_up"] + p["b_up"]) @ p["w_down"]


def block(x: jax.Array, p: dict[str, jax.Array], cache: tuple[jax.Array, jax.Array],
          pos: jax.Array | int) -> tuple[jax.Array, tuple[jax.Array, jax.Array]]:
    a, k_cache, v_cache = attention(layer_norm(x, p["ln1_scale"], p["ln1_bias"]), p, *cache,
                                    pos)
    x = x + a
    x = x + mlp(layer_norm(x, p["ln2_scale"], p["ln2_bias"]), p)
    return x, (k_cache, v_cache)


def run_layers(params: dict[str, Any], x: jax.Array, caches: list, pos: jax.Array | int
               ) -> tuple[jax.Array, list]:
    """All blocks on x [B, s, D]; logits [B, V] of the last token, and the new caches."""
    new = []
    for p, cache in zip(params["layers"], caches, strict=True):
        x, cache = block(x, p, cache, pos)
        new.append(cache)
    logits = jnp.einsum("bd,vd->bv", layer_norm(x[:, -1]), params["embed"])
    return logits, new


def empty_caches(params: dict[str, Any], batch: int, max_len: int, dtype) -> list:
    shapes = []
    for p in params["layers"]:
        if "w_qkv" in p:
            _, _, h, dh = p["w_qkv"].shape
            shapes.append((batch, max_len, h, dh))
        else:
            shapes.append((batch, max_len, p["w_kv"].shape[-1]))
    return [(jnp.zeros(s, dtype), jnp.zeros(s, dtype)) for s in shapes]


def serve(params: dict[str, Any], prompt: jax.Array, decode_steps: int
          ) -> tuple[jax.Array, jax.Array]:
    """Greedy generation: (tokens [B, 1 + decode_steps], logits [B, 1 + decode_steps, V])
    for int prompt tokens [B, S]. `decode_steps` is static (bind it with
    functools.partial, as `serving_fn` does)."""
    embed = params["embed"]
    batch, seq = prompt.shape
    caches = empty_caches(params, batch, seq + decode_steps, embed.dtype)
    # The prefill: the whole prompt through every layer, filling the caches.
    logits, caches = run_layers(params, jnp.take(embed, prompt, axis=0), caches, 0)
    caches = [(partir.tag(k, f"cache/{i}/k"), partir.tag(v, f"cache/{i}/v"))
              for i, (k, v) in enumerate(caches)]
    token = jnp.argmax(logits, axis=-1).astype(prompt.dtype)

    def step(carry, pos):
        token, caches = carry
        x = jnp.take(embed, token[:, None], axis=0)
        logits, caches = run_layers(params, x, caches, pos)
        next_token = jnp.argmax(logits, axis=-1).astype(token.dtype)
        return (next_token, caches), (next_token, logits)

    positions = seq + jnp.arange(decode_steps, dtype=jnp.int32)
    _, (tokens, step_logits) = jax.lax.scan(step, (token, caches), positions)
    tokens = jnp.concatenate([token[:, None], tokens.T], axis=1)
    logits = jnp.concatenate([logits[:, None], jnp.swapaxes(step_logits, 0, 1)], axis=1)
    return tokens, logits


def serving_fn(cfg: Config):
    """`serve` with the config's decode steps bound: fn(params, prompt)."""
    def serve_steps(params, prompt):
        return serve(params, prompt, cfg.decode_steps)
    serve_steps.__name__ = serve_steps.__qualname__ = "serve"
    return serve_steps


# --- inputs ----------------------------------------------------------------------------------


def param_shapes(cfg: Config) -> dict[str, Any]:
    d, h, dh, f = cfg.d_model, cfg.heads, cfg.head_dim, cfg.ff
    attn = ({"w_q": (d, h, dh), "w_kv": (d, 2, dh)} if cfg.multi_query
            else {"w_qkv": (d, 3, h, dh)})
    layer = {"ln1_scale": (d,), "ln1_bias": (d,), **attn, "w_o": (h, dh, d),
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


def make_inputs(cfg: Config, seed: int = 0) -> tuple[dict[str, Any], jax.Array]:
    """Concrete (params, prompt), seeded."""
    rng = np.random.default_rng(seed + 1)
    prompt = jnp.asarray(rng.integers(0, cfg.vocab, (cfg.batch, cfg.prompt), dtype=np.int32))
    return init_params(cfg, seed), prompt


def abstract_inputs(cfg: Config) -> tuple[dict[str, Any], jax.ShapeDtypeStruct]:
    """(params, prompt) as `jax.ShapeDtypeStruct`s: nothing is allocated."""
    params = jax.tree_util.tree_map(lambda s: jax.ShapeDtypeStruct(s, jnp.float32),
                                    param_shapes(cfg), is_leaf=_is_shape)
    return params, jax.ShapeDtypeStruct((cfg.batch, cfg.prompt), jnp.int32)


def _is_shape(x: Any) -> bool:
    return isinstance(x, tuple) and all(isinstance(d, int) for d in x)
