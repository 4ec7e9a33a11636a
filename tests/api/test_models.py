"""Models that real users bring, each a full optax training step
`(params, opt_state, batch) -> (params, opt_state, loss)` in plain JAX: under BP, BP+MP and
BP+Z3 (and BP+MP+Z3 where Megatron-style sharding is natural) on 8 CPU devices, the
partitioned step equals `jax.jit` of the same step and no primitive is reported
unsupported.

The models differ from those covered elsewhere (tests/api/test_cnn.py, test_lstm.py,
examples/): a CNN with training-mode BatchNorm and max pooling, a ResNet with a strided
downsample and a projection shortcut, a ViT, a top-2 mixture of experts, a bf16
mixed-precision MLP and a GPT whose layers run in a rematerialised `lax.scan` with a tied
embedding. Each one's docstring says which primitives it brings to the
partitioner.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax import lax

import partir
from partir import FIRST_DIVISIBLE_DIM, UNKNOWN, ManualPartition
from partir.core.regions import structured
from tests.oracles import assert_tree_close

MESH = {"batch": 4, "model": 2}
DN = ("NHWC", "HWIO", "NHWC")
B = 8  # global batch: 2 examples per "batch" shard


@dataclasses.dataclass(frozen=True)
class Model:
    """A loss `loss_fn(params, batch)`, its optimizer, inputs, and for MP the dimension
    of each parameter leaf sharded over "model" (leaves not named are left to
    propagation; the optimizer's moments share the parameters' leaf names)."""

    loss_fn: Callable
    optimizer: optax.GradientTransformation
    make_params: Callable[[np.random.Generator], dict]
    make_batch: Callable[[np.random.Generator], dict]
    mp_dims: dict[str, int]

    def step(self, params, opt_state, batch):
        loss, grads = jax.value_and_grad(self.loss_fn)(params, batch)
        updates, opt_state = self.optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    def inputs(self):
        rng = np.random.default_rng(0)
        params = jax.tree.map(lambda a: jnp.asarray(a, jnp.float32), self.make_params(rng))
        return params, self.optimizer.init(params), self.make_batch(rng)


def normal(rng, *shape, scale=1.0):
    return (scale * rng.normal(size=shape)).astype(np.float32)


def conv(x, w, stride=1, padding="SAME"):
    return lax.conv_general_dilated(x, w, (stride, stride), padding, dimension_numbers=DN)


def cross_entropy(logits, labels):
    logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    return -jnp.mean(jnp.take_along_axis(logp, labels[:, None], axis=-1))


def images(rng, classes=10, size=8):
    return {"x": jnp.asarray(normal(rng, B, size, size, 3)),
            "y": jnp.asarray(rng.integers(0, classes, (B,)), jnp.int32)}


def layer_norm(x, scale, bias):
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) * lax.rsqrt(var + 1e-5) * scale + bias


# --- 1. CNN with BatchNorm and max pooling ----------------------------------------------------


def batch_norm(x, p):
    """Training-mode BatchNorm: the statistics of this batch over N, H, W. Under BP the
    mean and variance are reductions over the sharded batch dimension (an all_reduce of
    partial sums, not a gather of the activations)."""
    mean = x.mean(axis=(0, 1, 2))
    var = ((x - mean) ** 2).mean(axis=(0, 1, 2))
    return (x - mean) * lax.rsqrt(var + 1e-5) * p["gamma"] + p["beta"]


def max_pool(x):
    # reduce_window max; its gradient is select_and_scatter_add.
    return lax.reduce_window(x, -jnp.inf, lax.max, (1, 2, 2, 1), (1, 2, 2, 1), "VALID")


def bn_cnn_loss(params, batch):
    """conv -> BatchNorm -> relu -> max pool, twice, then a dense head: the classic
    image classifier, whose batch statistics couple the examples of a batch."""
    h = batch["x"]
    for i in (1, 2):
        h = conv(h, params[f"conv{i}"])
        h = max_pool(jax.nn.relu(batch_norm(h, params[f"bn{i}"])))
    logits = h.reshape(h.shape[0], -1) @ params["dense"] + params["dense_b"]
    return cross_entropy(logits, batch["y"])


BN_CNN = Model(
    loss_fn=bn_cnn_loss,
    optimizer=optax.adam(1e-2),
    make_params=lambda rng: {
        "conv1": normal(rng, 3, 3, 3, 8, scale=0.3),
        "bn1": {"gamma": 1 + normal(rng, 8, scale=0.1), "beta": normal(rng, 8, scale=0.1)},
        "conv2": normal(rng, 3, 3, 8, 8, scale=0.2),
        "bn2": {"gamma": 1 + normal(rng, 8, scale=0.1), "beta": normal(rng, 8, scale=0.1)},
        "dense": normal(rng, 2 * 2 * 8, 10, scale=0.2), "dense_b": normal(rng, 10)},
    make_batch=images,
    # conv1's output channels (and bn1 with them), conv2's input channels: one
    # reduction of conv2's output, as Megatron does for an MLP.
    mp_dims={"conv1": 3, "gamma": 0, "beta": 0, "conv2": 2},
)


# --- 2. ResNet ----------------------------------------------------------------------------------


def res_block(h, p, stride):
    """Pre-activation residual block; a strided 3x3 conv downsamples, and a strided 1x1
    conv projects the shortcut when the shape changes."""
    out = conv(jax.nn.relu(h), p["conv_a"], stride)
    out = conv(jax.nn.relu(out), p["conv_b"])
    shortcut = conv(h, p["proj"], stride, "VALID") if "proj" in p else h
    return out + shortcut


def resnet_loss(params, batch):
    """A stem conv, an identity block, a downsampling block with a projection shortcut,
    global average pooling and a classifier: ResNet's structure at toy size."""
    h = conv(batch["x"], params["stem"])
    h = res_block(h, params["block1"], 1)
    h = res_block(h, params["block2"], 2)
    h = jax.nn.relu(h).mean(axis=(1, 2))  # global average pool
    return cross_entropy(h @ params["head"], batch["y"])


