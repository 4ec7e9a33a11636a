"""The one evaluator of primitive ops that the Core and PartIR:HLO interpreters and the
runtime share."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from partir.errors import ProgramError
from partir.ir import Location, Op, Value
from partir.ir.evaluate import evaluate
from partir.ir.opnames import CONSTANT, TAG
from tests.listings import f32 as _t


def test_a_primitive_is_bound_without_partirs_private_params():
    x = jnp.arange(6.0).reshape(2, 3)
    # transpose's shape rule takes no other keyword (some primitives ignore extra ones)
    op = Op("transpose", [Value(_t(2, 3))], [Value(_t(3, 2))],
            {"permutation": (1, 0), "_note": "for the passes"}, prim=lax.transpose_p)
    (out,) = evaluate(op, [x])
    np.testing.assert_array_equal(out, x.T)


def test_multiple_results_tags_and_constants():
    x = jnp.arange(4.0)
    split = Op("split", [Value(_t(4))], [Value(_t(1)), Value(_t(3))],
               {"sizes": (1, 3), "axis": 0}, prim=lax.split_p)
    assert [o.shape for o in evaluate(split, [x])] == [(1,), (3,)]
    assert evaluate(Op(TAG, [Value(_t(4))], [Value(_t(4))], {"name": "h"}), [x])[0] is x
    const = Op(CONSTANT, [], [Value(_t(2))], {"value": np.ones(2, np.float32)})
    np.testing.assert_array_equal(evaluate(const, [])[0], [1.0, 1.0])


def test_an_op_that_is_no_primitive_is_a_program_error_at_its_line():
    op = Op("core.frobnicate", [Value(_t(4))], [Value(_t(4))], loc=Location("model.py", 7))
    with pytest.raises(ProgramError, match=r"'core.frobnicate' is neither .* model.py:7"):
        evaluate(op, [jnp.zeros(4)])
