"""BP, then AutomaticPartition over "model" (the paper's BP+AutoMP): the search decides
what to tile on "model", guided by the simulator's step time (memory a hard constraint).

The tiny UNet (model.TINY) with concrete inputs (README.md, "Automatic partitioning",
has the full-size figures):

    partir partition examples/unet/bp_automp.partir.py --device h100
    partir partition examples/unet/bp_automp.partir.py --emit-schedule
    partir run examples/unet/bp_automp.partir.py --steps 3
"""

import model
from schedules import AUTO_MP, BP, MESH

import partir

program = partir.Program(model.train_step, *model.make_inputs(model.TINY))
mesh = MESH
schedule = [BP, AUTO_MP]
