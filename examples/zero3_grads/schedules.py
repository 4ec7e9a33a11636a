"""The tactics of the schedule files and of `demo.py`, on a mesh {"batch": 8}."""

import partir

MESH = {"batch": 8}
BP = partir.ManualPartition({"x": 0}, axis="batch", name="BP")
Z3 = partir.ManualPartition({"params": partir.FIRST_DIVISIBLE_DIM}, axis="batch", name="Z3")
# The gradients the step returns, `out/1/w1` and `out/1/w2`, tiled as Z3 tiled their
# parameters.
Z3_GRADS = partir.ManualPartition({"out/1": partir.FIRST_DIVISIBLE_DIM}, axis="batch",
                                  name="Z3 grads")
