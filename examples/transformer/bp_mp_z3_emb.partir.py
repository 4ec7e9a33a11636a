"""BP, MP, Z3, then EMB: the embedding's d_model dimension sharded over "model", which
propagates to the activations.

The tiny transformer (model.TINY) with concrete inputs, on the paper's tactics from
schedules.py (see README.md):

    partir partition examples/transformer/bp_mp_z3_emb.partir.py
    partir run examples/transformer/bp_mp_z3_emb.partir.py --steps 3
"""

import model
from schedules import BP, EMB, MESH, MP, Z3

import partir

program = partir.Program(model.train_step, *model.make_inputs(model.TINY))
mesh = MESH
schedule = [BP, MP, Z3, EMB]
