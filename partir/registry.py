"""Registries keyed by primitive name (the TMR, the simulator's cost rules): each entry is
declared once, beside its kin, as JAX registers rules per primitive."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TypeVar

T = TypeVar("T")


class Registry(dict[str, T]):
    """A dict of entries by primitive name that refuses a second entry for a name."""

    def __init__(self, what: str) -> None:
        super().__init__()
        self.what = what

    def register(self, names: str | Iterable[str], entry: T) -> T:
        for name in [names] if isinstance(names, str) else names:
            if name in self:
                raise ValueError(f"{self.what} for {name!r} registered twice")
            self[name] = entry
        return entry
