"""Device meshes: ordered axis names and sizes, and their refinement into sub-axes.

A sub-axis is a slice of a mesh axis's devices in Shardy's notation: `x:(p)s` has size s
and steps every p devices of axis `x`, so an axis `x` of size 4 is the same devices as
`x:(1)2` followed by `x:(2)2` (major to minor). A mesh whose axis was split (`refine`)
has the sub-axes in the axis's place, in that order, so its device grid is the original
one reshaped. The user's axes stay addressable: `parts("x")` names what `x` became.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import ItemsView, Iterator, Mapping, Sequence

from partir.errors import AxisNotInMeshError, PartitionError
from partir.ir.location import Location

_SUB_AXIS = re.compile(r"^(.+):\((\d+)\)(\d+)$")


def sub_axis_name(base: str, pre: int, size: int) -> str:
    return f"{base}:({pre}){size}"


def split_axis_name(name: str) -> tuple[str, int, int | None]:
    """(base axis, pre-size, size) of a sub-axis name; (name, 1, None) for a whole axis,
    whose size only the mesh knows."""
    m = _SUB_AXIS.match(name)
    if m is None:
        return name, 1, None
    return m.group(1), int(m.group(2)), int(m.group(3))


class Mesh(Mapping[str, int]):
    """An ordered mapping from mesh axis name to size, e.g. `Mesh({"batch": 4, "model": 2})`.

    Also accepts a `jax.sharding.Mesh`.
    """

    def __init__(self, axes: Mapping[str, int] | object) -> None:
        if hasattr(axes, "axis_names") and hasattr(axes, "devices"):
            axes = dict(zip(axes.axis_names, axes.devices.shape, strict=True))
        if not isinstance(axes, Mapping) or not axes:
            raise PartitionError(f"a mesh needs at least one named axis, got {axes!r}")
        for name, size in axes.items():
            if not isinstance(name, str) or not isinstance(size, int) or size < 1:
                raise PartitionError(
                    f"mesh axis {name!r} must be a string with a positive int size, got {size!r}")
        self._axes = dict(axes)

    def __getitem__(self, axis: str) -> int:
        return self._axes[axis]

    def __iter__(self) -> Iterator[str]:
        return iter(self._axes)

    def __len__(self) -> int:
        return len(self._axes)

    def items(self) -> ItemsView[str, int]:
        # the dict's own view: compilers read the axes per value
        return self._axes.items()

    @property
    def axis_names(self) -> tuple[str, ...]:
        return tuple(self._axes)

    @property
    def size(self) -> int:
        return math.prod(self._axes.values())

    def check_axis(self, axis: str, tactic: str | None = None, loc: Location | None = None
                   ) -> int:
        """The size of a user's axis (or sub-axis), however the mesh was refined since."""
        parts = self.parts(axis)
        if parts is None and self.split_for(axis) is not None:
            return split_axis_name(axis)[2]
        if parts is None:
            raise AxisNotInMeshError(
                f"axis {axis!r} is not in the mesh {self.user_mesh}; its axes are "
                f"{', '.join(map(repr, self.user_mesh))}", tactic=tactic, loc=loc)
        return math.prod(self._axes[a] for a in parts)

    # -- sub-axes ------------------------------------------------------------------------
    def _span(self, axis: str) -> tuple[str, int, int]:
        """(base, first, end): the axis as the pre-size range [first, end) of its base."""
        base, pre, size = split_axis_name(axis)
        return base, pre, pre * (self._axes[axis] if size is None else size)

    def parts(self, axis: str) -> tuple[str, ...] | None:
        """The axes of this mesh, major to minor, that together are `axis`: (axis,) for one
        of its own, the sub-axes a user's axis was split into, or None if none are."""
        if axis in self._axes:
            return (axis,)
        base, first, _ = split_axis_name(axis)
        spans = [(a, *self._span(a)[1:]) for a in self._axes if self._span(a)[0] == base]
        if not spans:
            return None
        end = first * split_axis_name(axis)[2] if axis != base else \
            max(e for _, _, e in spans)
        # minor sub-axes have the larger pre-sizes; the mesh keeps them major to minor
        out = [a for a, f, e in spans if first <= f and e <= end]
        covered = sorted((f, e) for a, f, e in spans if a in out)
        at = first
        for f, e in covered:
            if f != at:
                return None
            at = e
        return tuple(out) if at == end and out else None

    def refine(self, axis: str, sizes: Sequence[int]) -> Mesh:
        """This mesh with `axis` split into sub-axes of the given sizes, major to minor."""
        n = self._axes[axis]
        if math.prod(sizes) != n or any(k < 2 for k in sizes):
            raise PartitionError(f"cannot split axis {axis!r} of size {n} into {list(sizes)}")
        base, pre, _ = self._span(axis)
        axes: dict[str, int] = {}
        for name, size in self._axes.items():
            if name != axis:
                axes[name] = size
                continue
            for k in sizes:
                axes[sub_axis_name(base, pre, k)] = k
                pre *= k
        return Mesh(axes)

    def split_for(self, axis: str) -> tuple[str, tuple[int, ...]] | None:
        """How to split one of this mesh's axes so that the sub-axis `axis` (a name like
        `x:(2)2`) becomes one of them: the axis and the sizes to split it into, or None
        if `axis` is no sub-axis of an axis that has it within."""
        base, first, size = split_axis_name(axis)
        if size is None or size < 2:
            return None
        end = first * size
        for a in self._axes:
            b, f, e = self._span(a)
            if b == base and f <= first and end <= e and first % f == 0 and e % end == 0:
                sizes = tuple(k for k in (first // f, size, e // end) if k > 1)
                return (a, sizes) if len(sizes) > 1 else None
        return None

    @functools.cached_property
    def user_mesh(self) -> Mesh:
        """The mesh before any refinement: each base axis with its whole size."""
        axes: dict[str, int] = {}
        for name, size in self._axes.items():
            base = self._span(name)[0]
            axes[base] = axes.get(base, 1) * size
        return self if len(axes) == len(self._axes) else Mesh(axes)

    def coalesce(self, axes: Sequence[str]) -> tuple[str, ...]:
        """The axes (major to minor, as a dimension lists them) with runs of adjacent
        sub-axes merged, named by the user's axis when a run is all of it."""
        out: list[tuple[str, int, int]] = []
        for a in axes:
            base, first, end = self._span(a)
            if out and out[-1][0] == base and out[-1][2] == first:
                out[-1] = (base, out[-1][1], end)
            else:
                out.append((base, first, end))
        whole = self.user_mesh
        return tuple(base if (first, end) == (1, whole[base]) else
                     sub_axis_name(base, first, end // first) for base, first, end in out)

    def __repr__(self) -> str:
        return "Mesh({" + ", ".join(f"{k!r}: {v}" for k, v in self._axes.items()) + "})"

    def __str__(self) -> str:
        return "{" + ", ".join(f'"{k}":{v}' for k, v in self._axes.items()) + "}"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Mesh) and list(self._axes.items()) == list(other._axes.items())

    def __hash__(self) -> int:
        return hash(tuple(self._axes.items()))
