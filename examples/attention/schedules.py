"""Batch parallelism and Megatron-style model parallelism for the attention block."""

from __future__ import annotations

from partir import ManualPartition

MESH = {"batch": 2, "model": 4}

BP = ManualPartition({"x": 0, "target": 0}, axis="batch", name="BP")
# The projections' output dimension (heads x head_dim) and w_o's matching input dimension.
MP = ManualPartition({"params/w_q": 1, "params/w_k": 1, "params/w_v": 1, "params/w_o": 0},
                     axis="model", name="MP")
