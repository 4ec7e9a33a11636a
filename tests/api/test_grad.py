"""Differentiating a `partir.jit` function gives JAX's derivative of the unpartitioned
function: JAX differentiates the function itself (its `custom_jvp`/`custom_vjp` rules
honoured) and partir partitions the VJP with the same schedule, so no collective of the
partitioned program (a `pmax` of a sharded max) is ever differentiated. Every result is
compared with `jax.grad` of the unpartitioned function."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import partir
from examples.mlp.model import example_args, mlp

TOL = dict(rtol=1e-5, atol=1e-5)
MESH = partir.Mesh({"batch": 4, "model": 2})
BP = partir.ManualPartition({"x": 0}, axis="batch", name="BP")


def sharded(f, forms=None, mesh=None, **options):
    """f partitioned on one axis "a" of 2 devices, tiling `forms` (default: x on 0)."""
    schedule = [partir.ManualPartition(forms or {"x": 0}, axis="a")]
    return partir.jit(f, partir.Mesh(mesh or {"a": 2}), schedule, **options)[0]


def assert_trees_close(got, want):
    assert jax.tree.structure(got) == jax.tree.structure(want)
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(g, w, **TOL)


@pytest.mark.parametrize("act", [jax.nn.relu, jax.nn.softplus, jax.nn.relu6],
                         ids=["relu", "softplus", "relu6"])
def test_custom_jvp_rules_are_honoured_at_their_kinks(act):
    # relu'(0) = 0 and relu6'(0) = 0 by their rules (their bodies' derivative is 0.5);
    # softplus'(0) = 0.5 by its rule (its body, logaddexp, gives 0).
    def f(x):
        return jnp.sum(act(x) * jnp.arange(1.0, 9.0))

    x = jnp.array([0.0, 0.0, 6.0, 6.0, -1.0, 1.0, 0.0, 7.0])
    np.testing.assert_array_equal(jax.grad(sharded(f))(x), jax.grad(f)(x))


@jax.custom_vjp
def clipped_identity(x):
    return x


clipped_identity.defvjp(lambda x: (x, None), lambda _, g: (jnp.clip(g, -1.0, 1.0) * 3.0,))


def test_a_custom_vjp_backward_is_honoured():
    def f(x):
        return jnp.sum(clipped_identity(x) * jnp.arange(-4.0, 4.0))

    x = jnp.ones(8)
    got = jax.grad(sharded(f))(x)
    np.testing.assert_array_equal(got, jax.grad(f)(x))
    np.testing.assert_array_equal(got, [-3, -3, -3, -3, 0, 3, 3, 3])  # the rule's, not 1s


# Reductions over the sharded dimension: max and min reduce with pmax/pmin across the
# devices, softmax and logsumexp also subtract a (stop-gradient) max.
@pytest.mark.parametrize("reduce", [
    lambda x: jnp.max(x, axis=0), lambda x: jnp.min(x, axis=0),
    lambda x: jax.nn.softmax(x, axis=0), lambda x: jax.nn.logsumexp(x, axis=0)],
    ids=["max", "min", "softmax", "logsumexp"])
def test_reductions_over_a_sharded_dimension(reduce):
    def f(x):
        return jnp.sum(jnp.sin(reduce(x)))

    # Ties in columns 0 and 2: JAX shares the gradient among the tied elements.
    x = jnp.array([[1.0, 2.0, 3.0], [5.0, -1.0, 3.0], [5.0, 0.5, 2.0], [0.0, 4.0, -2.0]])
    assert_trees_close(jax.grad(sharded(f))(x), jax.grad(f)(x))


def test_value_and_grad():
    def f(x, w):
        return jnp.sum(jnp.max(jax.nn.relu(x @ w), axis=0))

    x, w = jnp.linspace(-1.0, 1.0, 24).reshape(8, 3), jnp.linspace(-2.0, 1.0, 6).reshape(3, 2)
    got = jax.value_and_grad(sharded(f), argnums=(0, 1))(x, w)
    assert_trees_close(got, jax.value_and_grad(f, argnums=(0, 1))(x, w))


def loss(params, x):
    """The mlp's loss on pytree parameters, with custom-rule activations at their kinks."""
    h = jax.nn.relu(x @ params["w1"])
    return jnp.sum(jax.nn.softplus(jnp.max(h @ params["w2"], axis=1)))


