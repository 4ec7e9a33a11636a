"""Whole PartIR:HLO programs through `build_callable`: the paper's chain (with and without
FSDP), index-dependent ops, argument placement, lowering, and the errors users see."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.sharding import NamedSharding, PartitionSpec

import partir
from partir.ir import TensorType
from partir.ir.opnames import CONSTANT, TAG
from partir.runtime import ArgumentError, DeviceCountError, ProgramError, build_callable
from tests.runtime.programs import (
    MESH,
    Builder,
    chain_program,
    chain_reference,
    normal,
)
from tests.runtime.test_collectives import check_shards


def chain_args():
    return normal((256, 8), 0), normal((8, 16), 1), normal((16, 8), 2)


@pytest.mark.parametrize("fsdp", [False, True], ids=["BP+MP", "BP+MP+Z3"])
def test_paper_chain(fsdp):
    exe = build_callable(chain_program(fsdp))
    args = chain_args()
    (out,) = exe(*args)
    check_shards(out, chain_reference(*args), rtol=1e-4, atol=1e-4)


def test_specs_and_shardings():
    exe = build_callable(chain_program(fsdp=True))
    P = PartitionSpec
    assert exe.in_specs == (P("B", None), P("B", "M"), P("M", "B"))
    assert exe.out_specs == (P("B", None),)
    assert exe.in_axes[1] == (("B",), ("M",))
    assert [t.shape for t in exe.global_in_types] == [(256, 8), (8, 16), (16, 8)]
    assert [t.shape for t in exe.global_out_types] == [(256, 8)]
    assert exe.jax_mesh.shape == {"B": 4, "M": 2}
    assert list(exe.jax_mesh.devices.flat) == jax.devices()
    assert exe.input_shardings[0] == NamedSharding(exe.jax_mesh, P("B", None))


def test_multi_axis_dimension_spec_and_reduce_scatter_output():
    """The chain ending in a reduce_scatter over M: the output's rows are split over
    (B, M), whose spec is the tuple of both axes."""
    b = Builder()
    x = b.arg("x", (256, 8), (("B",), ()))
    w1 = b.arg("w1", (8, 16), ((), ("M",)))
    w2 = b.arg("w2", (16, 8), (("M",), ()))
    x2 = b.prim(lambda a, c: a @ c, b.prim(lambda a, c: a @ c, x, w1), w2)
    y = b.collective("reduce_scatter", x2, (32, 8), axes=(("M",), ()), monoid="add")
    exe = build_callable(b.build([y], [(("B", "M"), ())]))
    assert exe.out_specs == (PartitionSpec(("B", "M"), None),)
    x, w1, w2 = chain_args()
    (out,) = exe(x, w1, w2)
    check_shards(out, x @ w1 @ w2, rtol=1e-4, atol=1e-4)


def test_index_dependent_iota():
    """iota counting along a dimension split over (B, M) and along one split over M: each
    device adds its tile offset, computed from `hlo.axis_index` coordinates."""
    b = Builder()
    i, j = b.axis_index("B"), b.axis_index("M")
    (rows,) = b.traced(lambda i, j: lax.broadcasted_iota(jnp.int32, (2, 6), 0)
                       + (i * 2 + j) * 2, i, j)
    (cols,) = b.traced(lambda j: lax.broadcasted_iota(jnp.int32, (2, 8), 1) + j * 8, j)
    exe = build_callable(b.build([rows, cols], [(("B", "M"), ()), (("B",), ("M",))]))
    got_rows, got_cols = exe()
    check_shards(got_rows, np.broadcast_to(np.arange(16, dtype=np.int32)[:, None], (16, 6)))
    check_shards(got_cols, np.broadcast_to(np.arange(16, dtype=np.int32), (8, 16)))


def test_constants_plain_and_index_dependent():
    value = np.arange(32, dtype=np.float32).reshape(8, 4)
    b = Builder()
    x = b.arg("x", (8, 4), (("M",), ()))
    (tile,) = b.traced(lambda j: lax.dynamic_slice_in_dim(jnp.asarray(value), j * 4, 4),
                       b.axis_index("M"))
    whole = b.op(CONSTANT, [], x.type.with_shape((8, 4)), value=value)
    y = b.prim(lambda a, c: a * c, x, tile)
    exe = build_callable(b.build([y, whole], [(("M",), ()), ((), ())]))
    x_val = normal((8, 4))
    got, got_whole = exe(x_val)
    check_shards(got, x_val * value)
    check_shards(got_whole, value)


def test_float64_constant_runs_in_32_bits_without_x64():
    """The frontend may declare a constant's numpy float64 type; JAX computes it in f32."""
    b = Builder()
    c = b.op(CONSTANT, [], TensorType((), np.dtype("float64")), value=np.array(0.5))
    exe = build_callable(b.build([c], [()]))
    (out,) = exe()
    assert out.dtype == np.float32 and float(out) == 0.5


