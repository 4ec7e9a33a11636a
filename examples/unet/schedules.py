"""The UNet tactics of the PartIR paper's appendix ("Schedules", "UNet tactics"), and the
schedules composed of them.

Inputs are named by `train_step`'s parameters and pytree paths, e.g.
`params/down/1/res_blocks/0/conv1/w`, `params/mid/attn/w_qkv`,
`opt_state/0/mu/up/0/res_blocks/2/skip/w`, `batch/images` (see `model.py`).
"""

from __future__ import annotations

import partir
from partir import FIRST_DIVISIBLE_DIM, REPLICATED, UNKNOWN, ManualPartition
from partir.tactics import Tactic

BATCH, MODEL = "batch", "model"
MESH = {BATCH: 4, MODEL: 2}

# The attention blocks' linear weights, heads first (w_qkv [H, C, 3, Dh], w_out [H, Dh, C]).
ATTENTION_WEIGHTS = ("w_qkv", "w_out")


def megatron(name: str, shape: tuple[int, ...]) -> int | object:
    """The paper's `_model_sharding` for the UNet: the attention linear weights on dim 0 (their
    heads), the weights of the residual blocks on their output features (dim 3 of an HWIO conv
    kernel, dim 1 of the time-embedding projection [T, C]); UNKNOWN for the rest (biases,
    norms, the other convs), left to propagation. Also sees Adam's moments, which share the
    parameters' leaf names."""
    parts = name.split("/")
    if parts[-1] in ATTENTION_WEIGHTS:
        return 0
    if parts[-1] == "w" and any(p.startswith("res_block") for p in parts):
        return len(shape) - 1
    return UNKNOWN


# Batch parallelism: images, noise and timesteps on their batch dim.
BP = ManualPartition({"batch": 0}, axis=BATCH, name="BP")
MP = ManualPartition({"params": megatron, "opt_state": megatron}, axis=MODEL, name="MP")
# ZeRO stage 2: optimizer state sharded over the data-parallel axis, parameters replicated.
Z2 = ManualPartition({"params": REPLICATED, "opt_state": FIRST_DIVISIBLE_DIM}, axis=BATCH,
                     name="Z2")
# ZeRO stage 3: parameters too.
Z3 = ManualPartition({"params": FIRST_DIVISIBLE_DIM, "opt_state": FIRST_DIVISIBLE_DIM},
                     axis=BATCH, name="Z3")

# The paper's automatic tactics (appendix "Automatic tactics"): searches over the same
# actions, guided by the simulator (device: the `device` argument, default partir's).
AUTO_MP = partir.AutomaticPartition(axis=MODEL, name="AutoMP")
AUTO_BP = partir.AutomaticPartition(axis=BATCH, name="AutoBP")
ALL_AUTO = partir.AutomaticPartition(axes=[BATCH, MODEL], name="AllAuto")

SCHEDULES: dict[str, list[ManualPartition]] = {
    "BP": [BP],
    "BP+Z2": [BP, Z2],
    "BP+Z3": [BP, Z3],
    "BP+MP": [BP, MP],
}
AUTO_SCHEDULES: dict[str, list[Tactic]] = {
    "BP+AutoMP": [BP, AUTO_MP],
    "AllAuto": [ALL_AUTO],
}


def mesh(**sizes: int) -> partir.Mesh:
    return partir.Mesh({**MESH, **sizes})
