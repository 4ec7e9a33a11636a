"""Where a workspace's daemon lives: its socket in a private runtime directory of the
user; its lock (`daemon.lock`), identity (`daemon.json`: pid, process start time,
socket, version, ...), log and jobs in the workspace's `.partir/`. The lock being the
workspace's, a second daemon for it refuses to start whatever runtime directory it was
given (and names the running one: pid and socket); a lock whose holder died is released
by the kernel (`flock`) and taken over by the next daemon.

The runtime directory is `$PARTIR_DAEMON_DIR` if set (tests), else
`$XDG_RUNTIME_DIR/partir`, else `~/.cache/partir/daemons`. It is created with mode 0700
and must belong to the user; a socket in it must be a socket of the user with mode 0600.
Anything else is refused (`InsecurePathError`): another user could otherwise read the
programs, or answer in the daemon's place.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any


class InsecurePathError(OSError):
    """A socket or runtime directory that belongs to another user or that others can
    access."""


# A Unix socket's path is at most 107 bytes (`sun_path` holds 108 with the final NUL).
SOCKET_PATH_MAX = 107


class SocketPathTooLong(OSError):
    """The socket's path does not fit in a Unix socket address."""


def check_socket_path(path: Path) -> None:
    """Refuse a socket path over the AF_UNIX limit before anything waits on it."""
    size = len(os.fsencode(path))
    if size > SOCKET_PATH_MAX:
        raise SocketPathTooLong(
            f"the daemon's socket path {path} is {size} bytes long, over the "
            f"{SOCKET_PATH_MAX}-byte limit of Unix socket paths: choose a shorter runtime "
            f"directory (PARTIR_DAEMON_DIR or XDG_RUNTIME_DIR)")


def runtime_dir() -> Path:
    override = os.environ.get("PARTIR_DAEMON_DIR")
    if override:
        return Path(override)
    xdg = os.environ.get("XDG_RUNTIME_DIR")
    if xdg and os.path.isdir(xdg):
        return Path(xdg) / "partir"
    return Path.home() / ".cache" / "partir" / "daemons"


def workspace_key(workspace: str | os.PathLike[str]) -> str:
    """One daemon per workspace: the key of its real path."""
    return hashlib.sha256(os.path.realpath(workspace).encode()).hexdigest()[:16]


@dataclass(frozen=True)
class DaemonPaths:
    workspace: Path
    dir: Path
    socket: Path
    status: Path
    lock: Path
    log: Path
    jobs: Path

    @classmethod
    def of(cls, workspace: str | os.PathLike[str], base: Path | None = None) -> DaemonPaths:
        ws = Path(os.path.realpath(workspace))
        base = base if base is not None else runtime_dir()
        key = workspace_key(ws)
        state = ws / ".partir"
        return cls(ws, base, base / f"{key}.sock", state / "daemon.json", state / "daemon.lock",
                   state / "daemon.log", state / "jobs")


def ensure_private_dir(path: Path) -> None:
    """Create `path` (mode 0700) or check that it is the user's and private."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    check_private_dir(path)


def check_private_dir(path: Path) -> None:
    _check_private(path, stat.S_ISDIR, "a directory", "", "access it", 0o700)


def check_socket(path: Path) -> None:
    """Refuse a socket that is not the user's own with mode 0600 (no group/other bits)."""
    _check_private(path, stat.S_ISSOCK, "a socket", "socket ", "connect to it", 0o600)


def _check_private(path: Path, is_kind: Callable[[int], bool], kind: str, label: str,
                   access: str, expected: int) -> None:
    """`path` is of the kind, the user's, and closed to group and others."""
    st = os.lstat(path)  # lstat: a symlink to someone else's file is refused too
    if not is_kind(st.st_mode):
        raise InsecurePathError(f"{path} is not {kind}")
    if st.st_uid != os.getuid():
        raise InsecurePathError(f"{label}{path} belongs to uid {st.st_uid}, not to this "
                                f"user (uid {os.getuid()})")
    if stat.S_IMODE(st.st_mode) & 0o077:
        raise InsecurePathError(f"{label}{path} has mode {stat.S_IMODE(st.st_mode):04o}: "
                                f"others can {access} (expected {expected:04o})")


def read_status(paths: DaemonPaths) -> dict[str, Any] | None:
    """The status file's contents, or None when there is none (or it is unreadable)."""
    try:
        with open(paths.status) as f:
            data = json.load(f)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def proc_stat(pid: int | str) -> list[str] | None:
    """The fields of `/proc/<pid>/stat` after the command name (state, ppid, ...); None
    when there is no such process."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return fields if len(fields) > 19 else None


def process_start_ticks(pid: int) -> int | None:
    """When process `pid` started, in clock ticks since boot (field 22 of
    `/proc/<pid>/stat`); None when there is no such process. With the pid, it names one
    process for good: a pid reused later has another start time."""
    fields = proc_stat(pid)
    return int(fields[19]) if fields is not None else None


def daemon_alive(status: dict[str, Any] | None) -> bool:
    """Whether the daemon a status file names still runs: its pid alive and, when the
    file records it, with the same start time (not a later process given its pid)."""
    if not status:
        return False
    try:
        pid = int(status.get("pid", 0))
    except (TypeError, ValueError):
        return False
    if not pid_alive(pid):
        return False
    ticks = status.get("start_ticks")
    return ticks is None or process_start_ticks(pid) in (None, ticks)


def pid_alive(pid: int) -> bool:
    """Whether process `pid` exists and has not exited (a zombie, exited but not yet
    reaped by its parent, counts as gone)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, but another user's
        return True
    fields = proc_stat(pid)
    return fields is None or fields[0] != "Z"
