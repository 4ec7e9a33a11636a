"""Megatron model parallelism (MP): shard attention by heads and the MLP by d_ff over
"model"; each block's two sub-layers need one all_reduce each, forward and backward.

The tiny transformer (model.TINY) with concrete inputs, on the paper's tactics from
schedules.py (see README.md):

    partir partition examples/transformer/mp.partir.py
    partir run examples/transformer/mp.partir.py --steps 3
"""

import model
from schedules import MESH, MP

import partir

program = partir.Program(model.train_step, *model.make_inputs(model.TINY))
mesh = MESH
schedule = [MP]