def test_tag_and_multiple_results():
    b = Builder()
    x = b.arg("x", (16, 6), (("B",), ()))
    t = b.op(TAG, [x], x.type, name="h")
    s = b.prim(lambda a: jnp.sin(a), t)
    exe = build_callable(b.build([s, x], [(("B",), ()), (("B",), ())]))
    x_val = normal((16, 6))
    got, same = exe(x_val)
    check_shards(got, np.sin(x_val))
    check_shards(same, x_val)


def test_sharded_inputs_pass_through_and_others_are_placed():
    exe = build_callable(chain_program())
    x, w1, w2 = chain_args()
    placed_x = jax.device_put(x, exe.input_shardings[0])
    # w1 on the mesh but replicated: the wrong layout, which is resharded
    misplaced_w1 = jax.device_put(w1, NamedSharding(exe.jax_mesh, PartitionSpec()))
    args = exe.place(placed_x, misplaced_w1, w2)
    assert args[0] is placed_x
    for a, sharding in zip(args, exe.input_shardings, strict=True):
        assert a.sharding.is_equivalent_to(sharding, a.ndim)
    (out,) = exe(placed_x, misplaced_w1, w2)
    check_shards(out, chain_reference(x, w1, w2), rtol=1e-4, atol=1e-4)


def test_host_values_take_jax_default_dtypes():
    exe = build_callable(chain_program())
    x, w1, w2 = chain_args()
    (out,) = exe(x.astype(np.float64), w1, w2.tolist())
    check_shards(out, chain_reference(x, w1, w2), rtol=1e-4, atol=1e-4)


def test_callable_under_an_outer_jit():
    exe = build_callable(chain_program())
    args = chain_args()
    out = jax.jit(lambda *a: exe(*a)[0] * 2)(*args)
    np.testing.assert_allclose(out, 2 * chain_reference(*args), rtol=1e-4, atol=1e-4)


def test_lower_compile_and_analyses():
    exe = build_callable(chain_program(fsdp=True))
    lowered = exe.lower(*chain_args())
    text = lowered.as_text()
    assert "all_gather" in text and "all_reduce" in text
    compiled = lowered.compile()
    assert compiled.memory_analysis() is not None
    (out,) = compiled(*exe.place(*chain_args()))
    check_shards(out, chain_reference(*chain_args()), rtol=1e-4, atol=1e-4)
    # without arguments, or with abstract ones, the program's own global types are used
    assert exe.lower().as_text() == text
    abstract = [jax.ShapeDtypeStruct(t.shape, t.dtype) for t in exe.global_in_types]
    assert exe.lower(*abstract).as_text() == text


def test_explicit_devices():
    b = Builder(partir.Mesh({"B": 2, "M": 2}))
    x = b.arg("x", (8, 4), (("B", "M"), ()))
    y = b.collective("all_gather", x, (8, 4), axes=(("B", "M"), ()))
    devices = jax.devices()[4:]
    exe = build_callable(b.build([y], [((), ())]), devices=devices)
    assert list(exe.jax_mesh.devices.flat) == devices
    x_val = normal((8, 4))
    (out,) = exe(x_val)
    assert out.sharding.device_set == set(devices)
    check_shards(out, x_val)


