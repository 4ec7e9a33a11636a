"""BP, MP and ZeRO stage 3 / FSDP (paper, section 2): also shard the parameters over
"batch", on the dimensions MP left whole, so each device stores a 2x8 tile of w1 and an
8x2 tile of w2 and gathers them where they are used.

`partir partition examples/mlp/bp_mp_z3.partir.py`
"""

from model import example_args, mlp

import partir

program = partir.Program(mlp, *example_args())
mesh = {"batch": 4, "model": 2}
schedule = [
    partir.ManualPartition({"x": 0}, axis="batch", name="BP"),
    partir.ManualPartition({"w1": 1}, axis="model", name="MP"),
    partir.ManualPartition({"w1": 0, "w2": 1}, axis="batch", name="Z3"),
]
