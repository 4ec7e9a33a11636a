"""How long the public `partir.partition` takes on a transformer training step, next to
what XLA takes to compile the same step, side by side in one run.

For each layer count (T32's shapes with 16, 32 and 64 layers by default; value_and_grad +
optax.adam), schedule BP + MP + Z3 on the mesh {batch: 4, model: 2}:

* `partir.partition(step, mesh, schedule, *abstract_inputs)`, what a user calls: JAX's
  trace, partir's frontend, the tactics, lowering Core -> SPMD -> HLO and simulating the
  final program;
* the same without JAX's trace: minus the time spent in `jax.make_jaxpr(step)(*inputs)`
  within that call;
* `jax.jit(step).lower(*inputs).compile()` of the unpartitioned step;
* `jax.jit(step, in_shardings, out_shardings).lower(...).compile()` with partir's
  `in_specs`/`out_specs` on the local devices: XLA's own SPMD partitioner given the same
  shardings.

Every measurement runs in a fresh process (no warm JAX or partir caches on either side),
repeated there with `jax.clear_caches()` in between; medians are reported. Everything is
abstract (`jax.ShapeDtypeStruct`s): nothing allocates the model.

Targets (issue 12): partition <= 0.35x the unpartitioned lower+compile at 32 layers and
<= 0.45x at 64; without the trace <= 0.2x at 32 layers; growth exponent of the partition
time over the layer counts <= 1.1.

With `--against REV`, it instead times `partir.partition` of this checkout and of the
commit REV (a temporary `git worktree`) side by side, alternating fresh processes, and
prints this checkout's time over REV's: the check that a change does not slow
partitioning down (issue 13: ratio <= 1.05).

With `--pipeline`, it times `partir.partition` of the scan-over-layers step with PP + BP
+ MP + Z3 (`partir.PipelinePartition` over 8 stages, 3 microbatches: 48 rows in 3 of 16,
which BP splits over its 16 devices) against BP + MP + Z3 on the same mesh {stage: 8,
batch: 16, model: 8}, alternating fresh processes (issue 29: ratio <= 2.0).

With `--scan`, it times `partir.partition` of the scan-over-layers step
(`model.train_step_scanned`, the layers' parameters stacked) against the unrolled step,
alternating fresh processes: a loop's body is partitioned once, so the scanned step may
take no longer than the unrolled one (issue 28: ratio <= 1.0).

    python benchmarks/partition_time.py [--repeat 3] [--layers 16 32 64] [--against REV]
        [--scan] [--pipeline]
"""

import os

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                           " --xla_force_host_platform_device_count=8").strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import argparse
import dataclasses
import gc
import json
import math
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path


def _root() -> Path:
    """The checkout whose partir is measured: `--root DIR` (a fresh process measuring
    another commit), else this file's."""
    if "--root" in sys.argv:
        return Path(sys.argv[sys.argv.index("--root") + 1])
    return Path(__file__).resolve().parents[1]


ROOT = _root()
sys.path.insert(0, str(ROOT))

import jax  # noqa: E402  (after sys.path names the measured checkout)

import partir  # noqa: E402
from examples.transformer import model, schedules  # noqa: E402

MESH = {schedules.BATCH: 4, schedules.MODEL: 2}
SCHEDULE = [schedules.BP, schedules.MP, schedules.Z3]
KINDS = ("partition", "xla_unpartitioned", "xla_sharded")  # the default table's
# `--pipeline`: the scan-over-layers step with and without the pipeline on one mesh.
STAGED_MESH = {schedules.STAGE: 8, schedules.BATCH: 16, schedules.MODEL: 8}
PIPELINED = [partir.PipelinePartition({"params/layers": 0}, axis=schedules.STAGE,
                                      microbatches=3, name="PP"), *SCHEDULE]
PIPELINE_KINDS = {"partition_pipelined": PIPELINED, "partition_staged": SCHEDULE}


