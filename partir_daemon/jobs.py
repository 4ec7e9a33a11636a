"""Jobs: partitioned programs run for N steps in child processes of the daemon.

Each job has a directory `<workspace>/.partir/jobs/<id>/` holding `job.json` (its
`JobInfo`, rewritten atomically by the daemon, the only writer: temporary file, fsync,
rename) and `log.txt` (what the job printed, copied there by the daemon from the job's
stderr, at most LOG_LIMIT_BYTES of it). Records outlive the daemon: on start, a daemon
marks the jobs that were still queued or running as `interrupted`.

A job's processes are the daemon's alone to end, and end with it: the runner starts in a
session (process group) of its own, gets SIGKILL when its daemon dies
(`processes.die_with_parent`) and exits when its stdin closes; cancelling, a timeout, a
storage error or the end of the job end its whole tree — the runner's group, its
descendants found in `/proc` (a child that called `setsid` too) and every process with
the job's `PARTIR_JOB_ID` in its environment. On start, a daemon kills what is left of
an earlier daemon's unfinished job only when it is that job's: the runner's pid is
signalled only if that process still has the job's id in its environment and started
when the record says the job did (a pid reused by another process is left alone).

States: queued -> running -> succeeded | failed (exit status != 0, e.g. the numerical
check failed or the program raised) | crashed (killed by a signal nobody sent) | timeout
| cancelled | interrupted (the daemon stopped first).

Storage errors (a full disk) never leave a job behind unfinished: a `run` whose directory
or first record cannot be written answers an error and leaves no job; an `OSError` in
writing a running job's record or log stops the job into `failed`, with the cause as its
error; a final record that cannot be written is kept in memory (what `job`/`jobs`
answer) and written again every RETRY_INTERVAL_S.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import secrets
import shutil
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from partir_daemon import protocol as P
from partir_daemon.client import child_env, module_command
from partir_daemon.paths import DaemonPaths, pid_alive, process_start_ticks
from partir_daemon.processes import (
    JOB_ID_VARIABLE,
    die_with_parent,
    job_processes,
    signal_all,
)

log = logging.getLogger("partir_daemon.jobs")

# How often a running job's record is rewritten for its step count (its final state is
# always written at once).
SAVE_INTERVAL_S = 0.5
# Between SIGTERM and SIGKILL when stopping a job.
KILL_GRACE_S = 2.0
# Of a job's output, at most this much goes to its log; the rest is counted and dropped.
LOG_LIMIT_BYTES = 16 * 1024 * 1024
# How often records that could not be written (a full disk) are written again.
RETRY_INTERVAL_S = 5.0
# After a job's process exited: how long its output pipes may stay open (a grandchild).
DRAIN_TIMEOUT_S = 5.0


class JobStorageError(Exception):
    """A job could not be created: its directory or first record cannot be written."""

ProgressSink = Callable[[P.ProgressParams], None]


def _open_private(path: str | os.PathLike[str], flags: int) -> int:
    """A file descriptor on `path`, created 0600 and kept so whatever the umask (and
    whatever mode an older file had): jobs' records and logs are the user's alone."""
    fd = os.open(path, flags | os.O_CREAT, 0o600)
    try:
        os.fchmod(fd, 0o600)
    except OSError:
        os.close(fd)
        raise
    return fd


def _private_dir(path: Path) -> None:
    """Create `path` (and missing parents) mode 0700 whatever the umask; fix its mode if
    it exists."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(path, 0o700)


def _write_json(path: Path, data: Any) -> None:
    """Replace `path` by `data` atomically and durably: a reader (or a crash) sees the old
    record or the new one, never a part of it. Raises OSError (the temporary file gone)."""
    tmp = path.with_name(path.name + ".tmp")
    try:
        with os.fdopen(_open_private(tmp, os.O_WRONLY | os.O_TRUNC), "w") as f:
            json.dump(data, f, indent=1)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(fd)  # the rename itself
    finally:
        os.close(fd)


def _append(fd: int, data: bytes) -> None:
    """Write all of `data` to the log `fd`. Raises OSError (e.g. ENOSPC)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _damaged(record: Path, error: Exception) -> P.JobInfo:
    """The job of a record an earlier daemon left unreadable (truncated by a crash or a
    full disk, or edited by hand): its directory's name is its id."""
    try:
        created = record.stat().st_mtime
    except OSError:
        created = 0.0
    what = error.message if isinstance(error, P.ProtocolError) else str(error)
    return P.JobInfo(record.parent.name, "damaged", "", 0, created, finished=created,
                     error=f"its record {record} is unreadable: {what}",
                     record_path=str(record), log_path=str(record.with_name("log.txt")))


