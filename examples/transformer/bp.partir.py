"""Batch parallelism (BP): shard the batch over "batch"; every parameter gradient
and the loss need an all_reduce over "batch".

The tiny transformer (model.TINY) with concrete inputs, on the paper's tactics from
schedules.py (see README.md):

    partir partition examples/transformer/bp.partir.py
    partir run examples/transformer/bp.partir.py --steps 3
"""

import model
from schedules import BP, MESH

import partir

program = partir.Program(model.train_step, *model.make_inputs(model.TINY))
mesh = MESH
schedule = [BP]
