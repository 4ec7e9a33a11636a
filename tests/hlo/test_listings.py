"""Golden tests: the paper's PartIR:HLO listings (sections 2 and 6), up to value names and
whitespace.

Each expected listing is the paper's text with these edits only:
- the function signature carries the attributes our functions have: the mesh and, per
  argument and result, the sharding of its device-local tensor (`in_shardings`,
  `out_shardings`, `[{}, {}]` for a replicated matrix); the paper elides them ("...") or
  shows the mesh only;
- primitive ops other than `matmul` print in the shared IR printer's generic form,
  `add(%a, %b)` (the paper writes `add %a %b`), and `// comments` are dropped;
- axes are separated by `, ` (the paper writes both `[{"B"},{}]` and `[{"B"}, {}]`);
- in lst:core-lowering the second loop nest slices %x (the paper's `%s` is a typo: %s is
  the loop's own result);
- the matmul chain of section 2 is traced from `main` as in the paper, so that the
  function is `@main`.
"""

from __future__ import annotations

import jax
import numpy as np
import pytest
from jax import lax

import partir
from partir.core.actions import Sum, Tile
from partir.core.dialect import make_loop, make_slice
from partir.core.interpreter import interpret
from partir.core.materialize import materialize
from partir.hlo import (
    count_collectives,
    interpret_hlo,
    lower_spmd_to_hlo,
    optimize,
    print_hlo,
    verify_hlo,
)
from partir.hlo.ops import (
    make_all_gather,
    make_all_reduce,
    make_all_slice,
    make_all_to_all,
    make_reduce_scatter,
)
from partir.ir import Function, Op, RangeType, Value, verify
from partir.ir.printer import Printer
from partir.mesh import Mesh
from partir.spmd import lower_core_to_spmd
from tests.examples import counts
from tests.listings import F32, same_listing
from tests.listings import f32 as _t
from tests.listings import matmul_op as _matmul

MESH = Mesh({"B": 4, "M": 2})


# --- section 6: lst:core-lowering -> lst:core-lowering-mhlo(-optimized) ---------------------


def core_lowering() -> Function:
    """lst:core-lowering, built op by op: two loop nests, the second adding %x to the
    result of the first."""
    x, w1, w2 = Value(_t(256, 8), "x"), Value(_t(8, 16), "w1"), Value(_t(16, 8), "w2")
    rb, rm, rb2 = Value(RangeType("B", 4), "rB"), Value(RangeType("M", 2), "rM"), \
        Value(RangeType("B", 4), "rB")
    xs, w1s, w2s = Value(_t(64, 8), "xs"), Value(_t(8, 8), "w1s"), Value(_t(8, 8), "w2s")
    x1ss = _matmul(xs, w1s, "x1ss")
    x2ss = _matmul(x1ss.results[0], w2s, "x2ss")
    x2s, r = Value(_t(64, 8), "x2s"), Value(_t(256, 8), "r")
    inner = make_loop("M", 2, (Sum(),), [make_slice(x, 0, rb, xs), make_slice(w1, 1, rm, w1s),
                                         x1ss, make_slice(w2, 0, rm, w2s), x2ss],
                      x2ss.results, [x2s], rm)
    first = make_loop("B", 4, (Tile(0),), [inner], [x2s], [r], rb)
    rs, xs2, w, s = (Value(_t(64, 8), "rs"), Value(_t(64, 8), "xs"), Value(_t(64, 8), "w"),
                     Value(_t(256, 8), "s"))
    add = Op("add", [rs, xs2], [w], prim=lax.add_p)
    second = make_loop("B", 4, (Tile(0),), [make_slice(r, 0, rb2, rs),
                                            make_slice(x, 0, rb2, xs2), add], [w], [s], rb2)
    return Function("f", [x, w1, w2], [first, second], [s], ["s"], {"mesh": MESH})


