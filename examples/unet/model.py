"""A diffusion UNet (Ho et al., the noise predictor of DDPM's reverse process) and its Adam
training step, in plain JAX, NHWC.

    conv_in -> [level 0 .. L-1: `res_blocks` residual blocks (+ self-attention at the
    `attn_levels` lowest resolutions), then a strided-conv downsample but at the last level]
    -> middle: residual block, self-attention, residual block
    -> [level L-1 .. 0: `res_blocks + 1` residual blocks, each on the concatenation of the
    activation and the skip of the matching down-path output (+ self-attention as on the
    way down), then a nearest upsample and a conv but at level 0]
    -> GroupNorm, SiLU, conv_out

A residual block is GroupNorm, SiLU, 3x3 conv, + a projection of the time embedding,
GroupNorm, SiLU, 3x3 conv, added to its input (through a 1x1 conv where the channel count
changes: on the way up, where the skip was concatenated). Its ten parameter tensors (twelve
with the 1x1 conv) are

    norm1/{scale,bias} [C_in], conv1/{w [3,3,C_in,C], b [C]}, temb/{w [4C0,C], b [C]},
    norm2/{scale,bias} [C], conv2/{w [3,3,C,C], b [C]}, (skip/{w [1,1,C_in,C], b [C]})

and a self-attention block's six are norm/{scale,bias} [C], w_qkv [H, C, 3, Dh],
b_qv [H, 2, Dh], w_out [H, Dh, C], b_out [C]: heads first, so that the paper's Megatron-like
rule "shard the attention linear weights on dim 0" splits them by heads. There is no key
bias: the softmax cancels it, so its gradient would be 0 up to rounding, which Adam's
normalised update would amplify into a test-breaking difference between two programs.

With `FULL` (4 levels of 4 residual blocks, attention at the lowest, 8x8 resolution) that is
    2 x 2 (time MLP) + 2 (conv_in) + 16 x 10 + 4 x 6 + 3 x 2 (down) + 2 x 10 + 6 (middle)
    + 20 x 12 + 5 x 6 + 3 x 2 (up) + 2 + 2 (output) = 502
parameter tensors, the paper's count (its BP all_reduce count, 503, is one per gradient
and one for the loss).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

LEARNING_RATE = 1e-3
GROUP_WIDTH = 8  # channels per GroupNorm group: DDPM's 32 groups at 256 channels
DIFFUSION_STEPS = 1000


@dataclasses.dataclass(frozen=True)
class Config:
    batch: int
    image_size: int
    channels: int  # every level's width (the model is as wide at every resolution)
    levels: int  # resolutions: image_size, image_size / 2, ...
    res_blocks: int  # residual blocks per level on the way down (one more on the way up)
    attn_levels: int  # the lowest resolutions with self-attention after each block
    heads: int
    in_channels: int = 3

    @property
    def groups(self) -> int:
        # GroupNorm's groups: of GROUP_WIDTH channels (it is not a parameter, so
        # `train_step` reads it off the channel count).
        return self.channels // GROUP_WIDTH

    @property
    def temb_dim(self) -> int:
        return 4 * self.channels

    @property
    def head_dim(self) -> int:
        return self.channels // self.heads

    def has_attention(self, level: int) -> bool:
        return level >= self.levels - self.attn_levels

    def __post_init__(self) -> None:
        if self.channels % self.heads or self.channels % GROUP_WIDTH:
            raise ValueError(f"channels {self.channels} must be a multiple of heads "
                             f"{self.heads} and of {GROUP_WIDTH}")
        if self.image_size % 2 ** (self.levels - 1):
            raise ValueError(f"image size {self.image_size} cannot be halved "
                             f"{self.levels - 1} times")


# The paper-sized model: 502 parameter tensors. Only ever used abstractly.
FULL = Config(batch=32, image_size=64, channels=256, levels=4, res_blocks=4, attn_levels=1,
              heads=16)
# Runs on 8 CPU devices. The batch and the channel counts are divisible by the mesh
# {"batch": 4, "model": 2}; 2 GroupNorm groups and 2 heads, divisible by "model".
TINY = Config(batch=8, image_size=8, channels=16, levels=2, res_blocks=1, attn_levels=1,
              heads=2)


# --- layers ----------------------------------------------------------------------------------


def group_norm(x: jax.Array, p: dict[str, jax.Array], groups: int,
               eps: float = 1e-5) -> jax.Array:
    b, h, w, c = x.shape
    g = x.reshape(b, h, w, groups, c // groups)
    mean = jnp.mean(g, axis=(1, 2, 4), keepdims=True)
    var = jnp.mean(jnp.square(g - mean), axis=(1, 2, 4), keepdims=True)
    g = (g - mean) * jax.lax.rsqrt(var + eps)
    return g.reshape(b, h, w, c) * p["scale"] + p["bias"]


def conv(x: jax.Array, p: dict[str, jax.Array], stride: int = 1) -> jax.Array:
    k = p["w"].shape[0]
    pad = (k - 1) // 2
    y = jax.lax.conv_general_dilated(x, p["w"], (stride, stride), [(pad, pad), (pad, pad)],
                                     dimension_numbers=("NHWC", "HWIO", "NHWC"))
    return y + p["b"]


def dense(x: jax.Array, p: dict[str, jax.Array]) -> jax.Array:
    return x @ p["w"] + p["b"]


def res_block(x: jax.Array, temb: jax.Array, p: dict[str, Any], groups: int) -> jax.Array:
    h = conv(jax.nn.silu(group_norm(x, p["norm1"], groups)), p["conv1"])
    h = h + dense(jax.nn.silu(temb), p["temb"])[:, None, None, :]
    h = conv(jax.nn.silu(group_norm(h, p["norm2"], groups)), p["conv2"])
    if "skip" in p:
        x = conv(x, p["skip"])
    return x + h


_QV_TO_QKV = np.array([[1, 0, 0], [0, 0, 1]], np.float32)


def attention(x: jax.Array, p: dict[str, Any], groups: int) -> jax.Array:
    b, hh, ww, c = x.shape
    h = group_norm(x, p["norm"], groups).reshape(b, hh * ww, c)
    # No key bias: it adds a per-query constant to the scores, which the softmax cancels. The
    # query and value biases are placed by a constant selection matrix rather than added to
    # slices of qkv, so that their gradient is one reduction (one all_reduce under BP).
    b_qkv = jnp.einsum("hsk,st->thk", p["b_qv"], _QV_TO_QKV)
    qkv = jnp.einsum("bnc,hctk->tbhnk", h, p["w_qkv"]) + b_qkv[:, None, :, None, :]
    q, k, v = qkv[0], qkv[1], qkv[2]
    scores = jnp.einsum("bhnk,bhmk->bhnm", q, k) / np.sqrt(q.shape[-1]).astype(x.dtype)
    out = jnp.einsum("bhnm,bhmk->bhnk", jax.nn.softmax(scores, axis=-1), v)
    out = jnp.einsum("bhnk,hkc->bnc", out, p["w_out"]) + p["b_out"]
    return x + out.reshape(b, hh, ww, c)


def downsample(x: jax.Array, p: dict[str, jax.Array]) -> jax.Array:
    return conv(x, p, stride=2)


def upsample(x: jax.Array, p: dict[str, jax.Array]) -> jax.Array:
    b, h, w, c = x.shape  # nearest neighbour: each pixel becomes a 2x2 block
    x = jnp.broadcast_to(x[:, :, None, :, None, :], (b, h, 2, w, 2, c))
    return conv(x.reshape(b, 2 * h, 2 * w, c), p)


def timestep_embedding(t: jax.Array, dim: int) -> jax.Array:
    half = dim // 2
    freqs = np.exp(-math.log(10000.0) * np.arange(half) / (half - 1)).astype(np.float32)
    args = t.astype(jnp.float32)[:, None] * freqs[None, :]
    return jnp.concatenate([jnp.sin(args), jnp.cos(args)], axis=1)


# --- model ---------------------------------------------------------------------------------


def forward(params: dict[str, Any], x: jax.Array, t: jax.Array, cfg: Config) -> jax.Array:
    """The predicted noise [B, H, W, in_channels] of noisy images x at timesteps t [B]."""
    g = cfg.groups
    temb = timestep_embedding(t, cfg.channels)
    temb = dense(jax.nn.silu(dense(temb, params["temb"]["dense0"])), params["temb"]["dense1"])

    h = conv(x, params["conv_in"])
    skips = [h]
    for level, p in enumerate(params["down"]):
        for i, rp in enumerate(p["res_blocks"]):
            h = res_block(h, temb, rp, g)
            if cfg.has_attention(level):
                h = attention(h, p["attn"][i], g)
            skips.append(h)
        if "downsample" in p:
            h = downsample(h, p["downsample"])
            skips.append(h)

    mid = params["mid"]
    h = res_block(h, temb, mid["res_block1"], g)
    h = attention(h, mid["attn"], g)
    h = res_block(h, temb, mid["res_block2"], g)

    for level in reversed(range(cfg.levels)):
        p = params["up"][level]
        for i, rp in enumerate(p["res_blocks"]):
            h = res_block(jnp.concatenate([h, skips.pop()], axis=-1), temb, rp, g)
            if cfg.has_attention(level):
                h = attention(h, p["attn"][i], g)
        if "upsample" in p:
            h = upsample(h, p["upsample"])
    assert not skips

    return conv(jax.nn.silu(group_norm(h, params["norm_out"], g)), params["conv_out"])


def _alphas_cumprod() -> np.ndarray:
    betas = np.linspace(1e-4, 0.02, DIFFUSION_STEPS, dtype=np.float64)
    return np.cumprod(1.0 - betas).astype(np.float32)


def loss_fn(params: dict[str, Any], batch: dict[str, jax.Array], cfg: Config) -> jax.Array:
    """DDPM's simple loss: the MSE of the noise predicted from the noised images."""
    abar = jnp.take(jnp.asarray(_alphas_cumprod()), batch["timesteps"])[:, None, None, None]
    noisy = jnp.sqrt(abar) * batch["images"] + jnp.sqrt(1.0 - abar) * batch["noise"]
    pred = forward(params, noisy, batch["timesteps"], cfg)
    return jnp.mean(jnp.square(pred - batch["noise"]))


