"""A least-recently-used cache bounded by entry count and by a cost (the ops an entry
holds, which is what its memory grows with: traced programs and Core states are tables
of ops, values and loop nests)."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Generic, TypeVar

K = TypeVar("K")
V = TypeVar("V")


@dataclass
class CacheCounters:
    hits: int = 0
    misses: int = 0
    evictions: int = 0


class LruCache(Generic[K, V]):
    def __init__(self, max_entries: int, max_cost: int,
                 on_evict: Callable[[V], None] | None = None) -> None:
        self.max_entries = max_entries
        self.max_cost = max_cost
        self.on_evict = on_evict  # receives each entry the bound evicts
        self.cost = 0
        self.counters = CacheCounters()
        self._entries: OrderedDict[K, tuple[V, int]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: K) -> bool:
        return key in self._entries

    def get(self, key: K) -> V | None:
        """The entry (now most recently used), counting a hit or a miss."""
        found = self._entries.get(key)
        if found is None:
            self.counters.misses += 1
            return None
        self.counters.hits += 1
        self._entries.move_to_end(key)
        return found[0]

    def peek(self, key: K) -> V | None:
        found = self._entries.get(key)
        return None if found is None else found[0]

    def put(self, key: K, value: V, cost: int) -> None:
        old = self._entries.pop(key, None)
        if old is not None:
            self.cost -= old[1]
        self._entries[key] = (value, cost)
        self.cost += cost
        self._evict(keep=key)

    def pop(self, key: K) -> V | None:
        found = self._entries.pop(key, None)
        if found is None:
            return None
        self.cost -= found[1]
        return found[0]

    def drop_where(self, predicate: Callable[[K, V], bool]) -> int:
        doomed = [k for k, (v, _) in self._entries.items() if predicate(k, v)]
        for k in doomed:
            self.pop(k)
        return len(doomed)

    def items(self) -> Iterator[tuple[K, V]]:
        return ((k, v) for k, (v, _) in list(self._entries.items()))

    def _evict(self, keep: K) -> None:
        # The newest entry stays even if it alone exceeds the bound: the request that made
        # it is using it.
        while (len(self._entries) > self.max_entries or self.cost > self.max_cost) and \
                len(self._entries) > 1:
            key = next(iter(self._entries))
            if key == keep:
                break
            value = self.pop(key)
            self.counters.evictions += 1
            if self.on_evict is not None:
                self.on_evict(value)
