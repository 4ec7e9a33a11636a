"""A Graph Network Simulator (Sanchez-Gonzalez et al. 2020) in the molecular configuration
of the PartIR paper (Godwin et al.), and its Adam training step, in plain JAX.

Encode-process-decode, as jraph's `GraphNetwork` (one graph per batch, with a global
latent):

    encode:   e = MLP_enc_e(edges), n = MLP_enc_n(nodes), g = 0
    24 steps, each with its own parameters (residual updates):
        e = e + MLP_e([e, n[senders], n[receivers], g])
        n = n + MLP_n([n, segment_sum(e, receivers, N), g])
        g = g + MLP_g([sum(n), sum(e), g])
    decode:   prediction = MLP_dec([n, g])  (per node; MSE against `targets`)

Every MLP has `mlp_layers` dense layers (`w{i}`, `b{i}`; hidden size `hidden`, output
`latent`, ReLU in between) followed by a LayerNorm (`ln_scale`, `ln_bias`), except the
decoder, whose last layer outputs `node_out` and which has no LayerNorm. Parameters:

    params = {"encoder": {"edge": mlp, "node": mlp}, "steps": [{"edge": mlp, "node": mlp,
              "global": mlp}, ...], "decoder": mlp}

The graph is `{"nodes": [N, node_in], "edges": [E, edge_in], "senders": [E] int32,
"receivers": [E] int32, "targets": [N, node_out]}`; inputs are named
`graph/edges`, `params/steps/3/edge/w0`, `opt_state/0/mu/decoder/b4`, ...
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

LEARNING_RATE = 1e-4
MLP_KINDS = ("edge", "node", "global")  # the per-step MLPs


@dataclasses.dataclass(frozen=True)
class Config:
    steps: int  # message-passing steps
    n_nodes: int
    n_edges: int
    latent: int
    hidden: int
    mlp_layers: int
    node_in: int = 16
    edge_in: int = 8
    node_out: int = 3
    layer_norm: bool = True

    def __post_init__(self) -> None:
        if self.mlp_layers < 1:
            raise ValueError("an MLP needs at least one layer")


# The paper's GNS: 5 MLP layers of hidden size 1024, 24 message-passing steps, latent 512,
# 2048 nodes and (at most) 65536 edges. Only ever used abstractly.
GNS = Config(steps=24, n_nodes=2048, n_edges=65536, latent=512, hidden=1024, mlp_layers=5)
# For 8 CPU devices: the edges divide by 4 and 8.
TINY = Config(steps=3, n_nodes=16, n_edges=64, latent=8, hidden=16, mlp_layers=3,
              node_in=4, edge_in=3, node_out=2)


# --- model -----------------------------------------------------------------------------------


def layer_norm(x: jax.Array, scale: jax.Array, bias: jax.Array,
               eps: float = 1e-5) -> jax.Array:
    mean = jnp.mean(x, axis=-1, keepdims=True)
    var = jnp.mean(jnp.square(x - mean), axis=-1, keepdims=True)
    return (x - mean) * jax.lax.rsqrt(var + eps) * scale + bias


def mlp(p: dict[str, jax.Array], x: jax.Array) -> jax.Array:
    layers = sum(1 for k in p if k.startswith("w"))
    for i in range(layers):
        x = x @ p[f"w{i}"] + p[f"b{i}"]
        if i < layers - 1:
            x = jax.nn.relu(x)
    if "ln_scale" in p:
        x = layer_norm(x, p["ln_scale"], p["ln_bias"])
    return x


def message_passing(p: dict[str, Any], nodes: jax.Array, edges: jax.Array, glob: jax.Array,
                    senders: jax.Array, receivers: jax.Array
                    ) -> tuple[jax.Array, jax.Array, jax.Array]:
    """One GraphNetwork step: edges, then nodes, then the global latent."""
    n_nodes, n_edges = nodes.shape[0], edges.shape[0]
    edge_in = jnp.concatenate(
        [edges, nodes[senders], nodes[receivers],
         jnp.broadcast_to(glob, (n_edges, glob.shape[-1]))], axis=-1)
    edges = edges + mlp(p["edge"], edge_in)
    received = jax.ops.segment_sum(edges, receivers, num_segments=n_nodes)
    node_in = jnp.concatenate(
        [nodes, received, jnp.broadcast_to(glob, (n_nodes, glob.shape[-1]))], axis=-1)
    nodes = nodes + mlp(p["node"], node_in)
    global_in = jnp.concatenate([jnp.sum(nodes, axis=0), jnp.sum(edges, axis=0), glob])
    glob = glob + mlp(p["global"], global_in)
    return nodes, edges, glob


def forward(params: dict[str, Any], graph: dict[str, jax.Array]) -> jax.Array:
    """Per-node predictions [N, node_out]."""
    edges = mlp(params["encoder"]["edge"], graph["edges"])
    nodes = mlp(params["encoder"]["node"], graph["nodes"])
    glob = jnp.zeros((edges.shape[-1],), edges.dtype)
    for p in params["steps"]:
        nodes, edges, glob = message_passing(p, nodes, edges, glob, graph["senders"],
                                             graph["receivers"])
    # The global latent is read out with every node, so every step's global update counts.
    return mlp(params["decoder"], jnp.concatenate(
        [nodes, jnp.broadcast_to(glob, nodes.shape)], axis=-1))


def loss_fn(params: dict[str, Any], graph: dict[str, jax.Array]) -> jax.Array:
    return jnp.mean(jnp.square(forward(params, graph) - graph["targets"]))


OPTIMIZER = optax.adam(LEARNING_RATE)


def train_step(params, opt_state, graph):
    """One Adam step: (new_params, new_opt_state, loss)."""
    loss, grads = jax.value_and_grad(loss_fn)(params, graph)
    updates, new_opt_state = OPTIMIZER.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), new_opt_state, loss


# --- inputs ----------------------------------------------------------------------------------


def mlp_shapes(cfg: Config, d_in: int, d_out: int, layer_norm: bool) -> dict[str, tuple]:
    sizes = [d_in] + [cfg.hidden] * (cfg.mlp_layers - 1) + [d_out]
    shapes: dict[str, tuple] = {}
    for i in range(cfg.mlp_layers):
        shapes[f"w{i}"] = (sizes[i], sizes[i + 1])
        shapes[f"b{i}"] = (sizes[i + 1],)
    if layer_norm:
        shapes["ln_scale"] = (d_out,)
        shapes["ln_bias"] = (d_out,)
    return shapes


def param_shapes(cfg: Config) -> dict[str, Any]:
    d, ln = cfg.latent, cfg.layer_norm
    step = {"edge": mlp_shapes(cfg, 4 * d, d, ln), "node": mlp_shapes(cfg, 3 * d, d, ln),
            "global": mlp_shapes(cfg, 3 * d, d, ln)}
    return {"encoder": {"edge": mlp_shapes(cfg, cfg.edge_in, d, ln),
                        "node": mlp_shapes(cfg, cfg.node_in, d, ln)},
            "steps": [step for _ in range(cfg.steps)],
            "decoder": mlp_shapes(cfg, 2 * d, cfg.node_out, False)}


def init_params(cfg: Config, seed: int = 0) -> dict[str, Any]:
    rng = np.random.default_rng(seed)

    def init(path: tuple[Any, ...], shape: tuple[int, ...]) -> jax.Array:
        name = path[-1].key
        if name == "ln_scale":
            # Not exactly 1: a scale applied to the wrong slice must change the result.
            x = 1.0 + 0.1 * rng.normal(size=shape)
        elif name.startswith("b") or name == "ln_bias":
            x = 0.1 * rng.normal(size=shape)
        else:
            x = rng.normal(0.0, shape[0] ** -0.5, shape)
        return jnp.asarray(x.astype(np.float32))

    return jax.tree_util.tree_map_with_path(init, param_shapes(cfg), is_leaf=_is_shape)


def make_graph(cfg: Config, seed: int = 0) -> dict[str, jax.Array]:
    """A random graph; every node has at least one incoming edge when E >= N."""
    rng = np.random.default_rng(seed + 1)
    n, e = cfg.n_nodes, cfg.n_edges
    receivers = rng.permutation(np.arange(e) % n).astype(np.int32)
    senders = rng.integers(0, n, e, dtype=np.int32)
    return {"nodes": jnp.asarray(rng.normal(size=(n, cfg.node_in)).astype(np.float32)),
            "edges": jnp.asarray(rng.normal(size=(e, cfg.edge_in)).astype(np.float32)),
            "senders": jnp.asarray(senders), "receivers": jnp.asarray(receivers),
            "targets": jnp.asarray(rng.normal(size=(n, cfg.node_out)).astype(np.float32))}


def make_inputs(cfg: Config, seed: int = 0) -> tuple[Any, Any, dict[str, jax.Array]]:
    """Concrete (params, opt_state, graph), seeded. Adam's moments are made non-zero by one
    training step first, so that a mis-partitioned optimizer update shows in the results."""
    params = init_params(cfg, seed)
    opt_state = OPTIMIZER.init(params)
    params, opt_state, _ = jax.jit(train_step)(params, opt_state, make_graph(cfg, seed + 100))
    return params, opt_state, make_graph(cfg, seed)


def abstract_inputs(cfg: Config) -> tuple[Any, Any, dict[str, jax.ShapeDtypeStruct]]:
    """(params, opt_state, graph) as `jax.ShapeDtypeStruct`s: nothing is allocated."""
    params = jax.tree_util.tree_map(lambda s: jax.ShapeDtypeStruct(s, jnp.float32),
                                    param_shapes(cfg), is_leaf=_is_shape)
    opt_state = jax.eval_shape(OPTIMIZER.init, params)
    n, e = cfg.n_nodes, cfg.n_edges
    graph = {"nodes": jax.ShapeDtypeStruct((n, cfg.node_in), jnp.float32),
             "edges": jax.ShapeDtypeStruct((e, cfg.edge_in), jnp.float32),
             "senders": jax.ShapeDtypeStruct((e,), jnp.int32),
             "receivers": jax.ShapeDtypeStruct((e,), jnp.int32),
             "targets": jax.ShapeDtypeStruct((n, cfg.node_out), jnp.float32)}
    return params, opt_state, graph


def _is_shape(x: Any) -> bool:
    return isinstance(x, tuple) and all(isinstance(d, int) for d in x)
