"""What passes make per op (lowering fragments, padding records), kept for the next
program that has the op.

Consecutive states of a schedule differ in the few ops their tactic changed (a one-leaf
tactic of a 200-tactic schedule changes a few dozen of a transformer's 2,500 ops), yet
each state's program is lowered (and reported on) whole. A pass whose output for an op
(or a fused group of ops) depends only on that op, the loops around it and what it
reads looks the fragment up here first, keyed by all of those. IR is never mutated, so
a fragment made for one program serves any program that has the same key. Where what
an op reads is made by the pass itself (the SPMD translation of its operands), the key
has the types and names of those values, not their identities: the fragment keeps the
values it read and made, its ops are rewired to the values read now (`rewired`), and
its results, the same values as before, make what reads them match in turn. What
differs is made afresh.

Keys hold ids, not the objects: hashing ops, loop nests or types by content would cost
what reusing them saves. Each entry holds the objects whose ids its key has, so that an
id cannot be reused for another object while the entry lives.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from partir.ir.ops import Op
from partir.ir.values import Value

__all__ = ["Fragments", "rewired", "sharing"]


@dataclass
class Fragments:
    """Fragments by key, in two generations: a lookup finds one in either (and keeps it
    in the newer), and once the newer holds `max_entries` the older is dropped, so what
    the last lowerings used stays and the bound is twice `max_entries`. `made` and
    `reused` count fragments per pass (the key's first element names the pass)."""

    # A t200 state's program has some 1,200 fragments, a one-leaf tactic makes ~60 new
    max_entries: int = 20_000
    made: Counter = field(default_factory=Counter)
    reused: Counter = field(default_factory=Counter)
    _new: dict[tuple, tuple[Any, Any]] = field(default_factory=dict)
    _old: dict[tuple, tuple[Any, Any]] = field(default_factory=dict)

    def get(self, key: tuple) -> Any | None:
        found = self._new.get(key)
        if found is None:
            found = self._old.pop(key, None)
            if found is None:
                return None
            self._keep(key, found)
        self.reused[key[0]] += 1
        return found[1]

    def get_or_make(self, key: tuple, holds: Any, make: Callable[[], Any]) -> Any:
        """The fragment under `key`, or `make()` kept there (`holds` as for `put`)."""
        found = self.get(key)
        if found is None:
            found = make()
            self.put(key, holds, found)
        return found

    def put(self, key: tuple, holds: Any, fragment: Any) -> None:
        """Keep `fragment` under `key`; `holds`: the objects whose ids are in the key."""
        self.made[key[0]] += 1
        self._keep(key, (holds, fragment))

    def _keep(self, key: tuple, entry: tuple[Any, Any]) -> None:
        if len(self._new) >= self.max_entries:
            self._old, self._new = self._new, {}
        self._new[key] = entry


def rewired(ops: list[Op], before: Sequence[Value], now: Sequence[Value]) -> list[Op]:
    """`ops` reading `now[i]` where they read `before[i]`: the ops that do are copied (IR
    is never mutated), with their results; the others are kept. Operands only: the
    regions of a fragment's ops read what their op passes them."""
    moved = {a: b for a, b in zip(before, now, strict=True) if a is not b}
    return [op if moved.keys().isdisjoint(op.operands) else
            Op(op.name, [moved.get(v, v) for v in op.operands], op.results, op.params,
               op.regions, op.loc, op.prim)
            for op in ops]


def sharing(values: Sequence[Value]) -> tuple[int, ...]:
    """Which of `values` are one value, for a key that has their types but not their
    identities: () when they are distinct (the usual case), else the position of each
    one's first occurrence. A fragment made from one value read twice is no fragment for
    two values, nor the converse."""
    if len(set(values)) == len(values):
        return ()
    first: dict[Value, int] = {}
    return tuple(first.setdefault(v, i) for i, v in enumerate(values))
