"""The IT32 example (examples/it32): an inference-only transformer served with a KV cache
(a prefill, then a `lax.scan` of decode steps), under the PartIR paper's IT32 schedules.

- The tiny model under BP, MP, BP+MP and BP+MP+MQ, executed on 8 CPU devices, equals the
  unpartitioned function; the Core interpreter's result equals it too (MP, BP+MP+MQ).
- The full-size IT32 (abstract inputs, mesh {"batch": 16, "model": 2}) gets the
  collectives derived in `examples/it32/README.md` ("Table 2, derived"): BP equals the
  paper's row; MP, BP+MP and BP+MP+MQ do not, because Megatron's groups cannot be sliced
  through the decode loop together (a `multiple_matches` conflict at the scan, so the loop
  runs unsliced on "model"). Every count is checked on 1-, 2- and 32-layer variants and on
  1, 2 and 1535 decode steps, which pins the per-layer, per-step and constant terms.
"""

from __future__ import annotations

import dataclasses
import functools
from pathlib import Path

import jax
import pytest

import partir
from examples.it32 import model, schedules
from partir.pipeline import lower
from partir.schedule_file import load_schedule_file
from tests.oracles import assert_tree_close

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "it32"
IT32 = model.IT32
NAMES = ("BP", "MP", "BP+MP", "BP+MP+MQ")

# The paper's Table 2, IT32 rows: (AG, AR, RS, A2A).
PAPER = {
    "BP": (0, 0, 0, 0),
    "BP+MP": (0, 98304, 0, 0),
    "BP+MP+MQ": (64, 98304, 0, 98240),
    "MP": (0, 98304, 0, 0),
}

# --- the model's structure (README, "Table 2, derived") -------------------------------------
# Megatron shards 5 tensors per block: w_qkv (w_q) and w_o by heads, w_up, b_up, w_down by
# d_ff. Summed over "model" per pass through a block: attention's and the MLP's output.
MEGATRON_TENSORS = 5
MEGATRON_SUMS = 2
CACHES = 2  # a key and a value cache per block


def config(name: str, layers: int, steps: int) -> model.Config:
    base = model.IT32_MQ if name.endswith("MQ") else model.IT32
    return dataclasses.replace(base, layers=layers, decode_steps=steps)


def counts(ag: int = 0, ar: int = 0, rs: int = 0, a2a: int = 0) -> dict[str, int]:
    return {"all_gather": ag, "all_reduce": ar, "reduce_scatter": rs, "all_to_all": a2a,
            "all_slice": 0}


def expected(name: str, layers: int, steps: int) -> dict[str, int]:
    """Our executed counts for `layers` blocks and `steps` decode steps; the README derives
    each term. None depends on `steps`: the decode loop's body holds no collective."""
    L = layers
    return {
        # every sequence is served on its own device group: nothing to communicate
        "BP": counts(),
        # the prefill's Megatron sums; the decode loop, unsliced on "model", needs the 5
        # Megatron-sharded tensors and the 2 head-sharded caches the prefill made, whole
        "MP": counts(ag=(MEGATRON_TENSORS + CACHES) * L, ar=MEGATRON_SUMS * L),
        "BP+MP": counts(ag=(MEGATRON_TENSORS + CACHES) * L, ar=MEGATRON_SUMS * L),
        # MQ slices the prefill's residual stream and the caches by batch over "model":
        # per block the prefill reduce-scatters its 2 Megatron sums, gathers the 2 layer
        # norms' outputs before the head/d_ff-sharded matmuls and the 2 caches for
        # attention's head-sharded queries; the decode loop is sliced by batch over both
        # axes and needs the 5 Megatron-sharded tensors whole
        "BP+MP+MQ": counts(ag=(2 + CACHES + MEGATRON_TENSORS) * L, rs=MEGATRON_SUMS * L),
    }[name]


@functools.cache
def _partitioned(name: str, layers: int, steps: int):
    cfg = config(name, layers, steps)
    return partir.core_partition(model.serving_fn(cfg), schedules.PAPER_MESH,
                                 schedules.SCHEDULES[name], *model.abstract_inputs(cfg))


@functools.cache
def _lowered(name: str, layers: int, steps: int):
    return lower(_partitioned(name, layers, steps).program)


def _table(c: dict[str, int]) -> tuple[int, int, int, int]:
    return c["all_gather"], c["all_reduce"], c["reduce_scatter"], c["all_to_all"]


def _scan(program):
    (scan,) = [op for op in program.ops if op.name == "scan"]
    return scan


# --- (a) executed on 8 CPU devices, and interpreted ------------------------------------------


@functools.cache
def _tiny(multi_query: bool):
    cfg = model.TINY_MQ if multi_query else model.TINY
    fn = model.serving_fn(cfg)
    args = model.make_inputs(cfg)
    return fn, args, jax.jit(fn)(*args)


