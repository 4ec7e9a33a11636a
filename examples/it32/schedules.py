"""The IT32 tactics of the PartIR paper's appendix ("T32/T48/IT32 tactics": the same
tactics as T32's), and the schedules of its Table 2 composed of them.

Inputs are named by `serve`'s parameters and pytree paths, e.g. `params/layers/0/w_up`,
`prompt`; the KV caches by their tags, `cache/<layer>/k` and `cache/<layer>/v` (see
`model.py`).
"""

from __future__ import annotations

import partir
from partir import BARRIER, UNKNOWN, ManualPartition

BATCH, MODEL = "batch", "model"
MESH = {BATCH: 4, MODEL: 2}
# The paper's Table 2 mesh.
PAPER_MESH = {BATCH: 16, MODEL: 2}

# Megatron-LM: attention by heads (query heads only in the multi-query model: its one
# key/value head `w_kv` is left to propagation, i.e. replicated) and the MLP by its hidden
# (d_ff) dimension: one reduction of attention's and one of the MLP's output per layer and
# per pass through the layers.
MEGATRON_DIMS = {
    "w_qkv": 2,  # [D, 3, H, Dh]: heads
    "w_q": 1,  # [D, H, Dh]: heads
    "w_o": 0,  # [H, Dh, D]: heads
    "w_up": 1,  # [D, F]
    "b_up": 0,  # [F]
    "w_down": 0,  # [F, D]
}


def megatron(name: str, shape: tuple[int, ...]) -> int | object:
    return MEGATRON_DIMS.get(name.rsplit("/", 1)[-1], UNKNOWN)


BP = ManualPartition({"prompt": 0}, axis=BATCH, name="BP")
# Megatron: every block's heads and d_ff are independent groups of the decode loop's body,
# which one loop over "model" slices together.
MP = ManualPartition({"params": megatron}, axis=MODEL, name="MP")
# Multi-query sharding (Pope et al., "Efficiently Scaling Transformer Inference"): the KV
# caches (one head, [B, T, Dh]) split by batch over the axis that shards the heads, so that
# no device holds (or reads, every step) the whole cache; the attention over them runs on
# the device's batch slice, every head. Barriers at the attention's input, queries and
# output keep that batch sharding inside the attention: the projections around it stay
# Megatron's (by heads), and the queries and the attention's output cross between the two
# with an all_to_all each. MQ comes before MP, which would otherwise shard the attention by
# heads first.
MQ = ManualPartition({"cache": 0, "attn": BARRIER}, axis=MODEL, name="MQ")

SCHEDULES: dict[str, list[ManualPartition]] = {
    "BP": [BP],
    "MP": [MP],
    "BP+MP": [BP, MP],
    "BP+MP+MQ": [BP, MQ, MP],
}


def mesh(**sizes: int) -> partir.Mesh:
    return partir.Mesh({**MESH, **sizes})
