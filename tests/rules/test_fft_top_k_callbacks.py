"""approx_top_k and fft tile their untouched dims (TMR oracle); host callbacks and foreign
function calls have no rule, so propagation reports them as unsupported, by name."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import partir
from partir.core.tmr import OpView, lookup
from partir.rules import CATALOGUE
from tests.core.tmr.oracle import check_entry, traced_ops

rng = np.random.default_rng(0)
# distinct values: ties would make the indices depend on the evaluation order
X = rng.permutation(4 * 8 * 16).astype(np.float32).reshape(4, 8, 16)


def _mappings(fn, name, *args):
    (op,) = traced_ops(fn, name, *args)
    view = OpView.of(op)
    return [str(m) for m in lookup(op.name).mappings(view)]


@pytest.mark.slow
@pytest.mark.parametrize("fn, kept", [
    (lambda a: tuple(lax.approx_max_k(a, 3)), (0, 1)),
    (lambda a: tuple(lax.approx_min_k(a, 3, reduction_dimension=1)), (0, 2)),
    (lambda a: tuple(lax.approx_max_k(a, 2, reduction_dimension=0,
                                      aggregate_to_topk=False)), (1, 2)),
], ids=["max_last", "min_middle", "max_first_unaggregated"])
def test_approx_top_k(fn, kept):
    assert _mappings(fn, "approx_top_k", X) == [
        f"(#tile<{d}>) -> #tile<{d}>, #tile<{d}>" for d in kept]
    assert check_entry(fn, X) >= 10


@pytest.mark.parametrize("fn, x, lead", [
    (lambda a: jnp.fft.fft(a, axis=-1), X.astype(np.complex64), 2),
    (lambda a: jnp.fft.ifft2(a), X.astype(np.complex64), 1),
    (lambda a: jnp.fft.rfft(a), X, 2),
    (lambda a: jnp.fft.irfft(a), X.astype(np.complex64), 2),
], ids=["fft", "ifft2", "rfft", "irfft"])
def test_fft_tiles_its_batch_dims(fn, x, lead):
    assert _mappings(fn, "fft", x) == [f"(#tile<{d}>) -> #tile<{d}>" for d in range(lead)]
    assert check_entry(fn, x, rtol=1e-3, atol=1e-2) >= 3


def test_fft_flops():
    (op,) = traced_ops(lambda a: jnp.fft.fft(a), "fft", X.astype(np.complex64))
    view = OpView.of(op)
    prim = CATALOGUE["fft"]
    assert prim.flops(view, prim.rule(view)) == 5 * 32 * 16 * 4


def _callback(x):
    return jax.pure_callback(np.sin, jax.ShapeDtypeStruct(x.shape, x.dtype), x)


def _io_callback(x):
    from jax.experimental import io_callback
    return io_callback(np.sin, jax.ShapeDtypeStruct(x.shape, x.dtype), x)


def _ffi(x):
    return jax.ffi.ffi_call("partir_test_target", jax.ShapeDtypeStruct(x.shape, x.dtype))(x)


@pytest.mark.parametrize("callback, name", [
    (_callback, "pure_callback"), (_io_callback, "io_callback"), (_ffi, "ffi_call")])
def test_opaque_calls_are_unsupported_conflicts(callback, name):
    assert lookup(name) is None

    def f(x, w):
        return callback(jnp.tanh(x @ w))

    x, w = X[0], rng.normal(size=(16, 4)).astype(np.float32)
    r = partir.core_partition(f, partir.Mesh({"batch": 4}),
                              [partir.ManualPartition({"x": 0}, axis="batch")], x, w)
    (c,) = r.unsupported
    assert (c.kind, c.op, c.axis) == ("unsupported", name, "batch")
    assert name in str(c)
    # Propagation reached the op: its operand's producer is sliced.
    (tanh,) = [op for op in r.program.ops if op.name == "tanh"]
    assert r.program.nest(tanh) != ()