OPTIMIZER = optax.adam(LEARNING_RATE)


def config_of(params: dict[str, Any], batch: dict[str, jax.Array]) -> Config:
    """The Config the params and batch have (train_step's signature is the transformer's)."""
    b, size, _, cin = batch["images"].shape
    down = params["down"]
    attn = sum("attn" in p for p in down)
    channels = params["conv_in"]["w"].shape[3]
    heads = params["mid"]["attn"]["w_qkv"].shape[0]
    return Config(batch=b, image_size=size, channels=channels, levels=len(down),
                  res_blocks=len(down[0]["res_blocks"]), attn_levels=attn, heads=heads,
                  in_channels=cin)


def train_step(params, opt_state, batch):
    """One Adam step: (new_params, new_opt_state, loss)."""
    cfg = config_of(params, batch)
    loss, grads = jax.value_and_grad(loss_fn)(params, batch, cfg)
    updates, new_opt_state = OPTIMIZER.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), new_opt_state, loss


# --- inputs ----------------------------------------------------------------------------------


def _res_block_shapes(c_in: int, c: int, temb: int) -> dict[str, Any]:
    p = {"norm1": {"scale": (c_in,), "bias": (c_in,)},
         "conv1": {"w": (3, 3, c_in, c), "b": (c,)},
         "temb": {"w": (temb, c), "b": (c,)},
         "norm2": {"scale": (c,), "bias": (c,)},
         "conv2": {"w": (3, 3, c, c), "b": (c,)}}
    if c_in != c:
        p["skip"] = {"w": (1, 1, c_in, c), "b": (c,)}
    return p


