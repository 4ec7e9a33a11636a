"""`CoreOp.signature`: the number propagation and materialize key their memos by. Equal
for ops equal in name, parameters and types (the ops of repeated layers), different
otherwise, and never reused when the table is cleared: a shared number is a shared
decision, so two different ops must never get one."""

import jax
import jax.numpy as jnp
import numpy as np

from partir.core import program
from partir.core.module import CoreModule
from partir.frontend import trace
from partir.ir.opnames import CONSTANT
from partir.mesh import Mesh


def _layers(x, w1, w2):
    # Two identical layers and one whose matmul contracts another shape.
    for w in (w1, w1):
        x = jnp.tanh(x @ w)
    return x @ w2


def _ops():
    args = (jax.ShapeDtypeStruct((8, 16), jnp.float32),
            jax.ShapeDtypeStruct((16, 16), jnp.float32),
            jax.ShapeDtypeStruct((16, 4), jnp.float32))
    return CoreModule(trace(_layers, *args), Mesh({"a": 2})).ops


def test_repeated_layers_share_a_signature_and_different_ops_do_not():
    ops = _ops()
    dots = [op for op in ops if op.name == "dot_general"]
    tanhs = [op for op in ops if op.name == "tanh"]
    assert len(dots) == 3 and len(tanhs) == 2
    assert dots[0].signature == dots[1].signature
    assert tanhs[0].signature == tanhs[1].signature
    # Another result type (8x4, not 8x16), and another primitive.
    assert dots[2].signature != dots[0].signature
    assert tanhs[0].signature != dots[0].signature


def test_unhashable_parameters_have_no_signature():
    ops = _ops()
    op = program.CoreOp(-1, CONSTANT, (), ops[0].results, {"value": np.zeros(3)},
                        ops[0].loc)
    assert op.signature is None


def test_a_cleared_table_gives_new_numbers_never_old_ones(monkeypatch):
    monkeypatch.setattr(program, "_SIGNATURES", {})
    before = {op.signature for op in _ops()} - {None}
    program._SIGNATURES.clear()
    after = {op.signature for op in _ops()} - {None}
    # The same program again, after the clear: equal ops share numbers among themselves
    # as before, but no number of the first is given to an op of the second.
    assert len(before) == len(after)
    assert before.isdisjoint(after)
