"""Edge sharding (ES), the PartIR paper's GNS tactic: the edges of the graph are split
over the "batch" axis, the nodes are replicated (Jia et al.'s edge sharding).

Inputs are named by `train_step`'s parameters and pytree paths: `graph/edges`,
`graph/senders`, `graph/receivers` (see `model.py`).
"""

from __future__ import annotations

import partir
from partir import ManualPartition
from partir.tactics import Tactic

BATCH, MODEL = "batch", "model"
MESH = {BATCH: 8}

# The paper's appendix: ManualPartition(inputs={'edges': ..., senders/receivers: 0},
# axis="batch"). The edge features and their endpoints are split on dim 0 (the edges);
# nodes, targets, parameters and optimizer state are left to propagation.
ES = ManualPartition({"graph/edges": 0, "graph/senders": 0, "graph/receivers": 0},
                     axis=BATCH, name="ES")

SCHEDULES: dict[str, list[ManualPartition]] = {"ES": [ES]}

# The paper's automatic tactics (appendix "Automatic tactics"): searches over the same
# actions, guided by the simulator (device: the `device` argument, default partir's).
# After ES, AutoBP searches what else to tile on "batch" (the nodes, the parameters, the
# optimizer state); AutoMP and AllAuto need a "model" axis (`mesh(model=2)`).
AUTO_BP = partir.AutomaticPartition(axis=BATCH, name="AutoBP")
AUTO_MP = partir.AutomaticPartition(axis=MODEL, name="AutoMP")
ALL_AUTO = partir.AutomaticPartition(axes=[BATCH, MODEL], name="AllAuto")
AUTO_SCHEDULES: dict[str, list[Tactic]] = {
    "ES+AutoBP": [ES, AUTO_BP],
    "ES+AutoMP": [ES, AUTO_MP],
    "AllAuto": [ALL_AUTO],
}


def mesh(**sizes: int) -> partir.Mesh:
    return partir.Mesh({**MESH, **sizes})
