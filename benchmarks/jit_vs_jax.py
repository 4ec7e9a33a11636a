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

With --gpu (scripts/gpu_check.sh) both sides run on the local GPUs instead, on the mesh
{batch: GPUs, model: 1}, and the model is sized to fill the GPU: the largest batch of
`GPU_BASE` whose simulated peak memory is under --fill of the device's memory. Also
reported there: the peak memory the device's allocator saw, and the simulator's estimate
of the step time and the peak memory for the GPU it ran on, against what was measured.
"""

import os
import sys

# Decided before jax is imported. On CPU: 8 virtual devices. With --gpu the parent process
# only sizes the model and must leave the GPU's memory to the measured processes, whose
# peak is read from the allocator: nothing is preallocated.
os.environ.update({"XLA_PYTHON_CLIENT_PREALLOCATE": "false"} if "--gpu" in sys.argv else {
    "XLA_FLAGS": (os.environ.get("XLA_FLAGS", "")
                  + " --xla_force_host_platform_device_count=8").strip(),
    "JAX_PLATFORMS": os.environ.get("JAX_PLATFORMS", "cpu")})

import argparse
import dataclasses
import json
import statistics
import subprocess
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

import partir
from examples.transformer import model, schedules

GPU = "--gpu" in sys.argv
TARGETS = {"first_result_s": 1.1, "step_s": 1.05, "memory_bytes": 1.0}
DONATED = (0, 1)  # params, opt_state
# The GPU run's model before sizing: a ~0.9B-parameter transformer whose batch is doubled
# until it fills the GPU (`sized_config`).
GPU_BASE = model.Config(layers=16, batch=1, seq=1024, heads=16, d_model=2048, vocab=32000)


def config(overrides: str, base: model.Config) -> model.Config:
    fields = dict(item.split("=") for item in overrides.split(",") if item)
    return dataclasses.replace(base, **{k: int(v) for k, v in fields.items()})


def mesh_shape() -> dict[str, int]:
    return {schedules.BATCH: jax.device_count(), schedules.MODEL: 1} if GPU else schedules.MESH


def simulator_device() -> str:
    """The registered device spec of the local devices, for the simulator's estimate."""
    if jax.devices()[0].platform == "cpu":
        return "cpu"
    kind = jax.devices()[0].device_kind
    for name in ("h200", "h100", "a100"):
        if name in kind.lower():
            return name
    raise SystemExit(f"no simulator device spec for GPU {kind!r} (partir.sim.registered_devices)")


def inputs(cfg: model.Config) -> tuple:
    """Seeded (params, opt_state, batch) made on the device without running train_step,
    which would warm the caches of the side being measured. Parameters are drawn as
    `model.init_params` draws them, by jax.random: numpy would take minutes for a model
    that fills a GPU."""
    def init(path: tuple, leaf: jax.ShapeDtypeStruct, key: jax.Array) -> jax.Array:
        name, shape = path[-1].key, leaf.shape
        noise = jax.random.normal(key, shape, leaf.dtype)
        if name.endswith("_scale"):
            return 1.0 + 0.1 * noise
        if name.startswith("b") or name.endswith("_bias"):
            return 0.1 * noise
        fan_in = shape[-1] if name == "embed" else int(np.prod(shape)) // shape[-1]
        return noise * fan_in ** -0.5

    abstract, _, _ = model.abstract_inputs(cfg)

    @jax.jit
    def draw(key: jax.Array) -> dict:
        keys = iter(jax.random.split(key, len(jax.tree.leaves(abstract))))
        return jax.tree_util.tree_map_with_path(lambda p, x: init(p, x, next(keys)), abstract)

    params = draw(jax.random.key(0))
    return params, model.OPTIMIZER.init(params), model.make_batch(cfg)


def capacity_bytes() -> int:
    """The device's memory as its allocator reports it, or its simulator spec's (CPU)."""
    stats = jax.devices()[0].memory_stats()
    return stats["bytes_limit"] if stats else partir.sim.get_device(
        simulator_device()).memory_bytes


def sized_config(cfg: model.Config, schedule: str, fill: float) -> model.Config:
    """`cfg` with its batch doubled while the simulated peak memory per device stays at
    most `fill` of the device's memory."""
    limit = fill * capacity_bytes()
    while True:
        bigger = dataclasses.replace(cfg, batch=2 * cfg.batch)
        meta = partir.partition(model.train_step, mesh_shape(), schedules.SCHEDULES[schedule],
                                *model.abstract_inputs(bigger), device=simulator_device())
        if meta.cost.peak_memory_bytes > limit:
            return cfg
        cfg = bigger


