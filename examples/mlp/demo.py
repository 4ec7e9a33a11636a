"""The paper's matmul chain partitioned with BP, MP and Z3 on a {batch: 4, model: 2} mesh
of 8 virtual CPU devices.

Prints, per tactic, the actions, the collectives of the lowered program, conflicts and
input shardings; then the final device-local PartIR:HLO program. Runs it on the devices
and checks it, and the sequential Core interpreter, against the unpartitioned function.
"""

from __future__ import annotations

import os
import sys

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                           + " --xla_force_host_platform_device_count=8").strip()
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import jax
import numpy as np
from model import example_args, mlp

import partir

SCHEDULE = [
    partir.ManualPartition({"x": 0}, axis="batch", name="BP"),
    partir.ManualPartition({"w1": 1}, axis="model", name="MP"),
    partir.ManualPartition({"w1": 0, "w2": 1}, axis="batch", name="Z3"),
]


def main() -> None:
    args = example_args()
    mesh = partir.Mesh({"batch": 4, "model": 2})
    fn, meta = partir.jit(mlp, mesh, SCHEDULE)
    got = np.asarray(fn(*args))
    print(f"mesh {mesh} on {len(jax.devices())} {jax.devices()[0].platform.upper()} devices")
    for i, t in enumerate(meta.tactics, 1):
        collectives = ", ".join(f"{k} {n}" for k, n in t.collectives.items() if n) or "none"
        print(f"\n[{i}] {t.name} ({t.axis}, {t.elapsed_s * 1e3:.1f} ms): "
              + "; ".join(t.actions))
        print(f"    collectives: {collectives}")
        print(f"    conflicts:   {len(t.conflicts) or 'none'}"
              + "".join(f"\n      - {c['kind']} at {c['op']} ({c['loc']['file']}:"
                        f"{c['loc']['line']}) on {c['axis']!r}" for c in t.conflicts))
        for name in ("x", "w1", "w2"):
            dims = ", ".join("{" + ", ".join(f'"{a}"' for a in axes) + "}"
                             for axes in t.shardings[name])
            print(f"    {name:<3} [{dims}]")
    print("\nPartIR:HLO after the last tactic (device-local):\n")
    print(meta.hlo_ir)
    want = np.asarray(mlp(*args))
    ok = np.allclose(got, want, rtol=1e-4, atol=1e-4)
    print(f"\nexecuted on the mesh: max |error| {np.max(np.abs(got - want)):.2e} "
          f"{'OK' if ok else 'MISMATCH'}")
    core = partir.core_partition(mlp, mesh, SCHEDULE, *args)
    interpreted = np.asarray(core.interpret(*args))
    ok_core = np.allclose(interpreted, want, rtol=1e-4, atol=1e-4)
    print(f"Core interpreter:     max |error| {np.max(np.abs(interpreted - want)):.2e} "
          f"{'OK' if ok_core else 'MISMATCH'}")
    if not (ok and ok_core):
        raise SystemExit(1)


if __name__ == "__main__":
    main()
