"""The PartIR paper's running example (section 2): the matmul chain `(x @ w1) @ w2` with
x 256x8, w1 8x16 and w2 16x8, with a relu in between as in `demo.py`.

The schedule files next to this module (`*.partir.py`) partition it; run one with
`partir partition examples/mlp/bp_mp_z3.partir.py`.
"""

from __future__ import annotations

import jax
import numpy as np

import partir


def mlp(x, w1, w2):
    return jax.nn.relu(x @ w1) @ w2


def mlp_tagged_output(x, w1, w2):
    """`mlp` with its result tagged "y": tactics shard inputs and tagged values only, so the
    ES schedule needs a name for the output activation."""
    return partir.tag(mlp(x, w1, w2), "y")


def example_args(seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """x, w1 and w2 of the paper's shapes. Real arrays rather than shapes, so that a
    partitioned program can also be run and compared with `mlp`."""
    rng = np.random.default_rng(seed)
    return (rng.normal(size=(256, 8)).astype(np.float32),
            rng.normal(size=(8, 16)).astype(np.float32),
            rng.normal(size=(16, 8)).astype(np.float32))
