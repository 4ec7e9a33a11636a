"""BP and MP of an MLP training step on a batch of 6 over a 4-device "batch" axis: the
batch is padded to 8 (README.md).

    partir partition examples/padding/batch6.partir.py
    partir run examples/padding/batch6.partir.py
"""

import model

import partir

program = partir.Program(model.mlp_step, *model.mlp_inputs())
mesh = {"batch": 4, "model": 2}
schedule = [
    partir.ManualPartition({"x": 0, "y": 0}, axis="batch", name="BP"),
    partir.ManualPartition({"params/w1": 1, "params/w2": 0}, axis="model", name="MP"),
]
