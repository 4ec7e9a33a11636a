"""BP then Megatron MP on an attention block with 2 heads on a 4-device "model" axis: the
head-splitting reshape shards the heads on the sub-axis `model:(1)2` and the head
dimension on `model:(2)2` (see README.md).

    partir partition examples/attention/bp_mp.partir.py
"""

import model
from schedules import BP, MESH, MP

import partir

program = partir.Program(model.train_step, *model.make_inputs())
mesh = MESH
schedule = [BP, MP]
