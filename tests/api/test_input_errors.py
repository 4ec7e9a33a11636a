"""Bad input to the runtime and to `partir.jit` gets a clear `PartitionError`.

What `partir.jit` does with new argument shapes: like `jax.jit`, the partitioned function
is compiled per argument signature (the pytree structure, shapes and dtypes of the
arguments). A call with a new signature traces the function again, applies the schedule
to the new program, lowers and compiles it; so arguments of other shapes, or of another
pytree structure, are not an error as long as the schedule still applies to them. If it
does not (an input the schedule names is gone, a dimension no longer divisible by its
axis), that call raises the tactic's error. `Metadata` describes the signature of the
last call. Only an executable built directly from a PartIR:HLO program
(`partir.runtime.build_callable`) has one fixed signature, and it rejects other
arguments with an `ArgumentError`.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import partir
from examples.mlp.model import example_args, mlp
from partir.pipeline import lower
from partir.runtime import ArgumentError, DeviceCountError, build_callable

MESH = partir.Mesh({"batch": 4, "model": 2})
BP = partir.ManualPartition({"x": 0}, axis="batch", name="BP")
MP = partir.ManualPartition({"w1": 1}, axis="model", name="MP")
TOL = dict(rtol=1e-5, atol=1e-5)


@pytest.fixture(scope="module")
def executable():
    """The BP+MP mlp as one executable for x 256x8, w1 8x16, w2 16x8 (float32)."""
    result = partir.core_partition(mlp, MESH, [BP, MP], *example_args())
    return build_callable(lower(result.program).hlo)


def test_executable_runs_its_own_signature(executable):
    args = example_args()
    (out,) = executable(*args)
    np.testing.assert_allclose(out, mlp(*args), **TOL)
    # Host float64 arrays take JAX's default dtype (float32), as with jax.jit.
    (out64,) = executable(*(a.astype(np.float64) for a in args))
    np.testing.assert_allclose(out64, out, **TOL)


@pytest.mark.parametrize("position, name, bad, local", [
    (0, "x", np.zeros((128, 8), np.float32), "tensor<64x8xf32>"),  # fewer rows
    (1, "w1", np.zeros((16, 8), np.float32), "tensor<8x8xf32>"),  # transposed
    (2, "w2", np.zeros((1, 16, 8), np.float32), "tensor<8x8xf32>"),  # another rank
    (0, "x", jnp.zeros((256, 4), jnp.float32), "tensor<64x8xf32>"),  # a jax.Array
])
def test_executable_rejects_other_shapes_naming_the_input(executable, position, name, bad,
                                                          local):
    args = list(example_args())
    want = args[position].shape
    args[position] = bad
    with pytest.raises(ArgumentError) as e:
        executable(*args)
    message = str(e.value)
    assert f"argument {name!r} of mlp" in message
    got = "x".join(map(str, bad.shape))
    assert f"is tensor<{got}xf32>" in message
    assert f"expects the global tensor<{'x'.join(map(str, want))}xf32>" in message
    assert f"device-local {local}" in message  # and how the program shards it
    assert isinstance(e.value, partir.PartitionError)


def test_executable_rejects_another_dtype(executable):
    x, w1, w2 = example_args()
    with pytest.raises(ArgumentError, match=r"argument 'x' of mlp is tensor<256x8xi32>; "
                                            r"the program expects the global "
                                            r"tensor<256x8xf32>"):
        executable(x.astype(np.int32), w1, w2)


def test_executable_rejects_a_wrong_argument_count(executable):
    x, w1, _ = example_args()
    with pytest.raises(ArgumentError, match=r"mlp takes 3 arguments \(x, w1, w2\), got 2"):
        executable(x, w1)


def test_executable_lower_checks_abstract_arguments(executable):
    _, w1, w2 = example_args()
    with pytest.raises(ArgumentError, match=r"argument 'x' of mlp is tensor<3x3xf32>"):
        executable.lower(jax.ShapeDtypeStruct((3, 3), np.float32), w1, w2)


def test_jit_schedule_naming_a_missing_input_fails_on_first_call():
    schedule = [partir.ManualPartition({"z": 0}, axis="batch", name="BP")]
    fn, meta = partir.jit(mlp, MESH, schedule)  # nothing is traced yet
    assert meta.tactics == []
    for _ in range(2):  # a failed signature is not cached: it fails again
        with pytest.raises(partir.UnknownInputError) as e:
            fn(*example_args())
        message = str(e.value)
        assert "tactic BP" in message and "'z'" in message
        assert "w1, w2, x" in message  # the inputs there are
        assert e.value.loc is not None and e.value.loc.file == __file__
    assert meta.tactics == []


def test_jit_on_a_mesh_larger_than_the_devices_fails_on_first_call():
    mesh = partir.Mesh({"batch": 16, "model": 2})
    fn, _ = partir.jit(mlp, mesh, [BP, MP])
    with pytest.raises(DeviceCountError) as e:
        fn(*example_args())
    message = str(e.value)
    assert f"has 32 devices but only {len(jax.devices())} cpu devices" in message
    assert "partir.partition" in message
    assert "XLA_FLAGS=--xla_force_host_platform_device_count=32" in message
    # As the error says, partitioning itself needs no devices.
    meta = partir.partition(mlp, mesh, [BP, MP], *example_args())
    assert meta.collectives["all_reduce"] == 1


def test_jit_repartitions_for_new_shapes():
    x, w1, w2 = example_args()
    fn, meta = partir.jit(mlp, MESH, [BP, MP])
    np.testing.assert_allclose(fn(x, w1, w2), mlp(x, w1, w2), **TOL)
    assert "%x: tensor<64x8xf32>" in meta.hlo_ir
    # Fewer rows: a new signature, partitioned and compiled anew (no ArgumentError).
    np.testing.assert_allclose(fn(x[:8], w1, w2), mlp(x[:8], w1, w2), **TOL)
    assert "%x: tensor<2x8xf32>" in meta.hlo_ir
    # The first signature is still right.
    np.testing.assert_allclose(fn(x, w1, w2), mlp(x, w1, w2), **TOL)
    # A batch the axis does not divide is padded (6 -> 8)...
    np.testing.assert_allclose(fn(x[:6], w1, w2), mlp(x[:6], w1, w2), **TOL)
    assert next((p["value"], p["size"], p["padded"]) for p in meta.padding) == ("x", 6, 8)
    # ... and a shape a schedule with pad=False cannot partition fails with its error.
    strict = dataclasses.replace(BP, pad=False)
    fn, meta = partir.jit(mlp, MESH, [strict, MP])
    with pytest.raises(partir.IndivisibleDimensionError, match=r"tactic BP: .*'x'.* 6"):
        fn(x[:6], w1, w2)


def layers(params, x):
    """A chain of matmuls over whatever pytree of weight matrices `params` is."""
    for w in jax.tree_util.tree_leaves(params):
        x = jax.nn.relu(x @ w)
    return x


LAYERS_SCHEDULE = [partir.ManualPartition({"x": 0}, axis="batch", name="BP"),
                   partir.ManualPartition({"params": partir.FIRST_DIVISIBLE_DIM},
                                          axis="model", name="params")]


def _is_spec(s) -> bool:
    return isinstance(s, jax.sharding.PartitionSpec)


def _param_names(meta: partir.Metadata) -> set[str]:
    return {n for n in meta.tactics[1].shardings if n.startswith("params")}


def test_jit_retraces_for_another_pytree_structure():
    x, w1, w2 = example_args()
    w3 = np.eye(8, dtype=np.float32)
    fn, meta = partir.jit(layers, MESH, LAYERS_SCHEDULE)
    calls = [{"a": w1, "b": w2}, [w1, w2, w3], ({"a": w1}, w2)]
    names = [{"params/a", "params/b"}, {"params/0", "params/1", "params/2"},
             {"params/0/a", "params/1"}]
    for params, inputs in zip(calls, names, strict=True):
        np.testing.assert_allclose(fn(params, x), layers(params, x), **TOL)
        # Every new signature refills the metadata: the leaves' names follow the pytree.
        assert _param_names(meta) == inputs
        # in_specs has the structure of the arguments, as jax.jit's in_shardings.
        assert jax.tree_util.tree_structure(meta.in_specs[0], is_leaf=_is_spec) \
            == jax.tree_util.tree_structure(params)
    # A structure seen before runs its compiled program again.
    np.testing.assert_allclose(fn(calls[0], x), layers(calls[0], x), **TOL)


def test_metadata_describes_the_signature_called_last():
    """Also after a call with a signature compiled before (Metadata once described the
    signature partitioned last, not the program that ran)."""
    x, w1, w2 = example_args()
    fn, meta = partir.jit(layers, MESH, LAYERS_SCHEDULE)
    fn({"a": w1, "b": w2}, x)
    fn([w1, w2], x)
    fn({"a": w1, "b": w2}, x)
    assert _param_names(meta) == {"params/a", "params/b"}
