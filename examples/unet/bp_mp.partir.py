"""BP, then the paper's Megatron-like MP over "model": the residual blocks' conv kernels on
their output features, the attention weights on their heads.

The tiny UNet (model.TINY) with concrete inputs, on the paper's tactics from schedules.py
(see README.md):

    partir partition examples/unet/bp_mp.partir.py
    partir run examples/unet/bp_mp.partir.py --steps 3
"""

import model
from schedules import BP, MESH, MP

import partir

program = partir.Program(model.train_step, *model.make_inputs(model.TINY))
mesh = MESH
schedule = [BP, MP]
