"""Jobs: run on 8 CPU devices, cancel, crash, timeout, and a daemon killed mid-job."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest

from partir_daemon.client import DaemonError
from partir_daemon.paths import pid_alive
from partir_daemon.processes import job_processes
from tests.daemon.support import BP_MP_Z3, processes_mentioning, wait_until

SCHEDULE = "mlp/bp_mp_z3.partir.py"
LONG = 10_000_000  # steps: the job runs until it is stopped


def _record(job) -> dict:
    with open(job.record_path) as f:
        return json.load(f)


def _running(client, job_id: str) -> bool:
    job = client.job(job_id, log_tail=0).job
    return job.state == "running" and job.steps_done > 0


@pytest.mark.slow
def test_a_job_runs_to_completion_on_8_cpu_devices(shared):
    progress = []
    client = shared.connect(on_progress=progress.append)
    job = client.run(SCHEDULE, steps=3)
    assert job.state == "running" and job.pid
    done = client.wait_job(job.id, timeout=180)
    assert done.state == "succeeded", done.error
    m = done.metrics
    assert m.devices == 8 and m.platform == "cpu" and m.steps == 3
    assert m.check_ok and m.max_abs_error < 1e-4
    assert m.step_time_median_s > 0 and m.peak_memory_bytes > 0
    assert m.collectives["all_gather"] == 2
    # The record and log are under the workspace's .partir/jobs/<id>/.
    assert done.record_path == str(shared.workspace / ".partir" / "jobs" / job.id /
                                   "job.json")
    assert _record(done)["state"] == "succeeded"
    log = client.job(job.id).log
    assert "8 cpu devices" in log and "step time" in log
    assert any(p.token == job.id and p.step == 3 for p in progress)
    assert job.id in [j.id for j in client.jobs()]
    assert not pid_alive(done.pid)


@pytest.mark.slow
def test_a_job_as_two_processes_equals_the_single_process_job(shared):
    """processes=2: two runners of 4 CPU devices under jax.distributed run the one
    8-device program; the record keeps each runner's exit and log, and cancelling a
    two-process job ends both runners."""
    client = shared.connect()
    single = client.wait_job(client.run(SCHEDULE, steps=2).id, timeout=180)
    job = client.wait_job(client.run(SCHEDULE, steps=2, processes=2).id, timeout=240)
    assert job.state == "succeeded", (job.error, client.job(job.id).log[-3000:])
    assert job.metrics.processes == 2 and single.metrics.processes == 1
    assert job.metrics.devices == single.metrics.devices == 8
    assert job.metrics.check_ok and job.metrics.collectives == single.metrics.collectives
    assert [(p.process, p.exit_code) for p in job.processes] == [(0, 0), (1, 0)]
    for p in job.processes:  # each runner's own log
        assert "step time" in Path(p.log_path).read_text()
    assert "process 1 of 2: exit 0" in client.job(job.id).log
    uneven = client.wait_job(client.run(SCHEDULE, steps=1, processes=3).id, timeout=60)
    assert uneven.state == "failed" and "cannot share 8 devices evenly" in uneven.error
    long = client.run(SCHEDULE, steps=LONG, processes=2)
    assert wait_until(lambda: _running(client, long.id), timeout=240)
    # the launcher, its reaper and its two runners carry the job's id
    assert len(job_processes(long.id, None)) >= 3
    assert client.cancel(long.id).job.state == "cancelled"
    assert wait_until(lambda: not job_processes(long.id, None), timeout=30)


@pytest.mark.slow
def test_cancel_a_long_job(shared):
    client = shared.connect()
    job = client.run(SCHEDULE, steps=LONG)
    assert wait_until(lambda: _running(client, job.id), timeout=120)
    result = client.cancel(job.id)
    assert result.cancelled and result.job.state == "cancelled"
    assert not pid_alive(job.pid)
    assert _record(result.job)["state"] == "cancelled"
    again = client.cancel(job.id)  # already over
    assert not again.cancelled and again.job.state == "cancelled"


def test_a_crashing_job_is_reported_as_crashed(shared):
    client = shared.connect()
    # Crashes only in the job process (which has PARTIR_JOB_ID), after partitioning.
    crash = BP_MP_Z3 + ("\nimport os, signal\nif os.environ.get('PARTIR_JOB_ID'):\n"
                        "    os.kill(os.getpid(), signal.SIGSEGV)\n")
    path = shared.write("crash.partir.py", crash)
    job = client.run(path, steps=3)
    done = client.wait_job(job.id, timeout=120)
    assert done.state == "crashed" and "SIGSEGV" in done.error
    assert done.exit_code == -signal.SIGSEGV
    assert not pid_alive(done.pid)


@pytest.mark.slow
def test_a_job_past_its_timeout_is_killed(shared):
    client = shared.connect()
    job = client.run(SCHEDULE, steps=LONG, timeout_s=4)
    done = client.wait_job(job.id, timeout=120)
    assert done.state == "timeout" and "4 s" in done.error
    assert not pid_alive(done.pid)


def test_a_job_of_a_broken_schedule_fails_with_its_diagnostic(shared):
    client = shared.connect()
    path = shared.write("broken.partir.py", BP_MP_Z3.replace('"w2": 1', '"w9": 1'))
    job = client.run(path, steps=3)
    assert job.state == "failed" and "w9" in job.error and "broken.partir.py:10" in job.error


@pytest.mark.slow
def test_killing_the_daemon_mid_job_leaves_an_interrupted_record(env):
    client = env.connect()
    job = client.run(SCHEDULE, steps=LONG)
    assert wait_until(lambda: _running(client, job.id), timeout=120)
    daemon = env.daemon_pid()
    os.kill(daemon, signal.SIGKILL)
    # The job's process notices its daemon is gone and exits.
    assert wait_until(lambda: not pid_alive(job.pid), timeout=30)
    assert wait_until(lambda: not processes_mentioning(str(env.workspace)), timeout=30)
    client.close()
    restarted = env.connect()  # auto-starts a new daemon
    assert restarted.status().pid != daemon
    info = restarted.job(job.id).job
    assert info.state == "interrupted" and "running" in info.error
    assert _record(info)["state"] == "interrupted"


@pytest.mark.slow
def test_shutdown_stops_running_jobs(env):
    client = env.connect()
    job = client.run(SCHEDULE, steps=LONG)
    assert wait_until(lambda: _running(client, job.id), timeout=120)
    client.shutdown()
    assert wait_until(lambda: not pid_alive(job.pid), timeout=30)
    assert wait_until(lambda: _record(job)["state"] == "interrupted", timeout=30)



@pytest.mark.slow
def test_a_run_whose_job_cannot_be_recorded_answers_an_error_and_leaves_no_job(env):
    # `.partir/jobs` a file: no job directory can be made (as on a full disk).
    (env.workspace / ".partir").mkdir(exist_ok=True)
    (env.workspace / ".partir" / "jobs").write_text("")
    client = env.connect()
    with pytest.raises(DaemonError, match="cannot create the job's record"):
        client.run(SCHEDULE, steps=3)
    broken = env.write("broken.partir.py", BP_MP_Z3.replace('"w2": 1', '"w9": 1'))
    with pytest.raises(DaemonError, match="cannot create the job's record"):
        client.run(broken, steps=3)
    assert client.jobs() == [] and client.status().pid == env.daemon_pid()
