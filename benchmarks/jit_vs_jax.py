"""partir.jit against jax.jit on the transformer example's training loop.

Both run `examples/transformer/model.train_step` on the shipped config (model.TINY, or
larger with --config) and the {batch: 4, model: 2} mesh of 8 virtual CPU devices, with the
same input and output shardings: partir.jit with a schedule (default BP+MP+Z3), and
jax.jit with partir's `meta.in_specs`/`out_specs` as `NamedSharding`s, both donating the
parameters and the optimizer state as a training loop does. Each side runs in a fresh
process so that neither profits from the other's caches. Reported side by side, with their
ratios (partir / jax) and targets:

* time to first result: from making the jitted function to the first step's results
  (trace, partition, compile, run; target <= 1.1x);
* steady-state step time: median over --steps steps feeding the parameters and the
  optimizer state back (target <= 1.05x);
* per-device memory: arguments + outputs + temporaries - aliased (donated) bytes from
  `.lower(...).compile().memory_analysis()` (target <= 1.0x).

The sides alternate, --repeat fresh processes each, and each figure is a side's best
over its processes: the machine's load drifts between processes. Both sides' losses must
agree (jax.jit is the oracle).

    python benchmarks/jit_vs_jax.py [--steps 50] [--repeat 2] [--schedule BP+MP+Z3]
        [--config d_model=256,seq=128]   (fields of model.TINY overridden)
"""

import os

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                           " --xla_force_host_platform_device_count=8").strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import argparse
import dataclasses
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

import partir
from examples.transformer import model, schedules

TARGETS = {"first_result_s": 1.1, "step_s": 1.05, "memory_bytes": 1.0}
DONATED = (0, 1)  # params, opt_state


def config(overrides: str) -> model.Config:
    fields = dict(item.split("=") for item in overrides.split(",") if item)
    return dataclasses.replace(model.TINY, **{k: int(v) for k, v in fields.items()})


def inputs(cfg: model.Config) -> tuple:
    """Seeded (params, opt_state, batch) made without running train_step, which would
    warm the caches of the side being measured."""
    params = model.init_params(cfg)
    return params, model.OPTIMIZER.init(params), model.make_batch(cfg)


def specs_to_json(specs) -> list:
    return [[list(e) if isinstance(e, tuple) else e for e in s]
            for s in jax.tree.leaves(specs, is_leaf=lambda x: isinstance(x, PartitionSpec))]


def specs_from_json(flat: list, like) -> object:
    specs = [PartitionSpec(*(tuple(e) if isinstance(e, list) else e for e in s)) for s in flat]
    return jax.tree.unflatten(jax.tree.structure(like), specs)


def jax_mesh() -> jax.sharding.Mesh:
    shape = tuple(schedules.MESH.values())
    return jax.sharding.Mesh(np.array(jax.devices()[:8]).reshape(shape),
                             tuple(schedules.MESH))


def memory_bytes(lowered) -> int:
    m = lowered.compile().memory_analysis()
    return (m.argument_size_in_bytes + m.output_size_in_bytes + m.temp_size_in_bytes
            - m.alias_size_in_bytes)


def measure(side: str, steps: int, schedule: str, specs: dict, cfg: model.Config) -> dict:
    args = inputs(cfg)
    abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), args)
    mesh = jax_mesh()
    start = time.perf_counter()
    if side == "partir":
        fn, _ = partir.jit(model.train_step, mesh, schedules.SCHEDULES[schedule],
                           donate_argnums=DONATED)
    else:
        def named(flat, like):
            return jax.tree.map(lambda s: NamedSharding(mesh, s), specs_from_json(flat, like),
                                is_leaf=lambda x: isinstance(x, PartitionSpec))
        fn = jax.jit(model.train_step, donate_argnums=DONATED,
                     in_shardings=named(specs["in"], abstract),
                     out_shardings=named(specs["out"], jax.eval_shape(model.train_step,
                                                                      *abstract)))
    params, opt_state, loss = jax.block_until_ready(fn(*args))
    first = time.perf_counter() - start
    batch = args[2]
    losses, times = [float(loss)], []
    for _ in range(steps):
        start = time.perf_counter()
        params, opt_state, loss = jax.block_until_ready(fn(params, opt_state, batch))
        times.append(time.perf_counter() - start)
        losses.append(float(loss))
    return {"first_result_s": first, "step_s": statistics.median(times),
            "memory_bytes": memory_bytes(fn.lower(params, opt_state, batch)),
            "losses": losses}


def in_fresh_process(side: str, args: argparse.Namespace, specs: dict) -> dict:
    out = subprocess.run([sys.executable, __file__, "--measure", side, "--steps",
                          str(args.steps), "--schedule", args.schedule, "--config",
                          args.config, "--specs", json.dumps(specs)],
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def verdict(ratio: float, target: float) -> str:
    return "met" if ratio <= target else "NOT met"


def show(value: float, key: str) -> str:
    if key == "memory_bytes":
        return f"{value / 2**20:.2f} MiB"
    return f"{value * 1e3:.2f} ms" if value < 1 else f"{value:.2f} s"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--schedule", default="BP+MP+Z3", choices=sorted(schedules.SCHEDULES))
    parser.add_argument("--config", default="",
                        help="fields of model.TINY to override, e.g. d_model=256,seq=128")
    parser.add_argument("--measure", choices=["partir", "jax"], help=argparse.SUPPRESS)
    parser.add_argument("--specs", help=argparse.SUPPRESS)
    args = parser.parse_args()
    cfg = config(args.config)
    if args.measure:
        print(json.dumps(measure(args.measure, args.steps, args.schedule,
                                 json.loads(args.specs), cfg)))
        return

    # The shardings jax.jit is given: partir's, without devices (abstract inputs).
    meta = partir.partition(model.train_step, schedules.MESH,
                            schedules.SCHEDULES[args.schedule],
                            *model.abstract_inputs(cfg))
    specs = {"in": specs_to_json(meta.in_specs), "out": specs_to_json(meta.out_specs)}
    print(f"train_step of examples/transformer, {cfg}, schedule {args.schedule}, mesh "
          f"{dict(schedules.MESH)}; jax {jax.__version__} on {len(jax.devices())} "
          f"{jax.devices()[0].platform} devices; {args.steps} steady-state steps; the best "
          f"of {args.repeat} fresh processes per side")
    runs = {"partir": [], "jax": []}
    for _ in range(args.repeat):
        for side, found in runs.items():
            found.append(in_fresh_process(side, args, specs))
    results = {side: {**found[0], **{key: min(r[key] for r in found) for key in TARGETS}}
               for side, found in runs.items()}
    print()
    print(f"{'':<24}{'partir.jit':>14}{'jax.jit':>14}{'ratio':>9}  target")
    for key, label in (("first_result_s", "time to first result"),
                       ("step_s", "steady-state step"),
                       ("memory_bytes", "memory per device")):
        p, j = results["partir"][key], results["jax"][key]
        ratio = p / j
        print(f"{label:<24}{show(p, key):>14}{show(j, key):>14}{ratio:>8.2f}x  "
              f"<= {TARGETS[key]}x {verdict(ratio, TARGETS[key])}")
    worst = max(abs(a - b) for a, b in zip(results["partir"]["losses"],
                                           results["jax"]["losses"], strict=True))
    agree = np.allclose(results["partir"]["losses"], results["jax"]["losses"], rtol=1e-4,
                        atol=1e-5)
    print(f"losses over {len(results['jax']['losses'])} steps: max |partir - jax| "
          f"{worst:.2e} {'agree' if agree else 'DISAGREE'}")


if __name__ == "__main__":
    main()