RESNET = Model(
    loss_fn=resnet_loss,
    optimizer=optax.sgd(0.05, momentum=0.9),
    make_params=lambda rng: {
        "stem": normal(rng, 3, 3, 3, 8, scale=0.3),
        "block1": {"conv_a": normal(rng, 3, 3, 8, 8, scale=0.15),
                   "conv_b": normal(rng, 3, 3, 8, 8, scale=0.15)},
        "block2": {"conv_a": normal(rng, 3, 3, 8, 16, scale=0.15),
                   "conv_b": normal(rng, 3, 3, 16, 16, scale=0.1),
                   "proj": normal(rng, 1, 1, 8, 16, scale=0.3)},
        "head": normal(rng, 16, 10, scale=0.3)},
    make_batch=images,
    # Each block's inner channels: conv_a's outputs, conv_b's inputs.
    mp_dims={"conv_a": 3, "conv_b": 2},
)


# --- 3. ViT -------------------------------------------------------------------------------------

VIT_D, VIT_HEADS, VIT_DH, VIT_F, PATCH = 16, 4, 4, 32, 4


def attention(x, p):
    """Multi-head self-attention with per-head projections [D, H, Dh], in einsum."""
    q, k, v = (jnp.einsum("btd,dhk->bthk", x, p[w]) for w in ("wq", "wk", "wv"))
    scores = jnp.einsum("bthk,bshk->bhts", q, k) / np.sqrt(VIT_DH)
    out = jnp.einsum("bhts,bshk->bthk", jax.nn.softmax(scores, axis=-1), v)
    return jnp.einsum("bthk,hkd->btd", out, p["wo"])


def vit_loss(params, batch):
    """Patches embedded by a strided conv, a class token, learned position embeddings,
    two pre-LN transformer blocks and a classifier on the class token."""
    x = conv(batch["x"], params["patch"], PATCH, "VALID")  # [B, 2, 2, D]
    x = x.reshape(x.shape[0], -1, VIT_D)
    cls = jnp.broadcast_to(params["cls"], (x.shape[0], 1, VIT_D))
    x = jnp.concatenate([cls, x], axis=1) + params["pos"]
    for p in params["blocks"]:
        x = x + attention(layer_norm(x, *p["ln1"]), p)
        h = jax.nn.gelu(layer_norm(x, *p["ln2"]) @ p["w_up"] + p["b_up"])
        x = x + h @ p["w_down"]
    x = layer_norm(x[:, 0], *params["ln_f"])
    return cross_entropy(x @ params["head"], batch["y"])


