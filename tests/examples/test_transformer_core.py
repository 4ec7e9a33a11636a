"""The transformer example end to end on PartIR:Core: the paper's tactics partition a full
Adam training step, and the partitioned program computes what the original does."""

import functools

import jax
import numpy as np
import pytest

import partir
from examples.transformer import model, schedules
from examples.transformer.schedules import BP, EMB, MP, SCHEDULES, Z3
from partir.core.conflicts import AXIS_IN_SCOPE
from tests.oracles import assert_tree_close

CFG = model.TINY
LAYERS = range(CFG.layers)
OPT = ("params", "opt_state/0/mu", "opt_state/0/nu")


@functools.cache
def partition(schedule: tuple[str, ...]) -> partir.CorePartition:
    # Partitioning only needs shapes; the abstract inputs make that explicit.
    return partir.core_partition(model.train_step, schedules.MESH,
                                 [getattr(schedules, t) for t in schedule],
                                 *model.abstract_inputs(CFG))


def test_t32_has_289_parameter_tensors():
    params, opt_state, batch = model.abstract_inputs(model.T32)
    leaves = jax.tree.leaves(params)
    assert len(leaves) == 289 == 9 * model.T32.layers + 1
    assert tuple(params["layers"][0]) == tuple(sorted(model.LAYER_PARAMS))
    assert all(isinstance(x, jax.ShapeDtypeStruct) for x in jax.tree.leaves(opt_state))
    assert params["embed"].shape == (32000, 4096)
    assert params["layers"][0]["w_qkv"].shape == (4096, 3, 32, 128)
    assert params["layers"][0]["w_up"].shape == (4096, 16384)
    assert batch["tokens"].shape == (48, model.T32.seq)


@pytest.mark.slow
def test_tiny_train_step_decreases_loss(tiny_inputs):
    params, opt_state, batch = tiny_inputs
    step = jax.jit(model.train_step)
    _, _, first = step(params, opt_state, batch)
    for _ in range(5):
        params, opt_state, loss = step(params, opt_state, batch)
    assert np.isfinite(first) and loss < first


# The dim of the Megatron split of each block weight; the rest is left to propagation.
MEGATRON = {"b_up": 0, "w_down": 0, "w_o": 0, "w_qkv": 2, "w_up": 1}
# The first dim Z3 can still take on "batch" (size 4) after Megatron took one on "model".
ZERO3 = {"ln1_bias": 0, "ln1_scale": 0, "ln2_bias": 0, "ln2_scale": 0, "w_down": 1, "w_o": 1,
         "w_qkv": 0, "w_up": 0}


@pytest.mark.slow  # about 45 s: the Core interpreter on the tiny model's three tactics
def test_bp_mp_z3_actions_and_results(tiny_inputs, tiny_expected):
    res = partition(("BP", "MP", "Z3"))
    assert res.unsupported == []
    assert [t.name for t in res.tactics] == ["BP", "MP", "Z3"]
    bp, mp, z3 = res.tactics

    assert bp.actions == ['tile<%batch/labels,0,"batch">', 'tile<%batch/tokens,0,"batch">',
                          "propagate"]
    assert mp.actions == [f'tile<%{p}/layers/{i}/{k},{d},"model">'
                          for p in OPT for i in LAYERS for k, d in MEGATRON.items()
                          ] + ["propagate"]
    # Batch and Megatron parallelism compose without conflicts on a transformer.
    assert bp.conflicts == [], [str(c) for c in bp.conflicts]
    assert mp.conflicts == [], [str(c) for c in mp.conflicts]

    assert z3.actions == [f'tile<%{p}/{name},{d},"batch">'
                          for p in OPT
                          for name, d in [("embed", 0)] + [(f"layers/{i}/{k}", d)
                                                           for i in LAYERS
                                                           for k, d in ZERO3.items()]
                          ] + ["propagate"]
    # b_up [F] has its only dim on "model" already; Adam's step count is a scalar.
    assert sorted(n.split(" ")[0] for n in z3.notes) == sorted(
        ["opt_state/0/count"] + [f"{p}/layers/{i}/b_up" for p in OPT for i in LAYERS])
    # Z3 meets the batch loops BP put around the forward and backward passes: those ops
    # cannot be nested in a second loop over "batch".
    assert {c.kind for c in z3.conflicts} <= {AXIS_IN_SCOPE}, [str(c) for c in z3.conflicts]

    for after in range(1, 4):
        assert_tree_close(res.interpret(*tiny_inputs, after=after), tiny_expected)


@pytest.mark.slow
@pytest.mark.parametrize("name", list(SCHEDULES))
def test_named_schedule_preserves_results(name, tiny_inputs, tiny_expected):
    res = partition(tuple(name.split("+")))
    assert [t.name for t in res.tactics] == [t.name for t in SCHEDULES[name]]
    assert res.unsupported == []
    assert_tree_close(res.interpret(*tiny_inputs), tiny_expected)


def test_bp_mp_shardings():
    sh = partition(("BP", "MP")).program.input_shardings()
    assert sh["params/layers/0/w_up"].dims == ((), ("model",))
    assert sh["params/layers/0/w_qkv"].dims == ((), (), ("model",), ())
    assert sh["params/layers/3/w_down"].dims == (("model",), ())
    assert sh["opt_state/0/mu/layers/0/w_up"].dims == ((), ("model",))
    assert sh["batch/tokens"].dims == (("batch",), ())
    assert sh["batch/labels"].dims == (("batch",), ())
    assert sh["params/embed"].dims == ((), ())


def test_emb_shards_embedding_on_d_model():
    res = partition(("BP", "MP", "Z3", "EMB"))
    assert res.tactics[-1].actions == [f'tile<%{p}/embed,1,"model">' for p in OPT
                                       ] + ["propagate"]
    sh = res.program.input_shardings()
    assert sh["params/embed"].dims == (("batch",), ("model",))


def test_schedules_cover_the_paper_tactics():
    assert SCHEDULES["BP+MP+Z3+EMB"] == [BP, MP, Z3, EMB]
    assert set(SCHEDULES) == {"BP", "MP", "BP+MP", "BP+MP+Z2", "BP+MP+Z3", "BP+MP+Z3+EMB",
                              "EMB"}
