"""Write the IR texts and metadata of every example schedule to one JSON file, so that two
commits can be byte-compared (`cmp`) when a refactoring must not change the output.

    python scripts/ir_snapshot.py OUT.json

Covers every `examples/**/*.partir.py` file (each tactic's Core text, the final Core,
SPMD and HLO texts, the StableHLO module, collectives, shardings, conflicts and cost) and
the transformer's T32 shapes with 2 layers (abstract inputs) under each cumulative prefix
of BP, MP, Z3, EMB. Wall-clock readings and the paths of the checkout and of the Python
environment are masked, and automatic searches run without their time budget: two runs
of one commit, in any checkout and under any load, give the same file.
"""

from __future__ import annotations

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

import dataclasses
import json
import math
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import partir  # noqa: E402
from partir.schedule_file import load_schedule_file  # noqa: E402


def _texts(meta: partir.Metadata) -> dict:
    """The texts and the metadata, without what differs between runs of one commit (the
    wall-clock readings: times, the automatic search's) or between checkouts (their
    path)."""
    record = meta.to_json()
    for tactic in record["tactics"]:
        tactic.pop("elapsed_s", None)
        search = tactic.get("search")
        if search:
            search.pop("elapsed_s", None)
            search["history"] = [entry[1:] for entry in search["history"]]
        tactic["notes"] = [re.sub(r" in [0-9.]+ s ", " in - s ", n) for n in tactic["notes"]]
    record.pop("elapsed_s", None)
    texts = {"core": meta.core_ir, "spmd": meta.spmd_ir, "hlo": meta.hlo_ir,
             "stablehlo": meta.stablehlo,
             "tactic_core": [t.core_ir for t in meta.tactics],
             "json": json.dumps(record, default=str, sort_keys=True)}
    text = json.dumps(texts)
    # The environment's path first: it may lie inside the checkout (a .venv there).
    for path, mask in ((sys.prefix, "<env>"), (str(ROOT), "<root>")):
        text = text.replace(json.dumps(path)[1:-1], mask)
    return json.loads(text)


def _unbounded(schedule: list) -> list:
    """The schedule with its automatic searches run to their own end: a time budget cuts
    a search short where the machine is loaded, and one commit would then snapshot two
    different searches."""
    return [dataclasses.replace(t, budget_s=math.inf)
            if isinstance(t, partir.AutomaticPartition) else t for t in schedule]


def snapshot() -> dict[str, dict]:
    out: dict[str, dict] = {}
    for path in sorted((ROOT / "examples").glob("**/*.partir.py")):
        sf = load_schedule_file(path)
        meta = partir.partition(sf.program.fn, sf.mesh, _unbounded(sf.schedule),
                                *sf.program.args)
        out[str(path.relative_to(ROOT))] = _texts(meta)
    sys.path.insert(0, str(ROOT / "examples" / "transformer"))
    from examples.transformer import model, schedules
    inputs = model.abstract_inputs(dataclasses.replace(model.T32, layers=2))
    mesh = {schedules.BATCH: 4, schedules.MODEL: 2}
    tactics = [schedules.BP, schedules.MP, schedules.Z3, schedules.EMB]
    for n in range(1, len(tactics) + 1):
        meta = partir.partition(model.train_step, mesh, tactics[:n], *inputs)
        out["T32x2:" + "+".join(t.name for t in tactics[:n])] = _texts(meta)
    return out


if __name__ == "__main__":
    with open(sys.argv[1], "w") as f:
        json.dump(snapshot(), f, indent=1, sort_keys=True)
