"""The GNS example (examples/gns): the paper's edge sharding (ES) of a Graph Network
Simulator training step.

- The tiny GNS partitioned by ES and executed on 8 CPU devices equals the unpartitioned
  step.
- The full-size GNS (abstract inputs) gets the all_reduces derived in
  `examples/gns/README.md` ("Table 2, derived"): 395, where the paper's Table 2 has 423.
  The count is checked per kind of all_reduce (by the shape it reduces) and on 1, 2 and 24
  message-passing steps, which pins the per-step and constant terms separately.
- The edges are really sharded: every edge-sized value is local (E/8 rows), nothing is
  gathered, and ES meets no conflict.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import re
from pathlib import Path

import jax
import numpy as np
import pytest

import partir
from examples.gns import model, schedules
from partir.pipeline import lower
from partir.schedule_file import load_schedule_file
from tests.examples import counts
from tests.oracles import assert_tree_close

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "gns"
GNS = model.GNS
PAPER_ES = (0, 423, 0, 0)  # Table 2, GNS ES: AG / AR / RS / A2A


def edge_mlp_tensors(cfg: model.Config) -> int:
    """Parameter tensors of an edge MLP: a weight and a bias per layer, the LayerNorm's."""
    return 2 * cfg.mlp_layers + (2 if cfg.layer_norm else 0)


def expected_all_reduces(cfg: model.Config) -> dict[str, int]:
    """The all_reduces over "batch" of ES, by cause (README, "Table 2, derived")."""
    s = cfg.steps
    return {
        # the edge encoder's and every step's edge MLP: gradients summed over the edges
        "edge-MLP gradients": (s + 1) * edge_mlp_tensors(cfg),
        # forward: segment_sum(edges, receivers) into the replicated nodes
        "segment_sum": s,
        # forward: sum(edges) into the global MLP's input
        "sum over edges": s,
        # backward: nodes[senders] and nodes[receivers] transpose to two scatter-adds, whose
        # partial sums are added before one all_reduce
        "gather cotangents": s,
        # backward: the global broadcast onto the edges transposes to a sum over edges;
        # the first step's global is the constant 0 and has no cotangent
        "global cotangents": s - 1,
    }


def expected(cfg: model.Config) -> dict[str, int]:
    return counts(ar=sum(expected_all_reduces(cfg).values()))


def _table(c: dict[str, int]) -> tuple[int, int, int, int]:
    return c["all_gather"], c["all_reduce"], c["reduce_scatter"], c["all_to_all"]


def with_steps(steps: int) -> model.Config:
    return dataclasses.replace(GNS, steps=steps)


@functools.cache
def _collectives(steps: int, layer_norm: bool = True,
                 mesh: tuple = (("batch", 8),)) -> dict[str, int]:
    cfg = dataclasses.replace(with_steps(steps), layer_norm=layer_norm)
    result = partir.core_partition(model.train_step, partir.Mesh(dict(mesh)), [schedules.ES],
                                   *model.abstract_inputs(cfg))
    assert result.unsupported == []
    return lower(result.program).collectives


@functools.cache
def _full() -> tuple[partir.CorePartition, partir.Metadata]:
    args = model.abstract_inputs(GNS)
    res = partir.core_partition(model.train_step, schedules.mesh(), [schedules.ES], *args)
    meta = partir.partition(model.train_step, schedules.mesh(), [schedules.ES], *args)
    return res, meta


@functools.cache
def _tiny() -> tuple:
    inputs = model.make_inputs(model.TINY)
    return inputs, jax.jit(model.train_step)(*inputs)


# --- the model -------------------------------------------------------------------------------


def test_full_size_model_structure():
    params, opt_state, graph = model.abstract_inputs(GNS)
    # encoders 2 x 12, 24 steps x 3 MLPs x 12, decoder 5 x 2 (no LayerNorm)
    assert len(jax.tree.leaves(params)) == 2 * 12 + 24 * 3 * 12 + 10 == 898
    assert len(params["steps"]) == 24
    step = params["steps"][0]
    assert step["edge"]["w0"].shape == (4 * 512, 1024)  # [edge, sender, receiver, global]
    assert step["node"]["w0"].shape == (3 * 512, 1024)  # [node, received, global]
    assert step["edge"]["w4"].shape == (1024, 512)
    assert graph["edges"].shape[0] == 65536 and graph["nodes"].shape[0] == 2048
    assert graph["senders"].dtype == graph["receivers"].dtype == np.int32
    assert all(isinstance(x, jax.ShapeDtypeStruct) for x in jax.tree.leaves(opt_state))


@pytest.mark.slow
def test_tiny_train_step_decreases_loss():
    (params, opt_state, graph), _ = _tiny()
    step = jax.jit(model.train_step)
    _, _, first = step(params, opt_state, graph)
    for _ in range(5):
        params, opt_state, loss = step(params, opt_state, graph)
    assert np.isfinite(first) and loss < first


# --- (a) execution ---------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("mesh", [{"batch": 8}, {"batch": 4, "model": 2}])
def test_es_on_8_devices_equals_the_unpartitioned_step(mesh):
    inputs, want = _tiny()
    fn, meta = partir.jit(model.train_step, partir.Mesh(mesh), schedules.SCHEDULES["ES"])
    assert_tree_close(fn(*inputs), want)
    assert meta.collectives == expected(model.TINY)  # 43 all_reduces, nothing else
    assert meta.in_specs[2]["edges"] == jax.sharding.PartitionSpec("batch", None)
    assert meta.in_specs[2]["nodes"] == jax.sharding.PartitionSpec(None, None)


