"""Pausing Python's cyclic garbage collector around allocation-heavy compiler passes.

Propagation and the actions allocate many small acyclic objects; the full collections they
trigger rescan the whole heap (the traced program, JAX's caches) and find nothing. Nothing
these passes create is cyclic, so reference counting frees it all the same.
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
            gc.enable()
