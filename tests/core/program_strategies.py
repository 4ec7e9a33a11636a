"""Hypothesis strategies for random JAX programs, meshes and ManualPartition schedules.

`programs()` draws a `ProgramCase`: a small DAG of jnp/lax operations over 1-4 float32
inputs (and an int32 `ids` input when the program gathers rows), written out as the
source of a Python function so that a failing case prints as readable code. The case is
self-contained: the function, example arguments as numpy arrays, input names, shapes and
dtypes. `meshes()` draws a mesh as a dict axis -> size and `schedules(case, mesh)` a list
of `partir.ManualPartition` tactics for that program and mesh.

Numerics are kept exact where possible: inputs hold small integers, scalar literals are
dyadic, and an operand whose magnitude bound would make a result exceed `LIMIT` goes
through `tanh` first, so sums and products of untouched values stay exact in float32
whatever order a partitioned program adds them in.
"""

from __future__ import annotations

import linecache
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from hypothesis import event
from hypothesis import strategies as st
from jax import lax

import partir

# Dimension sizes: powers of two that mesh axes of size 2 and 4 divide, and 6 and 12,
# which size 4 does not divide (and, once halved, size 2 may not either).
DIMS = (4, 8, 16, 6, 12)
MAX_RANK = 3
MAX_SIZE = 4096
LIMIT = 1e4  # magnitude bound above which operands are squashed with tanh
INPUT_RANGE = 3  # float inputs are integers in [-INPUT_RANGE, INPUT_RANGE]
IDS_HIGH = 6  # ids are in [0, IDS_HIGH): rows past a table's end are clamped or filled
AXIS_NAMES = ("a", "b", "c")
AXIS_SIZES = (2, 4)


@dataclass(frozen=True)
class Val:
    """A value of the program: an input or the result of an op."""

    name: str
    shape: tuple[int, ...]
    dtype: str  # "float32" | "int32"
    bound: float = 0.0  # upper bound on magnitudes (floats only)

    @property
    def rank(self) -> int:
        return len(self.shape)


@dataclass(frozen=True)
class OpSpec:
    kind: str  # the generator that made it (for statistics)
    result: Val
    expr: str  # Python expression computing the result


@dataclass(frozen=True)
class Recipe:
    inputs: tuple[Val, ...]
    ops: tuple[OpSpec, ...]
    outputs: tuple[str, ...]

    def source(self, name: str = "program") -> str:
        lines = [f"def {name}({', '.join(v.name for v in self.inputs)}):"]
        lines += [f"    {op.result.name} = {op.expr}" for op in self.ops]
        lines.append(f"    return ({''.join(o + ', ' for o in self.outputs)})")
        return "\n".join(lines) + "\n"


@dataclass(frozen=True)
class ProgramCase:
    """A random program with example arguments, usable by any test."""

    recipe: Recipe
    fn: Callable[..., Any] = field(repr=False)
    args: tuple[np.ndarray, ...] = field(repr=False)
    input_names: tuple[str, ...]
    input_shapes: tuple[tuple[int, ...], ...]
    input_dtypes: tuple[str, ...]
    seed: int

    @property
    def source(self) -> str:
        return self.recipe.source()

    def expected(self) -> tuple[Any, ...]:
        """The function under `jax.jit` on the example arguments: one compilation, where
        run eagerly each op would be one."""
        return jax.jit(self.fn)(*self.args)

    def arg_setup(self) -> str:
        """Python lines recreating `args` and the expected outputs (for reproducers)."""
        lines = [f"rng = np.random.default_rng({self.seed})"]
        lines += [f"{v.name} = {_arg_expr(v)}" for v in self.recipe.inputs]
        lines.append(f"args = ({''.join(v.name + ', ' for v in self.recipe.inputs)})")
        lines.append("expected = jax.jit(program)(*args)")
        return "\n".join(lines)

    def __repr__(self) -> str:
        shapes = ", ".join(f"{n}: {d}{list(s)}" for n, s, d in zip(
            self.input_names, self.input_shapes, self.input_dtypes, strict=True))
        return f"ProgramCase({shapes}; seed={self.seed})\n{self.source}"


def _arg_expr(v: Val) -> str:
    """Python expression drawing an example argument from `rng`."""
    if v.dtype == "int32":
        return f"rng.integers(0, {IDS_HIGH}, {v.shape}).astype(np.int32)"
    return (f"rng.integers({-INPUT_RANGE}, {INPUT_RANGE + 1}, {v.shape})"
            f".astype(np.float32)")


_COUNTER = [0]
_NAMESPACE = {"jnp": jnp, "lax": lax, "np": np, "jax": jax}


