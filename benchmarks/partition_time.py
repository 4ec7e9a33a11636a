"""How long PartIR takes to partition a 32-layer transformer training step, next to how long
XLA takes to compile the unpartitioned step (paper: propagation is a small fraction of
compilation).

Everything is abstract (`jax.ShapeDtypeStruct` inputs): neither partitioning nor XLA
compilation allocates the model, so the paper's T32 shapes are used as they are. The mesh
needs no devices; the 8 virtual CPU devices are only there so that jax sees the same
platform as the tests.

    python benchmarks/partition_time.py [--repeat 3] [--batch-axis 16] [--model-axis 2]
"""

import os

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                           " --xla_force_host_platform_device_count=8").strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import argparse
import dataclasses
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import jax

import partir
from examples.transformer import model, schedules

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=3,
                        help="partition and compile this many times; report medians")
    parser.add_argument("--batch-axis", type=int, default=16)
    parser.add_argument("--model-axis", type=int, default=2)
    parser.add_argument("--layers", type=int, default=model.T32.layers)
    parser.add_argument("--d-model", type=int, default=model.T32.d_model)
    args = parser.parse_args()

    cfg = dataclasses.replace(model.T32, layers=args.layers, d_model=args.d_model)
    mesh = {schedules.BATCH: args.batch_axis, schedules.MODEL: args.model_axis}
    schedule = [schedules.BP, schedules.MP, schedules.Z3]
    inputs = model.abstract_inputs(cfg)
    n_params = len(jax.tree.leaves(inputs[0]))
    equations = count_equations(jax.make_jaxpr(model.train_step)(*inputs).jaxpr)

    runs = []
    for _ in range(args.repeat):
        runs.append(partir.core_partition(model.train_step, mesh, schedule, *inputs))
    res = runs[-1]

    lower_times, compile_times = [], []
    for _ in range(args.repeat):
        # jax caches both steps in-process; a cold compile is what the comparison is about.
        jax.clear_caches()
        start = time.perf_counter()
        lowered = jax.jit(model.train_step).lower(*inputs)
        lower_times.append(time.perf_counter() - start)
        start = time.perf_counter()
        lowered.compile()
        compile_times.append(time.perf_counter() - start)
    lower_s, compile_s = statistics.median(lower_times), statistics.median(compile_times)

    print(f"model: {cfg}")
    print(f"  {n_params} parameter tensors; train_step = value_and_grad + optax.adam")
    print(f"  jaxpr equations (calls inlined): {equations}; partir IR ops: "
          f"{len(res.traced.function.ops)}")
    print(f"mesh: {mesh}; schedule: {' + '.join(t.name for t in schedule)}; median of "
          f"{args.repeat} run(s); jax {jax.__version__} on {jax.devices()[0].platform}, "
          f"{os.cpu_count()} cores")
    print()
    # (label, propagation seconds or None, elapsed seconds)
    rows = [("partir frontend (trace)", None, statistics.median([r.frontend_s for r in runs]))]
    for i, t in enumerate(res.tactics):
        rows.append((f"tactic {t.name} ({len(t.actions) - 1} actions, "
                     f"{len(t.conflicts)} conflicts)",
                     statistics.median([r.tactics[i].propagation_s for r in runs]),
                     statistics.median([r.tactics[i].elapsed_s for r in runs])))
    prop = statistics.median([sum(t.propagation_s for t in r.tactics) for r in runs])
    elapsed = statistics.median([sum(t.elapsed_s for t in r.tactics) for r in runs])
    rows.append(("all three tactics", prop, elapsed))
    rows.append(("jax trace + lower, unpartitioned step", None, lower_s))
    rows.append(("XLA compile, unpartitioned step", None, compile_s))
    width = max(len(r[0]) for r in rows)
    print(f"{'':{width}}  {'propagation':>12}  {'elapsed':>9}")
    for label, propagation, total in rows:
        head = f"{propagation:>11.3f}s" if propagation is not None else f"{'':>12}"
        print(f"{label:{width}}  {head}  {total:>8.3f}s")
    print()
    print(f"propagation of all tactics / XLA compile: {prop / compile_s:.1%} "
          f"(elapsed incl. action expansion: {elapsed / compile_s:.1%}; target <= 10%)")
    if res.unsupported:
        ops = sorted({c.op for c in res.unsupported})
        print(f"note: propagation stopped at primitives with no TMR entry: {ops}")


if __name__ == "__main__":
    main()
