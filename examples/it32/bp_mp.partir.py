"""IT32 serving loop, schedule BP+MP (README.md, "Table 2, derived").

The tiny served model (model.TINY) with concrete inputs, on the tactics of schedules.py:

    partir partition examples/it32/bp_mp.partir.py
    partir run examples/it32/bp_mp.partir.py
"""

import model
from schedules import MESH, SCHEDULES

import partir

program = partir.Program(model.serving_fn(model.TINY), *model.make_inputs(model.TINY))
mesh = MESH
schedule = SCHEDULES["BP+MP"]
