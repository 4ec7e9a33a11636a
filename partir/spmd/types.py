"""Distributed tensor types of PartIR:SPMD (paper, App. C, fig. "PartIR:SPMD").

    dtensor<{"a","b"}, [64,8]>       local tensors stacked over axes a and b
    dtensor<{}, [{"a"}256,8]>        a 256x8 tensor whose dim 0 is split over axis a

A type has *stacked* axes (each device's local tensor is unrelated to its neighbours' on
those axes) and, per dimension, the axes it is distributed over, major to minor, with the
dimension's global size. The local size of a dimension is its global size divided by the
sizes of its axes (rule L in the paper); the global type is only defined without stacked
axes.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from partir.ir.types import TensorType, tensor_type, tile_size

Dim = tuple[tuple[str, ...], int]  # (axes major to minor, global size)


def _axes(axes: tuple[str, ...]) -> str:
    return "{" + ",".join(f'"{a}"' for a in axes) + "}"


@dataclass(frozen=True)
class DTensorType:
    stacked: tuple[str, ...]
    dims: tuple[Dim, ...]
    dtype: np.dtype

    @staticmethod
    def of(t: TensorType, stacked: tuple[str, ...] = ()) -> DTensorType:
        """`dtensor<{stacked}, [n,...]>`: the tensor t on every device of the stacked
        axes, with no dimension distributed."""
        stacked = tuple(stacked)
        return _of(t.shape, t.dtype, stacked)

    @property
    def rank(self) -> int:
        return len(self.dims)

    @property
    def sizes(self) -> tuple[int, ...]:
        """The dimensions' global sizes (G of each distributed dimension)."""
        return tuple(n for _, n in self.dims)

    @property
    def axes(self) -> tuple[str, ...]:
        """Every mesh axis the type mentions: the stacked ones, then the dimensions'."""
        return self.stacked + tuple(a for axes, _ in self.dims for a in axes)

    def check(self, mesh: Mapping[str, int]) -> str | None:
        """Why the type is not well formed on the mesh, or None."""
        axes = self.axes
        for a in axes:
            if a not in mesh:
                return f"{self} names axis {a!r}, which is not in the mesh"
        if len(set(axes)) != len(axes):
            return f"{self} names an axis twice"
        for d, (dim_axes, n) in enumerate(self.dims):
            if len(dim_axes) > 1:
                # Only the major axis may pad the dimension (every later one divides the
                # tiles it splits): the tiles are then the blocks of the padded dimension.
                first = tile_size(n, mesh[dim_axes[0]])
                rest = math.prod(mesh[a] for a in dim_axes[1:])
                if first % rest:
                    return (f"{self}: dimension {d} of size {n} has tiles of {first} on "
                            f"{dim_axes[0]!r}, which {rest} does not divide")
        return None

    def local_type(self, mesh: Mapping[str, int]) -> TensorType:
        """L(mu): the type of each device's local tensor."""
        return _local_type(self, tuple(mesh.items()))

    def global_type(self, mesh: Mapping[str, int]) -> TensorType:
        """G(mu): the tensor the distributed value stands for. Undefined with stacked axes,
        whose local tensors have no global view until a tile_reduce gives them one."""
        self._require(mesh)
        if self.stacked:
            raise ValueError(f"{self} has stacked axes and so no global type")
        return TensorType(self.sizes, self.dtype)

    def _require(self, mesh: Mapping[str, int]) -> None:
        msg = self.check(mesh)
        if msg:
            raise ValueError(msg)

    def __str__(self) -> str:
        dims = ",".join(f"{_axes(axes) if axes else ''}{n}" for axes, n in self.dims)
        # The paper prints no element type (its listings are all f32); other element
        # types are spelled out so that a listing does not hide them.
        elt = str(TensorType((), self.dtype))[len("tensor<"):-1]
        suffix = "" if elt == "f32" else f", {elt}"
        return f"dtensor<{_axes(self.stacked)}, [{dims}]{suffix}>"


@functools.lru_cache(maxsize=1 << 16)
def _of(shape: tuple[int, ...], dtype: np.dtype, stacked: tuple[str, ...]) -> DTensorType:
    # Memoized like `_local_type`: the lowering asks for the type of every value it makes,
    # and the types are immutable, so values of one shape may share one.
    return DTensorType(stacked, tuple(((), n) for n in shape), dtype)


@functools.lru_cache(maxsize=1 << 16)
def _local_type(t: DTensorType, mesh: tuple[tuple[str, int], ...]) -> TensorType:
    # Memoized: a program's values share few types, and lowering asks for them per value.
    axis_sizes = dict(mesh)
    t._require(axis_sizes)
    return tensor_type(tuple(tile_size(n, math.prod(axis_sizes[a] for a in axes))
                             for axes, n in t.dims),
                       t.dtype)


def data_equivalent(t1: DTensorType | TensorType, t2: DTensorType | TensorType) -> bool:
    """mu1 ~ mu2 (rules EqTM, EqMT, EqMM): both distribute the same data, so redistribute
    may convert between them. Stacked axes must agree: redistribution only moves data
    within groups of devices with the same coordinates on the stacked axes."""
    if isinstance(t1, TensorType) and isinstance(t2, TensorType):
        return t1 == t2
    if isinstance(t1, TensorType):
        t1, t2 = t2, t1
    if isinstance(t2, TensorType):  # EqMT / EqTM: G(mu) = tau
        return not t1.stacked and t1.sizes == t2.shape and t1.dtype == t2.dtype
    return t1.stacked == t2.stacked and t1.sizes == t2.sizes and t1.dtype == t2.dtype  # EqMM