@pytest.mark.parametrize("mesh, devices", [({"B": 4, "M": 4}, None), ({"B": 4, "M": 2}, 4)])
def test_too_few_devices(mesh, devices):
    b = Builder(partir.Mesh(mesh))
    x = b.arg("x", (16, 4), (("B",), ()))
    fn = b.build([x], [(("B",), ())])
    with pytest.raises(DeviceCountError) as e:
        build_callable(fn, devices=None if devices is None else jax.devices()[:devices])
    assert isinstance(e.value, partir.PartitionError)
    size = partir.Mesh(mesh).size
    for part in ("partir.partition", f"--xla_force_host_platform_device_count={size}",
                 "jax.distributed", f"has {size} devices"):
        assert part in str(e.value)


def test_argument_errors():
    exe = build_callable(chain_program())
    x, w1, w2 = chain_args()
    with pytest.raises(ArgumentError, match=r"takes 3 arguments \(x, w1, w2\), got 2"):
        exe(x, w1)
    with pytest.raises(ArgumentError, match=r"'w1' .* tensor<8x8xf32>; the program expects "
                                            r"the global tensor<8x16xf32> .*\[\{\}, \{\"M\"\}\]"):
        exe(x, w1[:, :8], w2)
    with pytest.raises(ArgumentError, match="tensor<256x8xi32>"):
        exe(x.astype(np.int32), w1, w2)
    with pytest.raises(ArgumentError):
        exe.lower(x, w1, w2.T)


def _one_op_program(name, result_shape, mesh=MESH, **params):
    b = Builder(mesh)
    x = b.arg("x", (16, 4), (("B",), ()))
    y = b.collective(name, x, result_shape, **params)
    return b.build([y], [(("B",), ())])


@pytest.mark.parametrize("fn, message", [
    (_one_op_program("all_gather", (8, 4), axes=(("B",), ())),
     r"hlo.all_gather computes tensor<16x4xf32> on each device, the program declares "
     r"tensor<8x4xf32>"),
    (_one_op_program("all_reduce", (4, 4), axes=("X",), monoid="add"),
     r"hlo.all_reduce names axis 'X', which is not in the mesh"),
    (_one_op_program("all_reduce", (4, 4), axes=("M",), monoid="and"),
     r"hlo.all_reduce: the 'and' monoid is logical and needs a bool operand"),
    (_one_op_program("all_reduce", (4, 4), axes=("M",), monoid="mul"),
     r"unknown reduction monoid 'mul'"),
    (_one_op_program("all_slice", (4, 4), axes=((), ("B", "M"))),
     r"dimension 1 of size 4 cannot be split over axes \('B', 'M'\) of total size 8"),
    (_one_op_program("all_slice", (2, 4), axes=(("M",), ()), bad=1),
     r"hlo.all_slice has operands \['tensor<4x4xf32>'\] and params .* which do not fit"),
    (_one_op_program("unknown_op", (4, 4)),
     r"op 'hlo.unknown_op' is neither"),
])
def test_program_errors_at_trace_time(fn, message):
    exe = build_callable(fn)
    with pytest.raises(ProgramError, match=message):
        exe(normal((16, 4)))


@pytest.mark.parametrize("key, value, message", [
    ("mesh", None, "has no `mesh` attribute"),
    ("in_shardings", ((("B",), ()),) * 2, "has 3 arguments but 2 in_shardings"),
    ("out_shardings", None, "has no `out_shardings` attribute"),
    ("out_shardings", [(("X",), ())], "sharded over axis 'X', which is not in the mesh"),
    ("out_shardings", [(("B",),)], "has rank 2 but its sharding lists 1 dimensions"),
    ("out_shardings", [(("B",), ("B",))], "sharded twice over axis 'B'"),
])
def test_program_errors_at_build_time(key, value, message):
    fn = chain_program()
    if value is None:
        del fn.attributes[key]
    else:
        fn.attributes[key] = value
    with pytest.raises(ProgramError, match=message):
        build_callable(fn)
