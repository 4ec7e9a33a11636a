"""The daemon's child processes: tied to its life, and found again to be ended.

- `die_with_parent` (a `preexec_fn`): the child gets SIGKILL when the daemon's thread
  that started it dies (Linux `prctl(PR_SET_PDEATHSIG)`), so a job runner or compiler
  process never outlives a daemon that was SIGKILLed; if the daemon died before the
  call, the child exits at once. The runner's own `partir_daemon.reaper` then ends the
  processes the job started.
- `job_processes`: the processes of one job, to end its whole tree: the runner's
  descendants (by parent pid, read in `/proc` before the runner dies, so that a child
  that called `setsid` is followed too) and every process carrying the job's
  `PARTIR_JOB_ID` in its environment (what was reparented to init). A job id is random
  and written only into its own job's environment, so only that job's processes carry it:
  the daemon signals no process it did not start.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import signal
from collections.abc import Callable, Iterable

from partir_daemon.paths import proc_stat

JOB_ID_VARIABLE = "PARTIR_JOB_ID"
_PR_SET_PDEATHSIG = 1

try:  # loaded here: the child between fork and exec must not import or load anything
    _prctl = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True).prctl
except (OSError, AttributeError):  # not Linux: the processes' stdin watch remains
    _prctl = None


def set_parent_death_signal(sig: int) -> None:
    """Have this process get `sig` when its parent dies (Linux; elsewhere nothing)."""
    if _prctl is not None:
        _prctl(_PR_SET_PDEATHSIG, sig, 0, 0, 0)


def die_with_parent() -> Callable[[], None]:
    """A `preexec_fn` giving the child SIGKILL when its parent (this process) dies."""
    parent = os.getpid()

    def preexec() -> None:
        set_parent_death_signal(signal.SIGKILL)
        if os.getppid() != parent:  # the parent died before the call above
            os._exit(70)

    return preexec


def _children() -> dict[int, list[int]]:
    """Parent pid -> pids of its live children, from `/proc`."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        fields = proc_stat(entry) if entry.isdigit() else None
        if fields is not None and fields[0] != "Z":
            children.setdefault(int(fields[1]), []).append(int(entry))
    return children


def descendants(pid: int) -> set[int]:
    """The live descendants of `pid` (not `pid` itself)."""
    children = _children()
    found: set[int] = set()
    todo = list(children.get(pid, ()))
    while todo:
        child = todo.pop()
        if child not in found:
            found.add(child)
            todo.extend(children.get(child, ()))
    return found


def carrying(job_id: str) -> set[int]:
    """Live processes of this user whose environment holds `PARTIR_JOB_ID=<job_id>` (a
    job's processes, wherever they were reparented)."""
    wanted = f"{JOB_ID_VARIABLE}={job_id}".encode()
    found = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                if wanted not in f.read().split(b"\0"):
                    continue
        except OSError:  # gone, or another user's
            continue
        fields = proc_stat(entry)
        if fields is not None and fields[0] != "Z":
            found.add(int(entry))
    return found


def job_processes(job_id: str, runner: int | None) -> set[int]:
    """The live processes of a job: its runner's descendants and those carrying its id."""
    found = carrying(job_id)
    if runner is not None:
        found |= descendants(runner)
    return found


def signal_all(pids: Iterable[int], sig: int, group: int | None = None) -> None:
    """Send `sig` to the process group `group` (the job's) and to each of `pids`."""
    if group is not None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(group, sig)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)
