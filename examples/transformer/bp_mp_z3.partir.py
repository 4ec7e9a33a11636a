"""BP, MP, then ZeRO stage 3 / FSDP: the parameters too are sharded over "batch" and
gathered where they are used.

The tiny transformer (model.TINY) with concrete inputs, on the paper's tactics from
schedules.py (see README.md):

    partir partition examples/transformer/bp_mp_z3.partir.py
    partir run examples/transformer/bp_mp_z3.partir.py --steps 3
"""

import model
from schedules import BP, MESH, MP, Z3

import partir

program = partir.Program(model.train_step, *model.make_inputs(model.TINY))
mesh = MESH
schedule = [BP, MP, Z3]
