"""Loop-index information an entry's `apply` may need inside a loop nest.

Materialization traces an entry's `apply` with the indices as int32 scalars and emits the
traced ops into the loop body (the indices are `index` ops there); tests may call it with
Python ints as indices. Offsets are therefore computed with operations valid for both.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax.numpy as jnp
from jax import lax

from partir.core.actions import Loop, Sum, Tile
from partir.ir.types import TensorType, tile_size


class LocalContext:
    """Offsets of an op's local tiles within the global operands and results."""

    def __init__(self, nest: Sequence[Loop], in_types: Sequence[TensorType],
                 out_types: Sequence[TensorType], index: Callable[[str], Any],
                 axis_size: Callable[[str], int]) -> None:
        self.nest = tuple(nest)
        self.in_types = tuple(in_types)  # global types
        self.out_types = tuple(out_types)
        self.index = index
        self.axis_size = axis_size

    def _offset(self, size: int, levels: list[str]) -> Any:
        offset: Any = 0
        for axis in levels:
            size = tile_size(size, self.axis_size(axis))
            term = self.index(axis) * size
            # No `0 +` in a traced computation: the first term is the offset itself.
            offset = term if isinstance(offset, int) and offset == 0 else offset + term
        return offset

    def operand_offset(self, i: int, dim: int) -> Any:
        """Start of operand i's local tile along `dim` in the global operand."""
        levels = [lp.axis for lp in self.nest if lp.operands[i] == dim]
        return self._offset(self.in_types[i].shape[dim], levels)

    def slices_operand(self, i: int, dim: int) -> bool:
        """Does a loop of the nest slice operand i along `dim`? Not told by the local
        size: a padded dimension of size 1 has local tiles of size 1."""
        return any(lp.operands[i] == dim for lp in self.nest)

    def result_offset(self, k: int, dim: int) -> Any:
        """Start of result k's local tile along `dim` in the global result."""
        levels = [lp.axis for lp in self.nest if lp.results[k] == Tile(dim)]
        return self._offset(self.out_types[k].shape[dim], levels)

    def result_tiles(self, k: int, dim: int) -> int:
        """How many tiles of result k the loops split `dim` into."""
        n = 1
        for lp in self.nest:
            if lp.results[k] == Tile(dim):
                n *= self.axis_size(lp.axis)
        return n

    def cut(self, value: Any, k: int, dim: int, size: int) -> Any:
        """Result k's local tile of `size` along `dim`, cut out of `value`, the whole
        result along that dim. The last tiles of a padded dim reach past its end: the
        value is padded first, or the slice would be clamped back into it."""
        padded = size * self.result_tiles(k, dim)
        if padded > value.shape[dim]:
            widths = [(0, 0)] * value.ndim
            widths[dim] = (0, padded - value.shape[dim])
            value = jnp.pad(value, widths)
        # Offsets are never negative: no wrap-around select to emit.
        return lax.dynamic_slice_in_dim(value, self.result_offset(k, dim), size, axis=dim,
                                        allow_negative_indices=False)

    def sums_result(self, k: int) -> bool:
        return any(isinstance(lp.results[k], Sum) for lp in self.nest)

    def is_first(self, k: int) -> Any:
        """True on the single iteration of the `#sum` loops of result k whose indices are
        all 0: terms that must be added once, not once per iteration, are kept there."""
        first: Any = True
        for lp in self.nest:
            if isinstance(lp.results[k], Sum):
                at_0 = self.index(lp.axis) == 0
                first = at_0 if first is True else jnp.logical_and(first, at_0)
        return first
