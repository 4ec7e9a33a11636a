"""`partir.jit` where `jax.jit` would be used: arrays already placed on a mesh (built any
way JAX builds one) on the first call, training loops feeding outputs back without any
transfer, calls under `jax.jit` and `jax.grad`, a mesh's own device order, one tactic as a
schedule. Every result is checked against the unpartitioned function."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding

import partir
from examples.mlp.model import example_args, mlp
from partir.pipeline import lower
from partir.runtime import build_callable

MESH = partir.Mesh({"batch": 4, "model": 2})
BP = partir.ManualPartition({"x": 0}, axis="batch", name="BP")
MP = partir.ManualPartition({"w1": 1}, axis="model", name="MP")
Z3 = partir.ManualPartition({"w1": 0, "w2": 1}, axis="batch", name="Z3")
TOL = dict(rtol=1e-4, atol=1e-4)


def layer(x, w1, w2):
    """The mlp with ops whose traced params carry shardings when their inputs are placed:
    broadcasts (`zeros_like`, `ones`), an iota (`arange`) and dots contracting sharded
    dims."""
    h = jax.nn.relu(x @ w1 + jnp.arange(w1.shape[1], dtype=x.dtype)) + jnp.zeros_like(x @ w1)
    return h @ w2 + jnp.ones(w2.shape[1], x.dtype)


def jax_mesh(kind: str) -> jax.sharding.Mesh:
    shape, names = (4, 2), ("batch", "model")
    if kind == "Mesh":
        return jax.sharding.Mesh(np.array(jax.devices()[:8]).reshape(shape), names)
    if kind == "reversed":
        return jax.sharding.Mesh(np.array(jax.devices()[:8][::-1]).reshape(shape), names)
    axis_type = {"explicit": AxisType.Explicit, "auto": AxisType.Auto}[kind]
    return jax.make_mesh(shape, names, axis_types=(axis_type,) * 2)


def place(args, mesh, specs):
    return [jax.device_put(a, NamedSharding(mesh, s)) for a, s in zip(args, specs, strict=True)]


def same_layout(x: jax.Array, sharding: NamedSharding) -> bool:
    return x.sharding.is_equivalent_to(sharding, x.ndim)


@pytest.mark.parametrize("kind", ["Mesh", "explicit", "auto"])
@pytest.mark.parametrize("given", ["jax mesh", "partir.Mesh"])
def test_inputs_placed_before_the_first_call(kind, given):
    args = example_args()
    schedule = [BP, MP, Z3]
    in_specs = partir.partition(layer, MESH, schedule, *args).in_specs
    mesh = jax_mesh(kind)
    placed = place(args, mesh, in_specs)
    fn, meta = partir.jit(layer, mesh if given == "jax mesh" else MESH, schedule)
    with jax.transfer_guard("disallow_explicit"):  # laid out as needed: nothing moves
        out = fn(*placed)
    np.testing.assert_allclose(out, layer(*args), **TOL)
    assert meta.in_specs == in_specs
    assert same_layout(out, NamedSharding(mesh, meta.out_specs[0]))


@pytest.mark.parametrize("kind", ["Mesh", "explicit"])
def test_laid_out_arguments_are_passed_through_as_they_are(kind):
    args = example_args()
    mesh = jax_mesh(kind)
    exe = build_callable(lower(partir.core_partition(mlp, MESH, [BP, MP, Z3], *args).program)
                         .hlo, mesh)
    placed = place(args, mesh, exe.in_specs)
    assert all(a is b for a, b in zip(exe.place(*placed), placed, strict=True))
    # Host arrays and arrays laid out otherwise are placed.
    moved = exe.place(args[0], *place(args[1:], mesh, exe.in_specs[::-1][:2]))
    assert all(same_layout(x, s) for x, s in zip(moved, exe.input_shardings, strict=True))


def sgd_step(params, x):
    def loss(p):
        return jnp.mean(mlp(x, p["w1"], p["w2"]) ** 2)

    value, grads = jax.value_and_grad(loss)(params)
    return jax.tree.map(lambda p, g: p - 0.1 * g, params, grads), value


TRAIN_SCHEDULE = [
    partir.ManualPartition({"x": 0}, axis="batch", name="BP"),
    partir.ManualPartition({"params/w1": 1}, axis="model", name="MP"),
    partir.ManualPartition({"params/w1": 0, "params/w2": 1}, axis="batch", name="Z3"),
]


def no_host_copies(monkeypatch):
    """Makes copying a device array to the host fail. On CPU, device memory is host
    memory and `jax.transfer_guard` lets such copies through; every conversion to numpy
    (`np.asarray`, `float`, `.tolist()`) reads the array's `_value`."""
    def copied(x):
        raise AssertionError(f"a {x.aval} array was copied to the host")

    monkeypatch.setattr(type(jnp.zeros(())), "_value", property(copied))


