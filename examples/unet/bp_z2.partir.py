"""BP, then ZeRO stage 2: Adam's moments sharded over "batch" (FIRST_DIVISIBLE_DIM), the
parameters replicated: gradients are reduce-scattered, each parameter is updated on its
shard and gathered back.

The tiny UNet (model.TINY) with concrete inputs, on the paper's tactics from schedules.py
(see README.md):

    partir partition examples/unet/bp_z2.partir.py
    partir run examples/unet/bp_z2.partir.py --steps 3
"""

import model
from schedules import BP, MESH, Z2

import partir

program = partir.Program(model.train_step, *model.make_inputs(model.TINY))
mesh = MESH
schedule = [BP, Z2]
