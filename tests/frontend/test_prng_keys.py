"""Key-typed values in the IR: typed keys stay keys, raw uint32 keys are wrapped by the
traced program, and the traced function computes the same bits."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from partir.core.interpreter import interpret
from partir.frontend import trace
from partir.ir import print_function


def draw(x, key):
    key, sub = jax.random.split(key)
    return jax.random.bits(jax.random.fold_in(sub, 3), x.shape) ^ x, key


@pytest.mark.parametrize("make_key", [jax.random.key, jax.random.PRNGKey])
def test_keys_traced_as_key_types(make_key):
    key, x = make_key(0), jnp.arange(8, dtype=jnp.uint32)
    prog = trace(draw, x, key)
    types = {str(v.type) for op in prog.function.ops for v in op.results}
    assert {"tensor<2xkey<fry>>", "tensor<key<fry>>"} <= types
    text = print_function(prog.function)
    assert "random_split" in text and "random_fold_in" in text
    split = next(op for op in prog.function.ops if op.name == "random_split")
    assert split.results[0].type.nbytes == 2 * 2 * 4  # two keys of 2 x uint32
    bits, new_key = interpret(prog.function, x, key)
    want_bits, want_key = draw(x, key)
    np.testing.assert_array_equal(bits, want_bits)
    # key_data of a raw key is the key itself
    np.testing.assert_array_equal(jax.random.key_data(new_key), jax.random.key_data(want_key))


def test_a_typed_key_argument_and_its_shape_struct():
    key = jax.random.key(0)
    for arg in (key, jax.ShapeDtypeStruct(key.shape, key.dtype)):
        (a,) = trace(jax.random.key_data, arg).function.args
        assert str(a.type) == "tensor<key<fry>>" and a.type.nbytes == 8