def _attn_shapes(c: int, heads: int) -> dict[str, Any]:
    dh = c // heads
    return {"norm": {"scale": (c,), "bias": (c,)},
            "w_qkv": (heads, c, 3, dh), "b_qv": (heads, 2, dh),
            "w_out": (heads, dh, c), "b_out": (c,)}


def param_shapes(cfg: Config) -> dict[str, Any]:
    c, t = cfg.channels, cfg.temb_dim
    down, up = [], []
    for level in range(cfg.levels):
        p: dict[str, Any] = {"res_blocks": [_res_block_shapes(c, c, t)
                                            for _ in range(cfg.res_blocks)]}
        if cfg.has_attention(level):
            p["attn"] = [_attn_shapes(c, cfg.heads) for _ in range(cfg.res_blocks)]
        if level < cfg.levels - 1:
            p["downsample"] = {"w": (3, 3, c, c), "b": (c,)}
        down.append(p)
        # Every block on the way up reads the concatenation of its input and a skip.
        p = {"res_blocks": [_res_block_shapes(2 * c, c, t)
                            for _ in range(cfg.res_blocks + 1)]}
        if cfg.has_attention(level):
            p["attn"] = [_attn_shapes(c, cfg.heads) for _ in range(cfg.res_blocks + 1)]
        if level > 0:
            p["upsample"] = {"w": (3, 3, c, c), "b": (c,)}
        up.append(p)
    return {
        "temb": {"dense0": {"w": (c, t), "b": (t,)}, "dense1": {"w": (t, t), "b": (t,)}},
        "conv_in": {"w": (3, 3, cfg.in_channels, c), "b": (c,)},
        "down": down,
        "mid": {"res_block1": _res_block_shapes(c, c, t), "attn": _attn_shapes(c, cfg.heads),
                "res_block2": _res_block_shapes(c, c, t)},
        "up": up,
        "norm_out": {"scale": (c,), "bias": (c,)},
        "conv_out": {"w": (3, 3, c, cfg.in_channels), "b": (cfg.in_channels,)},
    }


