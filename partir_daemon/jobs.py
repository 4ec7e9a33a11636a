"""Jobs: partitioned programs run for N steps in child processes of the daemon.

Each job has a directory `<workspace>/.partir/jobs/<id>/` holding `job.json` (its
`JobInfo`, rewritten atomically by the daemon, the only writer) and `log.txt` (everything
the job printed). Records outlive the daemon: on start, a daemon marks the jobs that were
still queued or running as `interrupted` (their processes exit by themselves when the
daemon that started them dies, and any that did not are killed).

States: queued -> running -> succeeded | failed (exit status != 0, e.g. the numerical
check failed or the program raised) | crashed (killed by a signal nobody sent) | timeout
| cancelled | interrupted (the daemon stopped first).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import secrets
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from partir_daemon import protocol as P
from partir_daemon.client import child_env, module_command
from partir_daemon.paths import DaemonPaths, pid_alive

log = logging.getLogger("partir_daemon.jobs")

# How often a running job's record is rewritten for its step count (its final state is
# always written at once).
SAVE_INTERVAL_S = 0.5
# Between SIGTERM and SIGKILL when stopping a job.
KILL_GRACE_S = 2.0

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
    tmp = path.with_suffix(".tmp")
    with os.fdopen(_open_private(tmp, os.O_WRONLY | os.O_TRUNC), "w") as f:
        json.dump(data, f, indent=1)
    os.replace(tmp, path)


class JobManager:
    def __init__(self, paths: DaemonPaths) -> None:
        self.root = paths.jobs
        self.jobs: dict[str, P.JobInfo] = {}
        self._procs: dict[str, asyncio.subprocess.Process] = {}
        self._tasks: dict[str, asyncio.Task] = {}
        self._stopping: dict[str, str] = {}  # job id -> state it is being stopped into
        self._saved: dict[str, float] = {}

    # -- records -------------------------------------------------------------------------
    def _save(self, job: P.JobInfo, force: bool = True) -> None:
        now = time.monotonic()
        if not force and now - self._saved.get(job.id, 0.0) < SAVE_INTERVAL_S:
            return
        self._saved[job.id] = now
        _write_json(Path(job.record_path), P.to_json(job))

    def recover(self) -> None:
        """Load the records of earlier daemons; mark their unfinished jobs interrupted."""
        if not self.root.is_dir():
            return
        for record in sorted(self.root.glob("*/job.json")):
            try:
                job = P.from_json(P.JobInfo, json.loads(record.read_text()))
            except (OSError, ValueError, P.ProtocolError) as e:
                log.warning("skipping unreadable job record %s: %s", record, e)
                continue
            if job.state not in P.FINAL_JOB_STATES:
                if job.pid is not None and _is_our_runner(job.pid, job.id):
                    log.info("killing job %s's leftover process %d", job.id, job.pid)
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(job.pid, signal.SIGKILL)
                job.state = "interrupted"
                job.error = "the daemon stopped while the job was " + (
                    "running" if job.started else "queued")
                job.finished = job.finished or time.time()
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
        """A job that could not start (e.g. the schedule file has errors)."""
        job = self._new(params)
        job.state, job.error, job.finished = "failed", error, time.time()
        self._save(job)
        return job

    def _new(self, params: P.RunParams) -> P.JobInfo:
        job_id = time.strftime("%Y%m%d-%H%M%S-") + secrets.token_hex(3)
        directory = self.root / job_id
        _private_dir(self.root)
        directory.mkdir(mode=0o700, exist_ok=False)
        os.chmod(directory, 0o700)  # mkdir's mode is filtered by the umask
        job = P.JobInfo(job_id, "queued", params.path, params.steps, time.time(),
                        record_path=str(directory / "job.json"),
                        log_path=str(directory / "log.txt"))
        self.jobs[job_id] = job
        return job

    async def start(self, params: P.RunParams, path: str, devices: int,
                    progress: ProgressSink) -> P.JobInfo:
        job = self._new(params)
        self._save(job)
        cmd = [*module_command("partir_daemon.job_runner"), "--path", path,
               "--steps", str(params.steps), "--inputs", params.inputs,
               "--seed", str(params.seed)]
        if not params.check:
            cmd.append("--no-check")
        flags = os.environ.get("XLA_FLAGS", "")
        flags = " ".join(f for f in flags.split()
                         if not f.startswith("--xla_force_host_platform_device_count"))
        env = child_env({"XLA_FLAGS": f"{flags} --xla_force_host_platform_device_count="
                                      f"{devices}".strip(), "PARTIR_JOB_ID": job.id})
        with os.fdopen(_open_private(job.log_path, os.O_WRONLY | os.O_APPEND), "ab") as logf:
            # A session of its own: cancelling kills the job's whole process group.
            proc = await asyncio.create_subprocess_exec(
                *cmd, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
                stderr=logf, env=env, cwd=os.path.dirname(path), start_new_session=True,
                limit=P.MAX_MESSAGE_BYTES)
        job.state, job.pid, job.started = "running", proc.pid, time.time()
        self._save(job)
        self._procs[job.id] = proc
        self._tasks[job.id] = asyncio.create_task(self._monitor(job, proc, params, progress))
        log.info("job %s started: pid %d, %s, %d devices", job.id, proc.pid, path, devices)
        return job

    async def _monitor(self, job: P.JobInfo, proc: asyncio.subprocess.Process,
                       params: P.RunParams, progress: ProgressSink) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + params.timeout_s

        def report(message: str, step: int | None = None, total: int | None = None) -> None:
            progress(P.ProgressParams(job.id, "job", message, step, total, job.path))

        async def events() -> None:
            assert proc.stdout is not None
            async for line in proc.stdout:
                event = P.child_message(line)
                if event is None:
                    continue
                kind = event.get("event")
                if kind == "started":
                    report(f"running on {event['devices']} {event['platform']} devices")
                elif kind == "compiled":
                    report(f"partitioned and compiled in {event['compile_s']:.2f} s")
                elif kind == "step":
                    job.steps_done = int(event["step"])
                    self._save(job, force=False)
                    report(f"step {event['step']}/{event['total']}", event["step"],
                           event["total"])
                elif kind == "result":
                    job.metrics = P.from_json(P.JobMetrics, event["metrics"])
                    job.steps_done = job.metrics.steps
                elif kind == "error":
                    job.error = event.get("message")

        reader = asyncio.create_task(events())
        try:
            await asyncio.wait_for(proc.wait(), timeout=max(0.0, deadline - loop.time()))
        except TimeoutError:
            self._stopping.setdefault(job.id, "timeout")
            await self._kill(proc)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(reader, timeout=5)
        code = proc.returncode
        job.exit_code = code
        job.finished = time.time()
        stopped = self._stopping.pop(job.id, None)
        if stopped is not None:
            job.state = stopped  # type: ignore[assignment]
            job.error = job.error or {
                "timeout": f"did not finish within {params.timeout_s:g} s; killed",
                "cancelled": "cancelled on request",
                "interrupted": "the daemon shut down while the job was running"}[stopped]
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
        self._save(job)
        self._procs.pop(job.id, None)
        self._tasks.pop(job.id, None)
        report(f"{job.state}" + (f": {job.error}" if job.error else ""))
        log.info("job %s %s (exit %s)", job.id, job.state, code)

    async def _kill(self, proc: asyncio.subprocess.Process) -> None:
        """SIGTERM the job's process group, SIGKILL it if it is still there after a grace
        period; returns once the process is reaped."""
        for sig, wait in ((signal.SIGTERM, KILL_GRACE_S), (signal.SIGKILL, 30.0)):
            if proc.returncode is not None:
                return
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, sig)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(proc.wait(), timeout=wait)

    async def cancel(self, job_id: str) -> P.CancelResult:
        job = self.get(job_id)
        proc = self._procs.get(job_id)
        if job.state in P.FINAL_JOB_STATES or proc is None:
            return P.CancelResult(False, job)
        self._stopping[job_id] = "cancelled"
        await self._kill(proc)
        task = self._tasks.get(job_id)
        if task is not None:
            await asyncio.shield(task)
        return P.CancelResult(True, job)

    async def stop_all(self) -> None:
        """Stop every running job (the daemon is shutting down): they are interrupted."""
        for job_id, proc in list(self._procs.items()):
            self._stopping[job_id] = "interrupted"
            await self._kill(proc)
        tasks = list(self._tasks.values())
        if tasks:
            await asyncio.wait(tasks, timeout=10)


def _is_our_runner(pid: int, job_id: str) -> bool:
    """Whether `pid` is still the runner of `job_id` (pids are reused)."""
    if not pid_alive(pid):
        return False
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return f"PARTIR_JOB_ID={job_id}".encode() in f.read().split(b"\0")
    except OSError:
        return False