def vit_block(rng):
    d, h, k, f = VIT_D, VIT_HEADS, VIT_DH, VIT_F
    return {"ln1": [np.ones(d), np.zeros(d)], "ln2": [np.ones(d), np.zeros(d)],
            **{w: normal(rng, d, h, k, scale=d ** -0.5) for w in ("wq", "wk", "wv")},
            "wo": normal(rng, h, k, d, scale=d ** -0.5),
            "w_up": normal(rng, d, f, scale=d ** -0.5), "b_up": np.zeros(f),
            "w_down": normal(rng, f, d, scale=f ** -0.5)}


VIT = Model(
    loss_fn=vit_loss,
    optimizer=optax.adam(1e-3),
    make_params=lambda rng: {
        "patch": normal(rng, PATCH, PATCH, 3, VIT_D, scale=0.1),
        "cls": normal(rng, VIT_D, scale=0.1), "pos": normal(rng, 5, VIT_D, scale=0.1),
        "blocks": [vit_block(rng) for _ in range(2)],
        "ln_f": [np.ones(VIT_D), np.zeros(VIT_D)], "head": normal(rng, VIT_D, 10, scale=0.2)},
    make_batch=images,
    # Megatron: attention by heads, the MLP by its hidden dimension.
    mp_dims={"wq": 1, "wk": 1, "wv": 1, "wo": 0, "w_up": 1, "b_up": 0, "w_down": 0},
)


# --- 4. Mixture of experts ----------------------------------------------------------------------

MOE_T, MOE_D, MOE_F, EXPERTS, TOP = 8, 8, 16, 4, 2


def moe_layer(x, params):
    """Top-2 routing: a softmax router, `lax.top_k` of its probabilities, a dense dispatch
    (every expert runs on every token, the combine weights zero the unrouted ones) with
    the experts' weights stacked [E, D, F]; returns the output and Switch Transformer's
    load-balancing loss."""
    probs = jax.nn.softmax(x @ params["router"], axis=-1)  # [B, T, E]
    gates, idx = lax.top_k(probs, TOP)  # [B, T, TOP]
    mask = jax.nn.one_hot(idx, EXPERTS, dtype=x.dtype)  # [B, T, TOP, E]
    combine = jnp.einsum("btk,btke->bte", gates / gates.sum(-1, keepdims=True), mask)
    h = jax.nn.gelu(jnp.einsum("btd,edf->btef", x, params["w_in"]))
    y = jnp.einsum("btef,efd->bted", h, params["w_out"])
    out = jnp.einsum("bted,bte->btd", y, combine)
    # The fraction of tokens routed to each expert (first choice) times its mean probability.
    load = mask[:, :, 0].mean(axis=(0, 1))
    aux = EXPERTS * jnp.sum(load * probs.mean(axis=(0, 1)))
    return out, aux


def moe_loss(params, batch):
    """A residual MoE layer between an input and output projection, regressed on targets."""
    x = batch["x"] @ params["w_embed"]
    out, aux = moe_layer(x, params)
    pred = (x + out) @ params["w_head"]
    return jnp.mean((pred - batch["target"]) ** 2) + 0.01 * aux


MOE = Model(
    loss_fn=moe_loss,
    optimizer=optax.adam(1e-2),
    make_params=lambda rng: {
        "w_embed": normal(rng, MOE_D, MOE_D, scale=0.5), "router": normal(rng, MOE_D, EXPERTS),
        "w_in": normal(rng, EXPERTS, MOE_D, MOE_F, scale=0.3),
        "w_out": normal(rng, EXPERTS, MOE_F, MOE_D, scale=0.3),
        "w_head": normal(rng, MOE_D, 4, scale=0.3)},
    make_batch=lambda rng: {"x": jnp.asarray(normal(rng, B, MOE_T, MOE_D)),
                            "target": jnp.asarray(normal(rng, B, MOE_T, 4))},
    # Expert parallelism: each "model" shard holds half of the experts.
    mp_dims={"w_in": 0, "w_out": 0},
)


