"""Pausing Python's cyclic garbage collector around allocation-heavy compiler passes.

Propagation and the actions allocate many small acyclic objects; the full collections they
trigger rescan the whole heap (the traced program, JAX's caches) and find nothing. Nothing
these passes create is cyclic, so reference counting frees it all the same.

On resuming, what the pause allocated and kept (the new program) would all sit in the
youngest generation, and the next young collection would traverse every object of it to
find nothing. It is promoted to the oldest generation at once instead (`gc.freeze` then
`gc.unfreeze`, both constant time), where it waits for the next full collection like any
long-lived data.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def paused_gc() -> Iterator[None]:
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.freeze()
            gc.unfreeze()
            gc.enable()
