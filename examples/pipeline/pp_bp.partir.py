"""GPipe over "stage" and batch parallelism over "batch" (README.md).

    partir partition examples/pipeline/pp_bp.partir.py
"""

import model
from schedules import BP, MESH, PP

import partir

program = partir.Program(model.step, *model.example_args())
mesh = MESH
schedule = [PP, BP]