@pytest.mark.slow
def test_pytree_parameters_under_batch_and_model_parallelism():
    x, w1, w2 = map(jnp.asarray, example_args())
    params = {"w1": w1.at[:, :3].set(0.0), "w2": w2}  # relu at 0 for some hidden units
    x = x.at[:2].set(0.0)  # and whole rows at 0
    schedule = [partir.ManualPartition({"x": 0}, axis="batch", name="BP"),
                partir.ManualPartition({"params/w1": 1}, axis="model", name="MP")]
    fn, meta = partir.jit(loss, MESH, schedule)
    got = jax.grad(fn)(params, x)
    assert_trees_close(got, jax.grad(loss)(params, x))
    # The backward program is partitioned by the same schedule, through the same names.
    assert meta.tactics[1].actions[0] == "tile<%params/w1,1,\"model\">"
    assert [t.actions[0] for t in fn.vjp.metadata.tactics] == \
        [t.actions[0] for t in meta.tactics]
    assert fn.vjp.metadata.collectives["all_reduce"] > 0


def test_grad_under_jit():
    x, w1, w2 = map(jnp.asarray, example_args())
    w1 = w1.at[:, :3].set(0.0)  # relu at 0 for some hidden units

    def f(x, w1, w2):  # a max over the batch, which BP shards
        return jnp.sum(jnp.max(mlp(x, w1, w2), axis=0) ** 2)

    fn = partir.jit(f, MESH, [BP, partir.ManualPartition({"w1": 1}, axis="model")])[0]
    want = jax.grad(f, argnums=(1, 2))(x, w1, w2)
    assert_trees_close(jax.jit(jax.grad(fn, argnums=(1, 2)))(x, w1, w2), want)
    # And a jitted call differentiated from outside.
    assert_trees_close(jax.grad(jax.jit(fn), argnums=(1, 2))(x, w1, w2), want)


@pytest.mark.slow
def test_grad_of_grad():
    def f(x):
        return jnp.sum(jax.nn.softplus(x) * jnp.max(x) ** 2)

    x = jnp.array([0.0, 1.5, -1.0, 2.0, 0.5, 2.0, -3.0, 1.0])
    hvp = jnp.arange(8.0)

    def second(f):
        return jax.grad(lambda x: jnp.sum(jax.grad(f)(x) * hvp))

    assert_trees_close(second(sharded(f))(x), second(f)(x))


@pytest.mark.parametrize("mode", [
    lambda f, x: jax.jvp(f, (x,), (x,)), lambda f, x: jax.linearize(f, x)[1](x),
    lambda f, x: jax.jacfwd(f)(x), lambda f, x: jax.hessian(f)(x)],
    ids=["jvp", "linearize", "jacfwd", "hessian"])
def test_forward_mode_is_refused_as_for_a_custom_vjp_function(mode):
    # Not by differentiating the program's pmax.
    with pytest.raises(TypeError, match="forward-mode autodiff"):
        mode(sharded(lambda x: jnp.max(x)), jnp.arange(4.0))


def test_static_integer_and_pytree_arguments_and_outputs():
    def f(scale, params, ids, x):
        y = jnp.take(params["table"], ids, axis=0) * x * scale
        return {"loss": jnp.sum(jnp.max(y, axis=0)), "count": jnp.sum(ids)}

    table = jnp.linspace(-1.0, 1.0, 15).reshape(5, 3)
    args = (2.0, {"table": table}, jnp.array([0, 3, 3, 1]), jnp.ones((4, 3)))
    fn = sharded(f, {"x": 0, "ids": 0}, static_argnums=0)

    def loss(f):
        return lambda *a: f(*a)["loss"]

    want = jax.grad(loss(f), argnums=(1, 3))(*args)
    assert_trees_close(jax.grad(loss(fn), argnums=(1, 3))(*args), want)
    # The integer argument gets float0 cotangents, as from JAX.
    got = jax.grad(loss(fn), argnums=2, allow_int=True)(*args)
    assert got.dtype == jax.dtypes.float0 and got.shape == (4,)


def test_donated_arguments_survive_until_the_backward_program():
    def f(x):
        return jnp.sum(jnp.max(x, axis=0) ** 2)

    fn = sharded(f, donate_argnums=0)
    x = jnp.arange(8.0).reshape(4, 2)
    np.testing.assert_array_equal(jax.grad(fn)(x), jax.grad(f)(x))


def test_undifferentiated_calls_build_no_backward_program():
    fn = sharded(lambda x: jnp.max(x) * 2.0)
    x = jnp.arange(4.0)
    assert float(fn(x)) == 6.0
    assert float(jax.jit(fn)(x)) == 6.0  # traced, so a custom_vjp, but not differentiated
    assert fn.vjp.metadata.tactics == []  # nothing partitioned yet
    jax.grad(fn)(x)
    assert len(fn.vjp.metadata.tactics) == 1


def test_a_function_without_signature_cannot_be_differentiated():
    class NoSignature:
        __signature__ = "unreadable"  # inspect.signature raises TypeError

        def __call__(self, x):
            return jnp.max(x)

    fn = sharded(NoSignature(), {"arg0": 0})  # named by position
    assert float(fn(jnp.arange(4.0))) == 3.0
    with pytest.raises(partir.TracingError, match="cannot differentiate"):
        jax.grad(fn)(jnp.arange(4.0))
