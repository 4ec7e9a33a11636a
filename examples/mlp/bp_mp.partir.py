"""Batch and Megatron-style model parallelism (paper, section 2): after BP, shard the
hidden dimension of w1 over "model"; propagation shards w2's rows to match, and the
second matmul ends in a sum over "model" (an all_reduce once lowered).

`partir partition examples/mlp/bp_mp.partir.py`
"""

from model import example_args, mlp

import partir

program = partir.Program(mlp, *example_args())
mesh = {"batch": 4, "model": 2}
schedule = [
    partir.ManualPartition({"x": 0}, axis="batch", name="BP"),
    partir.ManualPartition({"w1": 1}, axis="model", name="MP"),
]
