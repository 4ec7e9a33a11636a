"""Job bookkeeping on a full disk: `OSError(ENOSPC)` injected, in process, at each place
the daemon writes a job's directory, record or log (issue 15.1). The job manager runs in
this process; its job processes are a small fake runner (no JAX), so that each case takes
a fraction of a second. Nothing may stay queued or running, no task may die."""

from __future__ import annotations

import asyncio
import errno
import json
import os
import sys
from pathlib import Path

import pytest

from partir_daemon import jobs
from partir_daemon import protocol as P
from partir_daemon.paths import DaemonPaths, pid_alive

# Speaks the runner's event protocol: `steps` step events, each after a line of output.
FAKE_RUNNER = '''
import json, os, sys, time
steps = int(sys.argv[sys.argv.index("--steps") + 1])
out = os.fdopen(os.dup(1), "wb", buffering=0)
os.dup2(2, 1)
def emit(**data):
    out.write((json.dumps(data) + "\\n").encode())
emit(event="started", devices=1, platform="cpu")
{extra}
for i in range(steps):
    print("{line}", flush=True)
    emit(event="step", step=i + 1, total=steps, time_s=0.0)
    time.sleep({sleep})
emit(event="result", metrics={{"platform": "cpu", "devices": 1, "steps": steps,
     "compile_s": 0.0, "step_time_median_s": None, "step_time_min_s": None,
     "peak_memory_bytes": None, "max_abs_error": None, "check_ok": None}})
print("done", flush=True)
'''

ENOSPC = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def _fake(monkeypatch, line: str = "output", sleep: float = 0.0, extra: str = "") -> None:
    script = FAKE_RUNNER.format(line=line, sleep=sleep, extra=extra)
    monkeypatch.setattr(jobs, "module_command", lambda module: [sys.executable, "-c", script])


@pytest.fixture
def manager(tmp_path) -> jobs.JobManager:
    (tmp_path / "ws").mkdir()
    (tmp_path / "ws" / "job.partir.py").write_text("")
    return jobs.JobManager(DaemonPaths.of(tmp_path / "ws", tmp_path / "rt"))


def _params(manager: jobs.JobManager, steps: int = 3) -> P.RunParams:
    return P.RunParams(str(manager.root.parent.parent / "job.partir.py"), steps=steps,
                       timeout_s=60)


async def _run(manager: jobs.JobManager, steps: int = 3) -> P.JobInfo:
    params = _params(manager, steps)
    job = await manager.start(params, params.path, 1, lambda p: None)
    task = manager._tasks[job.id]
    await asyncio.wait_for(asyncio.shield(task), timeout=30)
    assert task.done() and task.exception() is None
    return job


def _disk(job: P.JobInfo) -> dict:
    return json.loads(Path(job.record_path).read_text())


def _all_final(manager: jobs.JobManager) -> None:
    assert manager.running == 0
    assert not manager._procs and not manager._tasks and not manager._stopping
    for job in manager.jobs.values():
        assert job.state in P.FINAL_JOB_STATES
        assert job.pid is None or not pid_alive(job.pid)


def _failing_writes(monkeypatch, when) -> list:
    """Make `_write_json` raise ENOSPC whenever `when(data)`; returns the failed data."""
    real, failed = jobs._write_json, []

    def write(path, data):
        if when(data):
            failed.append(data)
            raise ENOSPC
        real(path, data)

    monkeypatch.setattr(jobs, "_write_json", write)
    return failed


def test_records_are_written_atomically_without_leftovers(tmp_path):
    path = tmp_path / "job.json"
    jobs._write_json(path, {"a": 1})
    assert json.loads(path.read_text()) == {"a": 1}
    assert os.listdir(tmp_path) == ["job.json"]
    with pytest.raises(TypeError):  # fails half-way through: the old record stays
        jobs._write_json(path, {"a": object()})
    assert json.loads(path.read_text()) == {"a": 1}
    assert os.listdir(tmp_path) == ["job.json"]


@pytest.mark.parametrize("site", ["jobs dir", "record", "log"])
def test_a_run_that_cannot_create_its_job_leaves_no_job(manager, monkeypatch, site):
    _fake(monkeypatch)
    if site == "jobs dir":
        def no_dir(path):
            raise ENOSPC
        monkeypatch.setattr(jobs, "_private_dir", no_dir)
    elif site == "record":
        _failing_writes(monkeypatch, lambda data: True)
    else:
        real = jobs._open_private

        def no_log(path, flags):
            if str(path).endswith("log.txt"):
                raise ENOSPC
            return real(path, flags)
        monkeypatch.setattr(jobs, "_open_private", no_log)

    async def run():
        params = _params(manager)
        with pytest.raises(jobs.JobStorageError, match="No space left"):
            await manager.start(params, params.path, 1, lambda p: None)
        if site != "log":  # a job failed before it starts has no log
            with pytest.raises(jobs.JobStorageError, match="No space left"):
                manager.failed(params, "the schedule has errors")

    asyncio.run(run())
    assert manager.jobs == {} and manager.running == 0
    assert not manager.root.exists() or os.listdir(manager.root) == []


