"""The IT32 example (examples/it32): an inference-only transformer served with a KV cache
(a prefill, then a `lax.scan` of decode steps), under the PartIR paper's IT32 schedules.

- The tiny model under BP, MP, BP+MP and BP+MP+MQ, executed on 8 CPU devices, equals the
  unpartitioned function; the Core interpreter's result equals it too (MP, BP+MP+MQ).
- The full-size IT32 (abstract inputs, mesh {"batch": 16, "model": 2}) gets the
  collectives derived in `examples/it32/README.md` ("Table 2, derived"), counted as
  executed per call: BP, MP and BP+MP equal the paper's rows (Megatron's two all-reduces
  per block run inside the decode loop's body, once per step); BP+MP+MQ has the paper's
  all-reduces and its two all-to-alls per block inside the loop, once per step, and two
  per block in the prefill where the paper gathers. Every count is checked on 1-,
  2- and 32-layer variants and on 1, 2 and 1535 decode steps, which pins the per-layer,
  per-step and constant terms apart; the static counts (each body collective once) too.
"""

from __future__ import annotations

import dataclasses
import functools
from collections import Counter
from pathlib import Path

import jax
import pytest

import partir
from examples.it32 import model, schedules
from partir.core.regions import structured
from partir.pipeline import lower
from partir.rules.catalogue import region_ops
from partir.schedule_file import load_schedule_file
from tests.examples import counts
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
MQ_MOVES = 2  # all_to_alls per block and pass: the queries, then the attention's output


def config(name: str, layers: int, steps: int) -> model.Config:
    base = model.IT32_MQ if "MQ" in name else model.IT32
    return dataclasses.replace(base, layers=layers, decode_steps=steps)


def expected(name: str, layers: int, steps: int, executed: bool = True) -> dict[str, int]:
    """Our counts for `layers` blocks and `steps` decode steps, as executed per call (a
    collective in the decode loop's body once per step) or static (once); the README
    derives each term."""
    L = layers
    runs = steps if executed else 1  # how often a collective of the loop's body counts
    return {
        # every sequence is served on its own devices: nothing to communicate
        "BP": counts(),
        # Megatron's 2 sums per block: in the prefill, and in the decode loop's body
        "MP": counts(ar=MEGATRON_SUMS * L + MEGATRON_SUMS * L * runs),
        "BP+MP": counts(ar=MEGATRON_SUMS * L + MEGATRON_SUMS * L * runs),
        # MQ slices the caches by batch over "model" and, between its barriers, the
        # attention over them; Megatron then shards the projections around it by heads.
        # Per block and per pass (the prefill, then each step): the 2 Megatron sums, the
        # queries' all_to_all from heads to batch and the attention output's back, and the
        # attention's input sliced by batch for the keys and values written to the caches
        # (an all_slice: no traffic).
        "BP+MP+MQ": counts(ar=MEGATRON_SUMS * L * (1 + runs), a2a=MQ_MOVES * L * (1 + runs),
                           slices=L * (1 + runs)),
    }[name]


SCHEDULES = schedules.SCHEDULES


@functools.cache
def _partitioned(name: str, layers: int, steps: int):
    cfg = config(name, layers, steps)
    return partir.core_partition(model.serving_fn(cfg), schedules.PAPER_MESH,
                                 SCHEDULES[name], *model.abstract_inputs(cfg))


@functools.cache
def _lowered(name: str, layers: int, steps: int):
    return lower(_partitioned(name, layers, steps).program)


def _table(c: dict[str, int]) -> tuple[int, int, int, int]:
    return c["all_gather"], c["all_reduce"], c["reduce_scatter"], c["all_to_all"]


def _scan(program):
    (scan,) = [op for op in structured(program).ops if op.name == "scan"]
    return scan


# --- (a) executed on 8 CPU devices, and interpreted ------------------------------------------


@functools.cache
def _tiny(multi_query: bool):
    cfg = model.TINY_MQ if multi_query else model.TINY
    fn = model.serving_fn(cfg)
    args = model.make_inputs(cfg)
    return fn, args, jax.jit(fn)(*args)


