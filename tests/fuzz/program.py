"""The fuzzer's programs as data: a list of op records (each a Python expression over its
arguments, with nested blocks for control flow), a mesh and a schedule. A case renders to
one runnable Python module, which is what the runner executes and what a failure prints,
so a repro is exactly the code that failed. Nothing here imports JAX: the parent process
of a campaign builds and shrinks cases without it."""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass, field

# Value kinds: f32, i32, bool, u32 (random bits), key (typed PRNG key), rawkey (u32[2]).
FLOAT, INT, BOOL, U32, KEY, RAWKEY = "f32", "i32", "bool", "u32", "key", "rawkey"
MODES = ("plain", "jit", "grad", "vg")


@dataclass(frozen=True)
class Var:
    name: str
    shape: tuple[int, ...]
    dtype: str

    @property
    def size(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n


@dataclass
class Block:
    """A nested function (loop body, branch, checkpointed function). `signature` and
    `unpack` are its def's arguments and first line, `ret` its return expression; all three
    name its params as {p0}, {p1}... and `ret` its results as {r0}, {r1}..."""

    params: list[Var]
    signature: str
    ops: list[Op]
    results: list[str]
    ret: str
    unpack: str = ""


@dataclass
class Op:
    """`outs = expr`, where expr names the op's arguments {0}, {1}... and the functions of
    its blocks {b0}, {b1}... `family` says which op family made it (coverage statistics)."""

    family: str
    expr: str
    args: list[str]
    outs: list[Var]
    blocks: list[Block] = field(default_factory=list)


@dataclass
class Input:
    var: Var
    init: str  # "normal" | "int:LO:HI" | "key" | "rawkey"
    stream: int  # the input's values come from default_rng([seed, stream]): stable when
    # other inputs are dropped by the minimizer


@dataclass
class Program:
    inputs: list[Input]
    ops: list[Op]
    outputs: list[str]


@dataclass
class TacticSpec:
    axis: str
    entries: list[tuple[str, str]]  # input or tag name -> rendered value ("0", "partir.REPLICATED")
    name: str | None = None
    pad: bool = True


@dataclass
class Case:
    seed: int
    program: Program
    mesh: list[tuple[str, int]]
    schedule: list[TacticSpec]

    def copy(self) -> Case:
        return copy.deepcopy(self)


# --- walking ---------------------------------------------------------------------------------

def walk_ops(ops: list[Op]):
    """Every op, blocks' ops included, outer ops first."""
    for op in ops:
        yield op
        for b in op.blocks:
            yield from walk_ops(b.ops)


def tags(program: Program) -> list[str]:
    found = []
    for op in walk_ops(program.ops):
        m = re.match(r'partir\.tag\(\{0\}, "(\w+)"\)$', op.expr)
        if m:
            found.append(m.group(1))
    return found


def free_vars(op: Op) -> set[str]:
    """The names an op reads: its arguments and what its blocks read from outside."""
    used = set(op.args)
    for b in op.blocks:
        used |= block_free_vars(b)
    return used


def block_free_vars(b: Block) -> set[str]:
    defined = {p.name for p in b.params}
    used: set[str] = set()
    for op in b.ops:
        used |= free_vars(op) - defined
        defined |= {o.name for o in op.outs}
    used |= set(b.results) - defined
    return used


def used_inputs(program: Program) -> list[Input]:
    used = set(program.outputs)
    for op in program.ops:
        used |= free_vars(op)
    return [i for i in program.inputs if i.var.name in used]


def var_types(program: Program) -> dict[str, Var]:
    types = {i.var.name: i.var for i in program.inputs}
    for op in walk_ops(program.ops):
        for o in op.outs:
            types[o.name] = o
        for b in op.blocks:
            for p in b.params:
                types[p.name] = p
    return types


# --- pruning (the minimizer's one transformation) ---------------------------------------------

def prune(program: Program, removed: set[str], rename: dict[str, str] | None = None) -> Program:
    """The program without the ops whose first output is in `removed`, with every read of
    a `rename` key redirected to its value; ops reading a value no longer defined go too
    (transitively), and a block result no longer defined falls back to the block's first
    param of the same type (a loop carry, a branch operand), so a body always type-checks."""
    rename = rename or {}
    types = var_types(program)
    alive = {i.var.name for i in program.inputs}

    def sub(name: str) -> str:
        seen = set()
        while name in rename and name not in seen:
            seen.add(name)
            name = rename[name]
        return name

    def prune_ops(ops: list[Op], alive: set[str]) -> list[Op]:
        kept = []
        for op in ops:
            if op.outs[0].name in removed:
                continue
            new = Op(op.family, op.expr, [sub(a) for a in op.args], list(op.outs), [])
            if not all(a in alive for a in new.args):
                continue
            ok = True
            for b in op.blocks:
                nb = prune_block(b, alive)
                if nb is None:
                    ok = False
                    break
                new.blocks.append(nb)
            if not ok:
                continue
            kept.append(new)
            alive |= {o.name for o in op.outs}
        return kept

    def prune_block(b: Block, outer: set[str]) -> Block | None:
        inner = set(outer) | {p.name for p in b.params}
        ops = prune_ops(b.ops, inner)
        results = []
        for r in b.results:
            r = sub(r)
            if r not in inner:
                want = types[r]
                same = [p.name for p in b.params if (p.shape, p.dtype) == (want.shape, want.dtype)]
                if not same:
                    return None
                r = same[0]
            results.append(r)
        return Block(list(b.params), b.signature, ops, results, b.ret, b.unpack)

    ops = prune_ops(program.ops, alive)
    outputs = []
    for o in program.outputs:
        o = sub(o)
        if o in alive and o not in outputs:
            outputs.append(o)
    return Program(list(program.inputs), ops, outputs)


def dead_ops(program: Program) -> set[str]:
    """The ops (by first output) whose results reach no output of the function."""
    dead: set[str] = set()

    def visit(ops: list[Op], live: set[str]) -> set[str]:
        """Mark the dead ops of a block whose `live` values are read after it; return
        what the block reads from outside."""
        live = set(live)
        for op in reversed(ops):
            if not any(o.name in live for o in op.outs):
                dead.add(op.outs[0].name)
                for b in op.blocks:
                    for inner in walk_ops(b.ops):
                        dead.add(inner.outs[0].name)
                continue
            live |= set(op.args)
            for b in op.blocks:
                live |= visit(b.ops, set(b.results)) - {p.name for p in b.params}
        return live

    visit(program.ops, set(program.outputs))
    return dead


def restrict_schedule(case: Case) -> list[TacticSpec]:
    """The schedule's entries that name an input or tag the rendered program has (pruning
    may drop either); tactics left empty go."""
    names = {i.var.name for i in used_inputs(case.program)} | set(tags(case.program))
    axes = {a for a, _ in case.mesh}
    out = []
    for t in case.schedule:
        entries = [(n, v) for n, v in t.entries if n in names]
        if entries and t.axis.split(":")[0] in axes:
            out.append(TacticSpec(t.axis, entries, t.name, t.pad))
    return out


# --- rendering ----------------------------------------------------------------------------------

PRELUDE = '''\
@jax.custom_jvp
def sin2(x):
    return 2.0 * jnp.sin(x)


@sin2.defjvp
def _sin2_jvp(primals, tangents):
    (x,), (t,) = primals, tangents
    return sin2(x), 2.0 * jnp.cos(x) * t


@jax.custom_vjp
def mul_tanh(x, y):
    return x * y + jnp.tanh(x)


def _mul_tanh_fwd(x, y):
    return mul_tanh(x, y), (x, y)


def _mul_tanh_bwd(res, g):
    x, y = res
    gx = g * (y + 1.0 - jnp.tanh(x) ** 2)
    return gx, g * x


mul_tanh.defvjp(_mul_tanh_fwd, _mul_tanh_bwd)
'''

HEADER = '''\
import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax import lax  # noqa: E402

import partir  # noqa: E402
'''


def _fmt_expr(op: Op, names: list[str]) -> str:
    return op.expr.format(*op.args, **{f"b{i}": n for i, n in enumerate(names)})


def render_ops(ops: list[Op], indent: str) -> list[str]:
    lines = []
    for op in ops:
        names = []
        for i, b in enumerate(op.blocks):
            fname = f"{op.outs[0].name}_b{i}"
            names.append(fname)
            p = {f"p{k}": v.name for k, v in enumerate(b.params)}
            r = {f"r{k}": v for k, v in enumerate(b.results)}
            lines.append(f"{indent}def {fname}({b.signature.format(**p)}):")
            if b.unpack:
                lines.append(f"{indent}    {b.unpack.format(**p)}")
            lines += render_ops(b.ops, indent + "    ")
            lines.append(f"{indent}    return {b.ret.format(**p, **r)}")
        lhs = ", ".join(o.name for o in op.outs)
        lines.append(f"{indent}{lhs} = {_fmt_expr(op, names)}")
    return lines


def _input_value(inp: Input, seed: int) -> str:
    v = inp.var
    if inp.init == "key":
        return f"jax.random.key({(seed * 31 + inp.stream) % 1000})"
    if inp.init == "rawkey":
        return f"jax.random.PRNGKey({(seed * 31 + inp.stream) % 1000})"
    rng = f"np.random.default_rng([{seed}, {inp.stream}])"
    if inp.init.startswith("int:"):
        _, lo, hi = inp.init.split(":")
        return f"{rng}.integers({lo}, {hi}, {v.shape}).astype(np.int32)"
    return f"{rng}.standard_normal({v.shape}).astype(np.float32)"


def float_outputs(program: Program) -> list[int]:
    types = var_types(program)
    return [k for k, o in enumerate(program.outputs) if types[o].dtype == FLOAT]


def float_argnums(program: Program) -> tuple[int, ...]:
    return tuple(k for k, i in enumerate(used_inputs(program)) if i.var.dtype == FLOAT)


def render(case: Case, mode: str = "plain", core: bool = False) -> str:
    """The case as a runnable module: `f`, `make_args`, `mesh`, `schedule`, and for `mode`
    the `reference(args)` and `partitioned(args)` the runner compares (with `core`, also
    `core(args)`: the sequential Core interpreter's result); run as a script it checks
    them itself."""
    prog = case.program
    inputs = used_inputs(prog)
    params = ", ".join(i.var.name for i in inputs)
    exprs = " ".join(op.expr for op in walk_ops(prog.ops))
    # the custom_jvp/custom_vjp helpers only where used, to keep repros short
    lines = [HEADER, "", PRELUDE, ""] if "sin2(" in exprs or "mul_tanh(" in exprs else [HEADER]
    lines.append(f"def f({params}):")
    lines += render_ops(prog.ops, "    ")
    lines.append(f"    return ({''.join(o + ', ' for o in prog.outputs).rstrip()})")
    lines += ["", "", "def make_args():"]
    lines += [f"    {i.var.name} = {_input_value(i, case.seed)}" for i in inputs]
    lines.append(f"    return ({''.join(i.var.name + ', ' for i in inputs).rstrip()})")
    lines += ["", ""]
    mesh = ", ".join(f'"{a}": {n}' for a, n in case.mesh)
    lines.append(f"mesh = partir.Mesh({{{mesh}}})")
    lines.append("schedule = [")
    for t in restrict_schedule(case):
        entries = ", ".join(f'"{n}": {v}' for n, v in t.entries)
        extra = (f', name="{t.name}"' if t.name else "") + ("" if t.pad else ", pad=False")
        lines.append(f'    partir.ManualPartition({{{entries}}}, axis="{t.axis}"{extra}),')
    lines.append("]")
    lines += ["", ""]
    fouts = float_outputs(prog)
    if mode in ("grad", "vg"):
        terms = " + ".join(f"_weighted(outs[{k}])" for k in fouts) or "0.0"
        lines += [
            "def _weighted(o):",
            "    # fixed, varied weights: a permuted or misplaced gradient shows",
            "    w = jnp.cos(jnp.arange(o.size, dtype=jnp.float32)).reshape(o.shape)",
            "    return jnp.sum(o * w)",
            "",
            "",
            "def loss_of(g):",
            "    def loss(*a):",
            "        outs = g(*a)",
            f"        return {terms}",
            "    return loss",
            "",
            "",
            f"ARGNUMS = {float_argnums(prog)!r}",
            "",
            "",
        ]
    if mode in ("plain", "jit"):
        lines += ["def reference(args):", "    return jax.jit(f)(*args)", "", "",
                  # JAX arrays: the case may use their methods (`.at`), as it does on the
                  # tracers the other references give it (fuzzer seed 3740).
                  "def reference_alts(args):", "    return (f(*map(jnp.asarray, args)),)", "", "",
                  "def partitioned(args):", "    global meta",
                  "    fn, meta = partir.jit(f, mesh, schedule)"]
        lines.append("    return fn(*args)" if mode == "plain"
                     else "    return jax.jit(lambda *a: fn(*a))(*args)")
    elif mode == "grad":
        lines += ["def reference(args):",
                  "    return jax.grad(loss_of(jax.jit(f)), argnums=ARGNUMS)(*args)", "", "",
                  # Two other ways: compiled as one program, and op by op (fuzzer seed
                  # 7821: XLA compiled both jitted references of a dynamic update of an
                  # array with its own slice wrongly; op by op agreed with partir).
                  "def reference_alts(args):",
                  "    return (jax.jit(jax.grad(loss_of(f), argnums=ARGNUMS))(*args),",
                  "            jax.grad(loss_of(f), argnums=ARGNUMS)(*args))", "", "",
                  "def partitioned(args):", "    global meta",
                  "    fn, meta = partir.jit(f, mesh, schedule)",
                  "    return jax.grad(loss_of(fn), argnums=ARGNUMS)(*args)"]
    elif mode == "vg":
        lines += [f"def f_vg({params}):",
                  f"    return jax.value_and_grad(loss_of(f), argnums=ARGNUMS)({params})",
                  "", "",
                  "def reference(args):", "    return jax.jit(f_vg)(*args)", "", "",
                  "def reference_alts(args):", "    return (f_vg(*args),)", "", "",
                  "def partitioned(args):", "    global meta",
                  "    fn, meta = partir.jit(f_vg, mesh, schedule)",
                  "    return fn(*args)"]
    else:
        raise ValueError(f"unknown mode {mode!r}")
    check = "partitioned"
    if core:
        fn = {"vg": "f_vg", "grad": "f_grad"}.get(mode, "f")
        if mode == "grad":  # the derivative's program partitioned by the schedule
            lines += ["", "", f"def f_grad({params}):",
                      f"    return jax.grad(loss_of(f), argnums=ARGNUMS)({params})"]
        lines += ["", "", "def core(args):",
                  f"    return partir.core_partition({fn}, mesh, schedule, *args)"
                  ".interpret(*args)"]
        check = "core"
    lines += ["", "", 'if __name__ == "__main__":', "    args = make_args()",
              "    want = reference(args)", f"    got = {check}(args)",
              "    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):",
              "        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-4,"
              " atol=1e-4)",
              '    print("same")', ""]
    return "\n".join(lines)


def function_source(case: Case) -> str:
    """Just `f` (for messages and unit tests)."""
    src = render(case)
    start = src.index("def f(")
    return src[start:src.index("\ndef make_args")].rstrip()
