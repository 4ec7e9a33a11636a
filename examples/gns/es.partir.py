"""Edge sharding (ES): the edges, senders and receivers split over "batch", the nodes
replicated; every edge-MLP parameter gradient, every segment_sum of edges into nodes and
every sum over edges needs an all_reduce over "batch" (README.md derives the count).

The tiny GNS (model.TINY) with concrete inputs, on the paper's tactic from schedules.py:

    partir partition examples/gns/es.partir.py
    partir run examples/gns/es.partir.py --steps 3
"""

import model
from schedules import ES, MESH

import partir

program = partir.Program(model.train_step, *model.make_inputs(model.TINY))
mesh = MESH
schedule = [ES]
