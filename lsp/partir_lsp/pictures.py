"""Sharding pictures: which devices hold which tile of a value, like
`jax.debug.visualize_array_sharding`, as a grid coloured by tile. One layout (`tiling`)
drawn two ways: a markdown table whose cells lead with a coloured square (it renders in
VS Code's and Neovim's hovers, which strip HTML colours), for the hover on an input key,
and a grid with ANSI background colours, for `partir show` in a terminal. Beside the
Shardy notation (`[{"batch"}, {}]`), `partition_spec` writes JAX's `P('batch', None)`."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

# Above this many tiles per side no picture is drawn.
MAX_SIDE = 16
# Tiles are coloured in this order, cycling: squares for markdown, the matching ANSI
# background colours (256-colour palette) for terminals.
SQUARES = ("🟥", "🟦", "🟩", "🟨", "🟪", "🟧", "🟫", "⬜")
ANSI = (160, 27, 34, 178, 91, 208, 94, 250)


@dataclass(frozen=True)
class Mesh:
    axes: tuple[tuple[str, int], ...]

    @classmethod
    def of(cls, mesh: dict[str, int] | None) -> Mesh:
        return cls(tuple((mesh or {}).items()))

    @property
    def size(self) -> int:
        return math.prod(n for _, n in self.axes)

    def coords(self, device: int) -> dict[str, int]:
        """Row-major device numbering over the mesh axes, the first axis major."""
        out = {}
        for axis, n in reversed(self.axes):
            out[axis] = device % n
            device //= n
        return out

    def __str__(self) -> str:
        return "{" + ", ".join(f'"{a}": {n}' for a, n in self.axes) + "}"


@dataclass(frozen=True)
class Tiling:
    """A value's tiles over the mesh: rows are tiles of its leading sharded dimensions,
    columns tiles of the last dimension (when sharded); each cell the devices holding
    that tile. `caption` says what a tile is."""

    rows: list[str]
    cols: list[str]
    cells: list[list[list[int]]]
    caption: str


def partition_spec(sharding: Sequence[Sequence[str]]) -> str:
    """`[["batch"], []]` as `P('batch', None)`; several axes on a dimension as a tuple."""

    def dim(axes: Sequence[str]) -> str:
        if not axes:
            return "None"
        if len(axes) == 1:
            return f"'{axes[0]}'"
        return "(" + ", ".join(f"'{a}'" for a in axes) + ")"

    return "P(" + ", ".join(dim(axes) for axes in sharding) + ")"


def _shard_index(axes: Sequence[str], coords: dict[str, int], mesh: Mesh) -> int:
    sizes = dict(mesh.axes)
    index = 0
    for a in axes:
        index = index * sizes.get(a, 1) + coords.get(a, 0)
    return index


def tiling(shape: Sequence[int], sharding: Sequence[Sequence[str]],
           mesh: Mesh) -> Tiling | None:
    """The layout of a value of `shape` sharded as `sharding` (per-dim mesh axes) over
    `mesh`; None without a mesh or past MAX_SIDE tiles a side."""
    if mesh.size <= 0 or not mesh.axes:
        return None
    sizes = dict(mesh.axes)
    rank = len(sharding)
    sharded = [d for d, axes in enumerate(sharding) if axes]
    col_dims = [rank - 1] if rank and (rank - 1) in sharded else []
    row_dims = [d for d in sharded if d not in col_dims]
    if rank == 1:
        row_dims, col_dims = [], sharded

    def count(dims: list[int]) -> int:
        return math.prod(math.prod(sizes.get(a, 1) for a in sharding[d]) for d in dims)

    if count(row_dims) > MAX_SIDE or count(col_dims) > MAX_SIDE:
        return None
    cells: dict[tuple[tuple[int, ...], tuple[int, ...]], list[int]] = {}
    for device in range(mesh.size):
        coords = mesh.coords(device)
        r = tuple(_shard_index(sharding[d], coords, mesh) for d in row_dims)
        c = tuple(_shard_index(sharding[d], coords, mesh) for d in col_dims)
        cells.setdefault((r, c), []).append(device)
    row_keys = sorted({r for r, _ in cells})
    col_keys = sorted({c for _, c in cells})

    def label(dims: list[int], key: tuple[int, ...]) -> str:
        return ", ".join(f"dim {d}: {i + 1}/{count([d])}"
                         for d, i in zip(dims, key, strict=True)) or "whole"

    caption = f"devices holding each tile (mesh {mesh}, device ids row-major"
    if row_dims or col_dims:
        caption += "; tiles of " + ", ".join(f"{shape[d] // max(count([d]), 1)} of dim {d}"
                                             for d in row_dims + col_dims)
    return Tiling([label(row_dims, r) for r in row_keys],
                  [label(col_dims, c) for c in col_keys],
                  [[cells.get((r, c), []) for c in col_keys] for r in row_keys],
                  caption + ")")


def _devices(cell: list[int]) -> str:
    return " ".join(str(d) for d in cell)


def markdown(t: Tiling) -> str:
    """The tiling as a markdown table, each tile's cell led by its colour's square."""
    width = len(t.cols)
    out = ["| tile | " + " | ".join(t.cols) + " |", "|" + "---|" * (width + 1)]
    for i, (label, row) in enumerate(zip(t.rows, t.cells, strict=True)):
        out.append(f"| {label} | " + " | ".join(
            f"{SQUARES[(i * width + j) % len(SQUARES)]} {_devices(cell)}"
            for j, cell in enumerate(row)) + " |")
    return f"{t.caption}:\n\n" + "\n".join(out)


def terminal(t: Tiling, color: bool) -> str:
    """The tiling as a grid of text cells, on ANSI background colours when `color` (else
    each cell is led by its colour's square, as in the markdown)."""
    width = len(t.cols)
    texts = [[_devices(cell) for cell in row] for row in t.cells]
    cell_width = max([len(c) for c in t.cols] + [len(x) + 3 for row in texts for x in row])
    label_width = max(len(r) for r in t.rows)
    out = [f"{t.caption}:", " " * label_width + " " + " ".join(c.center(cell_width)
                                                               for c in t.cols)]
    for i, (label, row) in enumerate(zip(t.rows, texts, strict=True)):
        drawn = []
        for j, text in enumerate(row):
            k = (i * width + j) % len(ANSI)
            if color:
                drawn.append(f"\x1b[48;5;{ANSI[k]}m\x1b[97m{text.center(cell_width)}\x1b[0m")
            else:
                drawn.append(f"{SQUARES[k]} {text.ljust(cell_width - 3)}")  # a square is 2 wide
        out.append(label.ljust(label_width) + " " + " ".join(drawn))
    return "\n".join(out)