def test_a_record_write_error_mid_job_fails_it_and_is_retried(manager, monkeypatch):
    _fake(monkeypatch, sleep=0.05)
    monkeypatch.setattr(jobs, "SAVE_INTERVAL_S", 0.0)
    monkeypatch.setattr(jobs, "RETRY_INTERVAL_S", 0.1)
    full = [True]
    failed = _failing_writes(monkeypatch, lambda data: full[0] and data["steps_done"] >= 2)

    async def run():
        job = await _run(manager, steps=1000)
        assert job.state == "failed" and "record" in job.error
        assert "No space left" in job.error
        assert job.steps_done < 1000 and not pid_alive(job.pid)
        _all_final(manager)
        # The final record could not be written either: kept in memory, retried.
        assert failed[-1]["state"] == "failed" and _disk(job)["state"] == "running"
        assert job.id in manager._unsaved
        full[0] = False
        for _ in range(50):
            if not manager._unsaved:
                break
            await asyncio.sleep(0.05)
        assert _disk(job)["state"] == "failed" and "No space left" in _disk(job)["error"]

    asyncio.run(run())


def test_a_log_write_error_fails_the_job(manager, monkeypatch):
    _fake(monkeypatch, sleep=0.02)

    def no_space(fd, data):
        raise ENOSPC
    monkeypatch.setattr(jobs, "_append", no_space)

    async def run():
        job = await _run(manager, steps=1000)
        assert job.state == "failed" and "log" in job.error and "No space" in job.error
        assert not pid_alive(job.pid)
        assert _disk(job)["state"] == "failed"
        _all_final(manager)

    asyncio.run(run())


def test_a_final_record_write_error_keeps_the_outcome_in_memory(manager, monkeypatch):
    _fake(monkeypatch)
    monkeypatch.setattr(jobs, "RETRY_INTERVAL_S", 3600)
    _failing_writes(monkeypatch, lambda data: data["state"] in P.FINAL_JOB_STATES)

    async def run():
        job = await _run(manager, steps=2)
        assert job.state == "succeeded" and job.metrics.steps == 2
        assert _disk(job)["state"] == "running" and job.id in manager._unsaved
        _all_final(manager)
        monkeypatch.undo()
        await manager.stop_all()  # writes what it can before the daemon exits
        assert _disk(job)["state"] == "succeeded" and not manager._unsaved

    asyncio.run(run())


def test_the_log_is_capped_and_says_so(manager, monkeypatch):
    _fake(monkeypatch, line="x" * 999)
    monkeypatch.setattr(jobs, "LOG_LIMIT_BYTES", 5000)

    async def run():
        job = await _run(manager, steps=20)
        assert job.state == "succeeded"
        log = Path(job.log_path).read_bytes()
        dropped = 20 * 1000 + len("done\n") - 5000
        assert job.log_dropped_bytes == dropped == _disk(job)["log_dropped_bytes"]
        assert log.startswith(b"x" * 999 + b"\n")
        assert len(log) < 5200
        assert log.endswith(f"capped at 5000 bytes; {dropped} more bytes of output were "
                            f"dropped]\n".encode())

    asyncio.run(run())


def test_bad_events_do_not_stop_the_reading(manager, monkeypatch):
    _fake(monkeypatch, extra='emit(event="step")\nemit(event="result", metrics=1)\n'
                             'out.write(b"{" * 100 + b"\\n")')

    async def run():
        job = await _run(manager, steps=3)
        assert job.state == "succeeded" and job.steps_done == 3

    asyncio.run(run())


def test_recovering_on_a_full_disk_keeps_the_interrupted_state(manager, monkeypatch):
    directory = manager.root / "20260101-000000-abcdef"
    directory.mkdir(parents=True)
    job = P.JobInfo("20260101-000000-abcdef", "running", "x.partir.py", 3, 1.0, started=2.0,
                    record_path=str(directory / "job.json"),
                    log_path=str(directory / "log.txt"))
    jobs._write_json(Path(job.record_path), P.to_json(job))
    _failing_writes(monkeypatch, lambda data: True)
    manager.recover()  # no event loop: retried by the next save or stop_all
    assert manager.jobs[job.id].state == "interrupted" and job.id in manager._unsaved
    assert manager.running == 0


def test_a_truncated_record_is_listed_as_damaged(manager):
    directory = manager.root / "20260101-000000-abcdef"
    directory.mkdir(parents=True)
    job = P.JobInfo("20260101-000000-abcdef", "succeeded", "x.partir.py", 3, 1.0,
                    record_path=str(directory / "job.json"),
                    log_path=str(directory / "log.txt"))
    text = json.dumps(P.to_json(job))
    (directory / "job.json").write_text(text[:len(text) // 2])  # a crash mid-write
    (directory / "log.txt").write_text("step 1\n")
    manager.recover()
    damaged = manager.get(job.id)
    assert damaged.state == "damaged" and damaged.state in P.FINAL_JOB_STATES
    assert "unreadable" in damaged.error and str(directory / "job.json") in damaged.error
    assert manager.log_tail(damaged, 5) == "step 1"
    assert manager.running == 0
