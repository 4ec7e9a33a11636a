"""PartIR:Core programs in loop-nest normal form.

Every op carries the nest of loops around it (outermost first): per loop, the mesh axis,
the action on each result and the slicing of each operand. This is the unfused Core
program (each op in its own loop nest, operands sliced by `slice` chains), stored so
that propagation reads and extends nests in constant time. `materialize` turns it into
explicit `loop`/`slice` IR with fused nests, for printing and the interpreter.

Besides primitive ops there are identity ops created by actions: `tile` (value tiling)
and `atomic` (keep replicated), and `tag` from `partir.tag`.
"""

from __future__ import annotations

import functools
import itertools
import operator
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from partir.core.actions import AnyAction, Loop, Sum, Tile
from partir.ir import Location, Region, TensorType, Value
from partir.ir.opnames import ATOMIC, TILE
from partir.ir.types import tensor_type, tile_size
from partir.mesh import Mesh
from partir.rules import OpView

IDENTITY_KINDS = (TILE, ATOMIC)
_UNSET = object()  # a CoreOp's signature not computed yet (None: it has none)
# Signature -> its number. Numbers are never reused, so clearing the table only makes
# later ops miss the memos of earlier ones.
_SIGNATURES: dict[tuple, int] = {}
_MAX_SIGNATURES = 1 << 14  # bounds what the keys keep alive (parameters: jaxprs...)
_signature_numbers = itertools.count()


# Not `frozen`: a frozen dataclass sets each field through `object.__setattr__`, which
# made building the ops of a large model (and rewiring them) 5x slower. Immutable all the
# same, by convention: nothing assigns a field but the memo below.
@dataclass(eq=False, slots=True)
class CoreOp:
    """An op of a Core program. Immutable: rewiring an operand makes a new CoreOp with the
    same `uid`, so snapshots taken after earlier tactics stay as they were."""

    uid: int
    name: str  # a primitive's name, CONSTANT, TAG, or an identity kind (TILE/ATOMIC)
    operands: tuple[Value, ...]
    results: tuple[Value, ...]
    params: Mapping[str, Any]
    loc: Location
    prim: Any = None
    # program position: (index,) for traced ops; an identity op on a value extends the
    # position of the value's definition, so it sorts after it and before the next op
    order: tuple[int, ...] = (0,)
    # A restructured control-flow op's regions, on global types (`partir.core.regions`).
    regions: tuple[Region, ...] = ()
    # The memoized `signature`, set once computed.
    _signature: Any = field(default=_UNSET, init=False, repr=False)

    @property
    def is_identity(self) -> bool:
        return self.name in IDENTITY_KINDS

    @property
    def signature(self) -> int | None:
        """The name, parameters and (global) types, which all propagation's decisions
        depend on besides local shapes, as a number: equal for ops equal in them, so the
        ops of repeated layers share their decisions. A number rather than the tuple,
        since memo keys holding it are hashed and compared per request, which a tuple
        does element by element. Computed once per op for all tactics (not a
        `cached_property`, whose lock costs more than this); None when the parameters
        are unhashable (e.g. array-valued constants)."""
        sig = self._signature
        if sig is not _UNSET:
            return sig
        types = [v.type for v in (*self.operands, *self.results)]
        # Shapes and dtypes rather than the types themselves: tuples of ints and dtypes
        # hash and compare in C. The parameters in their order, unsorted: a primitive
        # binds them in one order, and two equal dicts in different orders only miss
        # each other's memo entries.
        key = (self.name, tuple(self.params.items()),
               tuple([t.shape for t in types]), tuple([t.dtype for t in types]))
        try:
            sig = _SIGNATURES.get(key)
        except TypeError:
            sig = None
        else:
            if sig is None:
                if len(_SIGNATURES) >= _MAX_SIGNATURES:  # a daemon sees many programs
                    _SIGNATURES.clear()
                sig = _SIGNATURES[key] = next(_signature_numbers)
        self._signature = sig
        return sig

    def with_operand(self, i: int, value: Value) -> CoreOp:
        """This op (same uid) reading `value` as operand i. Calls the constructor directly
        rather than `dataclasses.replace`, which reads the fields by name, and keeps the
        signature when `value` has the operand's type (the result of an identity op
        inserted on it), since the signature reads only the types."""
        operands = list(self.operands)
        operands[i] = value
        new = CoreOp(self.uid, self.name, tuple(operands), self.results, self.params,
                     self.loc, self.prim, self.order, self.regions)
        if value.type is self.operands[i].type:  # propagation reads it from the uses
            new._signature = self.signature
        return new

    def view(self) -> OpView:
        """What the op's declaration sees of it, on its global types."""
        return OpView(self.name, self.params, tuple([v.type for v in self.operands]),
                      tuple([v.type for v in self.results]), regions=self.regions)

    def __repr__(self) -> str:
        return f"CoreOp({self.name} @ {self.loc})"


