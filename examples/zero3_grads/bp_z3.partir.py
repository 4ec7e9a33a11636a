"""BP and ZeRO-3 of a step returning its gradients: the gradients come back replicated,
each all-reduced whole (README.md).

    partir partition examples/zero3_grads/bp_z3.partir.py
"""

import model
from schedules import BP, MESH, Z3

import partir

program = partir.Program(model.step, *model.example_args())
mesh = MESH
schedule = [BP, Z3]