# --- 5. bf16 mixed precision --------------------------------------------------------------------


def bf16_mlp_loss(params, batch):
    """f32 master weights cast to bf16 for the forward pass (as mixed-precision training
    does), the loss computed in f32; the gradients flow back through the casts to f32."""
    p = jax.tree.map(lambda w: w.astype(jnp.bfloat16), params)
    h = batch["x"].astype(jnp.bfloat16)
    h = jax.nn.gelu(h @ p["w1"] + p["b1"])
    h = jax.nn.gelu(h @ p["w2"] + p["b2"])
    return cross_entropy(h @ p["w3"], batch["y"])


BF16_MLP = Model(
    loss_fn=bf16_mlp_loss,
    optimizer=optax.adam(1e-2),
    make_params=lambda rng: {
        "w1": normal(rng, 16, 32, scale=0.25), "b1": np.zeros(32),
        "w2": normal(rng, 32, 32, scale=0.18), "b2": np.zeros(32),
        "w3": normal(rng, 32, 10, scale=0.18)},
    make_batch=lambda rng: {"x": jnp.asarray(normal(rng, B, 16)),
                            "y": jnp.asarray(rng.integers(0, 10, (B,)), jnp.int32)},
    # Megatron MLP: w1 by columns, w2 by rows.
    mp_dims={"w1": 1, "b1": 0, "w2": 0},
)


# --- 6. GPT with scan over layers, remat and a tied embedding ------------------------------

GPT_V, GPT_T, GPT_D, GPT_HEADS, GPT_DH, GPT_F, GPT_L = 16, 8, 16, 4, 4, 32, 2


def gpt_layer(x, p):
    """A pre-LN causal decoder layer: the fused QKV projection [D, 3, H, Dh], as in
    examples/transformer, but its weights are one slice of the stacked layers."""
    qkv = jnp.einsum("btd,dchk->cbthk", layer_norm(x, *p["ln1"]), p["w_qkv"])
    scores = jnp.einsum("bthk,bshk->bhts", qkv[0], qkv[1]) / np.sqrt(GPT_DH)
    causal = jnp.tril(jnp.ones((x.shape[1], x.shape[1]), bool))
    scores = jnp.where(causal, scores, -1e9)
    out = jnp.einsum("bhts,bshk->bthk", jax.nn.softmax(scores, axis=-1), qkv[2])
    x = x + jnp.einsum("bthk,hkd->btd", out, p["w_o"])
    h = jax.nn.gelu(layer_norm(x, *p["ln2"]) @ p["w_up"] + p["b_up"])
    return x + h @ p["w_down"]


def gpt_loss(params, batch):
    """Next-token prediction: the layers' weights stacked on a leading [L] dimension and
    run by `lax.scan` over a `jax.checkpoint`ed body (rematerialised in the backward
    pass), the output projection the transposed input embedding."""
    tokens, targets = batch["tokens"][:, :-1], batch["tokens"][:, 1:]
    x = jnp.take(params["embed"], tokens, axis=0) + params["pos"]
    x, _ = lax.scan(jax.checkpoint(lambda x, p: (gpt_layer(x, p), None)), x,
                    params["layers"])
    logits = layer_norm(x, *params["ln_f"]) @ params["embed"].T  # tied embedding
    logp = jax.nn.log_softmax(logits, axis=-1)
    return -jnp.mean(jnp.take_along_axis(logp, targets[..., None], axis=-1))


def gpt_params(rng):
    L, d, h, k, f = GPT_L, GPT_D, GPT_HEADS, GPT_DH, GPT_F
    norm = [np.ones((L, d)), np.zeros((L, d))]
    return {"embed": normal(rng, GPT_V, d, scale=0.5), "pos": normal(rng, GPT_T, d, scale=0.1),
            "layers": {"ln1": norm, "ln2": norm,
                       "w_qkv": normal(rng, L, d, 3, h, k, scale=d ** -0.5),
                       "w_o": normal(rng, L, h, k, d, scale=d ** -0.5),
                       "w_up": normal(rng, L, d, f, scale=d ** -0.5),
                       "b_up": np.zeros((L, f)),
                       "w_down": normal(rng, L, f, d, scale=f ** -0.5)},
            "ln_f": [np.ones(d), np.zeros(d)]}


