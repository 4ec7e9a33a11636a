"""Batch parallelism, GPipe and Megatron on the scan-over-layers transformer: 2 stages of
2 layers over "stage", each microbatch's rows over "batch", each layer's heads and hidden
units over "model" (README.md, "Pipeline parallelism").

    partir partition examples/transformer/bp_pp_mp.partir.py
    partir run examples/transformer/bp_pp_mp.partir.py --steps 3
"""

import model
from schedules import BP, MP, PIPELINE_MP_MESH, PP

import partir

program = partir.Program(model.train_step_scanned, *model.make_scanned_inputs(model.TINY))
mesh = PIPELINE_MP_MESH
schedule = [BP, PP, MP]
