"""Edge sharding, then AutomaticPartition over "batch" (the paper's ES+AutoBP): the
search decides what else to tile on the axis the edges are split on (the nodes, the
parameters, the optimizer state), guided by the simulator's step time (memory a hard
constraint).

The tiny GNS (model.TINY) with concrete inputs (README.md, "Automatic partitioning", has
the full-size figures):

    partir partition examples/gns/es_autobp.partir.py --device h100
    partir partition examples/gns/es_autobp.partir.py --emit-schedule
    partir run examples/gns/es_autobp.partir.py --steps 3
"""

import model
from schedules import AUTO_BP, ES, MESH

import partir

program = partir.Program(model.train_step, *model.make_inputs(model.TINY))
mesh = MESH
schedule = [ES, AUTO_BP]
