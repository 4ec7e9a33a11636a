"""BP and ZeRO-3, and the gradients the step returns (the output `out/1`) sharded like
the parameters: each is reduce-scattered instead of all-reduced (README.md).

    partir partition examples/zero3_grads/bp_z3_grads.partir.py
    partir run examples/zero3_grads/bp_z3_grads.partir.py
"""

import model
from schedules import BP, MESH, Z3, Z3_GRADS

import partir

program = partir.Program(model.step, *model.example_args())
mesh = MESH
schedule = [BP, Z3, Z3_GRADS]
