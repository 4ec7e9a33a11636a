"""Random JAX programs, meshes and schedules from a seed.

A program is built op by op: a family is drawn, it picks operands among the values made
so far (recent ones preferred, so ops chain), draws its parameters, and its output types
come from `jax.eval_shape` of the op's expression; an op JAX rejects is dropped and
another drawn, so every program traces. Control-flow ops generate their bodies the same
way (two levels deep at most). Everything is drawn from `random.Random(seed)`: the same
seed gives the same case."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cache

from tests.fuzz.program import (
    BOOL,
    FLOAT,
    INT,
    KEY,
    PRELUDE,
    RAWKEY,
    U32,
    Block,
    Case,
    Input,
    Op,
    Program,
    TacticSpec,
    Var,
    block_free_vars,
    dead_ops,
    prune,
    tags,
    used_inputs,
    var_types,
    walk_ops,
)

DIMS = (1, 2, 3, 4, 6, 8, 12)
MAX_ELEMS = 1024
MESH_SIZES = (1, 2, 3, 4, 6, 8)
AXES = ("a", "b", "c")
MAX_DEPTH = 2
DATA = (FLOAT, INT)  # kinds most ops take
CONTROL = ("scan", "fori", "while", "cond", "switch", "checkpoint")

# --- output types by eval_shape ---------------------------------------------------------------


@cache
def _namespace() -> dict:
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax import lax

    import partir
    ns = {"jax": jax, "jnp": jnp, "np": np, "lax": lax, "partir": partir}
    exec(PRELUDE, ns)
    return ns


def _aval(v: Var):
    import jax
    import jax.numpy as jnp
    if v.dtype == KEY:
        return jax.ShapeDtypeStruct(v.shape, jax.eval_shape(lambda: jax.random.key(0)).dtype)
    dt = {FLOAT: jnp.float32, INT: jnp.int32, BOOL: jnp.bool_, U32: jnp.uint32,
          RAWKEY: jnp.uint32}[v.dtype]
    return jax.ShapeDtypeStruct(v.shape, dt)


def _kind(dtype) -> str | None:
    import jax
    import numpy as np
    if jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key):
        return KEY
    return {np.dtype("float32"): FLOAT, np.dtype("int32"): INT, np.dtype("bool"): BOOL,
            np.dtype("uint32"): U32}.get(np.dtype(dtype))


@cache
def infer(expr: str, args: tuple[tuple[tuple[int, ...], str], ...]
          ) -> tuple[tuple[tuple[int, ...], str], ...] | None:
    """The output types of `expr` applied to values of the given types; None if JAX
    rejects it or makes a type the fuzzer does not handle."""
    import warnings

    import jax
    names = [f"_a{i}" for i in range(len(args))]
    try:
        fn = eval(f"lambda {', '.join(names)}: {expr.format(*names)}", _namespace())
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            out = jax.eval_shape(fn, *[_aval(Var("_", s, d)) for s, d in args])
    except Exception:
        return None
    leaves = list(out) if isinstance(out, (tuple, list)) else [out]
    result = []
    for leaf in leaves:
        kind = _kind(leaf.dtype)
        if kind is None or not hasattr(leaf, "shape"):
            return None
        result.append((tuple(leaf.shape), kind))
    return tuple(result)


# --- the generator ------------------------------------------------------------------------------

@dataclass
class Scope:
    pool: list[Var]  # values visible here, oldest first
    ops: list[Op]
    depth: int
    local: set[str] = field(default_factory=set)  # values made in this scope


def bshape(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...] | None:
    """NumPy broadcasting of two shapes, or None."""
    out = []
    for i in range(1, max(len(a), len(b)) + 1):
        x = a[-i] if i <= len(a) else 1
        y = b[-i] if i <= len(b) else 1
        if x != y and 1 not in (x, y):
            return None
        out.append(max(x, y))
    return tuple(reversed(out))


def _ilist(xs) -> str:
    return "jnp.asarray([" + ", ".join(str(int(x)) for x in xs) + "], jnp.int32)"


class Generator:
    def __init__(self, seed: int) -> None:
        self.seed = seed
        self.rng = random.Random(seed)
        self.counter = 0
        self.inputs: list[Input] = []
        self.scopes: list[Scope] = []
        self.made = 0  # ops made so far, bodies included
        self.target = 0
        self.n_tags = 0
        self.families: dict[str, Callable[[Scope], bool]] = {
            "unary": self.g_unary, "binary": self.g_binary, "compare": self.g_compare,
            "where": self.g_where, "dot": self.g_dot, "reduce": self.g_reduce,
            "reshape": self.g_reshape, "transpose": self.g_transpose,
            "broadcast": self.g_broadcast, "slice": self.g_slice,
            "dynamic_slice": self.g_dynamic_slice,
            "dynamic_update_slice": self.g_dynamic_update_slice, "pad": self.g_pad,
            "gather": self.g_gather, "scatter": self.g_scatter, "segment": self.g_segment,
            "sort": self.g_sort, "iota": self.g_iota, "conv": self.g_conv,
            "reduce_window": self.g_reduce_window, "norm": self.g_norm, "tile": self.g_tile,
            "stack": self.g_stack, "custom": self.g_custom, "random": self.g_random,
            "tag": self.g_tag, "cumulative": self.g_cumulative, "permute": self.g_permute,
            "scan": self.g_scan, "fori": self.g_fori,
            "while": self.g_while, "cond": self.g_cond, "switch": self.g_switch,
            "checkpoint": self.g_checkpoint,
        }
        # Relative weights: plain data ops most, control flow often enough to nest.
        self.weights = {name: 3 for name in self.families}
        # (while: JAX cannot reverse-differentiate it, so grad modes skip those programs)
        self.weights.update(unary=5, binary=6, dot=5, reduce=4, reshape=4, tag=3, **{"while": 2})

    # -- helpers --

    def fresh(self, prefix: str = "v") -> str:
        self.counter += 1
        return f"{prefix}{self.counter}"

    def chance(self, p: float) -> bool:
        return self.rng.random() < p

    def pick_axis(self, s: Scope) -> tuple[Var, int] | None:
        """A float or int array of rank >= 1 and one of its axes, possibly negative."""
        x = self.pick(s, lambda v: v.dtype in (FLOAT, INT) and len(v.shape) >= 1)
        if x is None:
            return None
        r = len(x.shape)
        return x, self.rng.randrange(-r, r)

    def pick(self, s: Scope, pred: Callable[[Var], bool]) -> Var | None:
        cands = [v for v in s.pool if pred(v)]
        if not cands:
            return None
        # Recent values are likelier: ops chain rather than all reading the inputs.
        return self.rng.choices(cands, weights=range(1, len(cands) + 1))[0]

    def shape(self, max_rank: int = 3, min_rank: int = 1) -> tuple[int, ...]:
        while True:
            r = self.rng.randint(min_rank, max_rank)
            shp = tuple(self.rng.choice(DIMS) for _ in range(r))
            n = 1
            for d in shp:
                n *= d
            if n <= 256:
                return shp

    def new_input(self, shape: tuple[int, ...], dtype: str = FLOAT, init: str | None = None,
                  prefix: str = "x") -> Var:
        v = Var(self.fresh(prefix), shape, dtype)
        init = init or {FLOAT: "normal", KEY: "key", RAWKEY: "rawkey"}.get(dtype, "int:-2:10")
        self.inputs.append(Input(v, init, len(self.inputs)))
        for s in self.scopes:  # an argument of f is visible in every body
            s.pool.insert(0, v)
        return v

    def emit(self, s: Scope, family: str, expr: str, args: list[Var],
             kinds: list[str] | None = None, blocks: list[Block] | None = None,
             outs: list[Var] | None = None) -> bool:
        if outs is None:
            types = infer(expr, tuple((a.shape, a.dtype) for a in args))
            if types is None:
                return False
            outs = []
            for k, (shp, kind) in enumerate(types):
                if kinds is not None:
                    kind = kinds[k]
                outs.append(Var(self.fresh(), shp, kind))
        for o in outs:
            if o.size == 0 or o.size > MAX_ELEMS:
                return False
        s.ops.append(Op(family, expr, [a.name for a in args], outs, blocks or []))
        s.pool.extend(outs)
        s.local |= {o.name for o in outs}
        self.made += 1
        return True

    def data(self, v: Var) -> bool:
        return v.dtype in DATA

    def idx_scalar(self, s: Scope, size: int) -> tuple[str, list[Var]]:
        """A start index for a dimension of `size`: a Python int JAX clamps (negative or past
        the end), a traced int32 constant, or an int32 scalar of the program (a loop
        index, an argmax)."""
        r = self.rng.random()
        if r < 0.35:
            v = self.pick(s, lambda v: v.dtype == INT and v.shape == ())
            if v is not None:
                return "{%d}", [v]
        if r < 0.55:
            return f"jnp.int32({self.rng.randint(-size - 2, size + 2)})", []
        return str(self.rng.randint(-3, size + 2)), []

    @staticmethod
    def with_args(expr: str, first: int, parts: list[tuple[str, list[Var]]]
                  ) -> tuple[str, list[Var]]:
        """Number the `{%d}` placeholders of parts after the `first` arguments."""
        out, extra = [], []
        for text, vs in parts:
            if vs:
                text = text % (first + len(extra))
                extra += vs
            out.append(text)
        return expr.format(*out), extra

    # -- data families --

    def g_unary(self, s: Scope) -> bool:
        x = self.pick(s, lambda v: v.dtype in (FLOAT, INT, BOOL, U32))
        if x is None:
            return False
        exprs = {
            FLOAT: ["jnp.sin({0})", "jnp.tanh({0})", "-{0}", "jnp.abs({0})", "{0} * 0.5",
                    "jnp.square({0})", "jnp.sqrt(jnp.abs({0}) + 1.0)", "jnp.log1p(jnp.abs({0}))",
                    "jnp.exp(jnp.tanh({0}))", "jnp.floor({0} * 2.0).astype(jnp.int32)",
                    "lax.rsqrt({0} * {0} + 1.0)", "jnp.clip({0}, -0.5, 0.5)", "jnp.sign({0})"],
            INT: ["-{0}", "{0} % 3", "jnp.abs({0})", "{0}.astype(jnp.float32)", "{0} * 2 + 1"],
            BOOL: ["{0}.astype(jnp.float32)", "~{0}", "{0}.astype(jnp.int32)"],
            U32: ["({0} >> 28).astype(jnp.float32)", "({0} % 5).astype(jnp.int32)"],
        }[x.dtype]
        return self.emit(s, "unary", self.rng.choice(exprs), [x])

    def g_binary(self, s: Scope) -> bool:
        x = self.pick(s, self.data)
        if x is None:
            return False
        y = self.pick(s, lambda v: v.dtype == x.dtype and bshape(v.shape, x.shape) is not None)
        ops = ["{0} + {1}", "{0} - {1}", "{0} * {1}", "jnp.maximum({0}, {1})",
               "jnp.minimum({0}, {1})"]
        if x.dtype == FLOAT:
            ops.append("{0} / (jnp.abs({1}) + 1.0)")
        op = self.rng.choice(ops)
        if y is None or self.chance(0.15):
            c = "1.5" if x.dtype == FLOAT else "2"
            return self.emit(s, "binary", op.replace("{1}", c), [x])
        if self.chance(0.5):
            x, y = y, x
        return self.emit(s, "binary", op, [x, y])

    def g_compare(self, s: Scope) -> bool:
        x = self.pick(s, self.data)
        if x is None:
            return False
        y = self.pick(s, lambda v: v.dtype == x.dtype and bshape(v.shape, x.shape) is not None)
        if y is not None and self.chance(0.6):
            op = self.rng.choice(["{0} > {1}", "{0} <= {1}", "{0} == {1}", "{0} != {1}"])
            return self.emit(s, "compare", op, [x, y])
        op = self.rng.choice(["{0} > 0", "{0} < 1", "jnp.logical_and({0} > 0, {0} < 2)",
                              "jnp.isfinite({0})" if x.dtype == FLOAT else "{0} >= 3"])
        return self.emit(s, "compare", op, [x])

    def g_where(self, s: Scope) -> bool:
        x = self.pick(s, self.data)
        if x is None:
            return False
        y = self.pick(s, lambda v: v.dtype == x.dtype and bshape(v.shape, x.shape) is not None)
        c = self.pick(s, lambda v: v.dtype == BOOL and bshape(v.shape, x.shape) is not None)
        r = self.rng.random()
        if c is not None and y is not None and r < 0.3:
            return self.emit(s, "where", "jnp.where({0}, {1}, {2})", [c, x, y])
        if y is not None and r < 0.5:
            return self.emit(s, "where", "jnp.where({0} > {1}, {0}, {1})", [x, y])
        if y is not None and y.shape == x.shape and r < 0.7:
            return self.emit(s, "where", "lax.select({0} < {1}, {0}, {1})", [x, y])
        if c is not None and c.shape == x.shape and r < 0.85:
            return self.emit(s, "where", "lax.select({0}, {1}, -{1})", [c, x])
        return self.emit(s, "where", "jnp.where({0} > 0, {0}, 0)", [x])

    def g_dot(self, s: Scope) -> bool:
        a = self.pick(s, lambda v: v.dtype == FLOAT and 1 <= len(v.shape) <= 3)
        if a is None:
            return False
        ca = self.rng.randrange(len(a.shape))
        k = a.shape[ca]
        b = self.pick(s, lambda v: v.dtype == FLOAT and 1 <= len(v.shape) <= 3 and k in v.shape)
        if b is None or self.chance(0.4):
            n = self.rng.choice(DIMS)
            b = self.new_input((k, n) if self.chance(0.7) else (n, k), prefix="w")
        cb = self.rng.choice([i for i, d in enumerate(b.shape) if d == k])
        batch = [(i, j) for i in range(len(a.shape)) for j in range(len(b.shape))
                 if i != ca and j != cb and a.shape[i] == b.shape[j]]
        ba, bb = self.rng.choice(batch) if batch and self.chance(0.3) else (None, None)
        la = [chr(ord("a") + i) for i in range(len(a.shape))]
        lb = [chr(ord("n") + j) for j in range(len(b.shape))]
        lb[cb] = la[ca]
        if ba is not None:
            lb[bb] = la[ba]
        batch_l = [la[ba]] if ba is not None else []
        out = batch_l + [c for i, c in enumerate(la) if i not in (ca, ba)] + \
            [c for j, c in enumerate(lb) if j not in (cb, bb)]
        r = self.rng.random()
        if ba is None and ca == len(a.shape) - 1 and len(b.shape) == 2 and cb == 0 and r < 0.3:
            expr = "{0} @ {1}"
        elif r < 0.65:
            expr = f'jnp.einsum("{"".join(la)},{"".join(lb)}->{"".join(out)}", {{0}}, {{1}})'
        else:
            bt = ((ba,), (bb,)) if ba is not None else ((), ())
            expr = f"lax.dot_general({{0}}, {{1}}, ((({ca},), ({cb},)), {bt}))"
        return self.emit(s, "dot", expr, [a, b])

    def g_reduce(self, s: Scope) -> bool:
        x = self.pick(s, lambda v: self.data(v) and len(v.shape) >= 1)
        if x is None:
            return False
        r = len(x.shape)
        kind = self.rng.choice(["sum", "max", "min", "mean", "prod", "argmax", "argmin"])
        if kind.startswith("arg"):
            axis = self.rng.randrange(-r, r)
            return self.emit(s, "reduce", f"jnp.{kind}({{0}}, axis={axis})", [x])
        u = self.rng.random()
        if u < 0.15:
            axis = "None"
        elif u < 0.35 and r >= 2:
            axis = str(tuple(sorted(self.rng.sample(range(r), 2))))
        else:
            axis = str(self.rng.randrange(-r, r))
        keep = ", keepdims=True" if self.chance(0.3) else ""
        return self.emit(s, "reduce", f"jnp.{kind}({{0}}, axis={axis}{keep})", [x])

    def g_reshape(self, s: Scope) -> bool:
        x = self.pick(s, lambda v: v.dtype not in (KEY, RAWKEY))
        if x is None:
            return False
        shp = list(x.shape)
        options = [(x.size,)]
        for i in range(len(shp) - 1):
            options.append(tuple([*shp[:i], shp[i] * shp[i + 1], *shp[i + 2:]]))
        for i, d in enumerate(shp):
            for p in range(2, d):
                if d % p == 0:
                    options.append(tuple([*shp[:i], p, d // p, *shp[i + 1:]]))
            if d == 1:
                options.append(tuple(shp[:i] + shp[i + 1:]))
        if len(shp) < 4:
            i = self.rng.randint(0, len(shp))
            options.append(tuple([*shp[:i], 1, *shp[i:]]))
        new = self.rng.choice(options)
        expr = self.rng.choice([f"{{0}}.reshape({new})", f"jnp.reshape({{0}}, {new})"])
        return self.emit(s, "reshape", expr, [x])

    def g_transpose(self, s: Scope) -> bool:
        x = self.pick(s, lambda v: v.dtype not in (KEY, RAWKEY) and len(v.shape) >= 2)
        if x is None:
            return False
        r = len(x.shape)
        perm = list(range(r))
        while perm == list(range(r)):
            self.rng.shuffle(perm)
        u = self.rng.random()
        if u < 0.5:
            expr = f"jnp.transpose({{0}}, {tuple(perm)})"
        elif u < 0.7:
            expr = "{0}.T"
        elif u < 0.85:
            i, j = self.rng.sample(range(r), 2)
            expr = f"jnp.swapaxes({{0}}, {i}, {j - r})"
        else:
            expr = f"jnp.moveaxis({{0}}, {self.rng.randrange(r)}, {self.rng.randrange(r)})"
        return self.emit(s, "transpose", expr, [x])

    def g_broadcast(self, s: Scope) -> bool:
        x = self.pick(s, lambda v: v.dtype not in (KEY, RAWKEY) and len(v.shape) <= 3)
        if x is None:
            return False
        n = self.rng.choice(DIMS)
        r = len(x.shape)
        u = self.rng.random()
        if u < 0.3:
            expr = f"jnp.broadcast_to({{0}}, {(n, *x.shape)})"
        elif u < 0.5 and 1 in x.shape:
            expr = f"jnp.broadcast_to({{0}}, {tuple(n if d == 1 else d for d in x.shape)})"
        elif u < 0.7:
            expr = f"jnp.expand_dims({{0}}, {self.rng.randint(-r - 1, r)})"
        else:
            p = self.rng.randint(0, r)
            out = (*x.shape[:p], n, *x.shape[p:])
            dims = tuple(i if i < p else i + 1 for i in range(r))
            expr = f"lax.broadcast_in_dim({{0}}, {out}, {dims})"
        return self.emit(s, "broadcast", expr, [x])

    def g_slice(self, s: Scope) -> bool:
        x = self.pick(s, lambda v: v.dtype not in (KEY,) and len(v.shape) >= 1)
        if x is None:
            return False
        r = len(x.shape)
        d = self.rng.randrange(r)
        size = x.shape[d]
        u = self.rng.random()
        if u < 0.25:
            idx = [":"] * d + [str(self.rng.randrange(-size, size))]
            return self.emit(s, "slice", f"{{0}}[{', '.join(idx)}]", [x])
        if u < 0.7:
            lo = self.rng.choice(["", str(self.rng.randint(-size, size - 1))])
            hi = self.rng.choice(["", str(self.rng.randint(-size + 1, size + 1))])
            st = self.rng.choice(["", "", ":2", ":-1"])
            idx = [":"] * d + [f"{lo}:{hi}{st}"]
            return self.emit(s, "slice", f"{{0}}[{', '.join(idx)}]", [x])
        lo = self.rng.randint(0, size - 1)
        hi = self.rng.randint(lo + 1, size)
        stride = self.rng.choice([1, 1, 2])
        starts = tuple(lo if i == d else 0 for i in range(r))
        limits = tuple(hi if i == d else x.shape[i] for i in range(r))
        strides = tuple(stride if i == d else 1 for i in range(r))
        return self.emit(s, "slice", f"lax.slice({{0}}, {starts}, {limits}, {strides})", [x])

    def g_dynamic_slice(self, s: Scope) -> bool:
        x = self.pick(s, lambda v: v.dtype in (FLOAT, INT, BOOL) and len(v.shape) >= 1)
        if x is None:
            return False
        r = len(x.shape)
        if self.chance(0.3):
            d = self.rng.randrange(r)
            start = self.idx_scalar(s, x.shape[d])
            if self.chance(0.5):
                size = self.rng.randint(1, x.shape[d])
                expr, extra = self.with_args(
                    f"lax.dynamic_slice_in_dim({{{{0}}}}, {{}}, {size}, axis={d})", 1, [start])
            else:
                expr, extra = self.with_args(
                    f"lax.dynamic_index_in_dim({{{{0}}}}, {{}}, axis={d}, keepdims=False)",
                    1, [start])
            return self.emit(s, "dynamic_slice", expr, [x, *extra])
        starts = [self.idx_scalar(s, n) for n in x.shape]
        sizes = tuple(self.rng.randint(1, n) for n in x.shape)
        tmpl = "lax.dynamic_slice({{0}}, (" + "".join("{}, " for _ in starts) + f"), {sizes})"
        expr, extra = self.with_args(tmpl, 1, starts)
        return self.emit(s, "dynamic_slice", expr, [x, *extra])

    def g_dynamic_update_slice(self, s: Scope) -> bool:
        x = self.pick(s, lambda v: v.dtype in (FLOAT, INT) and len(v.shape) >= 1)
        if x is None:
            return False
        u = self.pick(s, lambda v: v.dtype == x.dtype and len(v.shape) == len(x.shape)
                      and all(a <= b for a, b in zip(v.shape, x.shape, strict=True)))
        starts = [self.idx_scalar(s, n) for n in x.shape]
        if u is None or self.chance(0.3):
            sl = ", ".join(f"0:{self.rng.randint(1, n)}" for n in x.shape)
            upd, args = f"{{{{0}}}}[{sl}] * 2", [x]  # a corner of x itself
        else:
            upd, args = "{{1}}", [x, u]
        body = "lax.dynamic_update_slice({{0}}, " + upd + ", (" + \
            "".join("{}, " for _ in starts) + "))"
        expr, extra = self.with_args(body, len(args), starts)
        return self.emit(s, "dynamic_update_slice", expr, [*args, *extra])

    def g_pad(self, s: Scope) -> bool:
        x = self.pick(s, lambda v: v.dtype in (FLOAT, INT) and 1 <= len(v.shape) <= 3)
        if x is None:
            return False
        r = len(x.shape)
        if self.chance(0.5):
            pads = tuple((self.rng.randint(0, 2), self.rng.randint(0, 2)) for _ in range(r))
            mode = self.rng.choice(["", "", ', mode="edge"', ', mode="reflect"', ', mode="wrap"'])
            return self.emit(s, "pad", f"jnp.pad({{0}}, {pads}{mode})", [x])
        cfg = tuple((self.rng.randint(-2, 2), self.rng.randint(-2, 2), self.rng.randint(0, 1))
                    for _ in range(r))
        return self.emit(s, "pad", f"lax.pad({{0}}, jnp.array(-1, {{0}}.dtype), {cfg})", [x])

    def _indices(self, s: Scope, size: int, mode: str | None, shape: tuple[int, ...]
                 ) -> tuple[str, list[Var]]:
        n = 1
        for d in shape:
            n *= d
        if mode == "promise_in_bounds":
            vals = [self.rng.randrange(size) for _ in range(n)]
        else:
            vals = [self.rng.randint(-size - 2, size + 2) for _ in range(n)]
        if mode != "promise_in_bounds" and self.chance(0.3):
            v = self.pick(s, lambda v: v.dtype == INT and 1 <= len(v.shape) <= 2)
            if v is not None:
                return "{%d}", [v]
            return "{%d}", [self.new_input(shape, INT, f"int:{-size - 2}:{size + 2}", "i")]
        text = _ilist(vals)
        if len(shape) > 1:
            text += f".reshape({shape})"
        return text, []

    def g_gather(self, s: Scope) -> bool:
        x = self.pick(s, lambda v: v.dtype in (FLOAT, INT) and len(v.shape) >= 1)
        if x is None:
            return False
        r = len(x.shape)
        d = self.rng.randrange(r)
        mode = self.rng.choice(["clip", "fill", "promise_in_bounds", "wrap", None])
        shape = (self.rng.randint(1, 6),) if self.chance(0.8) else (2, 3)
        idx, extra = self._indices(s, x.shape[d], mode, shape)
        fill = ""
        # JAX's default NaN fill stays in the mix: NaN must propagate through partitioned
        # reductions as it does in JAX (where jax.jit itself disagrees with op-by-op JAX,
        # the runner calls the case INVALID).
        if mode == "fill" and self.chance(0.7):
            fill = ", fill_value=-1" if x.dtype == INT else ", fill_value=7.5"
        u = self.rng.random()
        if u < 0.6:
            m = f', mode="{mode}"' if mode else ""
            expr, args = self.with_args(f"jnp.take({{{{0}}}}, {{}}, axis={d}{m}{fill})", 1,
                                        [(idx, extra)])
        elif u < 0.8:
            m = mode or "fill"
            sl = ":, " * d
            expr, args = self.with_args(f'{{{{0}}}}.at[{sl}{{}}].get(mode="{m}"{fill})', 1,
                                        [(idx, extra)])
        else:
            # take_along_axis: one index per position, the dimension d replaced
            ishape = tuple(self.rng.randint(1, 3) if i == d else n for i, n in enumerate(x.shape))
            idx, extra = self._indices(s, x.shape[d], mode, ishape)
            if extra:  # an int value of the program rarely has this shape: use constants
                idx, extra = self._indices(s, x.shape[d], "promise_in_bounds", ishape)
            m = f', mode="{mode}"' if mode in ("clip", "fill", "promise_in_bounds") else ""
            expr, args = f"jnp.take_along_axis({{0}}, {idx}, axis={d}{m}{fill})", []
        return self.emit(s, "gather", expr, [x, *args])

    def g_scatter(self, s: Scope) -> bool:
        x = self.pick(s, lambda v: v.dtype in (FLOAT, INT) and len(v.shape) >= 1)
        if x is None:
            return False
        d = 0 if len(x.shape) == 1 or self.chance(0.6) else 1
        size = x.shape[d]
        # (no `mul`: JAX differentiates it only with unique indices)
        kind = self.rng.choice(["set", "add", "max", "min"])
        mode = self.rng.choice([None, None, "drop", "clip", "promise_in_bounds"])
        m = self.rng.randint(1, min(6, size + 2))
        if kind == "set" or mode == "promise_in_bounds":
            # distinct positions: duplicates would make `set` pick an arbitrary update
            pos = self.rng.sample(range(size), min(m, size))
            vals = [p - size if self.chance(0.3) else p for p in pos]
            if mode in (None, "drop") and self.chance(0.4):
                vals.append(size + self.rng.randint(0, 3))  # out of bounds: dropped
        else:
            vals = [self.rng.randint(-size - 2, size + 2) for _ in range(m)]
        idx = _ilist(vals)
        ushape = (*x.shape[:d], len(vals), *x.shape[d + 1:])
        u = self.pick(s, lambda v: v.dtype == x.dtype and v.shape == ushape)
        r = self.rng.random()
        args = [x]
        if u is not None and r < 0.5:
            upd, args = "{1}", [x, u]
        elif r < 0.75 and x.dtype == FLOAT:
            upd, args = "{1}", [x, self.new_input(ushape, prefix="u")]
        else:
            upd = "1.5" if x.dtype == FLOAT else "3"
        sl = ":, " * d
        mstr = f', mode="{mode}"' if mode else ""
        return self.emit(s, "scatter", f"{{0}}.at[{sl}{idx}].{kind}({upd}{mstr})", args)

    def g_segment(self, s: Scope) -> bool:
        x = self.pick(s, lambda v: v.dtype == FLOAT and len(v.shape) >= 1)
        if x is None:
            return False
        n0 = x.shape[0]
        num = self.rng.randint(1, 8)
        kind = self.rng.choice(["sum", "sum", "max", "min"])  # (prod: a scatter_mul, see g_scatter)
        if self.chance(0.3):
            ids, args = "{1}", [x, self.new_input((n0,), INT, f"int:-1:{num + 1}", "seg")]
        else:
            vals = [self.rng.randrange(num) for _ in range(n0)]
            if self.chance(0.3):
                vals[self.rng.randrange(n0)] = self.rng.choice([-1, num])  # dropped
            if self.chance(0.5):
                vals.sort()
            ids, args = _ilist(vals), [x]
        return self.emit(s, "segment",
                         f"jax.ops.segment_{kind}({{0}}, {ids}, num_segments={num})", args)

    def g_sort(self, s: Scope) -> bool:
        found = self.pick_axis(s)
        if found is None:
            return False
        x, d = found
        r = len(x.shape)
        u = self.rng.random()
        if u < 0.3:
            desc = ", descending=True" if self.chance(0.3) else ""
            expr = f"jnp.sort({{0}}, axis={d}{desc})"
        elif u < 0.5:
            expr = f"jnp.argsort({{0}}, axis={d})"
        elif u < 0.85:
            expr = f"lax.top_k({{0}}, {self.rng.randint(1, x.shape[-1])})"
        else:
            expr = f"lax.sort({{0}}, dimension={d % r})"
        return self.emit(s, "sort", expr, [x])

    def g_iota(self, s: Scope) -> bool:
        x = self.pick(s, lambda v: v.dtype in (FLOAT, INT) and len(v.shape) >= 1)
        if x is None:
            return False
        n = x.shape[-1]
        u = self.rng.random()
        if len(x.shape) >= 2 and u < 0.4:
            fn = self.rng.choice(["tril", "triu"])
            return self.emit(s, "iota", f"jnp.{fn}({{0}}, {self.rng.randint(-1, 1)})", [x])
        if len(x.shape) >= 2 and u < 0.6:
            m = x.shape[-2]
            return self.emit(s, "iota", f"jnp.where(jnp.arange({m})[:, None] >= "
                             f"jnp.arange({n})[None, :], {{0}}, 0)", [x])
        if u < 0.75:
            return self.emit(s, "iota", f"{{0}} * (jnp.arange({n}) < {self.rng.randint(0, n)})",
                             [x])
        if u < 0.9:
            return self.emit(s, "iota", f"{{0}} + jnp.arange({n}, dtype={{0}}.dtype)", [x])
        d = self.rng.randrange(len(x.shape))
        return self.emit(s, "iota", f"lax.broadcasted_iota(jnp.int32, {x.shape}, {d}) < 2", [])

    def g_conv(self, s: Scope) -> bool:
        x = self.pick(s, lambda v: v.dtype == FLOAT and len(v.shape) in (3, 4))
        if x is None:
            if not self.chance(0.5):
                return False
            x = self.new_input((2, self.rng.choice((1, 2, 3, 4)), 6) if self.chance(0.6)
                               else (2, 2, 4, 4))
        nsp = len(x.shape) - 2
        channels_last = self.chance(0.3)
        c = x.shape[-1] if channels_last else x.shape[1]
        sp = x.shape[1:-1] if channels_last else x.shape[2:]
        groups = self.rng.choice([g for g in (1, 2) if c % g == 0])
        o = self.rng.choice((1, 2, 3, 4)) * groups
        ks = tuple(self.rng.randint(1, min(3, n)) for n in sp)
        if channels_last:
            dn = ("NWC", "WIO", "NWC") if nsp == 1 else ("NHWC", "HWIO", "NHWC")
            wshape = (*ks, c // groups, o)
        else:
            dn = ("NCW", "OIW", "NCW") if nsp == 1 else ("NCHW", "OIHW", "NCHW")
            wshape = (o, c // groups, *ks)
        w = self.pick(s, lambda v: v.dtype == FLOAT and v.shape == wshape)
        if w is None or self.chance(0.5):
            w = self.new_input(wshape, prefix="w")
        strides = tuple(self.rng.choice((1, 1, 2)) for _ in sp)
        padding = self.rng.choice(['"SAME"', '"VALID"', str(((1, 0),) * nsp)])
        rhs_dil = tuple(self.rng.choice((1, 1, 2)) for _ in sp)
        lhs_dil = tuple(self.rng.choice((1, 1, 1, 2)) for _ in sp)
        expr = (f"lax.conv_general_dilated({{0}}, {{1}}, window_strides={strides}, "
                f"padding={padding}, lhs_dilation={lhs_dil}, rhs_dilation={rhs_dil}, "
                f"dimension_numbers={dn}, feature_group_count={groups})")
        return self.emit(s, "conv", expr, [x, w])

    def g_reduce_window(self, s: Scope) -> bool:
        x = self.pick(s, lambda v: v.dtype == FLOAT and 1 <= len(v.shape) <= 4)
        if x is None:
            return False
        win = tuple(self.rng.randint(1, min(3, n)) for n in x.shape)
        strides = tuple(self.rng.choice((1, 1, 2)) for _ in x.shape)
        pad = self.rng.choice(['"VALID"', '"SAME"'])
        init, op = self.rng.choice([("-jnp.inf", "lax.max"), ("0.0", "lax.add"),
                                    ("jnp.inf", "lax.min")])
        expr = f"lax.reduce_window({{0}}, {init}, {op}, {win}, {strides}, {pad})"
        return self.emit(s, "reduce_window", expr, [x])

    def g_norm(self, s: Scope) -> bool:
        x = self.pick(s, lambda v: v.dtype == FLOAT and len(v.shape) >= 1)
        if x is None:
            return False
        d = self.rng.randrange(-len(x.shape), len(x.shape))
        expr = self.rng.choice([
            "({0} - jnp.mean({0}, axis=-1, keepdims=True)) * "
            "lax.rsqrt(jnp.var({0}, axis=-1, keepdims=True) + 1e-5)",
            "{0} * lax.rsqrt(jnp.mean(jnp.square({0}), axis=-1, keepdims=True) + 1e-6)",
            f"jax.nn.softmax({{0}}, axis={d})", f"jax.nn.log_softmax({{0}}, axis={d})",
            f"jax.nn.logsumexp({{0}}, axis={d})",
        ])
        return self.emit(s, "norm", expr, [x])

    def g_tile(self, s: Scope) -> bool:
        x = self.pick(s, lambda v: v.dtype in (FLOAT, INT) and 1 <= len(v.shape) <= 3)
        if x is None:
            return False
        if self.chance(0.7):
            reps = tuple(self.rng.randint(1, 3) for _ in range(self.rng.randint(1, len(x.shape)
                                                                                  + 1)))
            return self.emit(s, "tile", f"jnp.tile({{0}}, {reps})", [x])
        d = self.rng.randrange(len(x.shape))
        return self.emit(s, "tile", f"jnp.repeat({{0}}, {self.rng.randint(2, 3)}, axis={d})", [x])

    def g_stack(self, s: Scope) -> bool:
        x = self.pick(s, lambda v: v.dtype in (FLOAT, INT) and len(v.shape) <= 3)
        if x is None:
            return False
        r = len(x.shape)
        y = self.pick(s, lambda v: v.dtype == x.dtype and v.shape == x.shape and v != x)
        if self.chance(0.3) and r >= 1:
            d = self.rng.randrange(r)
            z = self.pick(s, lambda v: v.dtype == x.dtype and len(v.shape) == r and all(
                a == b for i, (a, b) in enumerate(zip(v.shape, x.shape, strict=True)) if i != d))
            if z is not None:
                return self.emit(s, "stack", f"jnp.concatenate([{{0}}, {{1}}], axis={d})", [x, z])
        d = self.rng.randint(-r - 1, r)
        if y is None:
            return self.emit(s, "stack", f"jnp.stack([{{0}}, -{{0}}, {{0}} * 2], axis={d})", [x])
        return self.emit(s, "stack", f"jnp.stack([{{0}}, {{1}}], axis={d})", [x, y])

    def g_custom(self, s: Scope) -> bool:
        x = self.pick(s, lambda v: v.dtype == FLOAT)
        if x is None:
            return False
        if self.chance(0.2):
            y = self.pick(s, lambda v: v.dtype == FLOAT and v.shape == x.shape) or x
            return self.emit(s, "custom", "mul_tanh({0}, {1})", [x, y])
        fn = self.rng.choice(["jax.nn.relu", "jax.nn.relu6", "jax.nn.softplus", "jax.nn.gelu",
                              "jax.nn.silu", "sin2", "jax.nn.hard_tanh"])
        return self.emit(s, "custom", f"{fn}({{0}})", [x])

    def g_random(self, s: Scope) -> bool:
        k = self.pick(s, lambda v: v.dtype in (KEY, RAWKEY))
        if k is None or self.chance(0.15):
            u = self.rng.random()
            if u < 0.35:
                k = self.new_input((), KEY, prefix="key")
            elif u < 0.6:
                k = self.new_input((2,), RAWKEY, prefix="rkey")
            else:
                raw = self.chance(0.4)
                fn = "jax.random.PRNGKey" if raw else "jax.random.key"
                return self.emit(s, "random", f"{fn}({self.rng.randint(0, 99)})", [],
                                 kinds=[RAWKEY if raw else KEY])
        raw = k.dtype == RAWKEY
        batched = len(k.shape) > (1 if raw else 0)
        like = self.pick(s, lambda v: v.dtype == FLOAT and len(v.shape) >= 1)
        shp = like.shape if like is not None else self.shape()
        if batched:
            kind = [RAWKEY if raw else KEY]
            n = k.shape[0]
            sub = shp[1:] if like is not None and len(shp) >= 1 else (3,)
            expr = self.rng.choice([
                f"jax.vmap(lambda k: jax.random.normal(k, {sub}))({{0}})",
                f"jax.vmap(lambda k: jax.random.uniform(k, {sub}))({{0}})",
                f"{{0}}[{self.rng.randrange(n)}]",
            ])
            return self.emit(s, "random", expr, [k], kinds=kind if expr.startswith("{0}[")
                             else None)
        u = self.rng.random()
        kind = [RAWKEY if raw else KEY]
        if u < 0.15:
            return self.emit(s, "random", f"jax.random.fold_in({{0}}, {self.rng.randint(0, 9)})",
                             [k], kinds=kind)
        if u < 0.3:
            return self.emit(s, "random", f"jax.random.split({{0}})[{self.rng.randint(0, 1)}]",
                             [k], kinds=kind)
        if u < 0.38:
            n = shp[0]
            return self.emit(s, "random", f"jax.random.split({{0}}, {n})", [k], kinds=kind)
        if u < 0.43 and not raw:
            return self.emit(s, "random", "jax.random.key_data({0})", [k], kinds=[RAWKEY])
        if u < 0.48 and raw:
            return self.emit(s, "random", "jax.random.wrap_key_data({0})", [k], kinds=[KEY])
        draw = self.rng.choice([
            f"jax.random.normal({{0}}, {shp})", f"jax.random.uniform({{0}}, {shp})",
            f"jax.random.bernoulli({{0}}, 0.7, {shp})", f"jax.random.bits({{0}}, {shp})",
            f"jax.random.randint({{0}}, {shp}, 0, 5)", f"jax.random.gumbel({{0}}, {shp})",
        ])
        return self.emit(s, "random", draw, [k])

    def g_cumulative(self, s: Scope) -> bool:
        found = self.pick_axis(s)
        if found is None:
            return False
        x, d = found
        r = len(x.shape)
        u = self.rng.random()
        if u < 0.5:
            fn = self.rng.choice(["cumsum", "cummax", "cummin", "cumprod"] +
                                 (["cumlogsumexp"] if x.dtype == FLOAT else []))
            rev = ", reverse=True" if self.chance(0.3) else ""
            return self.emit(s, "cumulative", f"lax.{fn}({{0}}, axis={d % r}{rev})", [x])
        if u < 0.8:
            return self.emit(s, "cumulative", f"jnp.cumsum({{0}}, axis={d})", [x])
        return self.emit(s, "cumulative", f"jnp.diff({{0}}, axis={d})", [x])

    def g_permute(self, s: Scope) -> bool:
        found = self.pick_axis(s)
        if found is None:
            return False
        x, d = found
        u = self.rng.random()
        if u < 0.45:
            shift = self.rng.randint(-x.shape[d] - 1, x.shape[d] + 1)
            return self.emit(s, "permute", f"jnp.roll({{0}}, {shift}, axis={d})", [x])
        if u < 0.75:
            return self.emit(s, "permute", f"jnp.flip({{0}}, axis={d})", [x])
        if u < 0.9 and x.dtype == FLOAT:
            # one-hot of the argmax: an iota compared with an index
            return self.emit(s, "permute", f"jax.nn.one_hot(jnp.argmax({{0}}, axis={d}), "
                             f"{x.shape[d]})", [x])
        sorted_ = self.pick(s, lambda v: v.dtype == x.dtype and len(v.shape) == 1)
        if sorted_ is None:
            return False
        return self.emit(s, "permute", "jnp.searchsorted(jnp.sort({0}), {1})", [sorted_, x])

    def g_tag(self, s: Scope) -> bool:
        x = self.pick(s, lambda v: v.dtype in (FLOAT, INT) and v.name in s.local)
        if x is None:
            return False
        self.n_tags += 1
        return self.emit(s, "tag", f'partir.tag({{0}}, "t{self.n_tags}")', [x])

    # -- control flow --

    def body(self, s: Scope, params: list[Var]) -> Scope:
        inner = Scope(list(s.pool) + params, [], s.depth + 1)
        self.scopes.append(inner)
        budget = self.rng.randint(1, max(1, min(4, self.target - self.made)))
        for k in range(budget):
            # a body has one op at least; past the program's target, no more
            if k and self.made >= self.target:
                break
            self.one_op(inner)
        self.scopes.pop()
        return inner

    def result(self, inner: Scope, like: Var) -> Var:
        """The body's result of `like`'s type (a new carry, a branch's result): the last
        value of that type made in the body (else `like` itself), combined with the last
        float value the body made and nothing read, so the body's ops are not dead code."""
        local = [v for v in inner.pool if v.name in inner.local]
        same = [v for v in local if v.shape == like.shape and v.dtype == like.dtype]
        base = (same[-1] if self.chance(0.8) else self.rng.choice(same)) if same else like
        read = {a for op in inner.ops for a in op.args}
        for op in inner.ops:
            for b in op.blocks:
                read |= block_free_vars(b)
        sinks = [v for v in local if v.dtype == FLOAT and v.name not in read and v != base]
        if not sinks or self.made >= self.target:
            return base
        v = sinks[-1]
        if bshape(like.shape, v.shape) == like.shape:
            ok = self.emit(inner, "binary", "{0} * 0.5 + jnp.tanh({1})", [base, v])
        else:
            ok = self.emit(inner, "binary", "{0} + jnp.mean({1})", [base, v])
        return inner.pool[-1] if ok else base

    def g_scan(self, s: Scope) -> bool:
        if s.depth >= MAX_DEPTH:
            return False
        c = self.pick(s, lambda v: v.dtype == FLOAT)
        xs = self.pick(s, lambda v: self.data(v) and len(v.shape) >= 1 and v.shape[0] <= 8)
        if c is None:
            return False
        cp = Var(self.fresh("c"), c.shape, FLOAT)
        self.made += 1
        if xs is None or self.chance(0.2):
            n = self.rng.randint(1, 4)
            inner = self.body(s, [cp])
            r = self.result(inner, cp)
            block = Block([cp], "{p0}, _", inner.ops, [r.name, r.name], "{r0}, {r1}")
            outs = [Var(self.fresh(), c.shape, FLOAT), Var(self.fresh(), (n, *c.shape), FLOAT)]
            return self._place(s, "scan", f"lax.scan({{b0}}, {{0}}, None, length={n})", [c],
                               [block], outs)
        xp = Var(self.fresh("x"), xs.shape[1:], xs.dtype)
        inner = self.body(s, [cp, xp])
        r = self.result(inner, cp)
        ys = [v for v in inner.pool if v.name in inner.local and v.dtype in DATA
              and v.shape in (cp.shape, xp.shape)]
        y = self.rng.choice(ys) if ys else self.rng.choice([cp, xp])
        block = Block([cp, xp], "{p0}, {p1}", inner.ops, [r.name, y.name], "{r0}, {r1}")
        extra = self.rng.choice(["", "", ", reverse=True", ", unroll=2"])
        outs = [Var(self.fresh(), c.shape, FLOAT),
                Var(self.fresh(), (xs.shape[0], *y.shape), y.dtype)]
        return self._place(s, "scan", f"lax.scan({{b0}}, {{0}}, {{1}}{extra})", [c, xs], [block],
                           outs)

    def _place(self, s: Scope, family: str, expr: str, args: list[Var], blocks: list[Block],
               outs: list[Var]) -> bool:
        # `made` counted this op when its body started; emit counts it again
        self.made -= 1
        return self.emit(s, family, expr, args, blocks=blocks, outs=outs)

    def _loop_body(self, s: Scope) -> tuple[Var, Var, Var, Scope, Var] | None:
        if s.depth >= MAX_DEPTH:
            return None
        c = self.pick(s, lambda v: v.dtype == FLOAT)
        if c is None:
            return None
        ip = Var(self.fresh("i"), (), INT)
        cp = Var(self.fresh("c"), c.shape, FLOAT)
        self.made += 1
        inner = self.body(s, [ip, cp])
        return c, ip, cp, inner, self.result(inner, cp)

    def g_fori(self, s: Scope) -> bool:
        got = self._loop_body(s)
        if got is None:
            return False
        c, ip, cp, inner, r = got
        lo = self.rng.randint(0, 1)
        hi = lo + self.rng.randint(1, 4)
        block = Block([ip, cp], "{p0}, {p1}", inner.ops, [r.name], "{r0}")
        return self._place(s, "fori", f"lax.fori_loop({lo}, {hi}, {{b0}}, {{0}})", [c], [block],
                           [Var(self.fresh(), c.shape, FLOAT)])

    def g_while(self, s: Scope) -> bool:
        got = self._loop_body(s)
        if got is None:
            return False
        c, ip, cp, inner, r = got
        n = self.rng.randint(1, 4)
        cond = self.rng.choice([f"s[0] < {n}", f"(s[0] < {n}) & (jnp.sum(s[1]) < 1e4)"])
        block = Block([ip, cp], "state", inner.ops, [r.name], "({p0} + 1, {r0})",
                      unpack="{p0}, {p1} = state")
        expr = f"lax.while_loop(lambda s: {cond}, {{b0}}, (jnp.int32(0), {{0}}))[1]"
        return self._place(s, "while", expr, [c], [block], [Var(self.fresh(), c.shape, FLOAT)])

    def _branches(self, s: Scope, n: int) -> tuple[Var, list[Block]] | None:
        if s.depth >= MAX_DEPTH:
            return None
        c = self.pick(s, lambda v: v.dtype == FLOAT)
        if c is None:
            return None
        self.made += 1
        blocks = []
        for _ in range(n):
            cp = Var(self.fresh("c"), c.shape, FLOAT)
            inner = self.body(s, [cp])
            blocks.append(Block([cp], "{p0}", inner.ops, [self.result(inner, cp).name], "{r0}"))
        return c, blocks

    def g_cond(self, s: Scope) -> bool:
        got = self._branches(s, 2)
        if got is None:
            return False
        c, blocks = got
        p = self.pick(s, lambda v: v.dtype == BOOL and v.shape == ())
        if p is not None and self.chance(0.5):
            expr, args = "lax.cond({1}, {b0}, {b1}, {0})", [c, p]
        else:
            q = self.pick(s, lambda v: v.dtype == FLOAT) or c
            # Not at 0: the sum of a centred value (a layer norm's) is 0 up to rounding,
            # which any other order of the sum's additions may flip (fuzzer seed 2513).
            expr, args = "lax.cond(jnp.sum({1}) > 0.5, {b0}, {b1}, {0})", [c, q]
        return self._place(s, "cond", expr, args, blocks, [Var(self.fresh(), c.shape, FLOAT)])

    def g_switch(self, s: Scope) -> bool:
        n = self.rng.randint(2, 3)
        got = self._branches(s, n)
        if got is None:
            return False
        c, blocks = got
        fns = ", ".join(f"{{b{i}}}" for i in range(n))
        q = self.pick(s, lambda v: v.dtype == FLOAT) or c
        # an index out of range is clamped by lax.switch
        idx = self.rng.choice(["jnp.argmax({1}) % 3", "jnp.argmax({1})",
                               f"jnp.int32({self.rng.randint(-1, 4)}) + 0 * jnp.argmax({{1}})"])
        return self._place(s, "switch", f"lax.switch({idx}, [{fns}], {{0}})", [c, q], blocks,
                           [Var(self.fresh(), c.shape, FLOAT)])

    def g_checkpoint(self, s: Scope) -> bool:
        got = self._branches(s, 1)
        if got is None:
            return False
        c, blocks = got
        policy = self.rng.choice(["", ", policy=jax.checkpoint_policies.nothing_saveable",
                                  ", prevent_cse=False"])
        return self._place(s, "checkpoint", f"jax.checkpoint({{b0}}{policy})({{0}})", [c],
                           blocks, [Var(self.fresh(), c.shape, FLOAT)])

    # -- driving --

    def one_op(self, s: Scope) -> None:
        names = list(self.families)
        if self.target - self.made < 3:  # no room left for a body: no control flow
            names = [n for n in names if n not in CONTROL]
        weights = [self.weights[n] * (3 if n == "tag" and s.depth else 1) for n in names]
        for _ in range(50):
            fam = self.rng.choices(names, weights=weights)[0]
            ops_before = len(s.ops)
            made_before = self.made
            if self.families[fam](s):
                return
            # a rejected op leaves nothing behind
            del s.ops[ops_before:]
            self.made = made_before

    def program(self) -> Program:
        top = Scope([], [], 0)
        self.scopes = [top]
        for _ in range(self.rng.randint(1, 2)):
            self.new_input(self.shape(max_rank=4 if self.chance(0.2) else 3))
        if self.chance(0.2):
            self.new_input((self.rng.randint(1, 6),), INT, "int:-3:12", "i")
        self.target = self.rng.randint(3, 25)
        while self.made < self.target:
            self.one_op(top)
        used: set[str] = set()
        for op in top.ops:
            used |= set(op.args)
            for b in op.blocks:
                used |= block_free_vars(b)
        made = [v for op in top.ops for v in op.outs if v.dtype in (FLOAT, INT, BOOL, U32)]
        sinks = [v for v in made if v.name not in used]
        outs = sinks[-3:] + ([self.rng.choice(made)] if made and self.chance(0.3) else [])
        if not any(v.dtype == FLOAT for v in outs):
            floats = [v for v in made if v.dtype == FLOAT] or \
                [i.var for i in self.inputs if i.var.dtype == FLOAT]
            outs.append(floats[-1])
        names = []
        for v in outs:
            if v.name not in names:
                names.append(v.name)
        program = Program(self.inputs, top.ops, names)
        # A tag on a value nothing reads is not in the traced program (JAX drops dead
        # code in bodies), so a tactic naming it would be refused: drop such tags.
        dead = dead_ops(program)
        dead_tags = {op.outs[0].name for op in walk_ops(program.ops)
                     if op.family == "tag" and op.outs[0].name in dead}
        return prune(program, dead_tags) if dead_tags else program

    def mesh(self) -> list[tuple[str, int]]:
        n = self.rng.randint(1, 3)
        sizes: list[int] = []
        total = 1
        for _ in range(n):
            size = self.rng.choice([m for m in MESH_SIZES if total * m <= 8])
            sizes.append(size)
            total *= size
        return list(zip(AXES, sizes, strict=False))

    def schedule(self, program: Program, mesh: list[tuple[str, int]]) -> list[TacticSpec]:
        values = {i.var.name: i.var for i in used_inputs(program)}
        tag_names = set(tags(program))
        types = var_types(program)
        for op in walk_ops(program.ops):
            if op.family == "tag":
                values[op.expr.split('"')[1]] = types[op.outs[0].name]
        names = list(values)
        out: list[TacticSpec] = []
        claimed: set[tuple[str, str]] = set()
        for t in range(self.rng.randint(1, 4)):
            axis, size = self.rng.choice(mesh)
            if size in (4, 6, 8) and self.chance(0.15):
                subs = [(p, q) for p in (1, 2, 3, 4) for q in (2, 3, 4)
                        if p * q <= size and size % (p * q) == 0 and q < size]
                p, q = self.rng.choice(subs)
                axis, size = f"{axis}:({p}){q}", q
            # tags are named more often: they are what reaches inside bodies
            picks = self.rng.sample(names, min(len(names), self.rng.randint(1, 3)))
            if tag_names and self.chance(0.4):
                picks = [self.rng.choice(sorted(tag_names)), *picks]
            entries = []
            base = axis.split(":")[0]
            for name in dict.fromkeys(picks):
                # a value tiled twice on one axis is a refusal (AlreadyTiledError): draw it
                # rarely, not whenever two tactics share an axis
                if (base, name) in claimed and not self.chance(0.02):
                    continue
                claimed.add((base, name))
                entries.append((name, self.dim_value(values[name], size)))
            if not entries:
                continue
            out.append(TacticSpec(axis, entries, f"T{t}" if self.chance(0.5) else None,
                                  pad=not self.chance(0.1)))
        return out

    def dim_value(self, v: Var, size: int) -> str:
        r = len(v.shape)
        u = self.rng.random()
        if r == 0 or v.dtype == KEY:
            return "partir.REPLICATED" if u < 0.7 else ("partir.UNKNOWN" if u < 0.9 else "0")
        if u < 0.08:
            return "partir.REPLICATED"
        if u < 0.12:
            return "partir.BARRIER"
        if u < 0.25:
            return "partir.FIRST_DIVISIBLE_DIM"
        if u < 0.3:
            return f"partir.FIRST_DIVISIBLE_DIM.after({self.rng.randrange(r)})"
        if u < 0.35:
            return "partir.UNKNOWN"
        divisible = [d for d in range(r) if v.shape[d] % size == 0 and v.shape[d] > 1]
        d = self.rng.choice(divisible) if divisible and self.chance(0.7) else \
            self.rng.randrange(r)
        return str(d - r if self.chance(0.3) else d)


def generate(seed: int) -> Case:
    g = Generator(seed)
    program = g.program()
    mesh = g.mesh()
    return Case(seed, program, mesh, g.schedule(program, mesh))
