"""IR types: ranked tensors and the range type of loop indices."""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any

from partir.ir.dtypes import dtype_name, itemsize

_DTYPE_NAMES = {
    "float32": "f32", "float64": "f64", "float16": "f16", "bfloat16": "bf16",
    "int8": "i8", "int16": "i16", "int32": "i32", "int64": "i64",
    "uint8": "ui8", "uint16": "ui16", "uint32": "ui32", "uint64": "ui64",
    "bool": "i1", "complex64": "complex<f32>", "complex128": "complex<f64>",
}


@dataclass(frozen=True)
class TensorType:
    shape: tuple[int, ...]
    dtype: Any  # a numpy dtype, or a JAX extended dtype (PRNG keys: partir.ir.dtypes)

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.size * itemsize(self.dtype)

    def with_shape(self, shape: tuple[int, ...]) -> TensorType:
        return tensor_type(tuple(shape), self.dtype)

    def __str__(self) -> str:
        return _tensor_text(self.shape, self.dtype)


# A model's values have few distinct types: the passes that make them per op (slicing,
# gathering, dividing by the loops) share one object per type. That costs less than
# building a frozen dataclass each time, and the identity tests and id-keyed memos of the
# passes then hit for equal types too.
@functools.lru_cache(maxsize=1 << 14)
def tensor_type(shape: tuple[int, ...], dtype: Any) -> TensorType:
    """The (shared) TensorType of `shape`, a tuple of ints, and `dtype`."""
    return TensorType(shape, dtype)


# Printing a large program names few distinct types many times.
@functools.lru_cache(maxsize=4096)
def _tensor_text(shape: tuple[int, ...], dtype: object) -> str:
    dims = "".join(f"{d}x" for d in shape)
    return f"tensor<{dims}{element_name(dtype)}>"


@functools.lru_cache(maxsize=256)
def element_name(dtype: object) -> str:
    """The listings' name of an element type: `f32`, `bf16`, `i1`, `key<fry>`, ..."""
    name = dtype_name(dtype)
    return _DTYPE_NAMES.get(name, name)


@dataclass(frozen=True)
class RangeType:
    """Type of a loop index over a mesh axis: `range<4>`."""

    axis: str
    size: int

    def __str__(self) -> str:
        return f"range<{self.size}>"


Type = TensorType | RangeType


def tile_size(n: int, parts: int) -> int:
    """The size of each of `parts` tiles of a dimension of size n: ceil(n / parts).

    The one place tile sizes are computed (Shardy's semantics): when `parts` does not
    divide n, the dimension is conceptually padded at its end to `parts` * tile_size
    and the positions past n hold arbitrary values; every stage slices them back off."""
    return -(-n // parts)


def padded_size(n: int, parts: int) -> int:
    """The size a dimension of size n is padded to when split into `parts` tiles."""
    return tile_size(n, parts) * parts
