"""Cooperative cancellation of compiler work (propagation, lowering, simulation), and
progress reports from long work inside a tactic (an automatic tactic's search).

A `CancellationToken` is a flag that another thread sets (`cancel`); the compiler checks
it at cheap points inside its long loops and raises `Cancelled` there. Work is checked
against the token current in its context (`cancellable(token)`), so the passes need no
extra parameter. Cancelled work leaves nothing half-done behind that anyone holds: a
tactic rewrites a fork of the cached state (`CoreModule.fork`), lowering builds new
functions, so dropping them on `Cancelled` keeps every cache valid.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar


class Cancelled(Exception):
    """The work was cancelled (its token was cancelled: e.g. a newer revision of the
    document it analysed arrived)."""


class CancellationToken:
    """Set once by `cancel` (from any thread), checked by `check` (cheap: one attribute)."""

    __slots__ = ("cancelled", "reason")

    def __init__(self) -> None:
        self.cancelled = False
        self.reason = ""

    def cancel(self, reason: str = "cancelled") -> None:
        if not self.cancelled:
            self.reason = reason
            self.cancelled = True

    def check(self) -> None:
        if self.cancelled:
            raise Cancelled(self.reason)


_current: ContextVar[CancellationToken | None] = ContextVar("partir_cancellation",
                                                            default=None)


def current() -> CancellationToken | None:
    """The token the running compiler work is checked against, if any."""
    return _current.get()


@contextmanager
def cancellable(token: CancellationToken | None) -> Iterator[None]:
    """Check the compiler work run inside against `token` (None: not cancellable)."""
    reset = _current.set(token)
    try:
        yield
    finally:
        _current.reset(reset)


def checkpoint() -> None:
    """Raise `Cancelled` if the current token was cancelled."""
    token = _current.get()
    if token is not None and token.cancelled:
        raise Cancelled(token.reason)


# progress(message, step, total): what a tool shows while a tactic works
Progress = Callable[[str, int | None, int | None], None]
_progress: ContextVar[Progress | None] = ContextVar("partir_progress", default=None)


@contextmanager
def reporting(progress: Progress | None) -> Iterator[None]:
    """Send the progress of the compiler work run inside to `progress`."""
    reset = _progress.set(progress)
    try:
        yield
    finally:
        _progress.reset(reset)


def report(message: str, step: int | None = None, total: int | None = None) -> None:
    """Tell the current progress receiver, if any, how the work is going."""
    progress = _progress.get()
    if progress is not None:
        progress(message, step, total)
