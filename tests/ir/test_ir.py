from __future__ import annotations

import pytest

from partir.core.actions import Tile
from partir.core.dialect import make_loop, make_slice
from partir.ir import (
    Function,
    Op,
    RangeType,
    Value,
    VerificationError,
    print_function,
    verify,
)
from tests.listings import f32 as _t


def test_printer_uses_the_paper_syntax():
    x = Value(_t(256, 8), "x")
    r = Value(RangeType("B", 4), "rB")
    s = Value(_t(64, 8))
    out = Value(_t(256, 8))
    loop = make_loop("B", 4, (Tile(0),), [make_slice(x, 0, r, s)], [s], [out], r)
    text = print_function(Function("f", [x], [loop], [out]))
    assert 'loop "B" [#tile<0>] (%rB: range<4>) {' in text
    assert "slice 0 %x[%rB] : tensor<64x8xf32>" in text
    assert "} : tensor<256x8xf32>" in text
    verify(Function("f", [x], [loop], [out]))


def test_verifier_rejects_use_before_definition():
    x = Value(_t(2), "x")
    y = Value(_t(2))
    z = Value(_t(2))
    ops = [Op("neg", [y], [z]), Op("neg", [x], [y])]
    with pytest.raises(VerificationError, match="before its definition"):
        verify(Function("f", [x], ops, [z]))


def test_verifier_rejects_range_escaping_its_loop():
    x = Value(_t(8), "x")
    r = Value(RangeType("B", 2), "rB")
    s = Value(_t(4))
    out = Value(_t(8))
    loop = make_loop("B", 2, (Tile(0),), [make_slice(x, 0, r, s)], [s], [out], r)
    leak = Value(_t(4))
    with pytest.raises(VerificationError):
        verify(Function("f", [x], [loop, make_slice(x, 0, r, leak)], [out]))


def test_verifier_checks_slice_and_loop_types():
    x = Value(_t(8, 3), "x")
    r = Value(RangeType("B", 2), "rB")
    bad = Value(_t(8, 3))
    with pytest.raises(VerificationError, match="should be tensor<4x3xf32>"):
        verify(Function("f", [x, r], [make_slice(x, 0, r, bad)], [bad]))
    s = Value(_t(4, 3))
    out = Value(_t(4, 3))  # a #tile<0> loop must return 8x3
    loop = make_loop("B", 2, (Tile(0),), [make_slice(x, 0, r, s)], [s], [out], r)
    with pytest.raises(VerificationError, match="does not match"):
        verify(Function("f", [x], [loop], [out]))
