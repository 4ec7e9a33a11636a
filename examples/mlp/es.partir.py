"""BP+MP+Z3, then the ES tactic of the paper's section 2: shard the input x and the output
activation on the model axis too (their feature dimension; "batch" has their first).
MP's sum over "model" then ends in a slice of the result (a reduce_scatter once lowered
instead of an all_reduce), and the first matmul needs all of x's features, which it
gathers: both show as `axis_in_scope` conflicts on the already MP-partitioned matmuls.

Tactics shard inputs and tagged values, so the program is the model's variant whose
result is tagged "y".

`partir partition examples/mlp/es.partir.py`
"""

from model import example_args, mlp_tagged_output

import partir

program = partir.Program(mlp_tagged_output, *example_args())
mesh = {"batch": 4, "model": 2}
schedule = [
    partir.ManualPartition({"x": 0}, axis="batch", name="BP"),
    partir.ManualPartition({"w1": 1}, axis="model", name="MP"),
    partir.ManualPartition({"w1": 0, "w2": 1}, axis="batch", name="Z3"),
    partir.ManualPartition({"x": 1, "y": 1}, axis="model", name="ES"),
]