GPT = Model(
    loss_fn=gpt_loss,
    optimizer=optax.adam(1e-3),
    make_params=gpt_params,
    make_batch=lambda rng: {
        "tokens": jnp.asarray(rng.integers(0, GPT_V, (B, GPT_T + 1)), jnp.int32)},
    # Megatron on the stacked layers (dimension 0 is the layer): heads and d_ff.
    mp_dims={"w_qkv": 3, "w_o": 1, "w_up": 2, "b_up": 1, "w_down": 1},
)

MODELS = {"bn_cnn": BN_CNN, "resnet": RESNET, "vit": VIT, "moe": MOE, "bf16_mlp": BF16_MLP,
          "gpt_scan": GPT}


# --- schedules ---------------------------------------------------------------------------------


def by_leaf(dims: dict[str, int]) -> Callable[[str, tuple[int, ...]], object]:
    def rule(name: str, shape: tuple[int, ...]) -> object:
        return dims.get(name.rsplit("/", 1)[-1], UNKNOWN)
    return rule


BP = ManualPartition({"batch": 0}, axis="batch", name="BP")


def zero(name: str, shape: tuple[int, ...]) -> object:
    # Past the layer dimension of stacked layers (params/layers/w_up: [L, D, F]), which the
    # scan iterates over: each layer's slice is gathered when the body takes it.
    return FIRST_DIVISIBLE_DIM.after(0) if "/layers/" in name else FIRST_DIVISIBLE_DIM


Z3 = ManualPartition({"params": zero, "opt_state": zero}, axis="batch", name="Z3")


def schedule(model: Model, name: str) -> list[ManualPartition]:
    mp = by_leaf(model.mp_dims)
    tactics = {"BP": BP, "Z3": Z3,
               "MP": ManualPartition({"params": mp, "opt_state": mp}, axis="model", name="MP")}
    return [tactics[t] for t in name.split("+")]


SCHEDULES = ["BP", "BP+MP", "BP+Z3", "BP+MP+Z3"]
CASES = [(m, s) for m in MODELS for s in SCHEDULES]


@functools.cache
def expected(model_name: str):
    model = MODELS[model_name]
    return jax.jit(model.step)(*model.inputs())


def assert_bf16_close(actual, expected) -> None:
    """bf16 carries 8 bits of mantissa (~4e-3 relative): partitioning reorders the
    reductions of the bf16 matmuls (partial sums over shards then an all_reduce), which
    changes the rounding of the bf16 values by a few ulps; the f32 results derived from
    them (loss, gradients, Adam's update) inherit that, so they are compared at 2e-2."""
    for a, e in zip(jax.tree.leaves(actual), jax.tree.leaves(expected), strict=True):
        np.testing.assert_allclose(np.asarray(a, np.float32), np.asarray(e, np.float32),
                                   rtol=2e-2, atol=2e-3)


def run(model_name: str, schedule_name: str):
    """Partition the model's step, check it equals the unpartitioned one and that no
    tactic reports an unsupported primitive; returns the metadata."""
    model = MODELS[model_name]
    args = model.inputs()
    fn, meta = partir.jit(model.step, MESH, schedule(model, schedule_name))
    compare = assert_bf16_close if model_name == "bf16_mlp" else assert_tree_close
    compare(fn(*args), expected(model_name))
    unsupported = [c for t in meta.tactics for c in t.conflicts if c["kind"] == "unsupported"]
    assert not unsupported, unsupported
    return meta


def params_on(meta, axis: str, dims: dict[str, int]) -> dict[str, list[int]]:
    """For each parameter input `params/.../leaf` whose leaf is in `dims`, the dimensions
    the final program shards over `axis`."""
    return {name: [d for d, axes in enumerate(s) if axis in axes]
            for name, s in meta.tactics[-1].shardings.items()
            if name.startswith("params/") and name.rsplit("/", 1)[-1] in dims}


@pytest.mark.slow
@pytest.mark.parametrize(("model_name", "schedule_name"),
                         [pytest.param(m, s, id=f"{m}-{s}") for m, s in CASES])
