"""AutomaticPartition against the paper's manual schedules, on the full-size transformer
(T32), UNet and GNS (abstract inputs) on {batch: 16, model: 2} (32 devices, as the
paper's 8x4 TPUs): per model and schedule, the search's time and evaluations, and the
found vs the manual simulated step time and peak memory per device, side by side.

    python benchmarks/auto_partition.py [--models t32,unet,gns] [--layers 32]
                                        [--device h100] [--budget 60] [--out auto_partition]

Schedules (the paper's "Composing automatic and manual tactic"): T32 BP+AutoMP vs BP+MP,
BP+AutoMP+Z3 and AllAuto (one search over both axes) vs BP+MP+Z3; UNet BP+AutoMP vs BP;
GNS ES+AutoBP vs ES. Each search gets the budget, 60 s by default (a search stops before
a step that would, on average, end past it). Writes OUT.json with every search's record
(best cost over time included) and OUT.png plotting the best step time over search time
when matplotlib is installed (`pip install -e ".[bench]"`; not a dependency of partir).
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

MESH = {"batch": 16, "model": 2}


def rows(name: str, args: argparse.Namespace) -> tuple[object, tuple, list]:
    """The model's step, its abstract inputs, and (schedule, auto schedule, manual name,
    manual schedule) rows."""

    def auto(label: str, **axes) -> partir.AutomaticPartition:
        return partir.AutomaticPartition(**axes, budget_s=args.budget, seed=args.seed,
                                         device=args.device, name=label)

    if name == "t32":
        from examples.transformer import model
        from examples.transformer.schedules import BP, MP, Z3
        cfg = dataclasses.replace(model.T32, layers=args.layers)
        return model.train_step, model.abstract_inputs(cfg), [
            ("BP+AutoMP", [BP, auto("AutoMP", axis="model")], "BP+MP", [BP, MP]),
            ("BP+AutoMP+Z3", [BP, auto("AutoMP", axis="model"), Z3], "BP+MP+Z3",
             [BP, MP, Z3]),
            ("AllAuto", [auto("AllAuto", axes=["batch", "model"])], "BP+MP+Z3",
             [BP, MP, Z3]),
        ]
    if name == "unet":
        from examples.unet import model
        from examples.unet.schedules import BP
        return model.train_step, model.abstract_inputs(model.FULL), [
            ("BP+AutoMP", [BP, auto("AutoMP", axis="model")], "BP", [BP]),
        ]
    if name == "gns":
        from examples.gns import model
        from examples.gns.schedules import ES
        return model.train_step, model.abstract_inputs(model.GNS), [
            ("ES+AutoBP", [ES, auto("AutoBP", axis="batch")], "ES", [ES]),
        ]
    raise SystemExit(f"unknown model {name!r} (t32, unet, gns)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="t32,unet,gns")
    parser.add_argument("--layers", type=int, default=32, help="T32's layers")
    parser.add_argument("--device", default="h100")
    parser.add_argument("--budget", type=float, default=60.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="auto_partition")
    args = parser.parse_args()
    gib = 2 ** 30
    print(f"mesh {MESH}, device {args.device}, budget {args.budget:.0f} s, seed {args.seed}, "
          f"T32 with {args.layers} layers")
    print(f"{'model':<5} {'schedule':<13} {'search s':>8} {'evals':>5} {'found ms':>9} "
          f"{'manual':>9} {'ratio':>6} {'found GiB':>9} {'manual':>7} {'fits':>9}  vs")
    histories: dict[str, dict] = {}
    for model_name in args.models.split(","):
        step, inputs, model_rows = rows(model_name, args)
        for name, schedule, manual_name, manual in model_rows:
            man = partir.partition(step, MESH, manual, *inputs, device=args.device)
            start = time.perf_counter()
            found = partir.partition(step, MESH, schedule, *inputs, device=args.device)
            total = time.perf_counter() - start
            searches = [t.search for t in found.tactics if t.search is not None]
            search_s = sum(s["elapsed_s"] for s in searches)
            evals = sum(s["evaluations"] for s in searches)
            key = f"{model_name.upper()} {name}"
            histories[key] = {
                "search": searches, "partition_s": total, "manual": manual_name,
                "found": {"step_time_s": found.cost.step_time_s,
                          "peak_memory_bytes": found.cost.peak_memory_bytes,
                          "fits": found.cost.fits, "collectives": found.collectives},
                "manual_cost": {"step_time_s": man.cost.step_time_s,
                                "peak_memory_bytes": man.cost.peak_memory_bytes,
                                "fits": man.cost.fits, "collectives": man.collectives}}
            fits = f"{'yes' if found.cost.fits else 'no'}/{'yes' if man.cost.fits else 'no'}"
            print(f"{model_name.upper():<5} {name:<13} {search_s:>8.1f} {evals:>5} "
                  f"{found.cost.step_time_s * 1e3:>9.2f} {man.cost.step_time_s * 1e3:>9.2f} "
                  f"{found.cost.step_time_s / man.cost.step_time_s:>6.3f} "
                  f"{found.cost.peak_memory_bytes / gib:>9.2f} "
                  f"{man.cost.peak_memory_bytes / gib:>7.2f} {fits:>9}  {manual_name}",
                  flush=True)
            for s in searches:
                print(f"      {s['stopped']}; {len(s['decisions'])} decisions:")
                for d in s["decisions"]:
                    print(f"        tile<{d['inputs']},{d['dim']},{d['axis']}> "
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
    models = list(dict.fromkeys(k.split()[0] for k in histories))
    fig, axes = plt.subplots(1, len(models), figsize=(5 * len(models), 4), squeeze=False)
    for ax, m in zip(axes[0], models, strict=True):
        for name, h in histories.items():
            if name.split()[0] != m:
                continue
            offset = 0.0
            for s in h["search"]:
                # The best so far, held until the search ended.
                ts = [offset + p[0] for p in s["history"]] + [offset + s["elapsed_s"]]
                ms = [p[1] * 1e3 for p in s["history"]] + [s["history"][-1][1] * 1e3]
                ax.step(ts, ms, where="post", label=name.split(" ", 1)[1])
                offset += s["elapsed_s"]
            ax.axhline(h["manual_cost"]["step_time_s"] * 1e3, ls="--", lw=0.8, color="grey")
        ax.set_yscale("log")
        ax.set_title(f"{m} (dashed: manual)")
        ax.set_xlabel("search time (s)")
        ax.set_ylabel("best simulated step time (ms)")
        ax.legend()
    fig.tight_layout()
    fig.savefig(args.out + ".png", dpi=120)
    print(f"wrote {args.out}.png")


if __name__ == "__main__":
    main()
