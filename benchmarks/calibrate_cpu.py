"""Measure this machine's figures for the simulator's `cpu` device spec (partir/sim/devices.py).

The `cpu` spec describes one of the 8 virtual devices that the tests, the examples and
`partir run` use (`--xla_force_host_platform_device_count=8`), so every figure is measured
the way such a device sees the machine: the same program runs on all 8 devices at once
(`jax.shard_map`), and per-device throughput is the work of one device over the wall time.

* matmul FLOP/s: chained f32 [n, n] @ [n, n] products on every device;
* memory bandwidth: a streaming `x * a + b` over a vector much larger than the caches,
  one fused kernel that reads and writes every element once;
* cache bandwidth: the same stream over a vector that fits in the per-core L2 cache;
* vector FLOP/s: a fused chain of multiply-adds over a cache-resident vector;
* per-kernel overhead: a chain of tiny [8, 8] matmuls, each followed by a tanh, which
  XLA can neither fuse nor reassociate: 2 kernels per step, nearly no work in them;
* collective setup and latency: chained `psum`s and `all_gather`s of one float over
  groups of 2, 4 and 8 devices; the simulator charges setup + (n - 1) * latency per
  collective over n devices, the least-squares line of those times against n - 1;
* collective bandwidth: `psum` of a large vector over the 8 devices: ring bytes
  2 (n-1)/n S over its time minus the setup and latency;
* combined collectives: chained `psum`s of 4 tiny arrays at once (one tuple all-reduce)
  over groups of 4, per array, against one array's psum: whether the runtime pays a
  combined collective's latency once or per operand (`DeviceSpec.combined_latency_once`).

Also printed, for reference: the same matmul and bandwidth figures with one device
owning the whole machine.

    python benchmarks/calibrate_cpu.py [--repeat 5]
"""

import os

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                           " --xla_force_host_platform_device_count=8").strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import argparse
import time
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, PartitionSpec

N_DEVICES = 8


def best_time(fn: Callable, *args: object, repeat: int) -> float:
    """Minimum wall time of `fn(*args)` after one warm-up (compiling) call."""
    jax.block_until_ready(fn(*args))
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - start)
    return min(times)


def on_all_devices(local: Callable) -> Callable:
    mesh = Mesh(np.array(jax.devices()[:N_DEVICES]), ("d",))
    return jax.jit(jax.shard_map(local, mesh=mesh, in_specs=PartitionSpec("d"),
                                 out_specs=PartitionSpec("d"), check_vma=False))


def matmul_chain(steps: int) -> Callable:
    def f(x: jax.Array) -> jax.Array:
        for _ in range(steps):
            x = (x @ x) * 1e-3  # the scale keeps the values finite
        return x
    return f


def stream(x: jax.Array) -> jax.Array:
    return x * 1.0001 + 0.5


VECTOR_STEPS = 64


def fma_chain(x: jax.Array) -> jax.Array:
    # One fused loop (an elementwise chain) doing 2 FLOPs per element and step.
    for _ in range(VECTOR_STEPS):
        x = x * 0.999 + 0.001
    return x


def kernel_chain(steps: int) -> Callable:
    def f(x: jax.Array) -> jax.Array:
        w = jnp.eye(8, dtype=x.dtype) * 0.5
        for _ in range(steps):
            x = jnp.tanh(x @ w)
        return x
    return f


def psum_chain(steps: int, axis: str = "d", gather: bool = False,
               operands: int = 1) -> Callable:
    """`steps` chained psums (or all_gathers) of `operands` arrays at once: XLA combines
    those into one all-reduce of a tuple."""
    def f(x: jax.Array) -> jax.Array:
        xs = [x * (k + 1) for k in range(operands)]
        for _ in range(steps):
            if gather:
                xs = [jax.lax.all_gather(x, axis, tiled=True)[:x.shape[0]] * 0.5 for x in xs]
            else:
                xs = [x * 0.5 for x in jax.lax.psum(tuple(xs), axis)]
        return sum(xs)
    return f