def test_training_step(model_name, schedule_name):
    meta = run(model_name, schedule_name)
    model = MODELS[model_name]
    if schedule_name == "BP":
        # The examples are split, not gathered: convs, BatchNorm's statistics, pooling,
        # attention, routing, the scan over layers and their gradients all run on the
        # local examples; only sums (gradients, batch statistics, the loss) are reduced.
        assert meta.collectives["all_gather"] == 0, meta.collectives
        assert meta.collectives["all_reduce"] > 0, meta.collectives
    if "MP" in schedule_name:
        # Each named parameter is sharded over "model" on exactly the intended dimension.
        on_model = params_on(meta, "model", model.mp_dims)
        assert on_model, meta.tactics[-1].shardings
        wrong = {n: d for n, d in on_model.items() if d != [model.mp_dims[n.rsplit("/", 1)[-1]]]}
        assert not wrong, wrong
    if "Z3" in schedule_name:
        # ZeRO-3 leaves the parameters sharded over "batch": each input parameter with a
        # dimension 4 divides that the tactics before left unsharded (FIRST_DIVISIBLE_DIM
        # skips sharded ones) is sharded on one dimension.
        args = model.inputs()
        shapes = {"params/" + "/".join(str(getattr(k, "key", getattr(k, "idx", k)))
                                       for k in path): leaf.shape
                  for path, leaf in jax.tree_util.tree_flatten_with_path(args[0])[0]}
        before, after = meta.tactics[-2].shardings, meta.tactics[-1].shardings
        missing = [n for n, shape in shapes.items()
                   if any(d % 4 == 0 and not before[n][i] for i, d in enumerate(shape))
                   and not any("batch" in axes for axes in after[n])]
        assert not missing, missing


# The primitives each model brings, which BP must split on the batch (forward and backward).
PRIMITIVES = {
    "bn_cnn": {"conv_general_dilated", "reduce_window_max", "select_and_scatter_add"},
    "resnet": {"conv_general_dilated"},
    "vit": {"conv_general_dilated"},
    "moe": {"top_k"},
    "bf16_mlp": {"dot_general"},
    "gpt_scan": {"scan"},
}


@pytest.mark.parametrize("model_name", MODELS)
def test_batch_parallelism_splits_each_primitive(model_name):
    """Without running: under BP no conflict at all, and every op of the model's
    characteristic primitives runs in a loop over "batch" (on the local examples);
    BP+MP+Z3 reports no primitive unsupported."""
    model = MODELS[model_name]
    args = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), model.inputs())
    result = partir.core_partition(model.step, MESH, schedule(model, "BP"), *args)
    assert result.conflicts == [], [str(c) for c in result.conflicts]
    program = structured(result.program)
    ops = [op for op in program.ops if op.name in PRIMITIVES[model_name]]
    assert {op.name for op in ops} == PRIMITIVES[model_name]
    unsplit = [op.name for op in ops if not any(lp.axis == "batch" for lp in program.nest(op))]
    assert not unsplit, unsplit
    full = partir.core_partition(model.step, MESH, schedule(model, "BP+MP+Z3"), *args)
    assert full.unsupported == [], [str(c) for c in full.unsupported]


@pytest.mark.slow
@pytest.mark.parametrize("dim", [0, 1], ids=["vocab", "d_model"])
def test_gpt_tied_embedding_sharded_over_model(dim):
    """The tied embedding [V, D] sharded over "model" (with BP): on the vocabulary, the
    lookup and the output projection are vocabulary-parallel and the log-softmax reduces
    over the shards, so nothing is gathered and no conflict arises; on d_model, both
    uses still equal the unpartitioned step."""
    emb = by_leaf({"embed": dim})
    tactic = ManualPartition({"params": emb, "opt_state": emb}, axis="model", name="EMB")
    args = GPT.inputs()
    fn, meta = partir.jit(GPT.step, MESH, [BP, tactic])
    assert_tree_close(fn(*args), expected("gpt_scan"))
    kinds = [c["kind"] for t in meta.tactics for c in t.conflicts]
    assert "unsupported" not in kinds, kinds
    assert meta.tactics[-1].shardings["params/embed"][dim] == ["model"]
    if dim == 0:
        assert kinds == [] and meta.collectives["all_gather"] == 0, (kinds, meta.collectives)
