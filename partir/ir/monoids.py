"""The reduction monoids of `#sum<m>` loops and of the `all_reduce<@m>` and
`reduce_scatter<@m>` collectives, declared once for every stage.

Each monoid says how two arrays combine (`combine`, with jax.numpy: the sequential
interpreters fold the iterations' results with it), which JAX collective reduces it over
named mesh axes (`collective`), whether it is logical (`and`, `or` combine bool operands
only: on integers JAX's `and`/`or` are bitwise, which no `#sum` computes), which
elementwise primitives compute it on two values (`elementwise`: `add_any` is how JAX's
autodiff accumulates the cotangents of a value used twice), which reduce primitive
computes it over dims (`reduce`), and its neutral element per dtype (`identity`).

`MONOIDS` maps each name to its monoid in the order the IR's messages list them
(add, max, min, and, or); `NAMES` is that order.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import jax.numpy as jnp
import numpy as np
from jax import lax


@dataclass(frozen=True)
class Monoid:
    name: str
    combine: Callable[[Any, Any], Any]
    collective: Callable[[Any, tuple[str, ...]], Any]
    logical: bool
    elementwise: tuple[str, ...]
    reduce: str
    _identity: Callable[[np.dtype], Any]

    def accepts(self, dtype: Any) -> bool:
        """Whether operands of `dtype` combine with this monoid (a logical one takes
        bools only)."""
        return not self.logical or np.dtype(dtype) == np.bool_

    def identity(self, dtype: Any) -> np.ndarray:
        """The neutral element for `dtype` as a 0-d numpy array: combining it with any x
        of that dtype gives x. ValueError if the monoid has none there (max of complex
        numbers, a logical monoid on non-bools, key dtypes)."""
        try:
            dt = np.dtype(dtype)
        except TypeError:
            raise ValueError(f"the {self.name!r} monoid has no identity for {dtype}") from None
        if not self.accepts(dt):
            raise ValueError(f"the {self.name!r} monoid is logical and has no identity "
                             f"for {dt.name}")
        value = self._identity(dt)
        if value is None:
            raise ValueError(f"the {self.name!r} monoid has no identity for {dt.name}")
        return np.asarray(value, dtype=dt)


def _extreme(dt: np.dtype, low: bool) -> Any:
    """The least (low) or greatest element of `dt`: -inf/+inf where the dtype has
    infinities, else its finite extreme; False/True for bool; None for complex."""
    if dt == np.bool_:
        return not low
    if jnp.issubdtype(dt, jnp.integer):
        info = jnp.iinfo(dt)
        return info.min if low else info.max
    if jnp.issubdtype(dt, jnp.floating):
        inf = -np.inf if low else np.inf
        if np.isinf(np.asarray(inf).astype(dt)):
            return inf
        info = jnp.finfo(dt)  # e.g. float8_e4m3fn: no infinities
        return info.min if low else info.max
    return None


def _zero(dt: np.dtype) -> Any:
    return np.zeros((), dt)


def _nan_propagating(collective: Callable[[Any, tuple[str, ...]], Any], sign: int
                     ) -> Callable[[Any, tuple[str, ...]], Any]:
    """`collective` (pmax, or pmin with sign -1) made to propagate NaN like
    `jnp.maximum`/`jnp.minimum` and XLA's max/min ops do. XLA's CPU all-reduce skips NaN
    operands (max(nan, -inf) is -inf there, min(nan, nan) is +inf), so a NaN that one
    device holds would vanish from a partitioned `reduce_max` or `segment_max`. One
    collective still: each element travels with a NaN flag (0 or `sign`, a number the
    same reduction carries), and a reduced flag that is not 0 means some device held
    NaN."""
    def reduce(x: Any, axes: tuple[str, ...]) -> Any:
        if not jnp.issubdtype(x.dtype, jnp.floating):
            return collective(x, axes)
        flag = jnp.isnan(x).astype(x.dtype) * sign
        value, nan = collective(jnp.stack([x, flag]), axes)
        return jnp.where(nan != 0, jnp.asarray(jnp.nan, x.dtype), value)
    return reduce


MONOIDS: dict[str, Monoid] = {m.name: m for m in (
    Monoid("add", jnp.add, lax.psum, False, ("add", "add_any"), "reduce_sum", _zero),
    Monoid("max", jnp.maximum, _nan_propagating(lax.pmax, 1), False, ("max",), "reduce_max",
           lambda dt: _extreme(dt, low=True)),
    Monoid("min", jnp.minimum, _nan_propagating(lax.pmin, -1), False, ("min",), "reduce_min",
           lambda dt: _extreme(dt, low=False)),
    # Logical, so only ever over bools, where min is `and` and max is `or` (JAX has no
    # pand/por collective).
    Monoid("and", jnp.logical_and, lax.pmin, True, ("and",), "reduce_and", lambda dt: True),
    Monoid("or", jnp.logical_or, lax.pmax, True, ("or",), "reduce_or", lambda dt: False),
)}

NAMES: tuple[str, ...] = tuple(MONOIDS)

# Elementwise primitive name -> the monoid it computes, in declaration order.
BY_ELEMENTWISE: dict[str, Monoid] = {p: m for m in MONOIDS.values() for p in m.elementwise}

# Reduce primitive name -> the monoid it computes over dims.
BY_REDUCE: dict[str, Monoid] = {m.reduce: m for m in MONOIDS.values()}


def of_reduce(primitive: str, dtype: Any) -> Monoid | None:
    """The monoid that the reduce primitive computes on operands of `dtype`, or None
    (reduce_prod and reduce_xor have none; reduce_and/reduce_or on integers are bitwise,
    not the logical monoids)."""
    m = BY_REDUCE.get(primitive)
    return m if m is not None and m.accepts(dtype) else None
