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


def test_a_control_flow_op_evaluated_again_is_not_compiled_again():
    """The interpreters evaluate a loop's body ops once per iteration of an enclosing
    loop: a scan op run again on operands of the same types reuses its compilation."""
    import jax
    from jax import monitoring

    from partir.frontend import trace

    def f(x):
        return lax.scan(lambda c, _: (jnp.sin(c) * 2.0, None), x, None, length=4)[0]

    (scan,) = [o for o in trace(f, jnp.ones(3)).function.ops if o.name == "scan"]
    compiles = []

    def listen(event: str, duration: float, **kwargs: object) -> None:
        if event == "/jax/core/compile/backend_compile_duration":
            compiles.append(event)

    ones, twos = jnp.ones(3), jnp.asarray([2.0, 3.0, 4.0], jnp.float32)
    monitoring.register_event_duration_secs_listener(listen)
    try:
        first = evaluate(scan, [ones])
        n = len(compiles)
        again = evaluate(scan, [twos])
        assert len(compiles) == n, "the same scan op was compiled again"
    finally:
        monitoring.unregister_event_duration_listener(listen)
    np.testing.assert_allclose(again[0], f(twos), rtol=1e-6)
    np.testing.assert_allclose(first[0], jax.jit(f)(ones), rtol=1e-6)
