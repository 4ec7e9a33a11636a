"""A jraph graph convolution (`jraph.GraphConvolution`, symmetric normalization) on a
small `GraphsTuple`, classifying its nodes, under BP over the edges and BP+Z3. With
`add_self_edges=True` jraph concatenates the node indices to the senders and receivers:
a concatenate along the sharded edge dimension (issue 27, cause 6: it gathered the edges
and everything after it ran replicated; now each is gathered once and the rest stays
partitioned)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import jraph
import numpy as np
import optax
import pytest

from partir import ManualPartition
from tests.models.harness import check_bp, check_zero3

N, E, D, H, C = 16, 4096, 8, 8, 4  # nodes, edges (the "batch"), features, classes
BP = ManualPartition({"graph/senders": 0, "graph/receivers": 0}, axis="batch", name="BP")
TX = optax.adam(1e-2)


def make_step(add_self_edges: bool):
    def step(params, opt_state, graph, labels):
        def loss_fn(params):
            gcn = jraph.GraphConvolution(lambda nodes: nodes @ params["w"],
                                         add_self_edges=add_self_edges)
            nodes = jax.nn.relu(gcn(graph).nodes)
            logits = nodes @ params["head"]
            return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()

        loss, grads = jax.value_and_grad(loss_fn)(params)
        updates, opt_state = TX.update(grads, opt_state, params)
        return loss, grads, optax.apply_updates(params, updates), opt_state
    return step


def inputs():
    rng = np.random.default_rng(0)
    params = {"w": jnp.asarray(rng.normal(size=(D, H)) / np.sqrt(D), jnp.float32),
              "head": jnp.asarray(rng.normal(size=(H, C)) / np.sqrt(H), jnp.float32)}
    graph = jraph.GraphsTuple(
        nodes=jnp.asarray(rng.normal(size=(N, D)), jnp.float32), edges=None,
        senders=jnp.asarray(rng.integers(0, N, E), jnp.int32),
        receivers=jnp.asarray(rng.integers(0, N, E), jnp.int32),
        n_node=jnp.asarray([N]), n_edge=jnp.asarray([E]), globals=None)
    labels = jnp.asarray(rng.integers(0, C, N), jnp.int32)
    return params, TX.init(params), graph, labels


@pytest.mark.slow
@pytest.mark.parametrize("add_self_edges", [False, True], ids=["edges", "self_edges"])
def test_graph_convolution(add_self_edges):
    # The node-level work (the feature transform, the head) is not split by BP over the
    # edges: 0.3 of the unpartitioned FLOPs per device leaves room for it.
    # With self edges, the concatenates gather the senders and the receivers once each
    # (GSPMD's choice), and everything after them stays partitioned.
    gathered = ("graph/receivers", "graph/senders") if add_self_edges else ()
    c = check_bp(make_step(add_self_edges), inputs(), BP, batch=E, max_flops_ratio=0.3,
                 concatenated=gathered)
    conflicts = [c["kind"] for t in c.md.tactics for c in t.conflicts]
    assert conflicts == [], conflicts


@pytest.mark.slow
def test_graph_convolution_zero3():
    check_zero3(make_step(True), inputs(), BP, batch=E, max_flops_ratio=0.3,
                concatenated=("graph/receivers", "graph/senders"))
