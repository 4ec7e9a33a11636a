"""AutomaticPartition against the paper's manual schedules on the transformer (T32,
abstract inputs) on {batch: 16, model: 2}: per schedule, the search's time and
evaluations, and the found vs the manual simulated step time and peak memory per device.

    python benchmarks/auto_partition.py [--layers 32] [--device a100] [--budget 60]
                                        [--out auto_partition]

Writes OUT.json with every search's best cost over time, and OUT.png plotting it when
matplotlib is installed (`pip install -e ".[bench]"`; not a dependency of partir).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the examples

import partir
from examples.transformer import model
from examples.transformer.schedules import BP, MP, Z3

MESH = {"batch": 16, "model": 2}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=32)
    parser.add_argument("--device", default="a100")
    parser.add_argument("--budget", type=float, default=60.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="auto_partition")
    args = parser.parse_args()
    cfg = dataclasses.replace(model.T32, layers=args.layers)
    inputs = model.abstract_inputs(cfg)

    def auto(name: str, **axes) -> partir.AutomaticPartition:
        return partir.AutomaticPartition(**axes, budget_s=args.budget, seed=args.seed,
                                         device=args.device, name=name)

    rows = [
        ("BP+AutoMP", [BP, auto("AutoMP", axis="model")], "BP+MP", [BP, MP]),
        ("BP+AutoMP+Z3", [BP, auto("AutoMP", axis="model"), Z3], "BP+MP+Z3", [BP, MP, Z3]),
        ("AllAuto", [auto("AllAuto", axes=["batch", "model"])], "BP+MP+Z3", [BP, MP, Z3]),
    ]
    print(f"T32 with {args.layers} layers on {MESH}, device {args.device}, "
          f"budget {args.budget:.0f} s, seed {args.seed}")
    header = (f"{'schedule':<14} {'search s':>8} {'evals':>5} {'found ms':>9} {'manual':>9} "
              f"{'ratio':>6} {'found GiB':>9} {'manual':>7} {'fits':>4}  vs")
    print(header)
    histories = {}
    for name, schedule, manual_name, manual in rows:
        man = partir.partition(model.train_step, MESH, manual, *inputs, device=args.device)
        start = time.perf_counter()
        found = partir.partition(model.train_step, MESH, schedule, *inputs,
                                 device=args.device)
        total = time.perf_counter() - start
        searches = [t.search for t in found.tactics if t.search is not None]
        search_s = sum(s["elapsed_s"] for s in searches)
        evals = sum(s["evaluations"] for s in searches)
        histories[name] = {"search": searches, "partition_s": total}
        gib = 2 ** 30
        print(f"{name:<14} {search_s:>8.1f} {evals:>5} "
              f"{found.cost.step_time_s * 1e3:>9.1f} {man.cost.step_time_s * 1e3:>9.1f} "
              f"{found.cost.step_time_s / man.cost.step_time_s:>6.3f} "
              f"{found.cost.peak_memory_bytes / gib:>9.2f} "
              f"{man.cost.peak_memory_bytes / gib:>7.2f} {'yes' if found.cost.fits else 'no':>4}"
              f"  {manual_name}")
        for s in searches:
            for d in s["decisions"]:
                print(f"    tile<{d['inputs']},{d['dim']},{d['axis']}> "
                      f"({len(d['names'])} values)")
    with open(args.out + ".json", "w") as f:
        json.dump(histories, f, indent=1)
    print(f"wrote {args.out}.json")
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no plot")
        return
    fig, ax = plt.subplots(figsize=(7, 4))
    for name, h in histories.items():
        for s in h["search"]:
            ts = [p[0] for p in s["history"]]
            ms = [p[1] * 1e3 for p in s["history"]]
            ax.step(ts, ms, where="post", label=name)
    ax.set_xlabel("search time (s)")
    ax.set_ylabel("best simulated step time (ms)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(args.out + ".png", dpi=120)
    print(f"wrote {args.out}.png")


if __name__ == "__main__":
    main()
