"""The same from Python with `partir.jit`'s `out_shardings`, as a `jax.jit` user says it:
the gradients' specs are the parameters' (`in_specs` of the step partitioned without
devices), so they come back sharded like them.

    python examples/zero3_grads/demo.py
"""

from __future__ import annotations

import os
import sys

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                           + " --xla_force_host_platform_device_count=8").strip()
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import jax
import numpy as np
from model import example_args, step
from schedules import BP, MESH, Z3

import partir

SCHEDULE = [BP, Z3]


def main() -> None:
    params, x = example_args()
    param_specs = partir.partition(step, MESH, SCHEDULE, params, x).in_specs[0]
    fn, meta = partir.jit(step, MESH, SCHEDULE, out_shardings=(None, param_specs))
    loss, grads = fn(params, x)
    expected_loss, expected = jax.jit(step)(params, x)
    np.testing.assert_allclose(loss, expected_loss, rtol=1e-5)
    for name, g in grads.items():
        np.testing.assert_allclose(g, expected[name], rtol=1e-4, atol=1e-6)
        print(f"grad {name}: {g.sharding.spec} (param: {param_specs[name]})")
    last = meta.tactics[-1]
    print(f"{last.name}: {'; '.join(last.actions)}")
    print("collectives:", ", ".join(f"{k} {n}" for k, n in meta.collectives.items() if n))


if __name__ == "__main__":
    main()
