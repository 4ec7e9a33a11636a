"""How long PartIR takes to partition a 32-layer transformer training step, next to how long
XLA takes to compile it (paper: propagation is a small fraction of compilation).

Two ratios are reported for BP + MP + Z3:

* propagation of all tactics on the paper's {batch: 16, model: 2} mesh / XLA's compile
  time of the unpartitioned step;
* total partitioning time (frontend + tactics + lowering Core -> SPMD -> HLO -> fusion
  passes) / XLA's compile time of the partitioned module. Compiling the partitioned module
  needs the mesh's devices, so this ratio uses the {batch: 4, model: 2} mesh that fits the
  8 local CPU devices, partitioned again on that mesh; both meshes' partitioning times are
  shown side by side.

A third figure: estimating the cost of the partitioned step (`partir.sim.simulate` on its
PartIR:HLO, what `partir.partition` adds to every tactic's metadata) / total partitioning
time (target <= 20%).

Everything is abstract (`jax.ShapeDtypeStruct` inputs): neither partitioning nor XLA
compilation allocates the model, so the paper's T32 shapes are used as they are.

    python benchmarks/partition_time.py [--repeat 3] [--batch-axis 16] [--model-axis 2]
        [--compile-batch-axis 4] [--compile-model-axis 2]
"""

import os

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                           " --xla_force_host_platform_device_count=8").strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import argparse
import dataclasses
import gc
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import jax

import partir
from examples.transformer import model, schedules
from partir.core.materialize import materialize
from partir.gcpause import paused_gc
from partir.hlo import locate_by_users, lower_spmd_to_hlo, optimize
from partir.runtime import build_callable
from partir.sim import simulate
from partir.spmd import lower_core_to_spmd

# Call-like equations whose bodies partir inlines: they are counted by their bodies.
_CALLS = ("pjit", "jit", "closed_call", "core_call", "custom_jvp_call", "custom_vjp_call",
          "remat2", "checkpoint")


def count_equations(jaxpr) -> int:
    """Equations of a jaxpr with call bodies inlined, as partir's frontend sees them."""
    n = 0
    for eqn in jaxpr.eqns:
        bodies = [p for p in eqn.params.values() if hasattr(p, "eqns") or hasattr(p, "jaxpr")]
        if eqn.primitive.name in _CALLS and bodies:
            body = bodies[0]
            n += count_equations(body.jaxpr if hasattr(body, "jaxpr") else body)
        else:
            n += 1
    return n


# Lowering stages of `partir.pipeline.lower`, timed one by one.
STAGES = ("materialize Core", "Core -> SPMD", "SPMD -> HLO", "HLO fusion passes, locations")


@dataclasses.dataclass
class Run:
    """Timings of one partitioning of the step: frontend, tactics, lowering of the final
    program. Only timings are kept, so that earlier repeats' programs do not grow the heap
    (and the garbage collector's work) of later ones."""

    frontend_s: float
    propagation_s: list[float]  # per tactic
    elapsed_s: list[float]  # per tactic, incl. action expansion
    lowering_s: list[float]  # per stage of STAGES
    lowering_gc_s: float  # of which in the cyclic garbage collector
    estimate_s: float  # the simulator on the final PartIR:HLO program

    @property
    def tactics_s(self) -> float:
        return sum(self.elapsed_s)

    @property
    def total_s(self) -> float:
        return self.frontend_s + self.tactics_s + sum(self.lowering_s)


class GcTimer:
    """Time spent in the cyclic garbage collector while active (via `gc.callbacks`)."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self._start = 0.0

    def _callback(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._start = time.perf_counter()
        else:
            self.seconds += time.perf_counter() - self._start

    def __enter__(self) -> "GcTimer":
        gc.callbacks.append(self._callback)
        return self

    def __exit__(self, *exc: object) -> None:
        gc.callbacks.remove(self._callback)


def partition_and_lower(inputs: tuple, mesh: dict,
                        schedule: list) -> tuple[Run, partir.CorePartition, object]:
    """Partition and lower the step once; its timings, Core partition and PartIR:HLO."""
    gc.collect()  # start every repeat from the same heap
    res = partir.core_partition(model.train_step, mesh, schedule, *inputs)
    program = res.program
    times = []
    # The stages of `partir.pipeline.lower`, timed one by one, under its paused GC.
    with paused_gc(), GcTimer() as gc_time:
        start = time.perf_counter()
        core = materialize(program)
        times.append(time.perf_counter() - start)
        start = time.perf_counter()
        spmd = lower_core_to_spmd(core, program.mesh)
        times.append(time.perf_counter() - start)
        start = time.perf_counter()
        hlo = lower_spmd_to_hlo(spmd, defer_gathers=True)
        times.append(time.perf_counter() - start)
        start = time.perf_counter()
        hlo = locate_by_users(optimize(hlo))
        times.append(time.perf_counter() - start)
        start = time.perf_counter()
        simulate(hlo)
        estimate_s = time.perf_counter() - start
    run = Run(res.frontend_s, [t.propagation_s for t in res.tactics],
              [t.elapsed_s for t in res.tactics], times, gc_time.seconds, estimate_s)
    return run, res, hlo


@dataclasses.dataclass
class Summary:
    """What is printed of the last repeat's programs, so that they need not be kept."""

    traced_ops: int
    hlo_ops: int
    tactics: list[tuple[str, int, int]]  # name, actions, conflicts
    unsupported: list[str]


