"""Element types of IR tensors: numpy dtypes and JAX's extended dtypes (PRNG keys).

A key array (`key<fry>[4]`) is one value per element to JAX's primitives but is held as
its key data, an array of the implementation's base dtype with the key shape appended
(`uint32[4, 2]` for threefry). Code that builds an array out of pieces (the SPMD and HLO
interpreters' assembly of tiles, `assembled`) works on that key data, whose leading dims
are the key array's dims, and wraps it back.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np


def is_extended(dtype: Any) -> bool:
    return jax.dtypes.issubdtype(dtype, jax.dtypes.extended)


def itemsize(dtype: Any) -> int:
    """Bytes per element: a threefry key is 2 x uint32."""
    return dtype.itemsize if is_extended(dtype) else np.dtype(dtype).itemsize


def dtype_name(dtype: Any) -> str:
    """numpy's name (`float32`), or JAX's for an extended dtype (`key<fry>`)."""
    return dtype.name if is_extended(dtype) else np.dtype(dtype).name


def canonical(dtype: Any) -> Any:
    """The dtype JAX computes in (64-bit types are 32-bit when x64 is off); extended
    dtypes are their own canonical form."""
    return dtype if is_extended(dtype) else np.dtype(jax.dtypes.canonicalize_dtype(dtype))


def sliceable(x: Any) -> Any:
    """`x` as an array to take many slices of: numpy, or a key array as it is (numpy
    cannot hold keys)."""
    return x if is_extended(getattr(x, "dtype", None)) else np.asarray(x)


def to_host(x: Any) -> np.ndarray:
    """A numpy array of `x`'s elements; a key array gives its key data."""
    if is_extended(getattr(x, "dtype", None)):
        return np.asarray(jax.random.key_data(x))
    return np.asarray(x)


def from_host(data: np.ndarray, dtype: Any) -> Any:
    """The array of element type `dtype` whose host form (`to_host`) is `data`."""
    if is_extended(dtype):
        return jax.random.wrap_key_data(data, impl=dtype._impl)
    return data


def assembled(shape: tuple[int, ...], dtype: Any,
              blocks: list[tuple[tuple[slice, ...], Any]]) -> Any:
    """The array of `shape` and element type `dtype` made of `blocks`, (index, array) pairs
    that cover it, key arrays included, built on the host (each block's update run
    eagerly would be a compilation of its own)."""
    out = host_zeros(shape, dtype)
    for index, x in blocks:
        out[index] = to_host(x)
    return from_host(out, dtype)


def host_zeros(shape: tuple[int, ...], dtype: Any) -> np.ndarray:
    """A numpy buffer for the host form of an array of `shape` and `dtype`."""
    if is_extended(dtype):
        data = jax.eval_shape(jax.random.key_data, jax.ShapeDtypeStruct(shape, dtype))
        return np.zeros(data.shape, data.dtype)
    return np.zeros(shape, np.dtype(dtype))
