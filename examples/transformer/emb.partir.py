"""EMB alone: the embedding's d_model dimension sharded over "model"; propagation
shards the activations' d_model, so every layer norm and every matmul contracting d_model
ends in an all_reduce.

The tiny transformer (model.TINY) with concrete inputs, on the paper's tactics from
schedules.py (see README.md):

    partir partition examples/transformer/emb.partir.py
    partir run examples/transformer/emb.partir.py --steps 3
"""

import model
from schedules import EMB, MESH

import partir

program = partir.Program(model.train_step, *model.make_inputs(model.TINY))
mesh = MESH
schedule = [EMB]