class JobManager:
    def __init__(self, paths: DaemonPaths) -> None:
        self.root = paths.jobs
        self.jobs: dict[str, P.JobInfo] = {}
        self._procs: dict[str, asyncio.subprocess.Process] = {}
        self._tasks: dict[str, asyncio.Task] = {}
        self._stopping: dict[str, str] = {}  # job id -> state it is being stopped into
        self._causes: dict[str, str] = {}  # job id -> why it is being stopped into failed
        self._saved: dict[str, float] = {}
        self._unsaved: set[str] = set()  # jobs whose record on disk is out of date
        self._retry: asyncio.Task | None = None
        self._kills: set[asyncio.Task] = set()  # referenced until done (not collected)

    # -- records -------------------------------------------------------------------------
    def _save(self, job: P.JobInfo, force: bool = True) -> OSError | None:
        """Write `job`'s record (at most every SAVE_INTERVAL_S unless `force`). Never
        raises: an OSError is returned, and the record written again later."""
        now = time.monotonic()
        if not force and now - self._saved.get(job.id, 0.0) < SAVE_INTERVAL_S:
            return None
        self._saved[job.id] = now
        try:
            _write_json(Path(job.record_path), P.to_json(job))
        except OSError as e:
            log.warning("cannot write the record of job %s: %s", job.id, e)
            self._unsaved.add(job.id)
            self._retry_later()
            return e
        self._unsaved.discard(job.id)
        return None

    def _retry_later(self) -> None:
        if self._retry is not None and not self._retry.done():
            return
        try:
            self._retry = asyncio.get_running_loop().create_task(self._retry_saves())
        except RuntimeError:  # no event loop (recover() called outside one)
            self._retry = None

    async def _retry_saves(self) -> None:
        while self._unsaved:
            await asyncio.sleep(RETRY_INTERVAL_S)
            self.retry_saves()

    def retry_saves(self) -> None:
        """Write again the records that could not be written."""
        for job_id in sorted(self._unsaved):
            job = self.jobs.get(job_id)
            if job is None:
                self._unsaved.discard(job_id)
                continue
            try:
                _write_json(Path(job.record_path), P.to_json(job))
            except OSError:
                continue
            self._unsaved.discard(job_id)
            log.info("wrote the record of job %s at last", job_id)

    def _storage_failed(self, job: P.JobInfo, what: str, error: OSError) -> None:
        """Writing a running job's record or log failed: stop it into `failed`."""
        if job.id in self._stopping or job.state in P.FINAL_JOB_STATES:
            return
        cause = f"could not write the job's {what}: {error}"
        log.warning("job %s: %s; stopping it", job.id, cause)
        self._stopping[job.id] = "failed"
        self._causes[job.id] = cause
        proc = self._procs.get(job.id)
        if proc is not None and proc.returncode is None:
            task = asyncio.get_running_loop().create_task(self._kill(job.id, proc))
            self._kills.add(task)
            task.add_done_callback(self._kills.discard)

    def recover(self) -> None:
        """Load the records of earlier daemons; mark their unfinished jobs interrupted."""
        if not self.root.is_dir():
            return
        for record in sorted(self.root.glob("*/job.json")):
            try:
                job = P.from_json(P.JobInfo, json.loads(record.read_text()))
            except (OSError, ValueError, P.ProtocolError) as e:
                # Listed, not dropped: its log may still say what the job did.
                log.warning("unreadable job record %s: %s", record, e)
                self.jobs[record.parent.name] = _damaged(record, e)
                continue
            if job.state not in P.FINAL_JOB_STATES:
                runner = job.pid if job.pid is not None and _is_our_runner(job) else None
                leftovers = job_processes(job.id, runner)
                if leftovers:
                    log.info("killing job %s's leftover processes %s", job.id,
                             sorted(leftovers))
                    signal_all(leftovers, signal.SIGKILL)
                job.state = "interrupted"
                job.error = "the daemon stopped while the job was " + (
                    "running" if job.started else "queued")
                job.finished = job.finished or time.time()
                self.jobs[job.id] = job  # before saving: a failed save is retried
                self._save(job)
            self.jobs[job.id] = job

    def get(self, job_id: str) -> P.JobInfo:
        job = self.jobs.get(job_id)
        if job is None:
            raise KeyError(job_id)
        return job

    def log_tail(self, job: P.JobInfo, lines: int) -> str:
        if lines <= 0:
            return ""
        try:
            with open(job.log_path, "rb") as f:
                f.seek(0, os.SEEK_END)
                size = f.tell()
                f.seek(max(0, size - 256 * 1024))
                text = f.read().decode(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    @property
    def running(self) -> int:
        return sum(j.state in ("queued", "running") for j in self.jobs.values())

    # -- starting ------------------------------------------------------------------------
    def failed(self, params: P.RunParams, error: str) -> P.JobInfo:
        """A job that could not start (e.g. the schedule file has errors). Raises
        JobStorageError (and leaves no job) if its record cannot be written."""
        return self._new(params, "failed", error)

    def _new(self, params: P.RunParams, state: P.JobState = "queued",
             error: str | None = None) -> P.JobInfo:
        """A new job with its directory and first record; registered only once they are
        written: raises JobStorageError, leaving nothing behind, if they cannot be."""
        job_id = time.strftime("%Y%m%d-%H%M%S-") + secrets.token_hex(3)
        directory = self.root / job_id
        job = P.JobInfo(job_id, state, params.path, params.steps, time.time(),
                        record_path=str(directory / "job.json"),
                        log_path=str(directory / "log.txt"), error=error)
        if state in P.FINAL_JOB_STATES:
            job.finished = job.created
        created = False
        try:
            _private_dir(self.root)
            directory.mkdir(mode=0o700, exist_ok=False)
            created = True
            os.chmod(directory, 0o700)  # mkdir's mode is filtered by the umask
            _write_json(Path(job.record_path), P.to_json(job))
        except OSError as e:
            if created:
                shutil.rmtree(directory, ignore_errors=True)
            raise JobStorageError(f"cannot create the job's record in {self.root}: {e}") \
                from e
        self._saved[job_id] = time.monotonic()
        self.jobs[job_id] = job
        return job

    def _forget(self, job: P.JobInfo) -> None:
        """Remove a job that never started, and its directory."""
        self.jobs.pop(job.id, None)
        self._saved.pop(job.id, None)
        self._unsaved.discard(job.id)
        shutil.rmtree(Path(job.record_path).parent, ignore_errors=True)

    async def start(self, params: P.RunParams, path: str, devices: int,
                    progress: ProgressSink) -> P.JobInfo:
        """Start a job. Raises (leaving no job) if its records cannot be written or its
        process cannot be started."""
        job = self._new(params)
        cmd = [*module_command("partir_daemon.job_runner"), "--path", path,
               "--steps", str(params.steps), "--inputs", params.inputs,
               "--seed", str(params.seed)]
        if not params.check:
            cmd.append("--no-check")
        if params.processes > 1:
            cmd += ["--processes", str(params.processes), "--devices", str(devices),
                    "--log-dir", str(Path(job.log_path).parent)]
        flags = os.environ.get("XLA_FLAGS", "")
        flags = " ".join(f for f in flags.split()
                         if not f.startswith("--xla_force_host_platform_device_count"))
        env = child_env({"XLA_FLAGS": f"{flags} --xla_force_host_platform_device_count="
                                      f"{devices}".strip(), JOB_ID_VARIABLE: job.id})
        logfd = -1
        try:
            logfd = _open_private(job.log_path, os.O_WRONLY | os.O_APPEND)
            # A session of its own (its tree is ended with its group), and death with the
            # daemon. Its output comes through the daemon, which caps it and survives a
            # full disk (the job, writing its log itself, would die of it).
            proc = await asyncio.create_subprocess_exec(
                *cmd, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE, env=env, cwd=os.path.dirname(path),
                start_new_session=True, preexec_fn=die_with_parent(),
                limit=P.MAX_MESSAGE_BYTES)
        except BaseException as e:
            if logfd >= 0:
                os.close(logfd)
            self._forget(job)
            if isinstance(e, OSError):
                raise JobStorageError(f"cannot start the job: {e}") from e
            raise
        job.state, job.pid, job.started = "running", proc.pid, time.time()
        self._procs[job.id] = proc
        error = self._save(job)
        self._tasks[job.id] = asyncio.create_task(
            self._monitor(job, proc, logfd, params, progress))
        if error is not None:
            self._storage_failed(job, "record", error)
        log.info("job %s started: pid %d, %s, %d devices", job.id, proc.pid, path, devices)
        return job

    async def _monitor(self, job: P.JobInfo, proc: asyncio.subprocess.Process, logfd: int,
                       params: P.RunParams, progress: ProgressSink) -> None:
        """Follow the job until its process exits, then record its final state, whatever
        goes wrong on the way."""
        def report(message: str, step: int | None = None, total: int | None = None) -> None:
            with contextlib.suppress(Exception):  # a closed connection
                progress(P.ProgressParams(job.id, "job", message, step, total, job.path))

        lost = None
        try:
            await self._follow(job, proc, logfd, params, report)
        except asyncio.CancelledError:
            lost = "the daemon stopped following the job"
            raise
        except Exception as e:
            log.exception("following job %s failed", job.id)
            lost = f"the daemon lost track of the job: {type(e).__name__}: {e}"
        finally:
            if proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
            # Whatever the job left running (a child that called setsid) ends with it.
            with contextlib.suppress(OSError):
                signal_all(job_processes(job.id, None), signal.SIGKILL)
            with contextlib.suppress(OSError):
                os.close(logfd)
            self._finish(job, proc, params, lost)
            report(f"{job.state}" + (f": {job.error}" if job.error else ""))

    async def _follow(self, job: P.JobInfo, proc: asyncio.subprocess.Process, logfd: int,
                      params: P.RunParams, report: Callable[..., None]) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + params.timeout_s

        def event(line: bytes) -> None:
            event = P.child_message(line)
            if event is None:
                return
            kind = event.get("event")
            if kind == "started":
                report(f"running on {event['devices']} {event['platform']} devices")
            elif kind == "compiled":
                report(f"partitioned and compiled in {event['compile_s']:.2f} s")
            elif kind == "step":
                job.steps_done = int(event["step"])
                error = self._save(job, force=False)
                if error is not None:
                    self._storage_failed(job, "record", error)
                report(f"step {event['step']}/{event['total']}", event["step"],
                       event["total"])
            elif kind == "result":
                job.metrics = P.from_json(P.JobMetrics, event["metrics"])
                job.steps_done = job.metrics.steps
            elif kind == "error":
                job.error = event.get("message")
            elif kind == "processes":
                job.processes = [P.from_json(P.JobProcess, p) for p in event["processes"]]

        async def events() -> None:
            assert proc.stdout is not None
            while True:
                try:
                    line = await proc.stdout.readline()
                except ValueError:  # a line over the limit: dropped
                    continue
                if not line:
                    return
                try:
                    event(line)
                except Exception:  # a malformed event must not stop the reading
                    log.exception("job %s: bad event %.200r", job.id, line)

        async def output() -> None:
            """Copy the job's output to its log, up to LOG_LIMIT_BYTES; after a write
            error, or past the limit, read on (the job would block) and drop it."""
            assert proc.stderr is not None
            written = dropped = 0
            failed = False
            while chunk := await proc.stderr.read(1 << 16):
                keep = b"" if failed else chunk[:max(0, LOG_LIMIT_BYTES - written)]
                dropped += len(chunk) - len(keep)
                if keep:
                    try:
                        _append(logfd, keep)
                        written += len(keep)
                    except OSError as e:
                        failed = True
                        self._storage_failed(job, "log", e)
            job.log_dropped_bytes = dropped
            if dropped and not failed:
                with contextlib.suppress(OSError):
                    _append(logfd, f"\n[partir: the log is capped at {LOG_LIMIT_BYTES} "
                                   f"bytes; {dropped} more bytes of output were dropped]\n"
                            .encode())

        readers = [asyncio.create_task(events()), asyncio.create_task(output())]
        try:
            try:
                await _exited(proc, max(0.0, deadline - loop.time()))
            except TimeoutError:
                self._stopping.setdefault(job.id, "timeout")
                await self._kill(job.id, proc)
            # Processes the job left (holding its output pipes open) end with it.
            signal_all(job_processes(job.id, None), signal.SIGKILL)
            done, _pending = await asyncio.wait(readers, timeout=DRAIN_TIMEOUT_S)
            for task in done:
                if task.exception() is not None:
                    log.error("job %s: reading its output failed: %r", job.id,
                              task.exception())
        finally:
            for task in readers:
                task.cancel()

    def _finish(self, job: P.JobInfo, proc: asyncio.subprocess.Process,
                params: P.RunParams, lost: str | None) -> None:
        """Give the job its final state, in memory at once, then in its record."""
        code = proc.returncode
        job.exit_code = code
        job.finished = time.time()
        stopped = self._stopping.pop(job.id, None)
        cause = self._causes.pop(job.id, None)
        if stopped is not None:
            job.state = stopped  # type: ignore[assignment]
            job.error = cause or job.error or {
                "timeout": f"did not finish within {params.timeout_s:g} s; killed",
                "cancelled": "cancelled on request",
                "interrupted": "the daemon shut down while the job was running",
                "failed": "failed"}[stopped]
        elif lost is not None:
            job.state, job.error = "failed", lost
        elif code == 0:
            job.state = "succeeded"
        elif code is not None and code < 0:
            job.state = "crashed"
            job.error = f"the job process was killed by {signal.Signals(-code).name}"
        else:
            job.state = "failed"
            if job.metrics is not None and job.metrics.check_ok is False:
                job.error = (f"the partitioned program differs from the unpartitioned "
                             f"function (max |error| {job.metrics.max_abs_error:.3g})")
            job.error = job.error or f"the job exited with status {code}"
        self._procs.pop(job.id, None)
        self._tasks.pop(job.id, None)
        self._save(job)  # kept in memory and written again later if this fails
        log.info("job %s %s (exit %s)", job.id, job.state, code)

    async def _kill(self, job_id: str, proc: asyncio.subprocess.Process) -> None:
        """End the job's whole process tree: SIGTERM, then SIGKILL to what is still there
        after a grace period; returns once the runner is reaped and the rest is gone."""
        loop = asyncio.get_running_loop()
        seen: dict[int, int | None] = {}  # pid -> start time: each one signalled

        def remaining() -> list[int]:
            # Signalled again only while the same process (its start time unchanged).
            return [p for p, ticks in seen.items()
                    if ticks is not None and process_start_ticks(p) == ticks and pid_alive(p)]

        for sig, grace in ((signal.SIGTERM, KILL_GRACE_S), (signal.SIGKILL, 30.0)):
            live = proc.returncode is None
            for pid in job_processes(job_id, proc.pid if live else None):
                seen.setdefault(pid, process_start_ticks(pid))
            tree = remaining()
            if not live and not tree:
                return
            signal_all(tree, sig, proc.pid if live else None)
            deadline = loop.time() + grace
            with contextlib.suppress(TimeoutError):
                await _exited(proc, grace)
            while remaining() and loop.time() < deadline:
                await asyncio.sleep(0.02)

    async def cancel(self, job_id: str) -> P.CancelResult:
        job = self.get(job_id)
        proc = self._procs.get(job_id)
        if job.state in P.FINAL_JOB_STATES or proc is None:
            return P.CancelResult(False, job)
        self._stopping[job_id] = "cancelled"
        self._causes.pop(job_id, None)
        await self._kill(job_id, proc)
        task = self._tasks.get(job_id)
        if task is not None:
            await asyncio.shield(task)
        return P.CancelResult(True, job)

    async def stop_all(self) -> None:
        """Stop every running job (the daemon is shutting down): they are interrupted."""
        for job_id, proc in list(self._procs.items()):
            self._stopping[job_id] = "interrupted"
            self._causes.pop(job_id, None)
            await self._kill(job_id, proc)
        tasks = list(self._tasks.values())
        if tasks:
            await asyncio.wait(tasks, timeout=10)
        self.retry_saves()
        if self._retry is not None:
            self._retry.cancel()


async def _exited(proc: asyncio.subprocess.Process, timeout: float) -> None:
    """Wait until `proc` exited (and was reaped); raises TimeoutError. Not `proc.wait()`:
    that also waits for its output pipes to close, which a grandchild can hold open."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while proc.returncode is None:
        if loop.time() >= deadline:
            raise TimeoutError
        await asyncio.sleep(0.02)


def _is_our_runner(job: P.JobInfo) -> bool:
    """Whether the record's pid is still the runner of `job` (pids are reused): that
    process has the job's id in its environment and started when the job did."""
    pid = job.pid
    if pid is None or not pid_alive(pid):
        return False
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            if f"{JOB_ID_VARIABLE}={job.id}".encode() not in f.read().split(b"\0"):
                return False
    except OSError:
        return False
    started = _start_time(pid)
    # The runner starts between the job's creation and its `started` stamp.
    return started is None or job.created - 2 <= started <= (job.started or job.created) + 2


def _start_time(pid: int) -> float | None:
    """When process `pid` started, in seconds since the epoch (1 s precision)."""
    ticks = process_start_ticks(pid)
    if ticks is None:
        return None
    try:
        with open("/proc/stat") as f:
            boot = next(int(line.split()[1]) for line in f if line.startswith("btime "))
    except (OSError, StopIteration, ValueError):
        return None
    return boot + ticks / os.sysconf("SC_CLK_TCK")
