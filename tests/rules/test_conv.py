"""conv_general_dilated's factor rule, checked by the TMR oracle: NHWC and NCHW convs,
strides, dilations, feature groups (depthwise included), batch groups, and the
transposed convs autodiff and ConvTranspose produce."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from jax import lax

from partir.core.tmr import OpView, lookup
from partir.rules import CATALOGUE, REDUCTION, REPLICATION
from tests.core.tmr.oracle import check_entry, check_op, random_operands, traced_ops

rng = np.random.default_rng(0)
NHWC = ("NHWC", "HWIO", "NHWC")
NCHW = ("NCHW", "OIHW", "NCHW")


def _normal(*shape):
    return rng.normal(size=shape).astype(np.float32)


def _conv(dn, strides=(1, 1), padding="SAME", groups=1, batch_groups=1, lhs_dilation=None,
          rhs_dilation=None):
    def f(x, w):
        return lax.conv_general_dilated(
            x, w, strides, padding, lhs_dilation=lhs_dilation, rhs_dilation=rhs_dilation,
            dimension_numbers=dn, feature_group_count=groups, batch_group_count=batch_groups)
    return f


def _mappings(fn, *args):
    (op,) = traced_ops(fn, "conv_general_dilated", *args)
    view = OpView.of(op)
    return [str(m) for m in lookup(op.name).mappings(view)]


def test_nhwc_conv_factors():
    x, w = _normal(8, 6, 6, 4), _normal(3, 3, 4, 8)
    fn = _conv(NHWC)
    # batch, output features, input features (#sum); spatial dims are not offered.
    assert _mappings(fn, x, w) == [
        "(#tile<0>, ⊥) -> #tile<0>", "(⊥, #tile<3>) -> #tile<3>",
        "(#tile<3>, #tile<2>) -> #sum"]
    (op,) = traced_ops(fn, "conv_general_dilated", x, w)
    view = OpView.of(op)
    rule = CATALOGUE["conv_general_dilated"].rule(view)
    assert [f.kind for f in rule.factors][2] == REDUCTION
    assert all(f.kind == REPLICATION for f in rule.factors[3:])
    # The FLOPs formula is XLA's: 2 * |out| * Cin * window.
    assert CATALOGUE["conv_general_dilated"].flops(view, rule) == 2 * 8 * 6 * 6 * 8 * 4 * 9


@pytest.mark.slow
@pytest.mark.parametrize("dn, x, w, kw", [
    (NHWC, (8, 6, 6, 4), (3, 3, 4, 8), {}),
    (NCHW, (8, 4, 6, 6), (8, 4, 3, 3), {}),
    (NHWC, (4, 9, 9, 4), (3, 3, 4, 8), {"strides": (2, 2), "padding": "VALID"}),
    (NCHW, (4, 4, 9, 9), (8, 4, 2, 2), {"rhs_dilation": (2, 2), "padding": ((1, 0), (2, 1))}),
    (NHWC, (4, 5, 5, 4), (3, 3, 4, 8), {"lhs_dilation": (2, 2), "padding": ((2, 2), (1, 2))}),
    (("NWC", "WIO", "NWC"), (8, 10, 4), (3, 4, 8), {"strides": (1,)}),
], ids=["nhwc", "nchw", "strided", "rhs_dilated", "lhs_dilated", "1d"])
def test_convs(dn, x, w, kw):
    kw = dict(kw)
    if dn[0] == "NWC":
        kw.setdefault("padding", "SAME")
    assert check_entry(_conv(dn, **kw), _normal(*x), _normal(*w), rtol=1e-4,
                       atol=1e-4) >= 12


@pytest.mark.parametrize("dn, x, w, groups", [
    (NHWC, (4, 6, 6, 8), (3, 3, 2, 16), 4),  # G=4, Cin/G=2, Cout/G=4
    (NCHW, (4, 8, 6, 6), (8, 1, 3, 3), 8),  # depthwise
    (NHWC, (4, 6, 6, 8), (3, 3, 1, 16), 8),  # depthwise, channel multiplier 2
    (NHWC, (4, 6, 6, 8), (3, 3, 4, 8), 2),  # G=2: an axis of 4 cannot slice G alone
], ids=["grouped", "depthwise_nchw", "depthwise_multiplier", "two_groups"])
def test_feature_groups(dn, x, w, groups):
    fn = _conv(dn, groups=groups)
    ms = _mappings(fn, _normal(*x), _normal(*w))
    f_in, f_out = dn[0].index("C"), dn[2].index("C")
    o_rhs = dn[1].index("O")
    # The group factor slices images, kernels and outputs on their feature dims.
    assert f"(#tile<{f_in}>, #tile<{o_rhs}>) -> #tile<{f_out}>" in ms
    assert check_entry(fn, _normal(*x), _normal(*w), rtol=1e-4, atol=1e-4) >= 8


def test_depthwise_local_group_count_follows_the_group_factor():
    x, w = _normal(4, 6, 6, 8), _normal(3, 3, 1, 8)
    (op,) = traced_ops(_conv(NHWC, groups=8), "conv_general_dilated", x, w)
    from partir.ir import TensorType
    f32 = np.dtype(np.float32)
    local = OpView(op.name, op.params, (TensorType((4, 6, 6, 2), f32),
                                        TensorType((3, 3, 1, 2), f32)),
                   (TensorType((4, 6, 6, 2), f32),))
    assert lookup(op.name).localize(local)["feature_group_count"] == 2


def test_batch_groups():
    # The kernel gradient of a grouped conv: batch_group_count = G.
    x, w = _normal(8, 6, 6, 4), _normal(3, 3, 4, 8)
    assert check_entry(_conv(NHWC, batch_groups=4), x, w, rtol=1e-4, atol=1e-4) >= 12


@pytest.mark.slow
@pytest.mark.parametrize("dn, x, w, kw", [
    (NHWC, (8, 6, 6, 4), (3, 3, 4, 8), {}),
    (NCHW, (8, 4, 9, 9), (8, 4, 3, 3), {"strides": (2, 2), "padding": "VALID"}),
    (NHWC, (4, 6, 6, 8), (3, 3, 2, 16), {"groups": 4}),
    (NHWC, (4, 6, 6, 8), (3, 3, 1, 8), {"groups": 8, "rhs_dilation": (2, 2)}),
], ids=["nhwc", "nchw_strided", "grouped", "depthwise_dilated"])
def test_gradient_convs(dn, x, w, kw):
    """Every conv of jax.grad (the lhs and rhs transposes, with other dimension numbers,
    lhs dilation and batch groups)."""
    x, w = _normal(*x), _normal(*w)
    fn = _conv(dn, **kw)
    grad = jax.grad(lambda a, b: (fn(a, b) ** 2).sum(), argnums=(0, 1))
    ops = traced_ops(grad, "conv_general_dilated", x, w)
    assert len(ops) == 3
    for op in ops:
        assert check_op(op, *random_operands(op, rng), rtol=1e-4, atol=1e-4) >= 6, op.params


def test_conv_transpose():
    x, w = _normal(4, 5, 5, 8), _normal(3, 3, 8, 4)

    def f(a, b):
        return lax.conv_transpose(a, b, (2, 2), "SAME", dimension_numbers=NHWC)

    (op,) = traced_ops(f, "conv_general_dilated", x, w)
    assert op.params["lhs_dilation"] == (2, 2)
    assert check_entry(f, x, w, rtol=1e-4, atol=1e-4) >= 12
