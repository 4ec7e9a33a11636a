"""BP, MP, then ZeRO stage 2: Adam's moments sharded over "batch" (the parameters
stay replicated); gradients are reduce_scattered instead of all_reduced.

The tiny transformer (model.TINY) with concrete inputs, on the paper's tactics from
schedules.py (see README.md):

    partir partition examples/transformer/bp_mp_z2.partir.py
    partir run examples/transformer/bp_mp_z2.partir.py --steps 3
"""

import model
from schedules import BP, MESH, MP, Z2

import partir

program = partir.Program(model.train_step, *model.make_inputs(model.TINY))
mesh = MESH
schedule = [BP, MP, Z2]