def specs_to_json(specs) -> list:
    return [[list(e) if isinstance(e, tuple) else e for e in s]
            for s in jax.tree.leaves(specs, is_leaf=lambda x: isinstance(x, PartitionSpec))]


def specs_from_json(flat: list, like) -> object:
    specs = [PartitionSpec(*(tuple(e) if isinstance(e, list) else e for e in s)) for s in flat]
    return jax.tree.unflatten(jax.tree.structure(like), specs)


def jax_mesh() -> jax.sharding.Mesh:
    shape = mesh_shape()
    devices = jax.devices()[:int(np.prod(list(shape.values())))]
    return jax.sharding.Mesh(np.array(devices).reshape(tuple(shape.values())), tuple(shape))


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
    stats = jax.devices()[0].memory_stats() or {}  # None on CPU
    return {"first_result_s": first, "step_s": statistics.median(times),
            "memory_bytes": memory_bytes(fn.lower(params, opt_state, batch)),
            "peak_bytes": stats.get("peak_bytes_in_use"), "losses": losses}


def in_fresh_process(side: str, args: argparse.Namespace, specs: dict) -> dict:
    out = subprocess.run([sys.executable, __file__, "--measure", side, "--steps",
                          str(args.steps), "--schedule", args.schedule, "--config",
                          args.config, "--specs", json.dumps(specs)]
                         + ["--gpu"] * GPU,
                         capture_output=True, text=True)
    if out.returncode:
        raise SystemExit(f"the {side} process failed ({out.returncode}):\n{out.stderr[-6000:]}")
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
                        help="fields of model.TINY (with --gpu: of the sized model) to "
                             "override, e.g. d_model=256,seq=128")
    parser.add_argument("--gpu", action="store_true",
                        help="run on the local GPUs, the model sized to fill one")
    parser.add_argument("--fill", type=float, default=0.6,
                        help="with --gpu: the share of GPU memory the simulated peak may use")
    parser.add_argument("--measure", choices=["partir", "jax"], help=argparse.SUPPRESS)
    parser.add_argument("--specs", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        cfg = config(args.config, GPU_BASE if GPU else model.TINY)
        print(json.dumps(measure(args.measure, args.steps, args.schedule,
                                 json.loads(args.specs), cfg)))
        return
    cfg = config(args.config, GPU_BASE if GPU else model.TINY)
    if GPU:
        cfg = sized_config(cfg, args.schedule, args.fill)
    # The measured processes get the sized model by its fields, not by sizing again.
    args.config = ",".join(f"{f.name}={getattr(cfg, f.name)}" for f in dataclasses.fields(cfg)
                           if getattr(cfg, f.name) is not None)

    # The shardings jax.jit is given: partir's, without devices (abstract inputs).
    meta = partir.partition(model.train_step, mesh_shape(), schedules.SCHEDULES[args.schedule],
                            *model.abstract_inputs(cfg), device=simulator_device())
    specs = {"in": specs_to_json(meta.in_specs), "out": specs_to_json(meta.out_specs)}
    params = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(model.abstract_inputs(cfg)[0]))
    print(f"train_step of examples/transformer, {cfg} ({params / 1e9:.2f}B parameters), "
          f"schedule {args.schedule}, mesh {mesh_shape()}; jax {jax.__version__} on "
          f"{len(jax.devices())} {jax.devices()[0].device_kind} devices; {args.steps} "
          f"steady-state steps; the best of {args.repeat} fresh processes per side")
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
    if results["partir"]["peak_bytes"] is not None:
        capacity = capacity_bytes()
        print(f"{'allocator peak':<24}" + "".join(
            f"{show(results[side]['peak_bytes'], 'memory_bytes'):>14}"
            for side in ("partir", "jax"))
            + f"  ({results['partir']['peak_bytes'] / capacity:.0%} of "
              f"{show(capacity, 'memory_bytes')})")
    cost = meta.cost
    print(f"simulator ({cost.device}) against partir.jit as measured: step "
          f"{show(cost.step_time_s, 'step_s')} vs {show(results['partir']['step_s'], 'step_s')} "
          f"({cost.step_time_s / results['partir']['step_s']:.2f}x); peak memory "
          f"{show(cost.peak_memory_bytes, 'memory_bytes')} vs "
          f"{show(results['partir']['memory_bytes'], 'memory_bytes')} "
          f"({cost.peak_memory_bytes / results['partir']['memory_bytes']:.2f}x)")


if __name__ == "__main__":
    main()
