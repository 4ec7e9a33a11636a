"""BP, then ZeRO stage 3 / FSDP: the parameters too are sharded over "batch"
(FIRST_DIVISIBLE_DIM) and gathered where they are used.

The tiny UNet (model.TINY) with concrete inputs, on the paper's tactics from schedules.py
(see README.md):

    partir partition examples/unet/bp_z3.partir.py
    partir run examples/unet/bp_z3.partir.py --steps 3
"""

import model
from schedules import BP, MESH, Z3

import partir

program = partir.Program(model.train_step, *model.make_inputs(model.TINY))
mesh = MESH
schedule = [BP, Z3]
