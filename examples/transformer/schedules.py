"""The transformer tactics of the PartIR paper's appendix, and schedules composed of them.

Inputs are named by `train_step`'s parameters and pytree paths, e.g.
`params/layers/0/w_up`, `opt_state/0/mu/embed`, `batch/tokens` (see `model.py`).
"""

from __future__ import annotations

import partir
from partir import FIRST_DIVISIBLE_DIM, REPLICATED, UNKNOWN, ManualPartition

BATCH, MODEL = "batch", "model"
MESH = {BATCH: 4, MODEL: 2}

# Megatron-LM: shard attention by heads and the MLP by its hidden (d_ff) dimension, so
# that each block needs a single reduction of its output per layer and per pass.
MEGATRON_DIMS = {
    "w_qkv": 2,  # [D, 3, H, Dh]: heads
    "w_o": 0,  # [H, Dh, D]: heads
    "w_up": 1,  # [D, F]
    "b_up": 0,  # [F]
    "w_down": 0,  # [F, D]
}


# Their ranks in one layer: a scan-over-layers model stacks them on a leading dimension.
RANKS = {"w_qkv": 4, "w_o": 3, "w_up": 2, "b_up": 1, "w_down": 2}


def megatron(name: str, shape: tuple[int, ...]) -> int | object:
    # The rule also sees Adam's moments (opt_state/0/mu/layers/3/w_up) and count, which
    # share the parameters' leaf names; layer norms and the embedding are left to
    # propagation. Stacked layers (params/layers/w_up: [L, D, F]) shift the dimension.
    leaf = name.rsplit("/", 1)[-1]
    if leaf not in MEGATRON_DIMS:
        return UNKNOWN
    return MEGATRON_DIMS[leaf] + len(shape) - RANKS[leaf]


def embedding(name: str, shape: tuple[int, ...]) -> int | object:
    # The d_model dimension of embed [V, D] (paper: "partitions the embedding tensor along
    # the d_model dimension").
    return 1 if name.rsplit("/", 1)[-1] == "embed" else UNKNOWN


BP = ManualPartition({"batch": 0}, axis=BATCH, name="BP")
MP = ManualPartition({"params": megatron, "opt_state": megatron}, axis=MODEL, name="MP")
def zero(name: str, shape: tuple[int, ...]) -> object:
    # The first divisible dimension, past the layer dimension of the scan-over-layers
    # model's stacked parameters (params/layers/w_up: [L, D, F]), which its scan iterates
    # over: sharded on D, each layer's tensor is gathered when the scan's body takes it.
    parts = name.split("/")
    stacked = "layers" in parts[:-1] and not parts[parts.index("layers") + 1].isdigit()
    return FIRST_DIVISIBLE_DIM.after(0) if stacked else FIRST_DIVISIBLE_DIM


# ZeRO stage 2: optimizer state sharded over the data-parallel axis, parameters replicated.
Z2 = ManualPartition({"params": REPLICATED, "opt_state": zero}, axis=BATCH, name="Z2")
# ZeRO stage 3: parameters too.
Z3 = ManualPartition({"params": zero, "opt_state": zero}, axis=BATCH, name="Z3")
EMB = ManualPartition({"params": embedding, "opt_state": embedding}, axis=MODEL, name="EMB")

# Pipeline parallelism on the scan-over-layers model (`train_step_scanned`): its stacked
# layers split into stages over "stage", the batch into microbatches (README.md).
STAGE = "stage"
PIPELINE_MESH = {STAGE: 4, BATCH: 2}  # PP
PIPELINE_MP_MESH = {STAGE: 2, BATCH: 2, MODEL: 2}  # BP+PP+MP
MICROBATCHES = 4
PP = partir.PipelinePartition({"params/layers": 0}, axis=STAGE, microbatches=MICROBATCHES,
                              name="PP")

SCHEDULES: dict[str, list[ManualPartition]] = {
    "BP": [BP],
    "MP": [MP],
    "BP+MP": [BP, MP],
    "BP+MP+Z2": [BP, MP, Z2],
    "BP+MP+Z3": [BP, MP, Z3],
    "BP+MP+Z3+EMB": [BP, MP, Z3, EMB],
    "EMB": [EMB],
}


def mesh(**sizes: int) -> partir.Mesh:
    return partir.Mesh({**MESH, **sizes})
