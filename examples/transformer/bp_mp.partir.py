"""BP then Megatron MP: the all_reduces of both.

The tiny transformer (model.TINY) with concrete inputs, on the paper's tactics from
schedules.py (see README.md):

    partir partition examples/transformer/bp_mp.partir.py
    partir run examples/transformer/bp_mp.partir.py --steps 3
"""

import model
from schedules import BP, MESH, MP

import partir

program = partir.Program(model.train_step, *model.make_inputs(model.TINY))
mesh = MESH
schedule = [BP, MP]