def repeat(n: int, inputs: tuple, mesh: dict,
           schedule: list) -> tuple[list[Run], Summary, partir.CorePartition, object]:
    runs = []
    for _ in range(n):
        run, res, hlo = None, None, None  # drop the previous repeat's programs first
        run, res, hlo = partition_and_lower(inputs, mesh, schedule)
        runs.append(run)
    summary = Summary(len(res.traced.function.ops), len(hlo.ops),
                      [(t.name, len(t.actions) - 1, len(t.conflicts)) for t in res.tactics],
                      sorted({c.op for c in res.unsupported}))
    return runs, summary, res, hlo


def median(values) -> float:
    return statistics.median(list(values))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=3,
                        help="partition and compile this many times; report medians")
    parser.add_argument("--batch-axis", type=int, default=16)
    parser.add_argument("--model-axis", type=int, default=2)
    parser.add_argument("--compile-batch-axis", type=int, default=4,
                        help="batch axis of the mesh the partitioned module is compiled for")
    parser.add_argument("--compile-model-axis", type=int, default=2,
                        help="model axis of the mesh the partitioned module is compiled for")
    parser.add_argument("--layers", type=int, default=model.T32.layers)
    parser.add_argument("--d-model", type=int, default=model.T32.d_model)
    args = parser.parse_args()

    cfg = dataclasses.replace(model.T32, layers=args.layers, d_model=args.d_model)
    mesh = {schedules.BATCH: args.batch_axis, schedules.MODEL: args.model_axis}
    cmesh = {schedules.BATCH: args.compile_batch_axis,
             schedules.MODEL: args.compile_model_axis}
    schedule = [schedules.BP, schedules.MP, schedules.Z3]
    inputs = model.abstract_inputs(cfg)
    n_params = len(jax.tree.leaves(inputs[0]))
    equations = count_equations(jax.make_jaxpr(model.train_step)(*inputs).jaxpr)

    runs, summary, _, _ = repeat(args.repeat, inputs, mesh, schedule)
    cruns, csummary, cres, chlo = repeat(args.repeat, inputs, cmesh, schedule)

    lower_times, compile_times = [], []
    for _ in range(args.repeat):
        # jax caches both steps in-process; a cold compile is what the comparison is about.
        jax.clear_caches()
        gc.collect()
        start = time.perf_counter()
        lowered = jax.jit(model.train_step).lower(*inputs)
        lower_times.append(time.perf_counter() - start)
        start = time.perf_counter()
        lowered.compile()
        compile_times.append(time.perf_counter() - start)
    compile_s = median(compile_times)

    # The partitioned module: the {4, 2} program as a jax callable on the local devices.
    flat = cres.flatten_args(*inputs)
    build_times, plower_times, pcompile_times = [], [], []
    for _ in range(args.repeat):
        executable = plowered = None
        jax.clear_caches()
        gc.collect()
        start = time.perf_counter()
        executable = build_callable(chlo)
        build_times.append(time.perf_counter() - start)
        start = time.perf_counter()
        plowered = executable.lower(*flat)
        plower_times.append(time.perf_counter() - start)
        start = time.perf_counter()
        plowered.compile()
        pcompile_times.append(time.perf_counter() - start)
    pcompile_s = median(pcompile_times)

    print(f"model: {cfg}")
    print(f"  {n_params} parameter tensors; train_step = value_and_grad + optax.adam")
    print(f"  jaxpr equations (calls inlined): {equations}; partir IR ops: "
          f"{summary.traced_ops}; final PartIR:HLO ops: "
          f"{summary.hlo_ops} on {mesh}, {csummary.hlo_ops} on {cmesh}")
    print(f"schedule: {' + '.join(t.name for t in schedule)}; median of {args.repeat} "
          f"run(s); jax {jax.__version__} on {jax.devices()[0].platform} "
          f"({len(jax.devices())} devices), {os.cpu_count()} cores")
    print()

    # Partitioning, both meshes side by side: (label, [(propagation or None, elapsed)] * 2).
    def side(fn) -> list:
        return [fn(rs) for rs in (runs, cruns)]

    rows = [("partir frontend (trace)",
             side(lambda rs: (None, median(r.frontend_s for r in rs))))]
    for i, ((name, actions, conflicts), (_, cactions, cconflicts)) in enumerate(
            zip(summary.tactics, csummary.tactics, strict=True)):
        label = (f"tactic {name} ({actions}/{cactions} actions, "
                 f"{conflicts}/{cconflicts} conflicts)")
        rows.append((label, side(lambda rs, i=i: (
            median(r.propagation_s[i] for r in rs),
            median(r.elapsed_s[i] for r in rs)))))
    rows.append(("all three tactics", side(lambda rs: (
        median(sum(r.propagation_s) for r in rs),
        median(r.tactics_s for r in rs)))))
    for k, stage in enumerate(STAGES):
        rows.append((f"lowering: {stage}",
                     side(lambda rs, k=k: (None, median(r.lowering_s[k] for r in rs)))))
    rows.append(("lowering, all stages",
                 side(lambda rs: (None, median(sum(r.lowering_s) for r in rs)))))
    rows.append(("  of which garbage collector pauses",
                 side(lambda rs: (None, median(r.lowering_gc_s for r in rs)))))
    rows.append(("total partitioning (frontend + tactics + lowering)",
                 side(lambda rs: (None, median(r.total_s for r in rs)))))
    rows.append(("estimating the cost (simulator on the final HLO)",
                 side(lambda rs: (None, median(r.estimate_s for r in rs)))))

    width = max(len(r[0]) for r in rows)
    names = [", ".join(f"{a}={n}" for a, n in m.items()) for m in (mesh, cmesh)]
    col = 12 + 2 + 9
    print(f"{'partitioning':{width}}  " + "    ".join(f"{n:^{col}}" for n in names))
    print(f"{'':{width}}  " + "    ".join(f"{'propagation':>12}  {'elapsed':>9}"
                                        for _ in names))
    for label, cells in rows:
        out = []
        for propagation, total in cells:
            head = f"{propagation:>11.3f}s" if propagation is not None else f"{'':>12}"
            out.append(f"{head}  {total:>8.3f}s")
        print(f"{label:{width}}  " + "    ".join(out))
    print()

    xrows = [("jax trace + lower, unpartitioned step", lower_times),
             ("XLA compile, unpartitioned step", compile_times),
             (f"build_callable, partitioned step ({names[1]})", build_times),
             (f"jax trace + lower, partitioned step ({names[1]})", plower_times),
             (f"XLA compile, partitioned step ({names[1]})", pcompile_times)]
    xwidth = max(len(r[0]) for r in xrows)
    print(f"{'jax / XLA':{xwidth}}  {'median':>9}  {'min':>8}  {'max':>8}")
    for label, times in xrows:
        print(f"{label:{xwidth}}  {median(times):>8.3f}s  {min(times):>7.3f}s  "
              f"{max(times):>7.3f}s")
    print()

    prop = median(sum(r.propagation_s) for r in runs)
    elapsed = median(r.tactics_s for r in runs)
    print(f"[{names[0]}] propagation of all tactics / XLA compile of the unpartitioned step: "
          f"{prop / compile_s:.1%} (elapsed incl. action expansion: "
          f"{elapsed / compile_s:.1%}; target <= 10%)")
    total = median(r.total_s for r in cruns)
    verdict = "met" if total / pcompile_s <= 0.10 else "NOT met"
    print(f"[{names[1]}] total partitioning (frontend + tactics + lowering) / XLA compile of "
          f"the partitioned module: {total:.3f}s / {pcompile_s:.3f}s = "
          f"{total / pcompile_s:.1%} (target <= 10%: {verdict})")
    total16 = median(r.total_s for r in runs)
    print(f"  for reference, [{names[0]}] total partitioning {total16:.3f}s = "
          f"{total16 / pcompile_s:.1%} of that compile")
    for rs, name in ((runs, names[0]), (cruns, names[1])):
        share = median(r.estimate_s / r.total_s for r in rs)
        print(f"[{name}] estimating the cost / total partitioning: {share:.1%} "
              f"(target <= 20%: {'met' if share <= 0.20 else 'NOT met'})")
    for sm, name in ((summary, names[0]), (csummary, names[1])):
        if sm.unsupported:
            print(f"note [{name}]: propagation stopped at primitives with no TMR entry: "
                  f"{sm.unsupported}")


if __name__ == "__main__":
    main()
