"""The diffusion UNet example (examples/unet): its schedule files run on 8 CPU devices and
equal the unpartitioned step, and the paper-sized model's collectives are the UNet rows of
the PartIR paper's Table 2 where the README derives that they should be.

`examples/unet/README.md` ("Table 2, derived") explains every count asserted here.
"""

from __future__ import annotations

import dataclasses
import functools
import pathlib

import jax
import pytest

import partir
from examples.unet import model, schedules
from partir.pipeline import lower
from partir.schedule_file import load_schedule_file
from tests.examples import counts
from tests.oracles import assert_tree_close

EXAMPLE = pathlib.Path(__file__).parents[2] / "examples" / "unet"
FILES = ["bp", "bp_z2", "bp_z3", "bp_mp"]
MESH = schedules.mesh(batch=16)  # {"batch": 16, "model": 2}, as for T32

# The paper's Table 2, UNet rows: (AG, AR, RS, A2A).
PAPER = {"BP": (0, 503, 0, 0), "BP+Z2": (517, 2, 501, 0), "BP+Z3": (799, 2, 501, 0)}

# Smaller variants of FULL: the counts below are functions of the structure.
VARIANTS = {
    "FULL": model.FULL,
    "2 levels, 1 block": dataclasses.replace(model.FULL, levels=2, res_blocks=1),
    "3 levels, 2 blocks, attention at 2": dataclasses.replace(
        model.FULL, levels=3, res_blocks=2, attn_levels=2),
}


# --- the model's structure (README, "The model") ---------------------------------------------


def n_res_blocks(cfg: model.Config) -> int:
    return cfg.levels * cfg.res_blocks + cfg.levels * (cfg.res_blocks + 1) + 2


def n_attention(cfg: model.Config) -> int:
    return cfg.attn_levels * (2 * cfg.res_blocks + 1) + 1


def n_params(cfg: model.Config) -> int:
    up_blocks = cfg.levels * (cfg.res_blocks + 1)  # each with a 1x1 skip conv
    # time MLP, conv_in, output norm and conv_out; 10 per residual block, + 2 per skip conv;
    # 6 per attention block; a strided conv and an upsampling conv per level but one.
    return (4 + 2 + 4 + 10 * n_res_blocks(cfg) + 2 * up_blocks + 6 * n_attention(cfg)
            + 2 * 2 * (cfg.levels - 1))


def n_convs(cfg: model.Config) -> int:
    up_blocks = cfg.levels * (cfg.res_blocks + 1)
    return 2 + 2 * n_res_blocks(cfg) + up_blocks + 2 * (cfg.levels - 1)


def backward_weights(cfg: model.Config) -> int:
    """The weights the backward pass reads: those of the linear maps whose input gradient
    it computes (all but conv_in's and the time MLP's first dense, whose inputs are
    data)."""
    return (n_convs(cfg) - 1) + n_res_blocks(cfg) + 1 + 2 * n_attention(cfg)


def expected(name: str, cfg: model.Config) -> dict[str, int]:
    """Our counts on "batch" (any size dividing the batch and the channels, but not 3)."""
    p = n_params(cfg)
    # ZeRO shards every parameter tensor but conv_out's bias [3].
    zero = p - 1
    return {
        # One AR per parameter gradient, and the loss.
        "BP": counts(ar=p + 1),
        # Every sharded gradient's AR becomes an RS; each parameter updated on its shard is
        # gathered back into the replicated parameter; conv_out/b's gradient and the loss
        # keep their AR.
        "BP+Z2": counts(ag=zero, ar=2, rs=zero),
        # Each sharded parameter is gathered where the forward first uses it, and again
        # for the backward where it reads it (README "BP+Z3"): the kernel of every conv
        # but conv_in (whose input gradient is not needed), of every residual block's time
        # projection and of the time MLP's second dense, and attention's two weights.
        "BP+Z3": counts(ag=zero + backward_weights(cfg), ar=2, rs=zero),
    }[name]


@functools.cache
def _args(cfg: model.Config) -> tuple:
    return model.abstract_inputs(cfg)


@functools.cache
def _partition(name: str, cfg: model.Config) -> partir.CorePartition:
    return partir.core_partition(model.train_step, MESH, schedules.SCHEDULES[name],
                                 *_args(cfg))


def _collectives(name: str, cfg: model.Config) -> dict[str, int]:
    return lower(_partition(name, cfg).program).collectives


def _table(c: dict[str, int]) -> tuple[int, int, int, int]:
    return c["all_gather"], c["all_reduce"], c["reduce_scatter"], c["all_to_all"]


def test_full_has_the_papers_502_parameter_tensors():
    params, _, batch = _args(model.FULL)
    assert len(jax.tree.leaves(params)) == n_params(model.FULL) == 502
    assert n_res_blocks(model.FULL) == 38 and n_attention(model.FULL) == 10
    assert n_convs(model.FULL) == 104
    assert params["mid"]["attn"]["w_qkv"].shape == (16, 256, 3, 16)
    assert params["up"][0]["res_blocks"][0]["conv1"]["w"].shape == (3, 3, 512, 256)
    assert batch["images"].shape == (32, 64, 64, 3)


