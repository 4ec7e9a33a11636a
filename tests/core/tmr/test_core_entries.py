import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from tests.core.tmr.oracle import check_entry

rng = np.random.default_rng(0)


@pytest.mark.slow
def test_dot_general_all_mappings():
    x = rng.normal(size=(8, 4, 6)).astype(np.float32)
    y = rng.normal(size=(8, 6, 4)).astype(np.float32)
    assert check_entry(lambda a, b: jnp.einsum("bij,bjk->bik", a, b), x, y) >= 8


def test_elementwise_with_scalar_literal():
    x = rng.normal(size=(4, 8)).astype(np.float32)
    assert check_entry(lambda a: a * 2.0, x) >= 2


def test_select_n():
    p = rng.normal(size=(4, 8)) > 0
    x = rng.normal(size=(4, 8)).astype(np.float32)
    assert check_entry(lambda p, a, b: lax.select(p, a, b), p, x, -x) >= 2


def test_constant_tiles_are_sliced_at_their_offset():
    c = np.arange(32, dtype=np.float32).reshape(4, 8)
    assert check_entry(lambda a: a + c, c) >= 2