class TraceTimer:
    """Time spent in JAX's trace (`jax.make_jaxpr(...)(*args)`, which partir's frontend
    calls) while installed."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self._make_jaxpr = jax.make_jaxpr

    def __enter__(self) -> "TraceTimer":
        def make_jaxpr(*args, **kwargs):
            trace = self._make_jaxpr(*args, **kwargs)

            def timed(*call_args, **call_kwargs):
                start = time.perf_counter()
                try:
                    return trace(*call_args, **call_kwargs)
                finally:
                    self.seconds += time.perf_counter() - start
            return timed

        jax.make_jaxpr = make_jaxpr
        return self

    def __exit__(self, *exc: object) -> None:
        jax.make_jaxpr = self._make_jaxpr


def _cold() -> None:
    jax.clear_caches()
    gc.collect()


def scanned_inputs(cfg: model.Config) -> tuple:
    """`model.abstract_inputs` for `model.train_step_scanned`: the layers stacked."""
    params, _, batch = model.abstract_inputs(cfg)
    stacked = jax.eval_shape(model.stack_layers, params)
    return stacked, jax.eval_shape(model.OPTIMIZER.init, stacked), batch


def measure(kind: str, layers: int, repeat: int) -> dict:
    """Run in a fresh process: `repeat` timings of one kind of work, with figures."""
    cfg = dataclasses.replace(model.T32, layers=layers)
    inputs = model.abstract_inputs(cfg)
    step, mesh, schedule = model.train_step, MESH, SCHEDULE
    if kind == "partition_scanned" or kind in PIPELINE_KINDS:
        inputs, step = scanned_inputs(cfg), model.train_step_scanned
    if kind in PIPELINE_KINDS:
        mesh, schedule = STAGED_MESH, PIPELINE_KINDS[kind]
    # `partir` imports its modules when a name is first read: importing is not
    # partitioning, and older checkouts imported everything with `import partir`.
    partition = partir.partition
    times, extra = [], {"trace_s": [], "tactics_s": []}
    for _ in range(repeat):
        # Each timing ends when the result is made: the previous repeat's result is
        # freed before the next starts (freeing a large program's objects takes tens of
        # milliseconds, which no single call pays), and every result is kept until the
        # clock is read, on both sides.
        result = meta = None
        _cold()
        start = time.perf_counter()
        if kind in ("partition", "partition_scanned", *PIPELINE_KINDS):
            with TraceTimer() as trace:
                meta = partition(step, mesh, schedule, *inputs)
            times.append(time.perf_counter() - start)
            extra["trace_s"].append(trace.seconds)
            extra["tactics_s"].append(sum(t.elapsed_s for t in meta.tactics))
        elif kind == "xla_unpartitioned":
            result = jax.jit(model.train_step).lower(*inputs).compile()
            times.append(time.perf_counter() - start)
        else:
            # partir's shardings, obtained outside the timed region.
            meta = partir.partition(model.train_step, MESH, SCHEDULE, *inputs)
            jmesh = jax.make_mesh(tuple(MESH.values()), tuple(MESH))

            def named(specs, jmesh=jmesh):
                return jax.tree.map(lambda s: jax.sharding.NamedSharding(jmesh, s), specs,
                                    is_leaf=lambda s: isinstance(s, jax.sharding.PartitionSpec))

            in_shardings, out_shardings = named(meta.in_specs), named(meta.out_specs)
            meta = None
            _cold()
            start = time.perf_counter()
            result = jax.jit(model.train_step, in_shardings=in_shardings,
                             out_shardings=out_shardings).lower(*inputs).compile()
            times.append(time.perf_counter() - start)
    del result
    return {"times": times, **extra}


def in_fresh_process(kind: str, layers: int, repeat: int, root: Path = ROOT) -> dict:
    out = subprocess.run(
        [sys.executable, __file__, "--measure", kind, "--layers", str(layers),
         "--repeat", str(repeat), "--root", str(root)],
        check=True, capture_output=True, text=True, cwd=root)
    return json.loads(out.stdout.strip().splitlines()[-1])


def against(rev: str, layers_list: list[int], repeat: int) -> None:
    """This checkout's partition time over commit `rev`'s, alternating fresh processes."""
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp) / "base"
        subprocess.run(["git", "worktree", "add", "--detach", "-q", str(base), rev],
                       check=True, cwd=ROOT)
        try:
            print(f"partir.partition of this checkout vs {rev}: median of {repeat} fresh "
                  f"processes each, alternating")
            ratios(layers_list, repeat, ("this", rev[:12]), 1.05,
                   lambda layers: in_fresh_process("partition", layers, 1)["times"],
                   lambda layers: in_fresh_process("partition", layers, 1, base)["times"])
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(base)], cwd=ROOT)


def scan_against_unrolled(layers_list: list[int], repeat: int) -> None:
    """The scan-over-layers step's partition time over the unrolled step's."""
    print(f"partir.partition of the scan-over-layers step vs the unrolled step: median of "
          f"{repeat} fresh processes each, alternating")
    ratios(layers_list, repeat, ("scanned", "unrolled"), 1.0,
           lambda layers: in_fresh_process("partition_scanned", layers, 1)["times"],
           lambda layers: in_fresh_process("partition", layers, 1)["times"])


def pipeline_against_staged(layers_list: list[int], repeat: int) -> None:
    """The pipelined step's partition time over the same schedule's without the
    pipeline."""
    print(f"partir.partition of the scan-over-layers step, PP + BP + MP + Z3 vs BP + MP + Z3 "
          f"on {STAGED_MESH}: median of {repeat} fresh processes each, alternating")
    ratios(layers_list, repeat, ("PP", "without PP"), 2.0,
           lambda layers: in_fresh_process("partition_pipelined", layers, 1)["times"],
           lambda layers: in_fresh_process("partition_staged", layers, 1)["times"])


def ratios(layers_list: list[int], repeat: int, labels: tuple[str, str], target: float,
           measured: Callable[[int], list[float]],
           baseline: Callable[[int], list[float]]) -> None:
    """Per layer count, the median of `measured`'s times over the median of `baseline`'s,
    `repeat` fresh processes each, alternating (the baseline first), against `target`."""
    print(f"{'layers':>6}  {labels[0]:>8}  {labels[1]:>12}  {'ratio':>6}")
    for layers in layers_list:
        ours, theirs = [], []
        for _ in range(repeat):
            theirs += baseline(layers)
            ours += measured(layers)
        a, b = statistics.median(ours), statistics.median(theirs)
        print(f"{layers:>6}  {a:>7.3f}s  {b:>11.3f}s  {a / b:>5.2f}x"
              f"   (target <= {target}: {verdict(a / b <= target)})")


def exponent(xs: list[int], ys: list[float]) -> float:
    """Least-squares slope of log y over log x."""
    lx, ly = [math.log(x) for x in xs], [math.log(y) for y in ys]
    mx, my = statistics.fmean(lx), statistics.fmean(ly)
    return (sum((a - mx) * (b - my) for a, b in zip(lx, ly, strict=True))
            / sum((a - mx) ** 2 for a in lx))


def verdict(ok: bool) -> str:
    return "met" if ok else "NOT met"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=3,
                        help="timings per fresh process; medians are reported")
    parser.add_argument("--layers", type=int, nargs="+", default=[16, 32, 64])
    parser.add_argument("--against", metavar="REV",
                        help="compare partir.partition with commit REV instead")
    parser.add_argument("--scan", action="store_true",
                        help="compare the scan-over-layers step with the unrolled one")
    parser.add_argument("--pipeline", action="store_true",
                        help="compare the pipelined scan-over-layers step with the same "
                             "schedule without the pipeline")
    parser.add_argument("--measure", choices=(*KINDS, "partition_scanned", *PIPELINE_KINDS),
                        help=argparse.SUPPRESS)
    parser.add_argument("--root", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        print(json.dumps(measure(args.measure, args.layers[0], args.repeat)))
        return
    if args.against:
        against(args.against, args.layers, args.repeat)
        return
    if args.scan:
        scan_against_unrolled(args.layers, args.repeat)
        return
    if args.pipeline:
        pipeline_against_staged(args.layers, args.repeat)
        return

    print(f"step: examples/transformer train_step, T32 shapes ({model.T32}) with the layer "
          f"counts below; schedule {' + '.join(t.name for t in SCHEDULE)} on {MESH}")
    print(f"jax {jax.__version__} on {jax.devices()[0].platform} ({len(jax.devices())} "
          f"devices), {os.cpu_count()} cores; median of {args.repeat} per fresh process")
    print()
    rows = {}
    for layers in args.layers:
        got = {kind: in_fresh_process(kind, layers, args.repeat) for kind in KINDS}
        med = {kind: statistics.median(r["times"]) for kind, r in got.items()}
        part = got["partition"]
        rows[layers] = {
            **med, "jax_trace": statistics.median(part["trace_s"]),
            "no_trace": statistics.median(t - j for t, j in zip(part["times"], part["trace_s"],
                                                                 strict=True)),
            "tactics": statistics.median(part["tactics_s"])}
    header = (f"{'layers':>6}  {'partir.partition':>16}  {'without trace':>13}  "
              f"{'jax trace':>9}  {'of which tactics':>16}  {'XLA unpartitioned':>17}  "
              f"{'XLA sharded':>11}  {'ratio':>6}  {'w/o trace':>9}")
    print(header)
    for layers, r in rows.items():
        print(f"{layers:>6}  {r['partition']:>15.3f}s  {r['no_trace']:>12.3f}s  "
              f"{r['jax_trace']:>8.3f}s  {r['tactics']:>15.3f}s  "
              f"{r['xla_unpartitioned']:>16.3f}s  {r['xla_sharded']:>10.3f}s  "
              f"{r['partition'] / r['xla_unpartitioned']:>5.2f}x  "
              f"{r['no_trace'] / r['xla_unpartitioned']:>8.2f}x")
    print("ratio: partir.partition / XLA lower+compile of the unpartitioned step")
    print()
    targets = {32: (0.35, 0.2), 64: (0.45, None)}
    for layers, (public, no_trace) in targets.items():
        if layers not in rows:
            continue
        r = rows[layers]
        ratio = r["partition"] / r["xla_unpartitioned"]
        print(f"{layers} layers: partir.partition / unpartitioned lower+compile = "
              f"{ratio:.2f}x (target <= {public}x: {verdict(ratio <= public)})")
        if no_trace is not None:
            ratio = r["no_trace"] / r["xla_unpartitioned"]
            print(f"{layers} layers: without JAX's trace = {ratio:.2f}x "
                  f"(target <= {no_trace}x: {verdict(ratio <= no_trace)})")
    if len(rows) > 1:
        xs = list(rows)
        for label, key in (("partir.partition", "partition"),
                           ("without trace", "no_trace"),
                           ("XLA unpartitioned", "xla_unpartitioned")):
            e = exponent(xs, [rows[x][key] for x in xs])
            target = f" (target <= 1.1: {verdict(e <= 1.1)})" if key == "partition" else ""
            print(f"growth exponent over {xs[0]}-{xs[-1]} layers, {label}: {e:.2f}{target}")


if __name__ == "__main__":
    main()