def on_groups(local: Callable, group: int) -> Callable:
    """`local` on a mesh of (8 / group, group) devices; collectives over the "g" axis."""
    mesh = Mesh(np.array(jax.devices()[:N_DEVICES]).reshape(N_DEVICES // group, group),
                ("o", "g"))
    spec = PartitionSpec(("o", "g"))
    return jax.jit(jax.shard_map(local, mesh=mesh, in_specs=spec, out_specs=spec,
                                 check_vma=False))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    r = args.repeat
    n, steps = 512, 8

    # Matmul FLOP/s: 8 devices at once, then 1 device with the whole machine.
    x = jnp.ones((N_DEVICES * n, n), jnp.float32) * 1e-3
    t = best_time(on_all_devices(matmul_chain(steps)), x, repeat=r)
    per_device_flops = 2 * n ** 3 * steps / t
    t1 = best_time(jax.jit(matmul_chain(steps)), x[:n], repeat=r)
    machine_flops = 2 * n ** 3 * steps / t1

    # Memory bandwidth: 1 read + 1 write of 4-byte floats per element.
    m = 1 << 24  # 64 MiB per device-local vector: far beyond the caches
    v = jnp.ones((N_DEVICES * (m // N_DEVICES),), jnp.float32)
    t = best_time(on_all_devices(stream), v, repeat=r)
    per_device_bw = 2 * 4 * (m // N_DEVICES) / t
    v1 = jnp.ones((m,), jnp.float32)
    t1 = best_time(jax.jit(stream), v1, repeat=r)
    machine_bw = 2 * 4 * m / t1

    # Cache bandwidth: 64 KiB per device, streamed 50 times in one program.
    c = 1 << 14

    def stream_many(x: jax.Array) -> jax.Array:
        for _ in range(50):
            x = jax.lax.optimization_barrier(stream(x))
        return x

    t = best_time(on_all_devices(stream_many), jnp.ones((N_DEVICES * c,)), repeat=r)
    cache_bw = 50 * 2 * 4 * c / t

    # Vector FLOP/s: 32 Ki floats per device stay in cache.
    k = 1 << 15
    w = jnp.ones((N_DEVICES * k,), jnp.float32)
    t = best_time(on_all_devices(fma_chain), w, repeat=r)
    vector_flops = 2 * VECTOR_STEPS * k / t

    # Per-kernel overhead: long chain minus short chain, per extra kernel (2 per step).
    small = jnp.ones((N_DEVICES * 8, 8), dtype=jnp.float32)
    long_, short = 400, 100
    t_long = best_time(on_all_devices(kernel_chain(long_)), small, repeat=r)
    t_short = best_time(on_all_devices(kernel_chain(short)), small, repeat=r)
    kernel_overhead = (t_long - t_short) / ((long_ - short) * 2)

    # Collective latency per peer: time per collective against n - 1.
    tiny = jnp.ones((N_DEVICES,), jnp.float32)
    points = []
    for group in (2, 4, 8):
        for gather in (False, True):
            t_long = best_time(on_groups(psum_chain(long_, "g", gather), group), tiny,
                               repeat=r)
            t_short = best_time(on_groups(psum_chain(short, "g", gather), group), tiny,
                                repeat=r)
            points.append((group - 1, (t_long - t_short) / (long_ - short)))
    # The least-squares line through the points: setup + latency * (n - 1).
    mean_p = sum(p for p, _ in points) / len(points)
    mean_t = sum(t for _, t in points) / len(points)
    latency = (sum((p - mean_p) * (t - mean_t) for p, t in points)
               / sum((p - mean_p) ** 2 for p, _ in points))
    setup = mean_t - latency * mean_p
    # A combined all-reduce: its time per operand against one psum's over 4 devices.
    combined = 4
    t_long = best_time(on_groups(psum_chain(long_, "g", operands=combined), 4), tiny, repeat=r)
    t_short = best_time(on_groups(psum_chain(short, "g", operands=combined), 4), tiny,
                        repeat=r)
    per_operand = (t_long - t_short) / (long_ - short) / combined
    big = 1 << 20  # floats per device
    t_big = best_time(on_all_devices(psum_chain(10)), jnp.ones((N_DEVICES * big,)), repeat=r)
    ring_bytes = 2 * (N_DEVICES - 1) / N_DEVICES * 4 * big
    link_bw = ring_bytes / max(t_big / 10 - setup - (N_DEVICES - 1) * latency, 1e-9)

    print(f"jax {jax.__version__}, {os.cpu_count()} cores, {N_DEVICES} virtual CPU devices")
    print(f"one of {N_DEVICES} devices running at once:")
    print(f"  matmul f32 FLOP/s           {per_device_flops:.3e}")
    print(f"  memory bandwidth B/s        {per_device_bw:.3e}")
    print(f"  cache bandwidth B/s         {cache_bw:.3e}")
    print(f"  vector f32 FLOP/s           {vector_flops:.3e}")
    print(f"  per-kernel overhead s       {kernel_overhead:.3e}")
    print("  collective time s, by group size n: " +
          ", ".join(f"n={p + 1} {'all_gather' if k % 2 else 'psum'} {t:.2e}"
                    for k, (p, t) in enumerate(points)))
    print(f"  collective setup s          {setup:.3e}")
    print(f"  collective latency per peer s {latency:.3e}")
    print(f"  collective bandwidth B/s    {link_bw:.3e}")
    print(f"  combined psum of {combined} arrays, per array over one psum's time "
          f"{per_operand / points[2][1]:.2f} (1: a rendezvous per operand; "
          f"{1 / combined:.2f}: one for all)")
    print("one device owning the machine:")
    print(f"  matmul f32 FLOP/s           {machine_flops:.3e}")
    print(f"  memory bandwidth B/s        {machine_bw:.3e}")


if __name__ == "__main__":
    main()
