"""Batch parallelism (paper, section 2): shard the batch dimension of x over "batch".

`partir partition examples/mlp/bp.partir.py`
"""

from model import example_args, mlp

import partir

program = partir.Program(mlp, *example_args())
mesh = {"batch": 4, "model": 2}
schedule = [
    partir.ManualPartition({"x": 0}, axis="batch", name="BP"),
]
