"""Batch parallelism (BP): images, noise and timesteps sharded on their batch dim over
"batch"; the convolutions run on the local images and every parameter gradient and the
loss need an all_reduce over "batch".

The tiny UNet (model.TINY) with concrete inputs, on the paper's tactics from schedules.py
(see README.md):

    partir partition examples/unet/bp.partir.py
    partir run examples/unet/bp.partir.py --steps 3
"""

import model
from schedules import BP, MESH

import partir

program = partir.Program(model.train_step, *model.make_inputs(model.TINY))
mesh = MESH
schedule = [BP]
