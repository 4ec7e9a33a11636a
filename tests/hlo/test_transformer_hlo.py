"""The transformer example on PartIR:HLO: every schedule's optimized program computes the
Adam training step on the simulated mesh, and its collectives are those the strategies
call for (paper, Table 2: one all_reduce per parameter gradient and one for the loss
under BP, four more per layer under Megatron MP, ZeRO's reduce_scatters...)."""

from __future__ import annotations

import functools

import jax
import pytest

import partir
from examples.transformer import model, schedules
from partir.core.materialize import materialize
from partir.hlo import count_collectives, interpret_hlo, lower_spmd_to_hlo, optimize, verify_hlo
from partir.hlo.printing import print_hlo
from partir.ir import Function
from partir.spmd import lower_core_to_spmd
from tests.examples.test_transformer_core import partition
from tests.oracles import assert_tree_close

CFG = model.TINY
PARAMS = 9 * CFG.layers + 1  # 9 per block and the (tied) embedding
# Z2 and Z3 shard on "batch" every parameter whose first free dim 4 divides: all but b_up,
# which Megatron already split on its only dim.
ZERO_SHARDED = 8 * CFG.layers + 1


@functools.cache
def hlo(schedule: str) -> tuple[partir.CorePartition, Function]:
    res = partition(tuple(schedule.split("+")))
    fn = optimize(lower_spmd_to_hlo(lower_core_to_spmd(materialize(res.program),
                                                        schedules.MESH)))
    verify_hlo(fn)
    return res, fn


@pytest.mark.slow
@pytest.mark.parametrize("name", list(schedules.SCHEDULES))
def test_schedule_computes_the_training_step(name, tiny_inputs, tiny_expected):
    res, fn = hlo(name)
    outs = interpret_hlo(fn, *res.flatten_args(*tiny_inputs))
    assert_tree_close(jax.tree_util.tree_unflatten(res.traced.out_tree, outs), tiny_expected)


def _counts(name: str) -> tuple[int, int, int, int]:
    c = count_collectives(hlo(name)[1])
    return c["all_gather"], c["all_reduce"], c["reduce_scatter"], c["all_to_all"]


def test_batch_parallelism_reduces_each_gradient_and_the_loss_once():
    assert _counts("BP") == (0, PARAMS + 1, 0, 0)


def test_megatron_adds_four_all_reduces_per_layer():
    assert _counts("MP") == (0, 4 * CFG.layers, 0, 0)
    assert _counts("BP+MP") == (0, PARAMS + 1 + 4 * CFG.layers, 0, 0)


@pytest.mark.parametrize("zero", ["Z2", "Z3"])
def test_zero_turns_the_sharded_gradients_reductions_into_reduce_scatters(zero):
    res, fn = hlo(f"BP+MP+{zero}")
    ag, ar, rs, a2a = _counts(f"BP+MP+{zero}")
    assert (ar + rs, rs, a2a) == (PARAMS + 1 + 4 * CFG.layers, ZERO_SHARDED, 0)
    # Z2 gathers every batch-sharded parameter once, after its update, in the program or,
    # where the update's result is returned as it is, by the output's sharding. Z3
    # gathers each before the forward's first use, and the weights the backward reads
    # (the 4 matrices of a block and the embedding) again for the backward.
    names = res.traced.output_names
    sharded_params = sum(1 for name, s in zip(names, fn.attributes["out_shardings"],
                                              strict=True)
                         if name.startswith("out/0/") and "batch" in sum(s, ()))
    if zero == "Z2":
        assert ag + sharded_params == ZERO_SHARDED
    else:
        assert ag == ZERO_SHARDED + 4 * CFG.layers + 1


@pytest.mark.slow
@pytest.mark.parametrize("name, counts", [("BP", (0, 290, 0, 0)), ("MP", (0, 128, 0, 0)),
                                          ("BP+MP", (0, 418, 0, 0))])
def test_t32_counts_match_the_paper(name, counts):
    """Table 2's T32 rows for BP, MP and BP+MP, on the paper's {batch: 16, model: 2} mesh
    (abstract tiny_inputs: nothing is allocated)."""
    mesh = partir.Mesh({"batch": 16, "model": 2})
    res = partir.core_partition(model.train_step, mesh, schedules.SCHEDULES[name],
                                *model.abstract_inputs(model.T32))
    fn = optimize(lower_spmd_to_hlo(lower_core_to_spmd(materialize(res.program), mesh)))
    c = count_collectives(fn)
    assert (c["all_gather"], c["all_reduce"], c["reduce_scatter"], c["all_to_all"]) == counts


@pytest.mark.slow
@pytest.mark.parametrize("name", list(schedules.SCHEDULES))
def test_deferred_gathers_give_the_same_optimized_program(name, tiny_inputs, tiny_expected):
    # What `partir.pipeline.lower` does: gathers that the next loop slices back are never
    # emitted, so there is less for the fusion passes to cancel, and the same result.
    res, eager = hlo(name)
    spmd = lower_core_to_spmd(materialize(res.program), schedules.MESH)
    unoptimized = lower_spmd_to_hlo(spmd, defer_gathers=True)
    verify_hlo(unoptimized)
    assert len(unoptimized.ops) < len(lower_spmd_to_hlo(spmd).ops)
    deferred = optimize(unoptimized)
    assert print_hlo(deferred) == print_hlo(eager)
    outs = interpret_hlo(deferred, *res.flatten_args(*tiny_inputs))
    assert_tree_close(jax.tree_util.tree_unflatten(res.traced.out_tree, outs), tiny_expected)