def test_the_tiny_model_really_generates():
    _, (params, prompt), (tokens, logits) = _tiny(False)
    cfg = model.TINY
    assert tokens.shape == (cfg.batch, 1 + cfg.decode_steps)
    assert logits.shape == (cfg.batch, 1 + cfg.decode_steps, cfg.vocab)
    # greedy: every token is its step's argmax, and the steps do not all repeat the first
    assert (tokens == logits.argmax(-1)).all()
    assert (tokens[:, 1:] != tokens[:, :1]).any()
    # the cache matters: the same model without the decode loop (one token more of prompt,
    # recomputed from scratch) predicts the loop's second token
    longer = jax.numpy.concatenate([prompt, tokens[:, :1]], axis=1)
    again = model.serve(params, longer, 0)[1][:, 0]
    assert_tree_close(again, logits[:, 1])


@pytest.mark.parametrize("name", NAMES)
def test_partitioned_serving_equals_the_unpartitioned_function(name):
    fn, args, expected_out = _tiny(name.endswith("MQ"))
    jitted, meta = partir.jit(fn, schedules.MESH, schedules.SCHEDULES[name])
    assert_tree_close(jitted(*args), expected_out)
    # the decode loop's body holds no collective: each runs once per call
    assert meta.executed_collectives == meta.collectives


@pytest.mark.parametrize("name", ["MP", "BP+MP+MQ"])
def test_the_core_interpreter_equals_the_unpartitioned_function(name):
    fn, args, expected_out = _tiny(name.endswith("MQ"))
    result = partir.core_partition(fn, schedules.MESH, schedules.SCHEDULES[name], *args)
    assert_tree_close(result.interpret(*args), expected_out)


# --- (b) Table 2 at full size ---------------------------------------------------------------


def test_the_full_size_model_serves_1536_passes_through_32_layers():
    assert IT32.layers == 32 and IT32.passes == 1536 == 1 + IT32.decode_steps
    assert (IT32.d_model, IT32.heads, IT32.ff, IT32.vocab) == (4096, 32, 16384, 32000)
    # the paper's MP row is 2 sums per block per pass
    assert PAPER["MP"][1] == MEGATRON_SUMS * IT32.layers * IT32.passes


def test_bp_equals_the_paper():
    assert _table(_lowered("BP", IT32.layers, IT32.decode_steps).executed_collectives) == \
        PAPER["BP"]
    # the decode loop is sliced by batch: each device serves its own sequences
    result = _partitioned("BP", IT32.layers, IT32.decode_steps)
    assert [lp.axis for lp in result.program.nest(_scan(result.program))] == ["batch"]


@pytest.mark.parametrize("layers,steps", [(1, 1), (1, 2), (2, 1), (2, 2),
                                          (IT32.layers, IT32.decode_steps)])
@pytest.mark.parametrize("name", NAMES)
def test_counts_follow_the_model_structure(name, layers, steps):
    lowered = _lowered(name, layers, steps)
    assert lowered.executed_collectives == expected(name, layers, steps)
    assert lowered.collectives == lowered.executed_collectives


@pytest.mark.parametrize("name", ["MP", "BP+MP", "BP+MP+MQ"])
def test_rows_that_differ_from_the_paper(name):
    # README, "Table 2, derived": if one of these starts to hold, update the README.
    ours = _table(_lowered(name, IT32.layers, IT32.decode_steps).executed_collectives)
    assert ours != PAPER[name]


@pytest.mark.parametrize("name", ["MP", "BP+MP"])
def test_megatron_does_not_reach_into_the_decode_loop(name):
    """The gap behind the MP rows: MP tiles 2 independent groups per block at once (heads,
    d_ff), all of which the scan could slice; propagation meets several matching loops at
    the scan and takes none, so the loop runs unsliced on "model"."""
    result = _partitioned(name, 2, 2)
    mp = result.tactics[-1]
    assert [c.kind for c in mp.conflicts] == ["multiple_matches"]
    assert mp.conflicts[0].op == "scan"
    assert "model" not in {lp.axis for lp in result.program.nest(_scan(result.program))}


def test_mq_slices_the_decode_loop_by_batch_over_both_axes():
    result = _partitioned("BP+MP+MQ", 2, 2)
    loop = result.program.nest(_scan(result.program))
    assert sorted(lp.axis for lp in loop) == ["batch", "model"]
    shardings = result.program.output_shardings()
    assert all(s.dims[0] == ("batch", "model") for s in shardings.values()), shardings


# --- schedule files ---------------------------------------------------------------------------


@pytest.mark.parametrize("path", sorted(EXAMPLES.glob("*.partir.py")), ids=lambda p: p.name)
def test_schedule_files_partition_as_their_schedules(path):
    """What `partir partition examples/it32/<file>` shows: the tiny model on the mesh
    {"batch": 4, "model": 2} gets the counts derived for the full-size one."""
    sf = load_schedule_file(path)
    name = {"bp": "BP", "mp": "MP", "bp_mp": "BP+MP", "bp_mp_mq": "BP+MP+MQ"}[
        path.name.removesuffix(".partir.py")]
    assert sf.mesh == partir.Mesh(schedules.MESH)
    assert [t.name for t in sf.schedule] == [t.name for t in schedules.SCHEDULES[name]]
    lowered = lower(sf.program.core_partition(sf.mesh, sf.schedule).program)
    tiny = model.TINY_MQ if name.endswith("MQ") else model.TINY
    assert lowered.executed_collectives == expected(name, tiny.layers, tiny.decode_steps)
