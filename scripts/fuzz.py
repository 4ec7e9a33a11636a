"""Differential fuzzing of partir against jax.jit (tests/fuzz).

    scripts/fuzz.py --seeds 0:200 --workers 2 [--timeout 120] [--modes plain,grad]
                    [--json out.json] [--minimize-s 60] [--budget-s 600] [--no-repros]
    scripts/fuzz.py --replay SEED [--modes MODE] [--core] [--source]

A campaign runs every seed in every mode (plain partir.jit, under jax.jit, jax.grad of a
loss of the partitioned function, a partitioned function calling jax.value_and_grad), the
Core interpreter too on every 5th seed in plain mode, then minimizes each WRONG, CRASH and
TIMEOUT and prints a summary: counts per class, refusals grouped by reason, and every
failure with its seed and minimized repro (runnable Python). --replay reruns one seed in
this process and prints the full traceback. Exit status 1 if anything failed."""

from __future__ import annotations

import argparse
import os
import sys
import traceback
from pathlib import Path

# Before anything imports JAX: 8 virtual CPU devices (workers set this themselves too).
os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                           " --xla_force_host_platform_device_count=8").strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.fuzz.program import MODES


def _seeds(text: str) -> list[int]:
    """A:B (B excluded), one seed, or seeds separated by commas (a replay of a list)."""
    if "," in text:
        return [int(s) for s in text.split(",")]
    a, _, b = text.partition(":")
    return list(range(int(a), int(b)) if b else range(int(a), int(a) + 1))


def replay(seed: int, modes: list[str], core: bool, source: bool) -> int:
    from tests.fuzz.generator import generate
    from tests.fuzz.program import render
    from tests.fuzz.runner import CORE_EVERY, FAILURES, execute
    case = generate(seed)
    status = 0
    for mode in modes:
        use_core = core or (mode == "plain" and seed % CORE_EVERY == 0)
        if source:
            print(render(case, mode, use_core))
        out = execute(case, mode, use_core)
        print(f"seed {seed} {mode}{' (+core)' if use_core else ''}: {out.cls} {out.error} "
              f"{out.message}")
        if out.trace:
            print(out.trace)
        status |= out.cls in FAILURES
    if not source:
        print("(--source prints the case as Python)")
    return status


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", default="0:100",
                    help="A:B (B excluded), one seed, or seeds separated by commas")
    ap.add_argument("--workers", type=int, default=max(1, (os.cpu_count() or 2) - 1))
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds a case")
    ap.add_argument("--modes", default=",".join(MODES), help=f"comma-separated of {MODES}")
    ap.add_argument("--json", help="write every case's outcome and the failures here")
    ap.add_argument("--minimize-s", type=float, default=60.0,
                    help="seconds spent minimizing each failure (0: none)")
    ap.add_argument("--minimize-total-s", type=float, default=1e9,
                    help="seconds spent minimizing, all failures together")
    ap.add_argument("--budget-s", type=float, help="stop starting cases after this many "
                    "seconds (then minimize): as many seeds as fit")
    ap.add_argument("--core-every", type=int, default=5,
                    help="also check the Core interpreter on seeds divisible by this (plain)")
    ap.add_argument("--no-repros", action="store_true", help="summary without the repros")
    ap.add_argument("--replay", type=int, help="rerun one seed here, with full tracebacks")
    ap.add_argument("--core", action="store_true", help="with --replay: check the Core "
                    "interpreter too")
    ap.add_argument("--source", action="store_true", help="with --replay: print the case")
    args = ap.parse_args(argv)
    modes = [m for m in args.modes.split(",") if m]
    if args.replay is not None:
        return replay(args.replay, modes, args.core, args.source)

    from tests.fuzz.campaign import run_campaign, write_json

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    try:
        report = run_campaign(_seeds(args.seeds), modes, args.workers, args.timeout,
                              args.minimize_s, args.minimize_total_s, args.core_every,
                              args.budget_s, log)
    except KeyboardInterrupt:
        traceback.print_exc()
        return 130
    print(report.format(repros=not args.no_repros))
    if args.json:
        write_json(report, args.json)
    return 1 if report.failures else 0


if __name__ == "__main__":
    sys.exit(main())
