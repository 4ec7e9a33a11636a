"""Independent items of compiler work done in this process and in forked ones at once: the
states of an edit, each lowered and simulated on its own (`Session.lower`).

Lowering a state's program is pure Python over immutable IR, so threads would take
turns on the interpreter lock. A forked process starts with this one's memory: the
session's caches (traces, programs, the fragments lowering reuses) are there without
being copied or serialized, and only what the work determines comes back through a
pipe, pickled (a state's collectives and cost: a few KB).

Which process does which item is decided as they go: the item indices wait in a pipe,
and each process reads the next one when it is free, so the items are started in
order, and a process that finishes early takes the next instead of waiting. A pipe has
no lock that a killed process could leave held.

Nothing a forked process does can change a result, only who made it:
- An item a forked process did not report — it raised, it died, or it stayed silent
  too long once this process had nothing else to do (`STALL_S`; it is killed) — is done
  again here, where its error, if any, is raised as it would be without forking.
- A forked process must not run computations with JAX. XLA's thread pools (JAX has
  started them for the user's model) are not copied by a fork, so a computation
  dispatched there would wait for threads that do not exist. The passes compute with
  NumPy; `partir.ir.evaluate.evaluate`, the one way they could dispatch, raises
  `ForkedDispatchError` in a forked process (`check_dispatch`), and the item is done here
  instead.
- Cancelling (the token is checked between items and while waiting) kills the forked
  processes; the caller's caches stay as they were, as for any cancelled work.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import os
import pickle
import select
import signal
import struct
import time
import warnings
from collections.abc import Callable, Sequence
from typing import Any

from partir.cancel import checkpoint

__all__ = ["STALL_S", "ForkedDispatchError", "check_dispatch", "run_forked"]

# How long a forked process may stay silent once this one has nothing else to do, at
# least: four times the longest item this one did, if that is longer. It then holds one
# item at most (the others wait in the queue, which this process empties), which is
# done here: what a stuck fork costs is bounded by that wait.
STALL_S = 2.0
_ITEM = struct.Struct("<i")
_MAX_ITEMS = 4096  # their indices fit a pipe's buffer, written before anyone reads
_LENGTH = struct.Struct("<I")
_forked = False
_NICENESS = 10
_PR_SET_PDEATHSIG = 1


class ForkedDispatchError(RuntimeError):
    """A forked process tried to run a JAX computation (see the module's docstring)."""


def check_dispatch(what: str) -> None:
    """Raise `ForkedDispatchError` in a forked process: `what` would run with JAX."""
    if _forked:
        raise ForkedDispatchError(f"{what} would run with JAX in a forked process")


def run_forked(items: Sequence[Any], work: Callable[[Any], Any],
               done: Callable[[Any, Any], None], processes: int,
               stall_s: float = STALL_S) -> int:
    """Call `work(item)` for every item, in this process and `processes - 1` forked ones,
    and `done(item, result)` here for each, as results come (items in about their order,
    not exactly; the first is done here, before any fork). `work`'s results must pickle.
    Cancellable (`partir.cancel`): between items, and while waiting for the forked
    processes, which are then killed. Returns how many items forked processes did."""
    if processes < 2 or len(items) < 2 or len(items) > _MAX_ITEMS:
        for item in items:
            checkpoint()
            done(item, work(item))
        return 0
    queue_r, queue_w = os.pipe()
    os.write(queue_w, b"".join(_ITEM.pack(k) for k in range(len(items))))
    os.close(queue_w)  # the forked processes inherit only the read end: EOF once empty
    children: dict[int, _Child] = {}
    reported: set[int] = set()
    longest = 0.0

    def here(k: int) -> None:
        nonlocal longest
        checkpoint()
        start = time.perf_counter()
        result = work(items[k])
        longest = max(longest, time.perf_counter() - start)
        reported.add(k)
        done(items[k], result)

    def take(child: _Child) -> None:
        for k, ok, result in child.read():
            if ok:
                reported.add(k)
                done(items[k], result)

    try:
        # This process does the first item before it forks: a tool shows it first (the
        # edited tactic's lens), as soon as without forking (a fork, and the copies of the
        # pages both processes then write, would slow it).
        here(_next(queue_r))
        parent = os.getpid()
        for _ in range(min(processes, len(items)) - 1):
            result_r, result_w = os.pipe()
            try:
                with warnings.catch_warnings():
                    # JAX warns of any fork once its backend runs; this one never
                    # dispatches to it (see the module's docstring).
                    warnings.filterwarnings("ignore", "os.fork", RuntimeWarning)
                    pid = os.fork()
            except OSError:  # no memory or processes left: fewer processes do the work
                os.close(result_r)
                os.close(result_w)
                break
            if pid == 0:  # pragma: no cover (the forked process; it never returns)
                os.close(result_r)
                _serve(queue_r, result_w, items, work, parent)
            os.close(result_w)
            children[result_r] = _Child(pid, result_r)
        while (k := _next(queue_r)) is not None:
            here(k)
            open_ = [fd for fd, c in children.items() if not c.closed]
            ready, _, _ = select.select(open_, [], [], 0) if open_ else ((), (), ())
            for fd in ready:
                take(children[fd])
        # This process is done: wait for the others, then do what they did not report.
        deadline = time.monotonic() + max(stall_s, 4 * longest)
        while any(not c.closed for c in children.values()):
            checkpoint()
            open_ = [fd for fd, c in children.items() if not c.closed]
            ready, _, _ = select.select(open_, [], [], 0.05)
            for fd in ready:
                take(children[fd])
                deadline = time.monotonic() + max(stall_s, 4 * longest)
            if time.monotonic() > deadline:
                break  # the silent ones are killed, their items done here
        for child in children.values():
            child.stop()
        for k in range(len(items)):
            if k not in reported:
                here(k)
        return sum(c.results for c in children.values())
    finally:
        os.close(queue_r)
        for child in children.values():
            child.stop()


def _next(queue_r: int) -> int | None:
    data = os.read(queue_r, _ITEM.size)
    return _ITEM.unpack(data)[0] if data else None


class _Child:
    """A forked process, as this one sees it: its pid and its result pipe."""

    def __init__(self, pid: int, fd: int) -> None:
        self.pid: int | None = pid
        self.fd = fd
        self.closed = False
        self.results = 0  # items it reported done
        self._buffer = b""

    def read(self) -> list[tuple[int, bool, Any]]:
        """The messages that arrived (the pipe is readable)."""
        data = os.read(self.fd, 1 << 16)
        if not data:
            self.closed = True
            return []
        self._buffer += data
        out = []
        while len(self._buffer) >= _LENGTH.size:
            (n,) = _LENGTH.unpack_from(self._buffer)
            if len(self._buffer) < _LENGTH.size + n:
                break
            k, ok, result = pickle.loads(self._buffer[_LENGTH.size:_LENGTH.size + n])
            self._buffer = self._buffer[_LENGTH.size + n:]
            self.results += ok
            out.append((k, ok, result))
        return out

    def stop(self) -> None:
        """Kill it (it may be done already) and reap it, once."""
        if self.pid is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGKILL)
        os.waitpid(self.pid, 0)
        os.close(self.fd)
        self.pid = None
        self.closed = True


