"""The paper's matmul chain partitioned with BP, MP and Z3 on a {batch: 4, model: 2} mesh.

Prints the per-tactic report (actions, conflicts, input shardings), the final
PartIR:Core program, and checks the sequential Core interpreter against the
unpartitioned function after every tactic.
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
from partir.report import format_report


def main() -> None:
    args = example_args()
    mesh = partir.Mesh({"batch": 4, "model": 2})
    schedule = [
        partir.ManualPartition({"x": 0}, axis="batch", name="BP"),
        partir.ManualPartition({"w1": 1}, axis="model", name="MP"),
        partir.ManualPartition({"w1": 0, "w2": 1}, axis="batch", name="Z3"),
    ]
    result = partir.core_partition(mlp, mesh, schedule, *args)
    print(format_report(result))
    print("\nPartIR:Core after the last tactic:\n")
    print(result.core_ir())
    want = np.asarray(mlp(*args))
    print(f"\n{len(jax.devices())} {jax.devices()[0].platform.upper()} devices available")
    for i in range(len(schedule) + 1):
        got = np.asarray(result.interpret(*args, after=i))
        err = float(np.max(np.abs(got - want)))
        ok = np.allclose(got, want, rtol=1e-4, atol=1e-4)
        label = result.tactics[i - 1].name if i else "traced"
        print(f"interpreter after {label:<6} max |error| {err:.2e}  {'OK' if ok else 'MISMATCH'}")
        if not ok:
            raise SystemExit(1)


if __name__ == "__main__":
    main()