CORE_LOWERING_MHLO = """\
func @f(%x: tensor<256x8xf32>,
        %w1: tensor<8x16xf32>,
        %w2: tensor<16x8xf32>) attributes {mesh={"B":4, "M":2},
        in_shardings=[[{}, {}], [{}, {}], [{}, {}]], out_shardings=[[{}, {}]]} {
  %xs1 = all_slice [{"B"}, {}] %x : tensor<64x8xf32>
  %w1s = all_slice [{}, {"M"}] %w1 : tensor<8x8xf32>
  %x1ss = matmul(%xs1, %w1s) : tensor<64x8xf32>
  %w2s = all_slice [{"M"}, {}] %w2 : tensor<8x8xf32>
  %x2ss = matmul(%x1ss, %w2s) : tensor<64x8xf32>
  %x2s = all_reduce <"M"> %x2ss : tensor<64x8xf32>
  %r = all_gather [{"B"}, {}] %x2s : tensor<256x8xf32>
  %rs = all_slice [{"B"}, {}] %r : tensor<64x8xf32>
  %xs2 = all_slice [{"B"}, {}] %x : tensor<64x8xf32>
  %w = add(%rs, %xs2) : tensor<64x8xf32>
  %s = all_gather [{"B"}, {}] %w : tensor<256x8xf32>
  return %s : tensor<256x8xf32>
}"""

CORE_LOWERING_MHLO_OPTIMIZED = """\
func @f(%xs: tensor<64x8xf32>,
        %w1s: tensor<8x8xf32>,
        %w2s: tensor<8x8xf32>) attributes {mesh={"B":4, "M":2},
        in_shardings=[[{"B"}, {}], [{}, {"M"}], [{"M"}, {}]], out_shardings=[[{"B"}, {}]]} {
  %x1ss = matmul(%xs, %w1s) : tensor<64x8xf32>
  %x2ss = matmul(%x1ss, %w2s) : tensor<64x8xf32>
  %x2s = all_reduce <"M"> %x2ss : tensor<64x8xf32>
  %w = add(%x2s, %xs) : tensor<64x8xf32>
  return %w : tensor<64x8xf32>
}"""


def _inputs(types, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.normal(size=t.shape).astype(F32) for t in types]


def test_core_lowering_to_hlo():
    core = core_lowering()
    verify(core, check_primitives=True)
    hlo = lower_spmd_to_hlo(lower_core_to_spmd(core, MESH))
    verify_hlo(hlo, check_primitives=True)
    assert same_listing(print_hlo(hlo), CORE_LOWERING_MHLO), print_hlo(hlo)


def test_core_lowering_optimized():
    hlo = lower_spmd_to_hlo(lower_core_to_spmd(core_lowering(), MESH))
    before = print_hlo(hlo)
    opt = optimize(hlo)
    assert print_hlo(hlo) == before, "optimize changed its input"
    verify_hlo(opt, check_primitives=True)
    assert same_listing(print_hlo(opt), CORE_LOWERING_MHLO_OPTIMIZED), print_hlo(opt)


def test_core_lowering_computes_the_program():
    core = core_lowering()
    args = _inputs([a.type for a in core.args])
    x, w1, w2 = args
    want = (x @ w1) @ w2 + x
    np.testing.assert_allclose(interpret(core, *args)[0], want, rtol=1e-4, atol=1e-4)
    hlo = lower_spmd_to_hlo(lower_core_to_spmd(core, MESH))
    for fn in (hlo, optimize(hlo)):
        np.testing.assert_allclose(interpret_hlo(fn, *args)[0], want, rtol=1e-4, atol=1e-4)


# --- section 2: the matmul chain under BP, BP+MP, BP+MP+Z3 and ES ---------------------------

DATA_PARALLEL_CHAIN = """\
func @main(%x: tensor<64x8xf32>,
           %w1: tensor<8x16xf32>,
           %w2: tensor<16x8xf32>)
     attributes {mesh={"B":4, "M":2},
     in_shardings=[[{"B"}, {}], [{}, {}], [{}, {}]], out_shardings=[[{"B"}, {}]]} {
  %x1 = matmul(%x, %w1) : tensor<64x16xf32>
  %x2 = matmul(%x1, %w2) : tensor<64x8xf32>
  return %x2 : tensor<64x8xf32>
}"""