def _serve(queue_r: int, result_w: int, items: Sequence[Any],
           work: Callable[[Any], Any], parent: int) -> None:  # pragma: no cover (forked)
    """The forked process: items from the queue until it is empty, each result (or that
    it has none) written back; then exit without running this process's exit handlers
    (they belong to the parent: its daemon's files, its pipes)."""
    global _forked
    _forked = True
    status = 0
    try:
        _die_with_parent(parent)
        gc.disable()  # a collection would touch (and so copy) every object of the parent
        # Background work: what a user waits on (the editor's server rendering the first
        # results, the daemon relaying them) runs first.
        os.nice(_NICENESS)
        # An interrupt meant for the parent (a schedule file's time limit) is not ours.
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2):
            signal.signal(sig, signal.SIG_DFL)
        while (k := _next(queue_r)) is not None:
            try:
                message = (k, True, work(items[k]))
                data = pickle.dumps(message, pickle.HIGHEST_PROTOCOL)
            except BaseException:  # done again by the parent, which reports its error
                data = pickle.dumps((k, False, None), pickle.HIGHEST_PROTOCOL)
            _write_all(result_w, _LENGTH.pack(len(data)) + data)
    except BaseException:
        status = 1
    finally:
        os._exit(status)


def _die_with_parent(parent: int) -> None:  # pragma: no cover (runs forked)
    """Linux: be killed when the parent dies (a daemon killing a stuck compiler process
    kills its forks too), rather than finish work nobody will read."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except (AttributeError, OSError):
        return
    if os.getppid() != parent:  # it died before prctl
        os._exit(1)


def _write_all(fd: int, data: bytes) -> None:  # pragma: no cover (runs forked)
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]