@pytest.mark.parametrize("kind", ["Mesh", "explicit"])
def test_training_loop_feeds_outputs_back_without_transfers(kind, monkeypatch):
    x, w1, w2 = example_args()
    mesh = jax_mesh(kind)
    step, meta = partir.jit(sgd_step, mesh, TRAIN_SCHEDULE)
    params, loss = step({"w1": w1, "w2": w2}, x)  # host arrays: placed on the first call
    in_shardings = jax.tree.map(lambda s: NamedSharding(mesh, s), meta.in_specs)
    assert jax.tree.all(jax.tree.map(same_layout, params, in_shardings[0]))
    x_placed = jax.device_put(x, in_shardings[1])
    losses = [loss]
    with monkeypatch.context() as patched:
        no_host_copies(patched)
        # Explicit transfers too: resharding an argument would be a device_put.
        with jax.transfer_guard("disallow_explicit"):
            for _ in range(9):
                previous = params
                params, loss = step(params, x_placed)
                losses.append(loss)
                assert jax.tree.all(jax.tree.map(lambda a, b: a.sharding == b.sharding,
                                                 params, previous))

    want_params, want_losses = {"w1": w1, "w2": w2}, []
    for _ in range(10):
        want_params, want_loss = jax.jit(sgd_step)(want_params, x)
        want_losses.append(want_loss)
    np.testing.assert_allclose(np.array(losses), np.array(want_losses), **TOL)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, **TOL), params, want_params)


def test_called_under_jax_jit():
    args = example_args()
    fn, meta = partir.jit(mlp, MESH, [BP, MP, Z3])
    out = jax.jit(lambda *a: fn(*a) * 2)(*args)
    np.testing.assert_allclose(out, 2 * mlp(*args), **TOL)
    assert meta.collectives["all_gather"] == 2  # partitioned while traced under jit
    np.testing.assert_allclose(fn(*args), mlp(*args), **TOL)  # and the same outside


@pytest.mark.slow
def test_differentiated_with_jax_grad():
    args = example_args()
    fn, _ = partir.jit(mlp, MESH, [BP, MP, Z3])
    weights = jnp.arange(8, dtype=jnp.float32)  # a cotangent that differs per column

    def loss(f):
        return lambda *a: jnp.sum(jnp.tanh(f(*a)) * weights)

    got = jax.grad(loss(fn), argnums=(0, 1, 2))(*args)
    want = jax.grad(loss(mlp), argnums=(0, 1, 2))(*args)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, **TOL)


def test_a_meshs_device_order_is_kept():
    args = example_args()
    mesh = jax_mesh("reversed")
    fn, meta = partir.jit(mlp, mesh, [BP, MP])
    # Inputs laid out on the row-major mesh are resharded onto the reversed one.
    out = fn(*place(args, jax_mesh("Mesh"), partir.partition(mlp, MESH, [BP, MP],
                                                             *args).in_specs))
    np.testing.assert_allclose(out, mlp(*args), **TOL)
    assert (out.sharding.mesh.devices == mesh.devices).all()
    assert out.sharding.spec == meta.out_specs[0]


def test_host_values_take_jax_jit_types():
    def scale(x, s):
        return x * s

    fn, _ = partir.jit(scale, MESH, partir.ManualPartition({"x": 0}, axis="batch"))
    x = example_args()[0].astype(np.float64)  # float32 without x64, as in jax.jit
    for s in (2.0, 2, np.float32(2.0)):
        out, want = fn(x, s), jax.jit(scale)(x, s)
        assert out.dtype == want.dtype
        np.testing.assert_allclose(out, want, **TOL)


def test_an_argument_that_is_no_array_is_a_tracing_error():
    fn, _ = partir.jit(mlp, MESH, BP)
    x, w1, _ = example_args()
    with pytest.raises(partir.TracingError, match=r"mlp: .*'w2'.* is not a valid JAX type"):
        fn(x, w1, "w2")


def test_one_tactic_is_a_schedule():
    args = example_args()
    fn, meta = partir.jit(mlp, MESH, BP)
    np.testing.assert_allclose(fn(*args), mlp(*args), **TOL)
    assert [t.name for t in meta.tactics] == ["BP"]
    assert partir.partition(mlp, MESH, BP, *args).in_specs == meta.in_specs
    assert len(partir.core_partition(mlp, MESH, BP, *args).tactics) == 1


@pytest.mark.parametrize("schedule, named", [({"x": 0}, "dict {'x': 0}"), ("BP", "str 'BP'"),
                                             (None, "NoneType None")])
def test_a_schedule_of_another_kind_is_named(schedule, named):
    for call in (lambda: partir.jit(mlp, MESH, schedule),
                 lambda: partir.partition(mlp, MESH, schedule, *example_args())):
        with pytest.raises(partir.InvalidTacticError,
                           match=f"a schedule is a partir.ManualPartition or a list of them, "
                                 f"got {named}"):
            call()