PARTITIONED_CHAIN = """\
func @main(%x: tensor<64x8xf32>,
           %w1: tensor<8x8xf32>,
           %w2: tensor<8x8xf32>) attributes {mesh={"B":4, "M":2},
     in_shardings=[[{"B"}, {}], [{}, {"M"}], [{"M"}, {}]], out_shardings=[[{"B"}, {}]]} {
  %x1 = matmul(%x, %w1) : tensor<64x8xf32>
  %x2 = matmul(%x1, %w2) : tensor<64x8xf32>
  %x3 = all_reduce <"M"> %x2 : tensor<64x8xf32>
  return %x3 : tensor<64x8xf32> }"""

FSDP_CHAIN = """\
func @main(%x: tensor<64x8xf32>,
           %w1: tensor<2x8xf32>,
           %w2: tensor<8x2xf32>)
     attributes {mesh={"B":4, "M":2},
     in_shardings=[[{"B"}, {}], [{"B"}, {"M"}], [{"M"}, {"B"}]], out_shardings=[[{"B"}, {}]]} {
  %w1g = all_gather [{"B"}, {}] %w1 : tensor<8x8xf32>
  %x1 = matmul(%x, %w1g) : tensor<64x8xf32>
  %w2g = all_gather [{}, {"B"}] %w2 : tensor<8x8xf32>
  %x2 = matmul(%x1, %w2g) : tensor<64x8xf32>
  %x3 = all_reduce <"M"> %x2 : tensor<64x8xf32>
  return %x3 : tensor<64x8xf32> }"""

# ES (the paper omits the code): x and the output are also sharded on "M", their dim 1.
# The sum over "M" that the output is sliced by becomes a reduce_scatter, and the first
# matmul, which needs all of x's features, gathers them.
ES_CHAIN = """\
func @main_tagged(%x: tensor<64x4xf32>,
           %w1: tensor<2x8xf32>,
           %w2: tensor<8x2xf32>)
     attributes {mesh={"B":4, "M":2},
     in_shardings=[[{"B"}, {"M"}], [{"B"}, {"M"}], [{"M"}, {"B"}]],
     out_shardings=[[{"B"}, {"M"}]]} {
  %xg = all_gather [{}, {"M"}] %x : tensor<64x8xf32>
  %w1g = all_gather [{"B"}, {}] %w1 : tensor<8x8xf32>
  %x1 = matmul(%xg, %w1g) : tensor<64x8xf32>
  %w2g = all_gather [{}, {"B"}] %w2 : tensor<8x8xf32>
  %x2 = matmul(%x1, %w2g) : tensor<64x8xf32>
  %x3 = reduce_scatter [{}, {"M"}] %x2 : tensor<64x4xf32>
  %y = tag "y" %x3 : tensor<64x4xf32>
  return %y : tensor<64x4xf32>
}"""

BP = partir.ManualPartition({"x": 0}, axis="B", name="BP")
MP = partir.ManualPartition({"w1": 1}, axis="M", name="MP")
Z3 = partir.ManualPartition({"w1": 0, "w2": 1}, axis="B", name="Z3")
ES = partir.ManualPartition({"x": 1, "y": 1}, axis="M", name="ES")
CHAIN_ARGS = (jax.ShapeDtypeStruct((256, 8), F32), jax.ShapeDtypeStruct((8, 16), F32),
              jax.ShapeDtypeStruct((16, 8), F32))


def main(x, w1, w2):
    return (x @ w1) @ w2


def main_tagged(x, w1, w2):
    return partir.tag(main(x, w1, w2), "y")


def chain_hlo(fn, schedule):
    """The optimized PartIR:HLO program of fn under the schedule, checked to compute fn."""
    r = partir.core_partition(fn, MESH, schedule, *CHAIN_ARGS)
    hlo = optimize(lower_spmd_to_hlo(lower_core_to_spmd(materialize(r.program), MESH)))
    verify_hlo(hlo, check_primitives=True)
    args = _inputs(CHAIN_ARGS, seed=3)
    np.testing.assert_allclose(interpret_hlo(hlo, *args)[0], fn(*args), rtol=1e-4, atol=1e-4)
    return hlo


