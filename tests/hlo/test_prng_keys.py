"""Key-typed values through the SPMD and HLO interpreters: keys sliced, gathered and
assembled as results give the unpartitioned function's keys and bits."""

from __future__ import annotations

import jax
import numpy as np
import pytest

import partir
from partir.core.materialize import materialize
from partir.hlo import count_collectives, interpret_hlo, lower_spmd_to_hlo, optimize
from partir.ir.dtypes import to_host
from partir.spmd import interpret_spmd, lower_core_to_spmd

MESH = partir.Mesh({"batch": 4, "model": 2})


def draws(x, keys):
    keys = jax.vmap(lambda k: jax.random.fold_in(k, 1))(keys)
    bits = jax.vmap(lambda k: jax.random.bits(k, (x.shape[1],)))(keys)
    # reversed keys cannot stay tiled: they are gathered first
    return x ^ bits, keys[::-1], keys


@pytest.mark.slow
@pytest.mark.parametrize("make_key", [jax.random.key, jax.random.PRNGKey])
def test_keys_sliced_gathered_and_assembled(make_key):
    keys = jax.random.split(make_key(2), 8)
    x = np.arange(8 * 6, dtype=np.uint32).reshape(8, 6)
    schedule = [partir.ManualPartition({"x": 0, "keys": 0}, axis="batch")]
    core = materialize(partir.core_partition(draws, MESH, schedule, x, keys).program)
    spmd = lower_core_to_spmd(core, MESH)
    hlo = optimize(lower_spmd_to_hlo(spmd))
    assert count_collectives(hlo)["all_gather"] == 1
    want = draws(x, keys)
    for run in (interpret_spmd(spmd, x, keys), interpret_hlo(hlo, x, keys)):
        for got, w in zip(run, want, strict=True):
            assert got.dtype == w.dtype
            np.testing.assert_array_equal(to_host(got), to_host(w))
