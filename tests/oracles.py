"""What every oracle test shares: the errors a random schedule may legitimately raise,
how a partitioned program's results are compared with the function's, and regression
cases found by the property tests."""

from __future__ import annotations

import jax
import numpy as np

import partir
from tests.core.program_strategies import PartitionCase, program_case

# Errors a random schedule may legitimately raise: it can name a dimension the axis does
# not divide, or tile (or replicate) the same input twice on one axis.
EXPECTED_ERRORS = (partir.IndivisibleDimensionError, partir.AlreadyTiledError)
RTOL = ATOL = 1e-4

# The JAX `slice` primitive was taken for the Core `slice` op by the printer and the
# interpreter.
STATIC_SLICE = PartitionCase(
    program_case({"x0": (4,)}, [("v0", "-x0"), ("v1", "v0[0:1]")]), {"a": 2},
    (partir.ManualPartition({"x0": partir.REPLICATED}, axis="a"),))
# Keeping an input replicated on two axes ordered the second identity loop after the
# first, which reads its result.
REPLICATED_TWICE = PartitionCase(
    program_case({"x0": (4,)}, [("v0", "-x0")]), {"a": 2, "b": 2},
    (partir.ManualPartition({"x0": partir.REPLICATED}, axis="b"),
     partir.ManualPartition({"x0": partir.REPLICATED}, axis="a")))


def assert_same(actual, expected, what: str) -> None:
    a_leaves, a_tree = jax.tree_util.tree_flatten(actual)
    e_leaves, e_tree = jax.tree_util.tree_flatten(expected)
    assert a_tree == e_tree, f"{what}: output structure {a_tree} != {e_tree}"
    for k, (a, e) in enumerate(zip(a_leaves, e_leaves, strict=True)):
        a, e = np.asarray(a), np.asarray(e)
        assert a.shape == e.shape, f"{what}, output {k}: shape {a.shape} != {e.shape}"
        assert a.dtype == e.dtype, f"{what}, output {k}: dtype {a.dtype} != {e.dtype}"
        if np.issubdtype(e.dtype, np.floating):
            # Sums may be reassociated: allow for cancellation against the output's scale.
            finite = np.abs(e[np.isfinite(e)])
            scale = max(1.0, float(finite.max())) if finite.size else 1.0
            np.testing.assert_allclose(a, e, rtol=RTOL, atol=ATOL * scale,
                                       err_msg=f"{what}, output {k}")
        else:
            np.testing.assert_array_equal(a, e, err_msg=f"{what}, output {k}")


def assert_tree_close(actual, expected) -> None:
    """Every leaf close (rtol 1e-4, atol 1e-5), reporting each leaf that is not by path."""
    actual_leaves, actual_tree = jax.tree_util.tree_flatten_with_path(actual)
    assert actual_tree == jax.tree_util.tree_structure(expected)
    wrong = []
    for (path, a), e in zip(actual_leaves, jax.tree.leaves(expected), strict=True):
        a, e = np.asarray(a), np.asarray(e)
        if a.shape != e.shape or not np.allclose(a, e, rtol=1e-4, atol=1e-5):
            err = np.abs(a - e).max() if a.shape == e.shape else f"shape {a.shape}"
            wrong.append(f"{jax.tree_util.keystr(path)}: {err}")
    assert not wrong, f"{len(wrong)} outputs differ: {wrong[:10]}"


def check_oracles(fn, mesh: partir.Mesh, schedule, *args, out_shardings=None):
    """fn(*args) by the Core interpreter of the partitioned program and by the executed
    program, both equal to `jax.jit(fn)`; the metadata."""
    expected = jax.jit(fn)(*args)
    cp = partir.core_partition(fn, mesh, schedule, *args, out_shardings=out_shardings)
    core = cp.interpret(*args)
    # the results of several outputs come as a list, the function's as a tuple
    assert_same(tuple(core) if isinstance(core, list) else core, expected, "Core interpreter")
    jitted, meta = partir.jit(fn, mesh, schedule, out_shardings=out_shardings)
    assert_same(jitted(*args), expected, "executed")
    return meta
