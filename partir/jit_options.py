"""The `jax.jit` keyword arguments `partir.jit` accepts, resolved against the function.

Names become positions as `jax.jit` does it (`static_argnames` -> `static_argnums`,
`donate_argnames` -> `donate_argnums`), because partir traces and caches by position.
`out_shardings` (a pytree prefix of the outputs of `PartitionSpec`s, None where
unconstrained) becomes one more tactic after the schedule
(`partir.tactics.OutShardings`); `in_shardings` is refused: the schedule decides them.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from partir.errors import PartitionError
from partir.tactics.outputs import check_out_shardings


class JitOptionError(PartitionError):
    """A `jax.jit` option partir.jit cannot honour, or one that names no parameter."""


# Options that would override what the schedule decides.
_SCHEDULE_DECIDES = ("in_shardings",)


@dataclass(frozen=True)
class JitOptions:
    static_argnums: tuple[int, ...] = ()
    donate_argnums: tuple[int, ...] = ()
    keep_unused: bool = False
    compiler_options: dict[str, Any] = field(default_factory=dict)
    out_shardings: Any = None  # jax.jit's, of PartitionSpecs (checked)


def _as_tuple(value: int | str | Sequence[Any] | None) -> tuple[Any, ...]:
    if value is None:
        return ()
    return (value,) if isinstance(value, int | str) else tuple(value)


def _positions(fn: Callable, names: tuple[str, ...], option: str) -> tuple[int, ...]:
    """The positional indices of the parameters `names` of `fn`."""
    if not names:
        return ()
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError) as e:
        raise JitOptionError(f"{option}: cannot read the signature of {fn!r}: {e}") from None
    positional = [p.name for p in params
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    out = []
    for name in names:
        if name not in positional:
            raise JitOptionError(f"{option} names {name!r}, which is not a positional "
                                 f"parameter of {getattr(fn, '__name__', fn)!r} "
                                 f"(parameters: {', '.join(positional) or 'none'})")
        out.append(positional.index(name))
    return tuple(out)


def resolve_jit_options(fn: Callable, options: dict[str, Any]) -> JitOptions:
    """`options` (keyword arguments of `partir.jit`) as positions, checked."""
    options = dict(options)
    for key in _SCHEDULE_DECIDES:
        if key in options:
            raise JitOptionError(f"partir.jit does not take {key}: the schedule decides the "
                                 f"inputs' shardings (see the returned Metadata's in_specs)")
    static = _as_tuple(options.pop("static_argnums", ()))
    static += _positions(fn, _as_tuple(options.pop("static_argnames", ())), "static_argnames")
    donate = _as_tuple(options.pop("donate_argnums", ()))
    donate += _positions(fn, _as_tuple(options.pop("donate_argnames", ())), "donate_argnames")
    keep_unused = bool(options.pop("keep_unused", False))
    compiler_options = dict(options.pop("compiler_options", None) or {})
    out_shardings = check_out_shardings(options.pop("out_shardings", None))
    if options:
        raise TypeError(f"partir.jit got unexpected keyword argument(s) "
                        f"{', '.join(sorted(options))}; it accepts static_argnums, "
                        f"static_argnames, donate_argnums, donate_argnames, keep_unused, "
                        f"compiler_options and out_shardings")
    if any(i < 0 for i in static + donate):
        raise JitOptionError(f"static_argnums/donate_argnums must be non-negative positions, "
                             f"got {list(static)} and {list(donate)}")
    if set(static) & set(donate):
        raise JitOptionError(f"arguments {sorted(set(static) & set(donate))} are both static "
                             f"and donated")
    return JitOptions(tuple(sorted(set(static))), tuple(sorted(set(donate))), keep_unused,
                      compiler_options, out_shardings)
