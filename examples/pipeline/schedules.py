"""The tactics of the schedule file, on a mesh {"stage": 4, "batch": 2}: each device of
"stage" holds one stage's layers and activation, each device of "batch" half of every
microbatch."""

import partir

MESH = {"stage": 4, "batch": 2}
PP = partir.ManualPartition({"params": 0}, axis="stage", name="PP")
BP = partir.ManualPartition({"xs": 1}, axis="batch", name="BP")