Nest = tuple[Loop, ...]


def divided_type(t: TensorType, dims: Sequence[int | None], sizes: Sequence[int]) -> TensorType:
    """t with, at each loop level, the dimension the level slices (None: none) divided by
    the level's axis size; t itself when no level slices it. Called per operand and
    result of every op in a loop nest, hence one pass and no copy when nothing changes."""
    shape = None
    for d, n in zip(dims, sizes, strict=True):
        if d is not None:
            if shape is None:
                shape = list(t.shape)
            shape[d] = tile_size(shape[d], n)
    return t if shape is None else tensor_type(tuple(shape), t.dtype)


def operand_local_type(op: CoreOp, nest: Nest, i: int, mesh: Mapping[str, int],
                       depth: int | None = None) -> TensorType:
    loops = nest if depth is None else nest[:depth]
    return divided_type(op.operands[i].type, [lp.operands[i] for lp in loops],
                        [mesh[lp.axis] for lp in loops])


def result_local_type(op: CoreOp, nest: Nest, k: int, mesh: Mapping[str, int],
                      depth: int | None = None) -> TensorType:
    loops = nest if depth is None else nest[:depth]
    return divided_type(op.results[k].type, tile_dims(loops, k),
                        [mesh[lp.axis] for lp in loops])


def tile_dims(loops: Sequence[Loop], k: int) -> list[int | None]:
    """Per loop, the dimension its action on result k tiles (None: not a tile)."""
    return [a.dim if isinstance(a := lp.results[k], Tile) else None for lp in loops]


@dataclass(frozen=True)
class Sharding:
    """A value's distribution over the mesh: per dim the tiling axes (major to minor),
    the axes with a pending `#sum`, and the axes on which it is kept replicated. Programs
    report them in the user's axes (`CoreProgram.sharding`)."""

    dims: tuple[tuple[str, ...], ...]
    partial: tuple[str, ...] = ()
    replicated: tuple[str, ...] = ()

    def __str__(self) -> str:
        text = "[" + ", ".join("{" + ", ".join(f'"{a}"' for a in axes) + "}"
                               for axes in self.dims) + "]"
        if self.partial:  # a pending #sum: the value still needs reducing over these axes
            text += " partial{" + ", ".join(f'"{a}"' for a in self.partial) + "}"
        if self.replicated:
            text += " replicated{" + ", ".join(f'"{a}"' for a in self.replicated) + "}"
        return text


def sharding_of(nest: Nest, k: int, rank: int) -> Sharding:
    dims: list[list[str]] = [[] for _ in range(rank)]
    partial, replicated = [], []
    for lp in nest:
        action = lp.results[k]
        if isinstance(action, Tile):
            dims[action.dim].append(lp.axis)
        elif isinstance(action, Sum):
            partial.append(lp.axis)
        elif isinstance(action, AnyAction):
            replicated.append(lp.axis)
    return Sharding(tuple(tuple(d) for d in dims), tuple(partial), tuple(replicated))


_order = operator.attrgetter("order")