# --- (b) Table 2 -----------------------------------------------------------------------------


@pytest.mark.slow
def test_full_size_es_counts():
    _, meta = _full()
    assert meta.collectives == expected(GNS)
    assert _table(meta.collectives) == (0, 395, 0, 0)
    # The paper's 423 = 24 x 17 + 15; ours 395 = 24 x 16 + 11 (README, "Table 2, derived").
    assert _table(meta.collectives) != PAPER_ES
    assert _table(meta.collectives)[0::2] == PAPER_ES[0::2]  # no AG, RS or A2A either


@pytest.mark.slow
@pytest.mark.parametrize("steps", [1, 2, 24])
def test_counts_follow_the_model_structure(steps):
    assert _collectives(steps) == expected(with_steps(steps))


@pytest.mark.slow
def test_counts_without_layer_norm_and_on_a_2d_mesh():
    # P = 10 tensors per edge MLP: 25 x 10 + 4 x 24 - 1 = 345. The "model" axis is unused
    # by ES and adds nothing.
    no_ln = dataclasses.replace(GNS, layer_norm=False)
    assert _collectives(24, layer_norm=False) == expected(no_ln)
    assert expected(no_ln)["all_reduce"] == 345
    assert _collectives(24, mesh=(("batch", 4), ("model", 2))) == expected(GNS)


@pytest.mark.slow
def test_all_reduces_by_what_they_reduce():
    """Each all_reduce's operand shape tells its cause (the weight gradients come out of
    the backward matmuls transposed)."""
    _, meta = _full()
    shapes = collections.Counter(
        re.findall(r"= all_reduce <\"batch\"> %\S+ : tensor<([0-9x]+)xf32>", meta.hlo_ir))
    want = expected_all_reduces(GNS)
    s, e = GNS.steps, GNS.steps + 1  # message-passing steps, edge MLPs
    assert shapes == {
        "2048x512": want["segment_sum"] + want["gather cotangents"],  # node-sized: 2 s
        # b4, ln_scale, ln_bias of every edge MLP; the sums over edges and their cotangents
        "512": 3 * e + want["sum over edges"] + want["global cotangents"],
        "1024": 4 * e,  # b0..b3
        "1024x2048": s, "1024x8": 1,  # w0 of the steps' and of the encoder's edge MLP
        "1024x1024": 3 * e,  # w1..w3
        "512x1024": e,  # w4
    }
    assert sum(shapes.values()) == 395


# --- (c) the edges are sharded -----------------------------------------------------------------


@pytest.mark.slow
def test_es_has_no_conflict_and_shards_only_the_edges():
    res, meta = _full()
    assert res.unsupported == []
    es = meta.tactics[0]
    assert es.conflicts == []
    assert es.actions == ['tile<%graph/edges,0,"batch">', 'tile<%graph/senders,0,"batch">',
                          'tile<%graph/receivers,0,"batch">', "propagate"]
    sh = res.program.input_shardings()
    assert sh["graph/edges"].dims == (("batch",), ())
    assert sh["graph/senders"].dims == (("batch",),)
    assert sh["graph/nodes"].dims == ((), ())
    assert sh["params/steps/0/edge/w0"].dims == ((), ())


def test_edge_computations_run_on_local_edge_tiles():
    _, meta = _full()
    hlo = meta.hlo_ir
    local = GNS.n_edges // 8
    assert meta.collectives["all_gather"] == 0
    # No value of the device-local program has all the edges.
    assert not re.search(rf"tensor<{GNS.n_edges}[x>]", hlo)
    # The gathers produce local edge tiles: forward the sender and receiver nodes (2 per
    # step), backward the cotangent of segment_sum (1). The scatter-adds into the
    # replicated nodes take local tiles and end in the node-sized all_reduces: forward
    # segment_sum (1 per step), backward the two gathers' cotangents (2).
    gathers = re.findall(r"= gather\(.*: tensor<([0-9x]+)xf32>", hlo)
    assert gathers == [f"{local}x{GNS.latent}"] * (3 * GNS.steps)  # 2 fwd, 1 bwd per step
    scatters = re.findall(r"= scatter-add\(.*: tensor<([0-9x]+)xf32>", hlo)
    assert scatters == [f"{GNS.n_nodes}x{GNS.latent}"] * (3 * GNS.steps)
    # Every matmul with an edge-MLP weight (forward, and backward through it) has E/8 rows.
    edge_w = re.compile(r'%"params/(?:encoder|steps/\d+)/edge/w\d"\)')
    rows = [re.search(r": tensor<(\d+)x", line).group(1)
            for line in hlo.splitlines() if edge_w.search(line)]
    # forward and backward per layer, but for the cotangent of the input edge features
    assert len(rows) == 2 * (GNS.steps + 1) * GNS.mlp_layers - 1
    assert set(rows) == {str(local)}


@pytest.mark.slow
def test_schedule_file_loads_and_partitions():
    sf = load_schedule_file(EXAMPLES / "es.partir.py")
    assert sf.mesh == partir.Mesh({"batch": 8})
    assert [t.name for t in sf.schedule] == ["ES"]
    result = sf.program.core_partition(sf.mesh, sf.schedule)
    assert result.unsupported == []
    assert lower(result.program).collectives == expected(model.TINY)
