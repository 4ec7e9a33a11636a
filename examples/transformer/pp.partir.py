"""GPipe on the scan-over-layers transformer: its 4 layers in 4 stages over "stage", the
batch in 4 microbatches (README.md, "Pipeline parallelism").

    partir partition examples/transformer/pp.partir.py
    partir run examples/transformer/pp.partir.py --steps 3
"""

import model
from schedules import PIPELINE_MESH, PP

import partir

program = partir.Program(model.train_step_scanned, *model.make_scanned_inputs(model.TINY))
mesh = PIPELINE_MESH
schedule = [PP]
