"""The MLP schedule files of `examples/mlp` executed with `partir.jit` on 8 CPU devices:
each computes what the unpartitioned function computes, and after each tactic the
program holds the collectives section 2 of the PartIR paper derives for the matmul chain
`(x @ w1) @ w2` on the mesh {B: 4, M: 2}:

- batch parallelism (BP): a pure map over x's batch dimension, no collective;
- + model parallelism (MP, Megatron): w1's columns and w2's rows over M, both operands of
  the second matmul are split on the contracting dimension, so one `all_reduce <"M">`;
- + fully sharded parameters (Z3, FSDP): w1 and w2 also split over B, on the dimensions
  MP left whole, each gathered before its matmul: two `all_gather`s and the all_reduce;
- + ES: x and the output split over M too; the all_reduce becomes a `reduce_scatter` and
  x is gathered (an `all_gather` of x) before the first matmul.

The schedule files are loaded as the CLI loads them (`load_schedule_file`), with the
concrete example arguments of `examples/mlp/model.py`.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path

import jax
import pytest

import partir
from partir.schedule_file import load_schedule_file
from tests.examples import counts as collective_counts
from tests.oracles import assert_same

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "mlp"
SCHEDULE_FILES = sorted(p.name for p in EXAMPLES.glob("*.partir.py"))
P = jax.sharding.PartitionSpec


def counts(all_gather: int = 0, all_reduce: int = 0, reduce_scatter: int = 0) -> dict:
    return collective_counts(all_gather, all_reduce, reduce_scatter)


NONE = counts()
BP_MP = counts(all_reduce=1)
BP_MP_Z3 = counts(all_gather=2, all_reduce=1)
BP_MP_Z3_ES = counts(all_gather=3, reduce_scatter=1)

# Per schedule file: the collectives of the program after each tactic (cumulative, as
# Metadata reports them), the collectives of the final PartIR:HLO program in program order
# (op, sharding or axes, operand), the device-local types of x, w1, w2 and the in/out
# PartitionSpecs.
EXPECTED = {
    "bp.partir.py": dict(
        tactics={"BP": NONE},
        ops=[],
        local={"x": "64x8", "w1": "8x16", "w2": "16x8"},
        in_specs=(P("batch", None), P(None, None), P(None, None)),
        out_specs=(P("batch", None),)),
    "bp_mp.partir.py": dict(
        tactics={"BP": NONE, "MP": BP_MP},
        ops=[("all_reduce", '<"model">', None)],
        local={"x": "64x8", "w1": "8x8", "w2": "8x8"},
        in_specs=(P("batch", None), P(None, "model"), P("model", None)),
        out_specs=(P("batch", None),)),
    "bp_mp_z3.partir.py": dict(
        tactics={"BP": NONE, "MP": BP_MP, "Z3": BP_MP_Z3},
        ops=[("all_gather", '[{"batch"}, {}]', "w1"),
             ("all_gather", '[{}, {"batch"}]', "w2"),
             ("all_reduce", '<"model">', None)],
        local={"x": "64x8", "w1": "2x8", "w2": "8x2"},
        in_specs=(P("batch", None), P("batch", "model"), P("model", "batch")),
        out_specs=(P("batch", None),)),
    "es.partir.py": dict(
        tactics={"BP": NONE, "MP": BP_MP, "Z3": BP_MP_Z3, "ES": BP_MP_Z3_ES},
        ops=[("all_gather", '[{}, {"model"}]', "x"),
             ("all_gather", '[{"batch"}, {}]', "w1"),
             ("all_gather", '[{}, {"batch"}]', "w2"),
             ("reduce_scatter", '[{}, {"model"}]', None)],
        local={"x": "64x4", "w1": "2x8", "w2": "8x2"},
        in_specs=(P("batch", "model"), P("batch", "model"), P("model", "batch")),
        out_specs=(P("batch", "model"),)),
}

COLLECTIVE_OP = re.compile(
    r"^\s*%(?P<result>\S+) = (?P<op>all_gather|all_reduce|reduce_scatter|all_to_all|all_slice)"
    r"(?:<@\w+>)? (?P<axes>\[.*\]|<.*>) (?P<operands>[^:]*) :", re.MULTILINE)


def hlo_collectives(hlo_ir: str) -> list[tuple[str, str, str]]:
    """The collectives of a PartIR:HLO listing in program order: (op, axes, operand)."""
    return [(m["op"], m["axes"], m["operands"].strip().lstrip("%"))
            for m in COLLECTIVE_OP.finditer(hlo_ir)]


def test_every_schedule_file_has_expectations():
    assert SCHEDULE_FILES, f"no schedule files in {EXAMPLES}"
    assert set(SCHEDULE_FILES) == set(EXPECTED)


@functools.cache
def run(name: str):
    """The schedule file loaded, jitted and run once on its example arguments."""
    sf = load_schedule_file(EXAMPLES / name)
    assert sf.program.static_argnums == ()
    fn, meta = partir.jit(sf.program.fn, sf.mesh, sf.schedule)
    out = fn(*sf.program.args)
    return name, sf, out, meta


@pytest.fixture(params=SCHEDULE_FILES)
def executed(request):
    return run(request.param)


def test_executed_schedule_equals_the_function(executed):
    name, sf, out, _ = executed
    assert len(jax.devices()) >= sf.mesh.size == 8
    expected = sf.program.fn(*sf.program.args)
    assert_same(out, expected, name)


def test_collectives_per_tactic_are_the_papers(executed):
    name, sf, _, meta = executed
    want = EXPECTED[name]
    assert [t.name for t in sf.schedule] == list(want["tactics"])
    assert {t.name: t.collectives for t in meta.tactics} == want["tactics"]
    assert meta.collectives == list(want["tactics"].values())[-1]


def test_hlo_program_is_the_papers(executed):
    name, _, _, meta = executed
    want = EXPECTED[name]
    got = [(op, axes, operand if operand in ("x", "w1", "w2") else None)
           for op, axes, operand in hlo_collectives(meta.hlo_ir)]
    assert got == want["ops"], meta.hlo_ir
    for arg, shape in want["local"].items():
        assert f"%{arg}: tensor<{shape}xf32>" in meta.hlo_ir, meta.hlo_ir
    assert meta.in_specs == want["in_specs"]
    assert meta.out_specs == want["out_specs"]


def test_es_gathers_x_before_the_first_matmul_and_scatters_the_result():
    """The paper: ES 'will convert the all_reduce operation to a reduce_scatter and
    introduce an all_gather on the input %x before using it in the first matmul'."""
    meta = run("es.partir.py")[3]
    lines = meta.hlo_ir.splitlines()
    gather_x = next(i for i, line in enumerate(lines)
                    if re.search(r"= all_gather \[\{\}, \{\"model\"\}\] %x\b", line))
    matmuls = [i for i, line in enumerate(lines) if "= matmul(" in line]
    scatter = next(i for i, line in enumerate(lines) if "= reduce_scatter " in line)
    assert len(matmuls) == 2, meta.hlo_ir
    gathered = lines[gather_x].split("=")[0].strip()
    assert gathered in lines[matmuls[0]], meta.hlo_ir
    assert gather_x < matmuls[0] < matmuls[1] < scatter, meta.hlo_ir
    assert "all_reduce" not in meta.hlo_ir