@dataclass(frozen=True)
class CoreProgram:
    """An immutable snapshot of a Core program (the state after some tactic)."""

    name: str
    mesh: Mesh
    args: tuple[Value, ...]
    ops: tuple[CoreOp, ...]
    nests: Mapping[int, Nest]  # by op uid; ops outside any loop are absent
    results: tuple[Value, ...]
    result_names: tuple[str, ...]
    # Per output, the sharding `out_shardings` asks for exactly (`CoreModule`), or None.
    out_constraints: tuple[tuple[tuple[str, ...], ...] | None, ...] = ()
    # Per argument, the sharding it arrives with (a region's argument, as its edge lays it
    # out: `partir.core.regions`), or None: whole on every device, sliced where used.
    in_constraints: tuple[tuple[tuple[str, ...], ...] | None, ...] = ()

    @functools.cached_property
    def producers(self) -> dict[Value, tuple[CoreOp, int]]:
        return {r: (op, k) for op in self.ops for k, r in enumerate(op.results)}

    def nest(self, op: CoreOp) -> Nest:
        return self.nests.get(op.uid, ())

    def sharding(self, v: Value) -> Sharding:
        p = self.producers.get(v)
        if p is None:
            return Sharding(tuple(() for _ in v.type.shape))
        op, k = p
        return self._users(sharding_of(self.nest(op), k, v.type.rank))

    def _users(self, s: Sharding) -> Sharding:
        """The sharding in the user's axes: sub-axes an axis was split into are named by
        the axis where a dimension has all of them, in order."""
        mesh = self.mesh
        if mesh.user_mesh is mesh:
            return s
        return Sharding(tuple(mesh.coalesce(axes) for axes in s.dims),
                        mesh.coalesce(s.partial), mesh.coalesce(s.replicated))

    def input_shardings(self) -> dict[str, Sharding]:
        """How each input is used: the slicing shared by all its uses, per dim.

        An input's sharding is what its uses agree on (an input used both sliced and whole
        is replicated in that respect). Value tiling loops are looked through to the last
        one on each chain, whose nest repeats the slicing of the earlier ones.
        """
        return dict(self._input_shardings)

    @functools.cached_property
    def _input_shardings(self) -> dict[str, Sharding]:
        # (the padding report, the metadata and the editor's value shardings all ask)
        # The uses of the inputs and of the identity ops' results on them, in one pass:
        # an identity op comes right after the value it is on (its `order`), so before
        # the uses of its result. One test per op, in C, passes over the others (most).
        uses: dict[Value, list[tuple[CoreOp, int]]] = defaultdict(list)
        followed = set(self.args)
        for op in self.ops:
            operands = op.operands
            if followed.isdisjoint(operands):
                continue
            for i, v in enumerate(operands):
                if v in followed:
                    uses[v].append((op, i))
            if op.name in IDENTITY_KINDS:
                followed.update(op.results)

        result = {}
        for a in self.args:
            found = self._slicings(uses, a)
            common = [tuple(axes) for axes in (found or [((),) * a.type.rank])[0]]
            for dims in found[1:]:
                for d, axes in enumerate(dims):
                    n = 0
                    while n < min(len(common[d]), len(axes)) and common[d][n] == axes[n]:
                        n += 1
                    common[d] = common[d][:n]
            result[a.name] = self._users(Sharding(tuple(common)))
        return result

    def _slicings(self, uses: Mapping[Value, list[tuple[CoreOp, int]]],
                  v: Value) -> list[tuple[tuple[str, ...], ...]]:
        """The axes each use of v slices each dimension over, through identity chains."""
        out = []
        for op, i in uses.get(v, ()):
            if op.is_identity and any(u.is_identity for u, _ in uses.get(op.results[0], ())):
                out += self._slicings(uses, op.results[0])
                continue
            dims: list[list[str]] = [[] for _ in range(v.type.rank)]
            for lp in self.nest(op):
                if lp.operands[i] is not None:
                    dims[lp.operands[i]].append(lp.axis)
            out.append(tuple(tuple(d) for d in dims))
        return out

    def output_shardings(self) -> dict[str, Sharding]:
        """Each output's sharding: that of its value, or the one `out_shardings` asks
        for, which the lowering lays it out in."""
        constraints = self.out_constraints or (None,) * len(self.results)
        return {n: self.sharding(v) if c is None else Sharding(c)
                for n, v, c in zip(self.result_names, self.results, constraints, strict=True)}
