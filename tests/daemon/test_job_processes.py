"""A job's processes (issue 15.2), in process with the fake runner of the storage tests:
cancelling or ending a job ends its whole tree, a grandchild that called `setsid`
included; a restarted daemon kills what is left of an earlier daemon's job only when it
is that job's, never an unrelated process that got its pid; children die with their
parent (PR_SET_PDEATHSIG)."""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from partir_daemon import jobs
from partir_daemon import protocol as P
from partir_daemon.paths import pid_alive
from partir_daemon.processes import JOB_ID_VARIABLE, carrying
from tests.daemon.support import processes_mentioning, wait_until
from tests.daemon.test_job_storage import _all_final, _disk, _fake, _params, manager  # noqa: F401

# A grandchild that leaves the job's process group and session, then sleeps; its command
# line carries a marker the test looks for (put together: not in the runner's own).
SETSID_CHILD = '''
import subprocess, sys
subprocess.Popen([sys.executable, "-c",
                  "import os, sys, time; os.setsid(); time.sleep(120)",
                  "{marker}"[:5] + "{marker}"[5:]], stdout=subprocess.DEVNULL)
'''


def _marker() -> str:
    return "partir-test-" + secrets.token_hex(6)


def _gone(marker: str) -> bool:
    return not processes_mentioning(marker)


def _kill_all(marker: str) -> None:
    for pid in processes_mentioning(marker):
        os.kill(pid, signal.SIGKILL)


def test_cancel_ends_a_setsid_grandchild(manager, monkeypatch):  # noqa: F811
    marker = _marker()
    _fake(monkeypatch, sleep=0.2, extra=SETSID_CHILD.format(marker=marker))

    async def go() -> P.JobInfo:
        params = _params(manager, steps=1000)
        job = await manager.start(params, params.path, 1, lambda p: None)
        def escaped() -> bool:  # out of the job's session
            return any(os.getsid(p) != job.pid for p in processes_mentioning(marker))

        assert await asyncio.to_thread(wait_until, escaped, 10)
        result = await manager.cancel(job.id)
        assert result.cancelled
        return job

    try:
        job = asyncio.run(go())
        assert wait_until(lambda: _gone(marker), timeout=5), "the grandchild survived"
        assert job.state == "cancelled" and _disk(job)["state"] == "cancelled"
        assert not carrying(job.id)
        _all_final(manager)
    finally:
        _kill_all(marker)


def test_a_job_that_ends_leaves_no_setsid_grandchild(manager, monkeypatch):  # noqa: F811
    marker = _marker()
    _fake(monkeypatch, extra=SETSID_CHILD.format(marker=marker))

    async def go() -> P.JobInfo:
        params = _params(manager, steps=2)
        job = await manager.start(params, params.path, 1, lambda p: None)
        await asyncio.wait_for(asyncio.shield(manager._tasks[job.id]), timeout=30)
        return job

    try:
        start = time.monotonic()
        job = asyncio.run(go())
        # Not held up by the grandchild keeping the job's output pipes open.
        assert time.monotonic() - start < jobs.DRAIN_TIMEOUT_S
        assert job.state == "succeeded", job.error
        assert wait_until(lambda: _gone(marker), timeout=5), "the grandchild survived"
        _all_final(manager)
    finally:
        _kill_all(marker)


def _unfinished_record(mgr: jobs.JobManager, job_id: str, pid: int,
                       started: float) -> Path:
    directory = mgr.root / job_id
    directory.mkdir(parents=True)
    job = P.JobInfo(job_id, "running", str(mgr.root / "x.partir.py"), 10,
                    started - 0.5, started=started, pid=pid,
                    record_path=str(directory / "job.json"),
                    log_path=str(directory / "log.txt"))
    (directory / "job.json").write_text(json.dumps(P.to_json(job)))
    return directory / "job.json"


def test_recovery_leaves_an_unrelated_process_with_the_jobs_pid_alone(manager):  # noqa: F811
    # The record of a job whose daemon was killed names a pid now used by an unrelated
    # process (here a `sleep` this test started: no job id in its environment).
    sleeper = subprocess.Popen(["sleep", "60"])
    try:
        record = _unfinished_record(manager, "20250101-000000-abcdef", sleeper.pid,
                                    time.time())
        manager.recover()
        time.sleep(0.2)
        assert sleeper.poll() is None and pid_alive(sleeper.pid), "an unrelated process " \
            "was signalled"
        data = json.loads(record.read_text())
        assert data["state"] == "interrupted" and "running" in data["error"]
        _all_final_records(manager)
    finally:
        sleeper.kill()
        sleeper.wait()


def test_recovery_kills_the_leftovers_of_the_jobs_own_tree(manager):  # noqa: F811
    job_id = "20250101-000000-" + secrets.token_hex(3)
    marker = _marker()
    env = {**os.environ, JOB_ID_VARIABLE: job_id}
    # A runner left by a killed daemon, and its setsid'd child (the job id inherited).
    runner = subprocess.Popen(
        [sys.executable, "-c", SETSID_CHILD.format(marker=marker) +
         "import time; time.sleep(120)"], env=env, start_new_session=True)
    try:
        assert wait_until(lambda: any(os.getsid(p) != runner.pid
                                      for p in processes_mentioning(marker)), timeout=10)
        record = _unfinished_record(manager, job_id, runner.pid, time.time())
        manager.recover()
        assert runner.wait(timeout=5) == -signal.SIGKILL
        assert wait_until(lambda: _gone(marker), timeout=5)
        assert json.loads(record.read_text())["state"] == "interrupted"
    finally:
        runner.kill()
        runner.wait()
        _kill_all(marker)


def test_recovery_spares_the_tree_of_a_pid_that_is_not_the_jobs(manager):  # noqa: F811
    # A record's pid now held by another process, started long after the job and without
    # its id: neither it nor its (setsid'd) child is signalled.
    job_id = "20250101-000000-" + secrets.token_hex(3)
    marker = _marker()
    holder = subprocess.Popen([sys.executable, "-c", SETSID_CHILD.format(marker=marker) +
                               "import time; time.sleep(120)"])
    try:
        assert wait_until(lambda: processes_mentioning(marker), timeout=10)
        record = _unfinished_record(manager, job_id, holder.pid, time.time() - 3600)
        manager.recover()
        time.sleep(0.2)
        assert holder.poll() is None and processes_mentioning(marker)
        assert json.loads(record.read_text())["state"] == "interrupted"
    finally:
        holder.kill()
        holder.wait()
        _kill_all(marker)


def _all_final_records(mgr: jobs.JobManager) -> None:
    for record in mgr.root.glob("*/job.json"):
        assert json.loads(record.read_text())["state"] in P.FINAL_JOB_STATES


PARENT = '''
import subprocess, sys, time
from partir_daemon.processes import die_with_parent
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)",
                          "{marker}"], preexec_fn=die_with_parent())
print(child.pid, flush=True)
time.sleep(120)
'''


@pytest.mark.parametrize("kill", ["SIGKILL", "SIGTERM"])
def test_a_child_dies_with_its_parent(kill):
    marker = _marker()
    parent = subprocess.Popen([sys.executable, "-c", PARENT.format(marker=marker)],
                              stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    try:
        child = int(parent.stdout.readline())
        assert pid_alive(child)
        parent.send_signal(getattr(signal, kill))
        parent.wait(timeout=10)
        assert wait_until(lambda: not pid_alive(child), timeout=5), "the child outlived it"
    finally:
        parent.kill()
        parent.wait()
        _kill_all(marker)
