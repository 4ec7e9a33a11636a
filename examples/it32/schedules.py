"""The IT32 tactics of the PartIR paper's appendix ("T32/T48/IT32 tactics": the same
tactics as T32's), and the schedules of its Table 2 composed of them.

Inputs are named by `serve`'s parameters and pytree paths, e.g. `params/layers/0/w_up`,
`prompt`; the KV caches by their tags, `cache/<layer>/k` and `cache/<layer>/v` (see
`model.py`).
"""

from __future__ import annotations

import partir
from partir import UNKNOWN, ManualPartition

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


# The first block's attention: the tensors MP0 tiles, before MP tiles the rest.
FIRST_ATTENTION = ("params/layers/0/w_qkv", "params/layers/0/w_q", "params/layers/0/w_o")


def megatron_first_attention(name: str, shape: tuple[int, ...]) -> int | object:
    return megatron(name, shape) if name in FIRST_ATTENTION else UNKNOWN


def megatron_rest(name: str, shape: tuple[int, ...]) -> int | object:
    return UNKNOWN if name in FIRST_ATTENTION else megatron(name, shape)


BP = ManualPartition({"prompt": 0}, axis=BATCH, name="BP")
# Megatron in two tactics, a workaround (README, "Gaps"): every block's heads and d_ff are
# independent groups of the decode loop's body, and tiled at once they all match the scan
# (a `multiple_matches` conflict: the loop stays unsliced on "model"). MP0 tiles one group,
# the first block's heads, which gives the scan a loop over "model" (slicing that block's
# caches); MP's tensors then reach a scan that already loops over "model", and propagation
# widens that loop to slice their groups too.
MP0 = ManualPartition({"params": megatron_first_attention}, axis=MODEL, name="MP0")
MP = ManualPartition({"params": megatron_rest}, axis=MODEL, name="MP")
# Megatron as one tactic, as the paper writes it (and as the T32 example does).
MP_AT_ONCE = ManualPartition({"params": megatron}, axis=MODEL, name="MP")
# Multi-query sharding (Pope et al., "Efficiently Scaling Transformer Inference"): the KV
# caches (one head, [B, T, Dh]) split by batch over the axis that shards the heads, so that
# no device holds (or reads, every step) the whole cache.
MQ = ManualPartition({"cache": 0}, axis=MODEL, name="MQ")

SCHEDULES: dict[str, list[ManualPartition]] = {
    "BP": [BP],
    "MP": [MP0, MP],
    "BP+MP": [BP, MP0, MP],
    "BP+MP+MQ": [BP, MP0, MP, MQ],
}
# The Megatron rows with MP as one tactic: the decode loop stays unsliced on "model".
AT_ONCE: dict[str, list[ManualPartition]] = {
    "MP": [MP_AT_ONCE],
    "BP+MP": [BP, MP_AT_ONCE],
    "BP+MP+MQ": [BP, MP_AT_ONCE, MQ],
}


def mesh(**sizes: int) -> partir.Mesh:
    return partir.Mesh({**MESH, **sizes})