def init_params(cfg: Config, seed: int = 0) -> dict[str, Any]:
    rng = np.random.default_rng(seed)

    def init(path: tuple[Any, ...], shape: tuple[int, ...]) -> jax.Array:
        name = path[-1].key
        if name == "scale":
            # Not exactly 1: a scale applied to the wrong slice must change the result.
            x = 1.0 + 0.1 * rng.normal(size=shape)
        elif name in ("bias", "b", "b_qv", "b_out"):
            x = 0.1 * rng.normal(size=shape)
        else:
            fan_in = {"w_qkv": shape[1], "w_out": shape[0] * shape[1]}.get(
                name, int(np.prod(shape[:-1])))
            x = rng.normal(0.0, fan_in ** -0.5, shape)
        return jnp.asarray(x.astype(np.float32))

    return jax.tree_util.tree_map_with_path(init, param_shapes(cfg), is_leaf=_is_shape)


def make_batch(cfg: Config, seed: int = 0) -> dict[str, jax.Array]:
    rng = np.random.default_rng(seed + 1)
    shape = (cfg.batch, cfg.image_size, cfg.image_size, cfg.in_channels)
    return {"images": jnp.asarray(rng.uniform(-1.0, 1.0, shape).astype(np.float32)),
            "noise": jnp.asarray(rng.normal(size=shape).astype(np.float32)),
            "timesteps": jnp.asarray(rng.integers(0, DIFFUSION_STEPS, (cfg.batch,),
                                                  dtype=np.int32))}


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
    shape = (cfg.batch, cfg.image_size, cfg.image_size, cfg.in_channels)
    batch = {"images": jax.ShapeDtypeStruct(shape, jnp.float32),
             "noise": jax.ShapeDtypeStruct(shape, jnp.float32),
             "timesteps": jax.ShapeDtypeStruct((cfg.batch,), jnp.int32)}
    return params, opt_state, batch


def _is_shape(x: Any) -> bool:
    return isinstance(x, tuple) and all(isinstance(d, int) for d in x)