def build(recipe: Recipe, seed: int = 0) -> ProgramCase:
    """Compile a recipe into a function and make example arguments for it."""
    src = recipe.source()
    _COUNTER[0] += 1
    filename = f"<program-{_COUNTER[0]}>"
    linecache.cache[filename] = (len(src), None, src.splitlines(True), filename)
    namespace = dict(_NAMESPACE)
    exec(compile(src, filename, "exec"), namespace)
    rng = np.random.default_rng(seed)
    args = tuple(eval(_arg_expr(v), {"np": np, "rng": rng}) for v in recipe.inputs)
    return ProgramCase(recipe, namespace["program"], args,
                       tuple(v.name for v in recipe.inputs),
                       tuple(v.shape for v in recipe.inputs),
                       tuple(v.dtype for v in recipe.inputs), seed)


def reproducer(case: ProgramCase, mesh: dict[str, int],
               schedule: Sequence[partir.ManualPartition]) -> str:
    """A standalone script partitioning the case and checking the interpreter after every
    tactic against the function."""
    return "\n".join([
        "import jax, numpy as np, jax.numpy as jnp, partir",
        "from jax import lax",
        "from partir.core.materialize import materialize",
        "from partir.ir import verify",
        "",
        case.source,
        case.arg_setup(),
        f"mesh = partir.Mesh({mesh!r})",
        f"schedule = {describe_schedule(schedule)}",
        "r = partir.core_partition(program, mesh, schedule, *args)",
        "for i in range(1, len(schedule) + 1):",
        "    print(r.core_ir(i))",
        "    verify(materialize(r.tactics[i - 1].program))",
        "    for out, exp in zip(r.interpret(*args, after=i), expected, strict=True):",
        "        np.testing.assert_allclose(out, exp, rtol=1e-4, atol=1e-4)",
    ]) + "\n"


# --- op generators -------------------------------------------------------------------------
#
# Each generator draws one op over the values built so far and returns
# (expr, shape, dtype, bound, operands) or None when it does not apply; the program
# then falls back to a unary op. Generators that come first shrink best.


class _Builder:
    def __init__(self, draw, inputs: list[Val]) -> None:
        self.draw = draw
        self.vals: list[Val] = list(inputs)
        self.ids: Val | None = None
        self.used: set[str] = set()

    @property
    def floats(self) -> list[Val]:
        return [v for v in self.vals if v.dtype == "float32"]

    def pick(self, vals: Sequence[Val] | None = None) -> Val | None:
        """A value, biased towards inputs not used yet, then the most recent values (so
        every input tends to be used and chains are likely)."""
        vals = self.floats if vals is None else list(vals)
        if not vals:
            return None
        fresh = [v for v in vals if v.name[0] == "x" and v.name not in self.used]
        vals = [v for v in vals if v not in fresh] + fresh[::-1]
        return vals[-1 - self.draw(st.integers(0, len(vals) - 1))]

    def dim(self, v: Val, negative: bool = True) -> int:
        lo = -v.rank if negative else 0
        d = self.draw(st.integers(lo, v.rank - 1))
        return d


def _squash(operands: Sequence[Val], bound_fn: Callable[..., float]):
    """Operand expressions and the result bound, squashing big operands with tanh."""
    b = bound_fn(*(v.bound for v in operands))
    if b <= LIMIT:
        return [v.name for v in operands], b
    exprs = [f"jnp.tanh({v.name})" if v.bound > 1 else v.name for v in operands]
    return exprs, bound_fn(*(min(v.bound, 1.0) for v in operands))


def _size(shape) -> int:
    return math.prod(shape)


def _ok(shape) -> bool:
    return len(shape) <= MAX_RANK and _size(shape) <= MAX_SIZE


UNARY = (
    ("(-{})", lambda b: b),
    ("jnp.tanh({})", lambda b: 1.0),
    ("jnp.abs({})", lambda b: b),
    ("jnp.sin({})", lambda b: 1.0),
    ("jax.nn.sigmoid({})", lambda b: 1.0),
    ("{} ** 2", lambda b: b * b),
    ("{} ** 3", lambda b: b ** 3),
    ("jnp.cos({})", lambda b: 1.0),
)


def gen_unary(g: _Builder):
    a = g.pick()
    tmpl, fb = g.draw(st.sampled_from(UNARY))
    (x,), b = _squash([a], fb)
    return tmpl.format(x), a.shape, "float32", b, [a]


SCALAR = (
    ("{} * 2.0", lambda b: 2 * b),
    ("{} + 1.0", lambda b: b + 1),
    ("(0.5 - {})", lambda b: b + 0.5),
    ("{} / 4.0", lambda b: b / 4),
    ("jnp.maximum({}, 0.0)", lambda b: b),
    ("{} * -1.5", lambda b: 1.5 * b),
)


