"""BP then Megatron MP on the scan-over-layers transformer: the layers' blocks are summed
over "model" inside the scan's body, once per layer (see README.md).

    partir partition examples/transformer/scan_bp_mp.partir.py
    partir run examples/transformer/scan_bp_mp.partir.py --steps 3
"""

import model
from schedules import BP, MESH, MP

import partir

program = partir.Program(model.train_step_scanned, *model.make_scanned_inputs(model.TINY))
mesh = MESH
schedule = [BP, MP]
