"""The Core interpreter's own checks, which it makes of values a traced run computes
(`partir.core.interpreter.checked`)."""

import numpy as np
import pytest

from partir.core.actions import ANY
from partir.core.dialect import make_loop, make_slice
from partir.core.interpreter import InterpreterError, interpret
from partir.ir import Function, RangeType, Value
from tests.listings import f32 as _t


def _any_loop(sliced: bool) -> Function:
    """loop "B" [any] over range<2> yielding the rB-th half of %x (sliced) or %x."""
    x = Value(_t(4), "x")
    r = Value(RangeType("B", 2), "rB")
    if sliced:
        half = Value(_t(2))
        body, yields, out = [make_slice(x, 0, r, half)], [half], Value(_t(2))
    else:
        body, yields, out = [], [x], Value(_t(4))
    return Function("f", [x], [make_loop("B", 2, (ANY,), body, yields, [out], r)], [out])


def test_an_any_loop_whose_iterations_differ_is_an_error():
    with pytest.raises(InterpreterError, match="`any` loop computed different values"):
        interpret(_any_loop(sliced=True), np.arange(4.0, dtype=np.float32))


def test_an_any_loop_whose_iterations_agree_gives_their_value():
    x = np.asarray([1.0, np.nan, 3.0, 4.0], np.float32)  # NaN equals NaN here
    (out,) = interpret(_any_loop(sliced=False), x)
    np.testing.assert_array_equal(out, x)