def gen_scalar(g: _Builder):
    a = g.pick()
    tmpl, fb = g.draw(st.sampled_from(SCALAR))
    (x,), b = _squash([a], fb)
    return tmpl.format(x), a.shape, "float32", b, [a]


BINARY = (
    ("{} + {}", lambda a, b: a + b),
    ("{} - {}", lambda a, b: a + b),
    ("{} * {}", lambda a, b: a * b),
    ("jnp.maximum({}, {})", max),
    ("jnp.minimum({}, {})", max),
)


def _broadcast(*shapes) -> tuple[int, ...] | None:
    """The numpy broadcast of the shapes (trailing dims, size 1 stretches), if any."""
    try:
        return tuple(np.broadcast_shapes(*shapes))
    except ValueError:
        return None


def _broadcastable(vals: Sequence[Val], shape) -> list[Val]:
    """Values that broadcast with `shape` to a shape within the limits."""
    return [v for v in vals if (s := _broadcast(shape, v.shape)) is not None and _ok(s)]


def gen_binary(g: _Builder):
    a = g.pick()
    # Equal shapes, trailing dims, or size-1 dims (which JAX broadcasts implicitly).
    b = g.pick(_broadcastable(g.floats, a.shape))
    tmpl, fb = g.draw(st.sampled_from(BINARY))
    (x, y), bound = _squash([a, b], fb)
    if g.draw(st.booleans()):
        x, y = y, x
    return tmpl.format(x, y), _broadcast(a.shape, b.shape), "float32", bound, [a, b]


def gen_where(g: _Builder):
    a = g.pick()
    other = g.pick(_broadcastable(g.floats, a.shape)) if g.draw(st.booleans()) else None
    shape = a.shape if other is None else _broadcast(a.shape, other.shape)
    false = g.pick(_broadcastable(g.floats, shape)) if g.draw(st.booleans()) else None
    used = [a] + [v for v in (other, false) if v is not None]
    exprs, bound = _squash(used, lambda *bs: max(bs))
    x, rest = exprs[0], exprs[1:]
    y = rest.pop(0) if other is not None else "0.25"
    z = rest.pop(0) if false is not None else "0.0"
    shape = _broadcast(*(v.shape for v in used))
    return f"jnp.where({x} > {y}, {x}, {z})", shape, "float32", bound, used


def gen_dot(g: _Builder):
    a = g.pick()
    b = g.pick()
    lc, rc, lb, rb = [], [], [], []
    taken: set[int] = set()
    for i, n in enumerate(a.shape):
        matches = [j for j, m in enumerate(b.shape) if m == n and j not in taken]
        if not matches:
            continue
        role = g.draw(st.sampled_from(("free", "contract", "batch")))
        if role == "free":
            continue
        j = g.draw(st.sampled_from(matches))
        taken.add(j)
        (lc if role == "contract" else lb).append(i)
        (rc if role == "contract" else rb).append(j)
    afree = [d for d in range(a.rank) if d not in lc + lb]
    bfree = [d for d in range(b.rank) if d not in rc + rb]
    shape = (tuple(a.shape[d] for d in lb) + tuple(a.shape[d] for d in afree)
             + tuple(b.shape[d] for d in bfree))
    if not _ok(shape):
        return None
    k = _size([a.shape[d] for d in lc])
    (x, y), bound = _squash([a, b], lambda p, q: k * p * q)
    if g.draw(st.booleans()):
        expr = f"lax.dot_general({x}, {y}, (({tuple(lc)}, {tuple(rc)}), " \
               f"({tuple(lb)}, {tuple(rb)})))"
    else:
        letters = iter("ijklmnopqrstuvwxyz")
        sa = [next(letters) for _ in range(a.rank)]
        sb = [next(letters) for _ in range(b.rank)]
        for i, j in zip(lc + lb, rc + rb, strict=True):
            sb[j] = sa[i]
        out = [sa[d] for d in lb] + [sa[d] for d in afree] + [sb[d] for d in bfree]
        if g.draw(st.booleans()):  # a permuted result order: einsum adds a transpose
            out = list(g.draw(st.permutations(out)))
            shape = tuple(dict(zip(sa + sb, a.shape + b.shape, strict=True))[c] for c in out)
        expr = f"jnp.einsum('{''.join(sa)},{''.join(sb)}->{''.join(out)}', {x}, {y})"
    return expr, shape, "float32", bound, [a, b]


def gen_reduce(g: _Builder):
    a = g.pick([v for v in g.floats if v.rank >= 1])
    if a is None:
        return None
    d = g.dim(a)
    n = a.shape[d]
    kind = g.draw(st.sampled_from(("sum", "max", "min", "mean")))
    keep = g.draw(st.booleans())
    (x,), b = _squash([a], (lambda b: n * b) if kind == "sum" else (lambda b: b))
    shape = list(a.shape)
    if keep:
        shape[d] = 1
    else:
        del shape[d]
    extra = ", keepdims=True" if keep else ""
    return f"jnp.{kind}({x}, axis={d}{extra})", tuple(shape), "float32", b, [a]


