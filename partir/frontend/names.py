"""Names of inputs and outputs: Python parameter names and pytree paths joined by "/".

An input is named by its parameter and its path in the argument's pytree (`params/w`);
an output by its path in the returned pytree under the root `OUTPUT_ROOT`: "out" for a
function returning one array, "out/0", "out/1/w" for `(loss, {"w": grad})`. Tactics
select outputs by these names as they select inputs. The root never clashes with an
input or tag: where one is named "out" (a parameter `out`), the root is "out_" (with
as many underscores as it takes), as partir.jit names the VJP's cotangent.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import jax

OUTPUT_ROOT = "out"


def key_to_str(key: Any) -> str:
    for attr in ("key", "idx", "name"):
        if hasattr(key, attr):
            return str(getattr(key, attr))
    return str(key)


def path_to_name(prefix: str, path: Sequence[Any]) -> str:
    parts = [prefix] if prefix else []
    parts += [key_to_str(k) for k in path]
    return "/".join(parts)


def parameter_names(fn: Callable, n_args: int) -> list[str]:
    """Names of the first `n_args` positional parameters of `fn` (arg{i} where unknown)."""
    names: list[str] = []
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        params = []
    for i in range(n_args):
        if i < len(params) and params[i].kind in (params[i].POSITIONAL_ONLY,
                                                  params[i].POSITIONAL_OR_KEYWORD):
            names.append(params[i].name)
        elif params and params[-1].kind == params[-1].VAR_POSITIONAL and i >= len(params) - 1:
            names.append(f"{params[-1].name}/{i - len(params) + 1}")
        else:
            names.append(f"arg{i}")
    return names


def leaf_names(tree: Any, prefix: str) -> list[str]:
    leaves, _ = jax.tree_util.tree_flatten_with_path(tree)
    return [path_to_name(prefix, path) for path, _ in leaves]


def output_root(taken: Iterable[str]) -> str:
    """The root outputs are named under: `OUTPUT_ROOT`, with underscores added while it is
    the first path component of one of the `taken` names (inputs and tags)."""
    tops = {n.split("/", 1)[0] for n in taken}
    root = OUTPUT_ROOT
    while root in tops:
        root += "_"
    return root
