"""Device meshes: ordered axis names and sizes."""

from __future__ import annotations

import math
from collections.abc import ItemsView, Iterator, Mapping

from partir.errors import AxisNotInMeshError, PartitionError
from partir.ir.location import Location


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
        if axis not in self._axes:
            raise AxisNotInMeshError(
                f"axis {axis!r} is not in the mesh {self}; its axes are "
                f"{', '.join(map(repr, self._axes))}", tactic=tactic, loc=loc)
        return self._axes[axis]

    def __repr__(self) -> str:
        return "Mesh({" + ", ".join(f"{k!r}: {v}" for k, v in self._axes.items()) + "})"

    def __str__(self) -> str:
        return "{" + ", ".join(f'"{k}":{v}' for k, v in self._axes.items()) + "}"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Mesh) and list(self._axes.items()) == list(other._axes.items())

    def __hash__(self) -> int:
        return hash(tuple(self._axes.items()))
