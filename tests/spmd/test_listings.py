"""Golden tests: the paper's PartIR:SPMD listings (App. C), up to value names and layout.

Each expected listing is the paper's text with these edits only, all of syntax the paper
writes two ways or that the shared IR printer fixes:
- the function signature has no `-> type` and ends in `return` rather than `yield`, and
  the mesh attribute reads `mesh={...}` (the IR printer's function syntax, as in the Core
  golden listings);
- a single stacked axis is braced like several, `dtensor<{"a"}, ...>` (the paper also
  writes `dtensor<"a", ...>`), and dimensions are separated by `,` without a space (the
  paper writes both);
- the second execute's range is `%ra2`: the paper reuses `%ra` in a sibling region,
  while our value names are unique in a function;
- the execute example binds `add(...)` with a let before yielding it: the paper's
  grammar yields variables, and so does the IR.
Listings are compared with whitespace runs collapsed, so alignment does not matter.
"""

from __future__ import annotations

import numpy as np
from jax import lax

from partir.core.actions import Sum, Tile
from partir.core.dialect import make_loop, make_slice
from partir.core.interpreter import interpret
from partir.ir import Function, Op, RangeType, Value, print_function, verify
from partir.ir.printer import Printer
from partir.mesh import Mesh
from partir.spmd import DTensorType, interpret_spmd, lower_core_to_spmd
from partir.spmd.ops import make_execute
from tests.listings import F32, same_listing
from tests.listings import f32 as _t
from tests.listings import matmul_op as _matmul

MESH = Mesh({"a": 4, "b": 2})

SPMD_TILED_CHAIN_MATMUL = """\
func @main(%x: dtensor<{}, [256,8]>, %w1: dtensor<{}, [8,16]>, %w2: dtensor<{}, [16,8]>)
  attributes {mesh={"a":4, "b":2}} {
    %x1s0 = spmd.execute "a"
                (%x: dtensor<{}, [256,8]>, %w1: dtensor<{}, [8,16]>)
                (%ra: range<4>, %yx: tensor<256x8xf32>, %yw1: tensor<8x16xf32>) {
        %xs  = slice 0 %yx[%ra]   : tensor<64x8xf32>
        %x1s = matmul(%xs,  %yw1) : tensor<64x16xf32>
        yield %x1s : tensor<64x16xf32>
    } : dtensor<{"a"}, [64,16]>
    %x2s0 = spmd.execute "a" "b"
                (%x1s0: dtensor<{"a"}, [64,16]>, %w2: dtensor<{}, [16,8]>)
                (%ra2: range<4>, %rb: range<2>, %yx1s0: tensor<64x16xf32>,
                 %yw2: tensor<16x8xf32>) {
        %x1ss = slice 1 %yx1s0[%rb] : tensor<64x8xf32>
        %w2s  = slice 0 %yw2[%rb]   : tensor<8x8xf32>
        %x2ss = matmul(%x1ss, %w2s) : tensor<64x8xf32>
        yield %x2ss : tensor<64x8xf32>
    } : dtensor<{"a","b"}, [64,8]>
    %x2s1 = spmd.tile_reduce [#sum<"b">] %x2s0     : dtensor<{"a"}, [64,8]>
    %x2s2 = spmd.tile_reduce [#tile<"a", 0>] %x2s1 : dtensor<{}, [{"a"}256,8]>
    %x2s3 = spmd.redistribute %x2s2 -> dtensor<{}, [256,8]>
    return %x2s3 : dtensor<{}, [256,8]>
}"""

EXECUTE_EXAMPLE = """\
%r = spmd.execute "a" "b"
        (%x1: dtensor<{}, [{"a"}256,{"b"}8]>, %x2: dtensor<{}, [{"a"}256,{"b"}8]>)
        (%ra: range<4>, %rb: range<2>, %y1: tensor<64x4xf32>, %y2: tensor<64x4xf32>) {
  %s = add(%y1, %y2) : tensor<64x4xf32>
  yield %s : tensor<64x4xf32>
} : dtensor<{"a","b"}, [64,4]>"""


def core_tiled_chain_matmul() -> Function:
    """lst:Core-tiled-chain-matmul, built op by op (our materializer would fuse the two
    matmuls into the inner loop instead)."""
    x, w1, w2 = Value(_t(256, 8), "x"), Value(_t(8, 16), "w1"), Value(_t(16, 8), "w2")
    ra, rb = Value(RangeType("a", 4), "ra"), Value(RangeType("b", 2), "rb")
    xs, x1ss, w2s = Value(_t(64, 8), "xs"), Value(_t(64, 8), "x1ss"), Value(_t(8, 8), "w2s")
    x1s = _matmul(xs, w1, "x1s")
    x2ss = _matmul(x1ss, w2s, "x2ss")
    x2s, r = Value(_t(64, 8), "x2s"), Value(_t(256, 8), "r")
    inner = make_loop("b", 2, (Sum(),), [make_slice(x1s.results[0], 1, rb, x1ss),
                                         make_slice(w2, 0, rb, w2s), x2ss],
                      x2ss.results, [x2s], rb)
    outer = make_loop("a", 4, (Tile(0),), [make_slice(x, 0, ra, xs), x1s, inner], [x2s], [r],
                      ra)
    return Function("main", [x, w1, w2], [outer], [r], ["r"], {"mesh": MESH})


def test_core_to_spmd_listing():
    core = core_tiled_chain_matmul()
    verify(core, check_primitives=True)
    spmd = lower_core_to_spmd(core, MESH)
    verify(spmd)
    assert same_listing(print_function(spmd), SPMD_TILED_CHAIN_MATMUL), print_function(spmd)


def test_core_to_spmd_listing_computes_the_chain():
    rng = np.random.default_rng(0)
    args = [rng.normal(size=a.type.shape).astype(np.float32)
            for a in core_tiled_chain_matmul().args]
    want = (args[0] @ args[1]) @ args[2]
    core = core_tiled_chain_matmul()
    before = print_function(core)
    (got,) = interpret_spmd(lower_core_to_spmd(core, MESH), *args)
    assert print_function(core) == before, "the lowering changed its input"
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(interpret(core, *args)[0], want, rtol=1e-4, atol=1e-4)


def _execute_example() -> tuple[Op, list[Value]]:
    distributed = DTensorType((), ((("a",), 256), (("b",), 8)), F32)
    x1, x2 = Value(distributed, "x1"), Value(distributed, "x2")
    ra, rb = Value(RangeType("a", 4), "ra"), Value(RangeType("b", 2), "rb")
    y1, y2 = Value(_t(64, 4), "y1"), Value(_t(64, 4), "y2")
    s = Value(_t(64, 4), "s")
    add = Op("add", [y1, y2], [s], prim=lax.add_p)
    r = Value(DTensorType(("a", "b"), (((), 64), ((), 4)), F32), "r")
    return make_execute(("a", "b"), MESH, [x1, x2], [ra, rb], [y1, y2], [add], [s], [r]), [x1, x2]


def test_execute_example_prints_as_in_the_paper():
    op, args = _execute_example()
    p = Printer()
    p.print_op(op, 0)
    assert same_listing("\n".join(p.lines), EXECUTE_EXAMPLE), "\n".join(p.lines)
    verify(Function("add", args, [op], op.results, attributes={"mesh": MESH}))
