"""A tied embedding with a vocabulary of 50 sharded over 8 devices: padded to 56
(README.md).

    partir partition examples/padding/vocab50.partir.py
"""

import model

import partir

program = partir.Program(model.lm_step, *model.lm_inputs())
mesh = {"vocab": 8}
schedule = [partir.ManualPartition({"params/embed": 0}, axis="vocab", name="EMB")]
