"""Device meshes: ordered axis names and sizes, and their refinement into sub-axes.

A sub-axis is a slice of a mesh axis's devices in Shardy's notation: `x:(p)s` has size s
and steps every p devices of axis `x`, so an axis `x` of size 4 is the same devices as
`x:(1)2` followed by `x:(2)2` (major to minor). A mesh whose axis was split (`refine`)
has the sub-axes in the axis's place, in that order, so its device grid is the original
one reshaped. The user's axes stay addressable: `parts("x")` names what `x` became.
"""

from __future__ import annotations

import functools
import itertools
import math
import re
from collections.abc import ItemsView, Iterator, Mapping, Sequence

from partir.errors import AxisNotInMeshError, PartitionError, SubAxisOverlapError
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

    def check_axis(self, axis: str, tactic: str | None = None, loc: Location | None = None,
                   splits: Sequence[str] = ()) -> int:
        """The size of a user's axis (or sub-axis), however the mesh was refined since.
        A sub-axis of the user's mesh that the sub-axes its axis was split into (`splits`
        says why each split was made) cannot make up is a SubAxisOverlapError."""
        parts = self.parts(axis)
        if parts is None and self.split_for(axis) is not None:
            return split_axis_name(axis)[2]
        if parts is None:
            cut = self._cut_by(axis)
            if cut:
                base = split_axis_name(axis)[0]
                why = f" ({'; '.join(s for s in splits if repr(base) in s)})" if splits else ""
                raise SubAxisOverlapError(
                    f"sub-axis {axis!r} overlaps sub-axis {cut[0]!r} without containing it: "
                    f"axis {base!r} is already split into "
                    f"{', '.join(a for a in self._axes if self._span(a)[0] == base)}{why}, "
                    f"and no split of {cut[0]!r} makes {axis!r} of whole sub-axes (it would "
                    f"start or end at pre-size {cut[1]}, inside {cut[0]!r}); name sub-axes "
                    f"that nest with the earlier ones", tactic=tactic, loc=loc)
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

    def split_for(self, axis: str) -> tuple[tuple[str, tuple[int, ...]], ...] | None:
        """How to split this mesh's axes so that the sub-axis `axis` (a name like `x:(2)2`)
        becomes a run of them: the splits to make in turn, each an axis and the sizes to
        split it into (`refine`), or None if none do: `axis` is no sub-axis of the
        mesh's axes, or is one already, or an end of it falls inside a sub-axis where that
        cannot be split (`x:(1)3` inside `x:(1)4` of an axis of 12)."""
        base, first, size = split_axis_name(axis)
        if size is None or size < 2:
            return None
        end = first * size
        spans = [(a, *self._span(a)[1:]) for a in self._axes if self._span(a)[0] == base]
        if not spans or not any(f <= first for _, f, _ in spans) \
                or not any(end <= e for _, _, e in spans):
            return None
        splits = []
        for a, f, e in spans:
            # the ends of `axis` inside this span, where it must be split
            cuts = [p for p in (first, end) if f < p < e]
            if not cuts:
                continue
            if any(p % f or e % p for p in cuts):
                return None
            bounds = [f, *cuts, e]
            splits.append((a, tuple(hi // lo for lo, hi in itertools.pairwise(bounds))))
        return tuple(splits) or None

    def _cut_by(self, axis: str) -> tuple[str, int] | None:
        """The sub-axis of this mesh, and the pre-size inside it, where an end of `axis` (a
        sub-axis of the user's mesh) falls and no split can put a boundary: why the
        sub-axes its axis was split into cannot make it up. None if there is none."""
        base, first, size = split_axis_name(axis)
        if size is None or self.user_mesh is self or base not in self.user_mesh \
                or self.user_mesh.split_for(axis) is None:
            return None
        for a in self._axes:
            b, f, e = self._span(a)
            for p in (first, first * size):
                if b == base and f < p < e and (p % f or e % p):
                    return a, p
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