CHAIN_CASES = {
    "BP": (main, [BP], DATA_PARALLEL_CHAIN, {}),
    "BP+MP": (main, [BP, MP], PARTITIONED_CHAIN, {"all_reduce": 1}),
    "BP+MP+Z3": (main, [BP, MP, Z3], FSDP_CHAIN, {"all_gather": 2, "all_reduce": 1}),
    "BP+MP+Z3+ES": (main_tagged, [BP, MP, Z3, ES], ES_CHAIN,
                    {"all_gather": 3, "reduce_scatter": 1}),
}


@pytest.mark.parametrize("name", list(CHAIN_CASES))
def test_matmul_chain(name):
    fn, schedule, listing, collectives = CHAIN_CASES[name]
    hlo = chain_hlo(fn, schedule)
    assert same_listing(print_hlo(hlo), listing), print_hlo(hlo)
    assert count_collectives(hlo) == {**counts(), **collectives}


# --- lst:mhlo-collectives ------------------------------------------------------------------

COLLECTIVES_MESH = Mesh({"x1": 2, "x2": 4, "x3": 8})

# The listing's lines with `<@red_fn>` read as addition, which prints without a reduction
# (like #sum), and `{{"x1, "x3"}}` (a typo) as {"x1", "x3"}.
COLLECTIVES = [
    ('%rst = all_reduce <"x1", "x2"> %operand : tensor<16x5x40xf32> -> tensor<16x5x40xf32>',
     lambda x: make_all_reduce(x, ("x1", "x2"), name="rst")),
    ('%rst = all_slice [{"x1"}, {}, {"x2"}] %operand : tensor<16x5x40xf32> '
     "-> tensor<8x5x10xf32>",
     lambda x: make_all_slice(x, (("x1",), (), ("x2",)), COLLECTIVES_MESH, "rst")),
    ('%rst = all_slice [{"x1", "x3"}, {}, {"x2"}] %operand : tensor<16x5x40xf32> '
     "-> tensor<1x5x10xf32>",
     lambda x: make_all_slice(x, (("x1", "x3"), (), ("x2",)), COLLECTIVES_MESH, "rst")),
    ('%rst = all_gather [{"x1"}, {"x3"}, {}] %operand : tensor<8x10x16xf32> '
     "-> tensor<16x80x16xf32>",
     lambda x: make_all_gather(x, (("x1",), ("x3",), ()), COLLECTIVES_MESH, "rst")),
    ('%rst = reduce_scatter [{"x1"}, {}, {"x2"}] %operand : tensor<16x5x40xf32> '
     "-> tensor<8x5x10xf32>",
     lambda x: make_reduce_scatter(x, (("x1",), (), ("x2",)), COLLECTIVES_MESH, name="rst")),
    ('%rst = all_to_all {0 -> 1} <"x1", "x2"> %operand : tensor<16x32xf32> '
     "-> tensor<128x4xf32>",
     lambda x: make_all_to_all(x, 1, 0, ("x1", "x2"), COLLECTIVES_MESH, "rst")),
]


@pytest.mark.parametrize("line, make", COLLECTIVES, ids=[c[0].split()[2] + str(i)
                                                         for i, c in enumerate(COLLECTIVES)])
def test_collectives_listing(line, make):
    """Each collective of lst:mhlo-collectives has the listed result type and prints as
    listed. Ops print their result type only (as in every other listing of the paper);
    this listing also shows the operand type, which is checked separately."""
    text, types = line.split(" : ")
    operand_type, result_type = types.split(" -> ")
    shape = tuple(int(n) for n in operand_type[len("tensor<"):-len("xf32>")].split("x"))
    op = make(Value(_t(*shape), "operand"))
    assert str(op.operands[0].type) == operand_type
    p = Printer()
    p.print_op(op, 0)
    assert p.lines == [f"{text} : {result_type}"]
    fn = Function("f", op.operands, [op], op.results, attributes={
        "mesh": COLLECTIVES_MESH, "in_shardings": (((),) * len(shape),),
        "out_shardings": (((),) * op.results[0].type.rank,)})
    verify_hlo(fn)