@pytest.mark.slow
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


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_partitioned_serving_equals_the_unpartitioned_function(name):
    fn, args, expected_out = _tiny(name.endswith("MQ"))
    jitted, meta = partir.jit(fn, schedules.MESH, schedules.SCHEDULES[name])
    assert_tree_close(jitted(*args), expected_out)
    tiny = model.TINY_MQ if name.endswith("MQ") else model.TINY
    assert meta.executed_collectives == expected(name, tiny.layers, tiny.decode_steps)
    assert meta.collectives == expected(name, tiny.layers, tiny.decode_steps, False)


@pytest.mark.slow
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


@pytest.mark.slow
@pytest.mark.parametrize("name", ["BP", "MP", "BP+MP"])
def test_rows_equal_to_the_paper(name):
    lowered = _lowered(name, IT32.layers, IT32.decode_steps)
    assert _table(lowered.executed_collectives) == PAPER[name]


@pytest.mark.slow
def test_bp_slices_the_decode_loop_by_batch():
    result = _partitioned("BP", IT32.layers, IT32.decode_steps)
    assert [lp.axis for lp in structured(result.program).nest(_scan(result.program))] == ["batch"]


@pytest.mark.parametrize("name", ["MP", "BP+MP"])
def test_megatron_sums_inside_the_decode_loop(name):
    """Every block's heads (with its caches) and d_ff are sliced through the loop, with no
    conflict; the body sums attention's and the MLP's output over "model", 2 per block and
    step, the prefill 2 per block."""
    result = _partitioned(name, 2, 2)
    assert all(t.conflicts == [] for t in result.tactics)
    nest = structured(result.program).nest(_scan(result.program))
    assert sorted(lp.axis for lp in nest) == sorted(["model", *(["batch"] if "BP" in name
                                                                 else [])])
    lowered = _lowered(name, 2, 2)
    assert lowered.executed_by_axes() == {("all_reduce", ("model",)): 2 * 2 * (1 + 2)}
    assert lowered.collectives["all_gather"] == 0


@pytest.mark.slow
@pytest.mark.parametrize("layers,steps", [(1, 1), (1, 2), (2, 1), (2, 2),
                                          (IT32.layers, IT32.decode_steps)])
@pytest.mark.parametrize("name", sorted(SCHEDULES))
def test_counts_follow_the_model_structure(name, layers, steps):
    lowered = _lowered(name, layers, steps)
    assert lowered.executed_collectives == expected(name, layers, steps)
    assert lowered.collectives == expected(name, layers, steps, executed=False)


@pytest.mark.slow
def test_the_mq_row_moves_the_queries_as_the_paper_does():
    """README, "BP+MP+MQ": the paper's all-reduces, and its all-to-alls in every pass;
    where the paper's prefill gathers (2 per block, once), ours moves the queries with
    all-to-alls as the decode steps do, so its AG + A2A equals the paper's."""
    ours = _table(_lowered("BP+MP+MQ", IT32.layers, IT32.decode_steps).executed_collectives)
    paper = PAPER["BP+MP+MQ"]
    assert ours == (0, 98304, 0, 98304)
    assert ours[1] == paper[1] and ours[0] + ours[3] == paper[0] + paper[3]
    assert paper[3] == MQ_MOVES * IT32.layers * IT32.decode_steps


def test_mq_moves_the_queries_inside_the_decode_loop():
    """The all_to_alls are ops of the decode loop's body (two per block), the caches stay
    sliced by batch over "model" through the loop, and neither tactic has a conflict."""
    result = _partitioned("BP+MP+MQ", 2, 2)
    assert all(t.conflicts == [] for t in result.tactics)
    (scan,) = [op for op in _lowered("BP+MP+MQ", 2, 2).hlo.ops if op.name == "scan"]
    body = Counter(inner.name for inner, _ in region_ops(scan))
    assert body["hlo.all_to_all"] == MQ_MOVES * 2 and body["hlo.all_gather"] == 0
    cfg = config("BP+MP+MQ", 2, 2)
    caches = [v.type.shape for v in scan.operands
              if v.type.shape[1:] == (cfg.max_len, cfg.head_dim)]
    # the 2 blocks' key and value caches, each device holding its batch slice: IT32's 32
    # sequences over "batch" (16), then "model" (2)
    assert caches == [(1, cfg.max_len, cfg.head_dim)] * 4


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
    assert lowered.collectives == expected(name, tiny.layers, tiny.decode_steps, False)