def gen_argmax(g: _Builder):
    a = g.pick([v for v in g.floats if v.rank >= 1])
    if a is None:
        return None
    d = g.dim(a)
    fn = g.draw(st.sampled_from(("argmax", "argmin")))
    shape = a.shape[:d % a.rank] + a.shape[d % a.rank + 1:]
    return f"jnp.{fn}({a.name}, axis={d})", shape, "int32", 0.0, [a]


def gen_broadcast(g: _Builder):
    a = g.pick([v for v in g.floats if v.rank < MAX_RANK])
    if a is None:
        return None
    shape = (g.draw(st.sampled_from(DIMS)), *a.shape)
    if not _ok(shape):
        return None
    return f"jnp.broadcast_to({a.name}, {shape})", shape, "float32", a.bound, [a]


def gen_outer(g: _Builder):
    a = g.pick([v for v in g.floats if 1 <= v.rank < MAX_RANK])
    if a is None:
        return None
    b = g.pick([v for v in g.floats if v.rank == a.rank and v.shape[:-1] == a.shape[:-1]])
    shape = (*a.shape, b.shape[-1])
    if not _ok(shape):
        return None
    (x, y), bound = _squash([a, b], lambda p, q: p * q)
    return f"{x}[..., :, None] * {y}[..., None, :]", shape, "float32", bound, [a, b]


