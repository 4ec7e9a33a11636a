"""partir.jit takes jax.jit's keyword arguments: static and donated arguments by position
or name, keep_unused, compiler_options and out_shardings (tests/api/test_out_shardings.py);
it refuses the in_shardings the schedule decides."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import partir
from examples.mlp.model import example_args, mlp
from partir.jit_options import JitOptionError
from tests.oracles import assert_tree_close

MESH = partir.Mesh({"batch": 4, "model": 2})
BP = partir.ManualPartition({"x": 0}, axis="batch", name="BP")


def scaled(x, w, power):
    return jnp.tanh(x @ w) ** power


def step(x, w, power):
    # its result can reuse x's buffer, so donating x lets XLA consume it
    return x - 0.1 * (jnp.tanh(x @ w) ** power) @ w.T


def _args():
    x, w, _ = example_args()
    return x, w


def test_static_argnames_resolves_to_a_position_and_keywords_are_accepted():
    x, w = _args()
    fn, meta = partir.jit(scaled, MESH, [BP], static_argnames="power")
    want = scaled(x, w, 3)
    np.testing.assert_allclose(fn(x, w, 3), want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(fn(x, w=w, power=3), want, rtol=1e-5, atol=1e-5)
    # a different static value is a different program
    np.testing.assert_allclose(fn(x, w, 2), scaled(x, w, 2), rtol=1e-5, atol=1e-5)
    assert len(meta.in_specs) == 2  # the static argument is not an input


def test_donated_arguments_are_consumed_like_jax_jit():
    x, w = _args()
    fn, _ = partir.jit(step, MESH, [BP], static_argnums=2, donate_argnames="x")
    placed = jax.device_put(x, jax.sharding.NamedSharding(
        jax.sharding.Mesh(np.array(jax.devices()[:8]).reshape(4, 2), ("batch", "model")),
        jax.sharding.PartitionSpec("batch", None)))
    out = fn(placed, w, 2)
    np.testing.assert_allclose(out, step(x, w, 2), rtol=1e-5, atol=1e-5)
    assert placed.is_deleted()
    kept = jax.device_put(w)
    fn(jax.device_put(x), kept, 2)
    assert not kept.is_deleted()


def test_donated_pytree_argument_donates_every_leaf():
    x, w = _args()

    def f(params, x):
        # results shaped like the parameters: their buffers can be reused
        return {"w": params["w"] * 0.9 + x.mean(), "b": params["b"] * 0.9}

    params = {"w": np.asarray(w), "b": np.ones((w.shape[1],), np.float32)}
    fn, meta = partir.jit(f, MESH, [partir.ManualPartition({"x": 0}, axis="batch")],
                          donate_argnums=0)
    want = f(params, x)
    assert_tree_close(fn(params, x), want)
    jax_mesh = jax.sharding.Mesh(np.array(jax.devices()[:8]).reshape(4, 2),
                                 ("batch", "model"))
    placed = jax.tree.map(lambda a, s: jax.device_put(a, jax.sharding.NamedSharding(
        jax_mesh, s)), params, meta.in_specs[0])
    assert_tree_close(fn(placed, x), want)
    assert all(leaf.is_deleted() for leaf in jax.tree.leaves(placed))


def test_keep_unused_and_compiler_options_reach_jax_jit():
    x, w = _args()

    def ignores_w(x, w):
        return x * 2.0

    fn, _ = partir.jit(ignores_w, MESH, [BP], keep_unused=True,
                       compiler_options={"xla_embed_ir_in_executable": True})
    np.testing.assert_allclose(fn(x, w), x * 2.0)
    text = fn.lower(x, w).as_text()
    # keep_unused: the unused argument stays a parameter of the executable's main function
    main = next(line for line in text.splitlines() if "func.func public @main" in line)
    assert main.count("%arg") == 2


@pytest.mark.parametrize("kwargs, error, words", [
    ({"in_shardings": None}, JitOptionError, "schedule decides"),
    ({"out_shardings": ("batch",)}, partir.PartitionError, "out_shardings at [0]: expected "
                                                           "a jax.sharding.PartitionSpec"),
    ({"static_argnames": "nope"}, JitOptionError, "'nope'"),
    ({"static_argnums": 2, "donate_argnums": 2}, JitOptionError, "both static and donated"),
    ({"static_argnums": -1}, JitOptionError, "non-negative"),
    ({"backend_name": "cpu"}, TypeError, "backend_name"),
])
def test_bad_options_are_named(kwargs, error, words):
    with pytest.raises(error) as e:
        partir.jit(scaled, MESH, [BP], **kwargs)
    assert words in str(e.value)


def test_a_keyword_the_function_does_not_have_is_reported():
    x, w = _args()
    fn, _ = partir.jit(mlp, MESH, [BP])
    with pytest.raises(partir.PartitionError) as e:
        fn(x, w, w2=w, bogus=1)
    assert "bogus" in str(e.value)
