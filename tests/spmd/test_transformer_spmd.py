"""The transformer example on PartIR:SPMD: the lowering of an Adam training step
partitioned with the paper's full schedule verifies and computes the original results."""

import jax
import pytest

from examples.transformer import model, schedules
from partir.core.materialize import materialize
from partir.ir import verify
from partir.spmd import interpret_spmd, lower_core_to_spmd
from tests.examples.test_transformer_core import partition
from tests.oracles import assert_tree_close


@pytest.mark.slow
def test_bp_mp_z3_emb_lowering_preserves_results():
    res = partition(("BP", "MP", "Z3", "EMB"))
    spmd = lower_core_to_spmd(materialize(res.program), schedules.MESH)
    verify(spmd)
    inputs = model.make_inputs(model.TINY)
    outs = interpret_spmd(spmd, *res.flatten_args(*inputs))
    assert_tree_close(jax.tree_util.tree_unflatten(res.traced.out_tree, outs),
                      jax.jit(model.train_step)(*inputs))