def gen_reshape(g: _Builder):
    a = g.pick([v for v in g.floats if v.rank >= 1])
    if a is None:
        return None
    shape = list(a.shape)
    if a.rank >= 2 and g.draw(st.booleans()):  # merge two adjacent dims
        i = g.draw(st.integers(0, a.rank - 2))
        shape[i:i + 2] = [shape[i] * shape[i + 1]]
    else:  # split a dim into two
        if a.rank >= MAX_RANK:
            return None
        i = g.draw(st.integers(0, a.rank - 1))
        f = g.draw(st.sampled_from((2, 4, 3)))
        if shape[i] % f:
            return None
        shape[i:i + 1] = [f, shape[i] // f] if g.draw(st.booleans()) else [shape[i] // f, f]
    return f"jnp.reshape({a.name}, {tuple(shape)})", tuple(shape), "float32", a.bound, [a]


def gen_transpose(g: _Builder):
    a = g.pick([v for v in g.floats if v.rank >= 2])
    if a is None:
        return None
    perm = tuple(g.draw(st.permutations(range(a.rank))))
    shape = tuple(a.shape[p] for p in perm)
    return f"jnp.transpose({a.name}, {perm})", shape, "float32", a.bound, [a]


def gen_expand_squeeze(g: _Builder):
    ones = [v for v in g.floats if 1 in v.shape]
    if ones and g.draw(st.booleans()):
        a = g.pick(ones)
        d = g.draw(st.sampled_from([d for d, n in enumerate(a.shape) if n == 1]))
        shape = a.shape[:d] + a.shape[d + 1:]
        return f"jnp.squeeze({a.name}, {d})", shape, "float32", a.bound, [a]
    a = g.pick([v for v in g.floats if v.rank < MAX_RANK])
    if a is None:
        return None
    d = g.draw(st.integers(0, a.rank))
    shape = (*a.shape[:d], 1, *a.shape[d:])
    return f"jnp.expand_dims({a.name}, {d})", shape, "float32", a.bound, [a]


def _index(d: int, item: str) -> str:
    return "[" + ":, " * d + item + "]"


def gen_slice(g: _Builder):
    a = g.pick([v for v in g.floats if v.rank >= 1])
    if a is None:
        return None
    d = g.dim(a, negative=False)
    n = a.shape[d]
    start = g.draw(st.integers(0, n - 1))
    stop = g.draw(st.integers(start + 1, n))
    step = g.draw(st.sampled_from((1, 2)))
    shape = list(a.shape)
    shape[d] = len(range(start, stop, step))
    item = f"{start}:{stop}" + (f":{step}" if step != 1 else "")
    return f"{a.name}{_index(d, item)}", tuple(shape), "float32", a.bound, [a]


def gen_pad(g: _Builder):
    a = g.pick([v for v in g.floats if v.rank >= 1])
    if a is None:
        return None
    d = g.dim(a, negative=False)
    lo, hi = g.draw(st.integers(0, 2)), g.draw(st.integers(0, 2))
    widths = tuple((lo, hi) if k == d else (0, 0) for k in range(a.rank))
    shape = list(a.shape)
    shape[d] += lo + hi
    if not _ok(shape):
        return None
    return f"jnp.pad({a.name}, {widths})", tuple(shape), "float32", a.bound, [a]


def gen_concat(g: _Builder):
    a = g.pick([v for v in g.floats if v.rank >= 1])
    if a is None:
        return None
    d = g.dim(a, negative=False)
    b = g.pick([v for v in g.floats if v.rank == a.rank and all(
        v.shape[k] == a.shape[k] for k in range(a.rank) if k != d)])
    shape = list(a.shape)
    shape[d] += b.shape[d]
    if not _ok(shape):
        return None
    axis = d - a.rank if g.draw(st.booleans()) else d
    return (f"jnp.concatenate([{a.name}, {b.name}], axis={axis})", tuple(shape), "float32",
            max(a.bound, b.bound), [a, b])


def gen_iota(g: _Builder):
    a = g.pick([v for v in g.floats if v.rank >= 1])
    if a is None:
        return None
    if g.draw(st.booleans()):
        n = a.shape[-1]
        (x,), b = _squash([a], lambda b: b + n)
        return f"{x} + jnp.arange({n}, dtype=jnp.float32)", a.shape, "float32", b, [a]
    d = g.dim(a, negative=False)
    n = a.shape[d]
    (x,), b = _squash([a], lambda b: b + n)
    return (f"{x} + lax.broadcasted_iota(jnp.float32, {a.shape}, {d})", a.shape, "float32",
            b, [a])


def gen_cumulative(g: _Builder):
    a = g.pick([v for v in g.floats if v.rank >= 1])
    if a is None:
        return None
    d = g.dim(a)
    n = a.shape[d]
    if g.draw(st.booleans()):
        (x,), b = _squash([a], lambda b: n * b)
        return f"jnp.cumsum({x}, axis={d})", a.shape, "float32", b, [a]
    return f"lax.cummax({a.name}, axis={d % a.rank})", a.shape, "float32", a.bound, [a]


def gen_dynamic_slice(g: _Builder):
    a = g.pick([v for v in g.floats if v.rank >= 1])
    if a is None:
        return None
    starts, sizes = [], []
    for n in a.shape:
        # Start anywhere in [0, n]: past n - size it is clamped (to 0 for a whole dim).
        size = n if g.draw(st.booleans()) else g.draw(st.integers(1, n))
        starts.append(g.draw(st.integers(0, n)))
        sizes.append(size)
    return (f"lax.dynamic_slice({a.name}, {tuple(starts)}, {tuple(sizes)})", tuple(sizes),
            "float32", a.bound, [a])


def gen_dynamic_update_slice(g: _Builder):
    a = g.pick([v for v in g.floats if v.rank >= 1])
    if a is None:
        return None
    b = g.pick([v for v in g.floats if v.rank == a.rank and all(
        m <= n for m, n in zip(v.shape, a.shape, strict=True))])
    starts = tuple(g.draw(st.integers(0, n)) for n in a.shape)
    return (f"lax.dynamic_update_slice({a.name}, {b.name}, {starts})", a.shape, "float32",
            max(a.bound, b.bound), [a, b])


def gen_gather(g: _Builder):
    if g.ids is None:
        a = g.pick([v for v in g.floats if v.rank >= 1])
        if a is None:
            return None
        ranks = [1, 2] if a.rank <= 2 else [1]
        rank = g.draw(st.sampled_from(ranks))
        shape = tuple(g.draw(st.sampled_from(DIMS)) for _ in range(rank))
        g.ids = Val("ids", shape, "int32")
    else:
        a = g.pick([v for v in g.floats if 1 <= v.rank <= MAX_RANK + 1 - g.ids.rank])
        if a is None:
            return None
    ids = g.ids
    style = g.draw(st.sampled_from(("getitem", "take", "take_clip")))
    d = 0 if style == "getitem" else g.dim(a)
    shape = a.shape[:d % a.rank] + ids.shape + a.shape[d % a.rank + 1:]
    if not _ok(shape):
        return None
    if style == "getitem":
        expr = f"{a.name}[ids]"
    else:
        mode = ", mode='clip'" if style == "take_clip" else ""
        expr = f"jnp.take({a.name}, ids, axis={d}{mode})"
    return expr, shape, "float32", a.bound, [a, ids]


def gen_constant(g: _Builder):
    a = g.pick([v for v in g.floats if v.rank >= 1])
    if a is None:
        return None
    (x,), b = _squash([a], lambda b: b + 2)
    const = (f"(np.arange({_size(a.shape)}, dtype=np.float32).reshape({a.shape}) % 5 - 2)")
    return f"{x} + {const}", a.shape, "float32", b, [a]


def gen_conv(g: _Builder):
    """A 1-d NWC conv (rank 3 stays within MAX_RANK) of a value with a kernel: another
    value of the kernel's shape (W, Cin / groups, Cout) when there is one, else an integer
    constant; feature groups 1, 2 or depthwise."""
    a = g.pick([v for v in g.floats if v.rank == 3])
    if a is None:
        return None
    cin = a.shape[2]
    groups = g.draw(st.sampled_from((1, 2, cin)))
    kernels = [v for v in g.floats if v.rank == 3 and v.shape[1] * groups == cin
               and v.shape[0] <= 3 and v.shape[2] % groups == 0 and v is not a]
    b = g.pick(kernels) if kernels and g.draw(st.booleans()) else None
    if b is None:
        cout = g.draw(st.sampled_from(DIMS))
        if cin % groups or cout % groups:
            return None
        kshape = (g.draw(st.integers(1, 3)), cin // groups, cout)
        kernel = (f"(np.arange({_size(kshape)}, dtype=np.float32).reshape({kshape}) % 5 - 2)")
        (x,), bound = _squash([a], lambda p: kshape[0] * kshape[1] * 2 * p)
        operands = [a]
    else:
        kshape = b.shape
        (x, kernel), bound = _squash([a, b], lambda p, q: kshape[0] * kshape[1] * p * q)
        operands = [a, b]
    stride = g.draw(st.sampled_from((1, 2)))
    padding = g.draw(st.sampled_from(("SAME", "VALID")))
    n = a.shape[1]
    w = -(-n // stride) if padding == "SAME" else (n - kshape[0]) // stride + 1
    if w < 1:
        return None
    expr = (f"lax.conv_general_dilated({x}, {kernel}, ({stride},), '{padding}', "
            f"dimension_numbers=('NWC', 'WIO', 'NWC'), feature_group_count={groups})")
    return expr, (a.shape[0], w, kshape[2]), "float32", bound, operands


def gen_pool(g: _Builder):
    """Sum or max pooling along one dim of a value (window 2 or 3, stride 1 or 2)."""
    a = g.pick([v for v in g.floats if v.rank >= 1])
    if a is None:
        return None
    d = g.dim(a, negative=False)
    k, stride = g.draw(st.integers(2, 3)), g.draw(st.sampled_from((1, 2)))
    if a.shape[d] < k:
        return None
    window = tuple(k if i == d else 1 for i in range(a.rank))
    strides = tuple(stride if i == d else 1 for i in range(a.rank))
    shape = tuple((n - k) // stride + 1 if i == d else n for i, n in enumerate(a.shape))
    if g.draw(st.booleans()):
        (x,), b = _squash([a], lambda b: k * b)
        return (f"lax.reduce_window({x}, 0.0, lax.add, {window}, {strides}, 'VALID')",
                shape, "float32", b, [a])
    return (f"lax.reduce_window({a.name}, -jnp.inf, lax.max, {window}, {strides}, 'VALID')",
            shape, "float32", a.bound, [a])


def _same_shape(g: _Builder, a: Val) -> Val:
    return g.pick([v for v in g.floats if v.shape == a.shape])


def gen_scan(g: _Builder):
    """A scan over a stack of 2-3 transforms of a value (a scan over layers): the carry
    and, sometimes, per-step outputs reduced over the carry's first dim. The carry may be
    centred on its mean at each step: sliced, the body sums the slices' partial means
    before using them (a collective inside the body)."""
    a = g.pick([v for v in g.floats if v.rank >= 1])
    if a is None:
        return None
    b = _same_shape(g, a)
    (x, y), _ = _squash([a, b], lambda p, q: 1.0)
    steps = g.draw(st.sampled_from((f"[{y}, -{y}]", f"[{y}, {y} * 0.5, -{y}]")))
    n = steps.count(",") + 1
    update = g.draw(st.sampled_from(("jnp.tanh(c * s + c)",
                                     "jnp.tanh(c * s - jnp.mean(c * s))")))
    body = f"lambda c, s: ({update}, jnp.sum(jnp.tanh(c) * jnp.tanh(s), axis=0))"
    if g.draw(st.booleans()):
        return (f"lax.scan({body}, {x}, jnp.stack({steps}))[0]", a.shape, "float32", 1.0,
                [a, b])
    bound = float(a.shape[0])
    return (f"lax.scan({body}, {x}, jnp.stack({steps}))[1]", (n, *a.shape[1:]), "float32",
            bound, [a, b])


def gen_loop(g: _Builder):
    """A fori_loop, a while_loop counting its steps, or a while_loop whose predicate
    reads the data (so it must not be sharded through)."""
    a = g.pick()
    (x,), _ = _squash([a], lambda p: 1.0)
    kind = g.draw(st.sampled_from(("fori", "count", "data")))
    if kind == "fori":
        expr = f"lax.fori_loop(0, 3, lambda i, c: jnp.tanh(c) * 0.9 + i * 0.1, {x})"
    elif kind == "count":
        expr = (f"lax.while_loop(lambda s: s[0] < 3, lambda s: (s[0] + 1, jnp.sin(s[1]) + "
                f"s[1] * 0.5), (0, {x}))[1]")
    else:
        expr = (f"lax.while_loop(lambda c: jnp.sum(jnp.abs(c)) < 20.0, lambda c: c * 1.5 + "
                f"0.25, jnp.tanh({x}))")
    return expr, a.shape, "float32", 40.0, [a]


def gen_cond(g: _Builder):
    """lax.cond on a predicate of the data, or lax.switch, with branches that compute
    differently on the same operands."""
    a = g.pick()
    b = _same_shape(g, a)
    (x, y), _ = _squash([a, b], lambda p, q: 1.0)
    if g.draw(st.booleans()):
        expr = (f"lax.cond(jnp.sum({y}) > 0, lambda p, q: jnp.tanh(p) * q, "
                f"lambda p, q: p - q, {x}, {y})")
    else:
        expr = (f"lax.switch(jnp.int32(jnp.sum({y}) > 0) + 1, [lambda p: p * 2.0, "
                f"lambda p: jnp.sin(p), lambda p: p - 1.0], {x})")
    return expr, a.shape, "float32", 2.0, [a, b]


GENERATORS: dict[str, Callable[[_Builder], Any]] = {
    "unary": gen_unary,
    "scalar": gen_scalar,
    "binary": gen_binary,
    "dot": gen_dot,
    "reduce": gen_reduce,
    "reshape": gen_reshape,
    "transpose": gen_transpose,
    "broadcast": gen_broadcast,
    "outer": gen_outer,
    "expand_squeeze": gen_expand_squeeze,
    "slice": gen_slice,
    "pad": gen_pad,
    "concat": gen_concat,
    "where": gen_where,
    "iota": gen_iota,
    "cumulative": gen_cumulative,
    "dynamic_slice": gen_dynamic_slice,
    "dynamic_update_slice": gen_dynamic_update_slice,
    "gather": gen_gather,
    "argmax": gen_argmax,
    "constant": gen_constant,
    "conv": gen_conv,
    "pool": gen_pool,
    "scan": gen_scan,
    "loop": gen_loop,
    "cond": gen_cond,
}


def shapes(min_rank: int = 1, max_rank: int = MAX_RANK) -> st.SearchStrategy[tuple[int, ...]]:
    return st.lists(st.sampled_from(DIMS), min_size=min_rank, max_size=max_rank).map(tuple)


@st.composite
def recipes(draw, min_inputs: int = 1, max_inputs: int = 4, min_ops: int = 3,
            max_ops: int = 10, exclude: Sequence[str] = ()) -> Recipe:
    """A program of `min_ops`-`max_ops` ops over `min_inputs`-`max_inputs` float inputs,
    drawn from the GENERATORS not in `exclude`."""
    kinds = tuple(k for k in GENERATORS if k not in exclude)
    n_in = draw(st.integers(min_inputs, max_inputs))
    inputs = [Val(f"x{i}", draw(shapes()), "float32", float(INPUT_RANGE)) for i in range(n_in)]
    g = _Builder(draw, inputs)
    ops: list[OpSpec] = []
    for k in range(draw(st.integers(max(min_ops, n_in), max(max_ops, n_in)))):
        kind = draw(st.sampled_from(kinds))
        out = GENERATORS[kind](g)
        if out is None:
            kind, out = "unary", gen_unary(g)
        expr, shape, dtype, bound, operands = out
        event(f"op: {kind}")
        result = Val(f"v{k}", tuple(shape), dtype, bound)
        ops.append(OpSpec(kind, result, expr))
        g.used.update(v.name for v in operands)
        g.vals.append(result)
    if g.ids is not None:
        inputs.append(g.ids)
    outputs = tuple(op.result.name for op in ops if op.result.name not in g.used)
    return Recipe(tuple(inputs), tuple(ops), outputs)


def programs(**kwargs: Any) -> st.SearchStrategy[ProgramCase]:
    """Random programs with example arguments (see `recipes` for the size knobs)."""
    return st.builds(build, recipes(**kwargs), st.integers(0, 2**16))


# --- meshes and schedules ------------------------------------------------------------------


def meshes(max_axes: int = 3) -> st.SearchStrategy[dict[str, int]]:
    return st.integers(1, max_axes).flatmap(
        lambda n: st.tuples(*(st.sampled_from(AXIS_SIZES) for _ in range(n))).map(
            lambda sizes: dict(zip(AXIS_NAMES, sizes, strict=False))))


@dataclass(frozen=True)
class Rule:
    """A callable input form `(name, shape) -> form`, as ManualPartition accepts."""

    form: Any

    def __call__(self, name: str, shape: tuple[int, ...]) -> Any:
        return self.form


# Dimensions are the interesting case, so they are drawn most often.
FORMS = ("dim", "dim", "FIRST_DIVISIBLE_DIM", "REPLICATED", "UNKNOWN")


@st.composite
def input_forms(draw, shape: tuple[int, ...], only_unknown: bool = False) -> Any:
    kind = "UNKNOWN" if only_unknown else draw(st.sampled_from(FORMS))
    if kind == "dim":
        form = draw(st.integers(-len(shape), len(shape) - 1))
    else:
        form = getattr(partir, kind)
    return Rule(form) if draw(st.integers(0, 7)) == 7 else form


@st.composite
def schedules(draw, case: ProgramCase, mesh: dict[str, int], min_tactics: int = 1,
              max_tactics: int = 3, only_unknown: bool = False) -> list[partir.ManualPartition]:
    """1-3 ManualPartition tactics, each on a random mesh axis over a random non-empty
    subset of the inputs, each mapped to a dimension (possibly negative), REPLICATED,
    FIRST_DIVISIBLE_DIM or UNKNOWN (or a callable rule returning one)."""
    shape_of = dict(zip(case.input_names, case.input_shapes, strict=True))
    out = []
    unused = list(mesh)
    for t in range(draw(st.integers(min_tactics, max_tactics))):
        # Mostly a fresh axis: reusing one often tiles an input twice on it, an error.
        fresh = unused and draw(st.integers(0, 3)) > 0
        axis = draw(st.sampled_from(tuple(unused if fresh else mesh)))
        if axis in unused:
            unused.remove(axis)
        count = draw(st.integers(1, len(case.input_names)))
        names = draw(st.permutations(case.input_names))[:count]
        inputs = {n: draw(input_forms(shape_of[n], only_unknown)) for n in names}
        out.append(partir.ManualPartition(inputs, axis=axis, name=f"t{t}"))
    return out


@dataclass(frozen=True)
class PartitionCase:
    """A program with a mesh and a schedule to partition it with."""

    program: ProgramCase
    mesh: dict[str, int]
    schedule: tuple[partir.ManualPartition, ...]

    @property
    def only_unknown(self) -> bool:
        return all(getattr(f, "form", f) is partir.UNKNOWN
                   for t in self.schedule for f in t.inputs.values())

    def reproducer(self) -> str:
        return reproducer(self.program, self.mesh, self.schedule)

    def __repr__(self) -> str:
        return f"PartitionCase:\n{self.reproducer()}"


@st.composite
def partition_cases(draw, only_unknown: bool | None = False, max_tactics: int = 3,
                    **program_kwargs: Any) -> PartitionCase:
    """A program, a mesh and a schedule. `only_unknown`: every input form is UNKNOWN
    (True), or not necessarily (False), or so one time in four (None)."""
    case = draw(programs(**program_kwargs), label="program")
    mesh = draw(meshes(), label="mesh")
    if only_unknown is None:
        only_unknown = draw(st.integers(0, 3)) == 3
    schedule = draw(schedules(case, mesh, max_tactics=max_tactics,
                              only_unknown=only_unknown), label="schedule")
    return PartitionCase(case, mesh, tuple(schedule))


def program_case(inputs: dict[str, tuple[int, ...]], ops: Sequence[tuple[str, str]],
                 outputs: Sequence[str] | None = None, seed: int = 0) -> ProgramCase:
    """A ProgramCase written by hand, for explicit examples: float inputs by name and
    shape, and (result name, expression) lines; by default the last result is the output.
    (The recipe does not record the shapes of the results.)"""
    vals = tuple(Val(n, tuple(s), "float32", float(INPUT_RANGE)) for n, s in inputs.items())
    specs = tuple(OpSpec("explicit", Val(n, (), "float32"), e) for n, e in ops)
    outs = tuple(outputs) if outputs is not None else (ops[-1][0],)
    return build(Recipe(vals, specs, outs), seed)


def describe_schedule(schedule: Sequence[partir.ManualPartition]) -> str:
    """The schedule as Python source (callable rules print as `Rule(form=...)`)."""
    text = "[" + ",\n ".join(
        f"partir.ManualPartition({dict(t.inputs)!r}, axis={t.axis!r}, name={t.name!r})"
        for t in schedule) + "]"
    return text.replace("Rule(form=", "(lambda form: lambda name, shape: form)(")


__all__ = ["DIMS", "GENERATORS", "OpSpec", "PartitionCase", "ProgramCase", "Recipe", "Rule",
           "Val", "build", "describe_schedule", "meshes", "partition_cases", "program_case",
           "programs", "recipes", "reproducer", "schedules", "shapes"]