@pytest.mark.parametrize("cfg", VARIANTS.values(), ids=VARIANTS.keys())
def test_param_count_formula(cfg):
    assert len(jax.tree.leaves(_args(cfg)[0])) == n_params(cfg)


@pytest.mark.slow
def test_tiny_train_step_decreases_loss():
    params, opt_state, batch = model.make_inputs(model.TINY)
    step = jax.jit(model.train_step)
    _, _, first = step(params, opt_state, batch)
    for _ in range(5):
        params, opt_state, loss = step(params, opt_state, batch)
    assert loss < first


# --- Table 2 -----------------------------------------------------------------------------------


@pytest.mark.slow
def test_bp_equals_the_paper():
    assert _table(_collectives("BP", model.FULL)) == PAPER["BP"]


@pytest.mark.slow
@pytest.mark.parametrize("name", ["BP+Z2", "BP+Z3"])
def test_zero_reduce_scatters_and_all_reduces_equal_the_paper(name):
    ours = _table(_collectives(name, model.FULL))
    assert ours[1:] == PAPER[name][1:]
    # The paper gathers more (README "BP+Z2", "BP+Z3"): 517 and 799.
    assert ours[0] == {"BP+Z2": 501, "BP+Z3": 663}[name] < PAPER[name][0]


@pytest.mark.slow
@pytest.mark.parametrize("cfg", VARIANTS.values(), ids=VARIANTS.keys())
@pytest.mark.parametrize("name", ["BP", "BP+Z2", "BP+Z3"])
def test_counts_follow_the_model_structure(name, cfg):
    assert _collectives(name, cfg) == expected(name, cfg)


@pytest.mark.parametrize("name", sorted(schedules.SCHEDULES))
@pytest.mark.slow
def test_no_unsupported_op(name):
    res = _partition(name, model.FULL)
    assert res.unsupported == []
    allowed = {"BP": set(), "BP+Z2": {"axis_in_scope", "replicated_operand"},
               "BP+Z3": {"axis_in_scope"}, "BP+MP": {"axis_in_scope", "needs_replication"}}
    assert {c.kind for c in res.conflicts} <= allowed[name], [str(c) for c in res.conflicts]


def test_bp_partitions_the_convs_on_batch():
    # No conflict and no all_gather: every conv (forward, input and kernel gradients) runs on
    # the local images; the kernel gradients are partial sums, all_reduced once each.
    res = _partition("BP", model.FULL)
    assert res.conflicts == []
    hlo = lower(res.program).text("hlo")
    assert "all_gather" not in hlo
    convs = [line for line in hlo.splitlines() if "conv_general_dilated(" in line]
    # forward, input gradient (but conv_in), kernel gradient: local batch 32 / 16 = 2
    assert len(convs) == 3 * n_convs(model.FULL) - 1
    assert all("tensor<2x" in line or "tensor<3x3x" in line or "tensor<1x1x" in line
               for line in convs)


def test_bp_mp_megatron_actions():
    res = _partition("BP+MP", model.FULL)
    mp = res.tactics[1]
    tiled = [a for a in mp.actions if a.startswith("tile<%params/")]
    # The residual blocks' conv kernels (and their 1x1 skip convs) and time projections on
    # their output features, the attention weights on heads.
    per_block = [f"{k}/w" for k in ("conv1", "conv2", "temb")]
    assert len(tiled) == (len(per_block) * n_res_blocks(model.FULL)
                          + model.FULL.levels * (model.FULL.res_blocks + 1)
                          + 2 * n_attention(model.FULL))
    sh = res.program.input_shardings()
    assert sh["params/down/0/res_blocks/0/conv1/w"].dims == ((), (), (), ("model",))
    assert sh["params/mid/res_block1/temb/w"].dims == ((), ("model",))
    assert sh["params/mid/attn/w_qkv"].dims == (("model",), (), (), ())
    assert sh["params/mid/attn/w_out"].dims == (("model",), (), ())
    assert sh["batch/images"].dims == (("batch",), (), (), ())


# --- execution ---------------------------------------------------------------------------------


@functools.cache
def _schedule_file(name: str):
    return load_schedule_file(EXAMPLE / f"{name}.partir.py")


@functools.cache
def _unpartitioned(name: str):
    sf = _schedule_file(name)
    return jax.jit(sf.program.fn)(*sf.program.args)


@pytest.mark.slow
@pytest.mark.parametrize("name", FILES)
def test_schedule_file_runs_and_equals_unpartitioned(name):
    sf = _schedule_file(name)
    assert sf.mesh == schedules.mesh()
    fn, meta = partir.jit(sf.program.fn, sf.mesh, sf.schedule)
    assert_tree_close(fn(*sf.program.args), _unpartitioned(name))
    assert [t.name for t in meta.tactics] == [t.name for t in sf.schedule]
    # TINY: 126 parameter tensors, 24 convs; "batch" of 4 divides all but conv_out/b.
    tiny = model.TINY
    assert n_params(tiny) == 126 and n_convs(tiny) == 24
    if name in ("bp", "bp_z2", "bp_z3"):
        assert meta.collectives == expected({"bp": "BP", "bp_z2": "BP+Z2",
                                             "bp_z3": "BP+Z3"}[name], tiny)
