"""IT32 serving loop, schedule BP+MP+MQ (README.md, "Table 2, derived").

The tiny served model (model.TINY_MQ) with concrete inputs, on the tactics of schedules.py:

    partir partition examples/it32/bp_mp_mq.partir.py
    partir run examples/it32/bp_mp_mq.partir.py
"""

import model
from schedules import MESH, SCHEDULES

import partir

program = partir.Program(model.serving_fn(model.TINY_MQ), *model.make_inputs(model.TINY_MQ))
mesh = MESH
schedule = SCHEDULES["BP+MP+MQ"]
