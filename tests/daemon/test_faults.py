"""Faults with real daemon processes (issue 15.2): one daemon per workspace whatever the
runtime directory, a stale lock taken over, a daemon SIGKILLed mid-job (its job runner
and compiler processes die with it; the next daemon finishes the records without
signalling an unrelated process), a compiler SIGKILLed at each stage (a clear error,
then the next request served), a job whose child called `setsid` cancelled. Each checks:
a clear error or a correct result, no job left unfinished, no record lost, and (in the
fixture's teardown) no process of the workspace left behind."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from partir_daemon import protocol as P
from partir_daemon.client import (
    DaemonClient,
    DaemonElsewhere,
    RequestError,
    child_env,
    module_command,
)
from partir_daemon.paths import pid_alive, read_status
from tests.daemon.support import BP_MP_Z3, processes_mentioning, wait_until

SCHEDULE = "mlp/bp_mp_z3.partir.py"
LONG = 10_000_000  # steps: the job runs until it is stopped


def _running(client: DaemonClient, job_id: str) -> bool:
    job = client.job(job_id, log_tail=0).job
    return job.state == "running" and job.steps_done > 0


def _compilers(env) -> list[int]:
    return processes_mentioning(f"partir_daemon.worker --workspace {env.workspace}")


def _records(env) -> dict[str, dict]:
    return {p.parent.name: json.loads(p.read_text())
            for p in (env.workspace / ".partir" / "jobs").glob("*/job.json")}


@pytest.fixture
def other_runtime():
    path = Path(tempfile.mkdtemp(prefix="pdrt"))
    path.chmod(0o700)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.mark.slow
def test_a_second_daemon_in_another_runtime_dir_is_refused_and_the_job_unharmed(
        env, other_runtime):
    client = env.connect()
    job = client.run(SCHEDULE, steps=LONG)
    assert wait_until(lambda: _running(client, job.id), timeout=120)
    first = client.status().pid
    # The identity lives in the workspace, next to the lock; the runtime directory holds
    # only the socket.
    identity = read_status(env.paths)
    assert env.paths.status == env.workspace / ".partir" / "daemon.json"
    assert identity["pid"] == first and identity["socket"] == str(env.paths.socket)
    assert identity["start_ticks"] and identity["version"] and identity["started"]
    assert sorted(p.name for p in env.runtime.iterdir()) == [env.paths.socket.name]

    # Started as another session would: another XDG_RUNTIME_DIR, no runtime dir given.
    child = child_env({"XDG_RUNTIME_DIR": str(other_runtime)})
    child.pop("PARTIR_DAEMON_DIR", None)
    second = subprocess.run(
        [*module_command("partir_daemon.server"), "--workspace", str(env.workspace),
         *env.config.to_args()], capture_output=True, text=True, env=child,
        cwd=str(env.workspace), timeout=60)
    assert second.returncode == 3, second.stderr
    assert f"pid {first}" in second.stderr and str(env.paths.socket) in second.stderr
    assert not list(other_runtime.rglob("*.sock"))

    # A client looking in the other runtime directory is told where the daemon is.
    with pytest.raises(DaemonElsewhere, match=f"pid {first}, socket {env.paths.socket}"):
        DaemonClient.connect(env.workspace, runtime_dir=other_runtime / "partir",
                             config=env.config, start_timeout=30)
    assert not list(other_runtime.rglob("*.sock"))

    # The first daemon and its job go on.
    assert client.status().pid == first and pid_alive(job.pid)
    before = client.job(job.id, log_tail=0).job.steps_done
    assert wait_until(lambda: client.job(job.id, log_tail=0).job.steps_done > before,
                      timeout=30)
    assert client.job(job.id, log_tail=0).job.state == "running"
    assert client.cancel(job.id).job.state == "cancelled"
    assert not pid_alive(job.pid)
    assert all(r["state"] in P.FINAL_JOB_STATES for r in _records(env).values())


@pytest.mark.slow
def test_a_stale_lock_and_identity_are_taken_over(env):
    client = env.connect()
    assert client.partition(SCHEDULE).ok
    dead = client.status().pid
    compilers = _compilers(env)
    assert compilers
    os.kill(dead, signal.SIGKILL)
    assert wait_until(lambda: not pid_alive(dead), timeout=10)
    # Its compiler processes die with it (parent-death signal), not at the next start.
    assert wait_until(lambda: not any(pid_alive(p) for p in compilers), timeout=5)
    client.close()
    assert env.paths.lock.exists() and env.paths.socket.exists()  # left by the killed one
    # Its identity file now names a live process that is not a daemon (a reused pid).
    sleeper = subprocess.Popen(["sleep", "60"])
    try:
        identity = read_status(env.paths)
        identity["pid"] = sleeper.pid
        env.paths.status.write_text(json.dumps(identity))
        restarted = env.connect()  # not fooled: starts a daemon, which takes the lock
        status = restarted.status()
        assert status.pid not in (dead, sleeper.pid)
        assert read_status(env.paths)["pid"] == status.pid
        assert restarted.partition(SCHEDULE).ok
        assert sleeper.poll() is None  # never signalled
    finally:
        sleeper.kill()
        sleeper.wait()


@pytest.mark.slow
def test_a_daemon_killed_mid_job_takes_its_job_along_and_the_next_spares_strangers(env):
    client = env.connect()
    job = client.run(SCHEDULE, steps=LONG)
    assert wait_until(lambda: _running(client, job.id), timeout=120)
    daemon = client.status().pid
    compilers = _compilers(env)
    # A record left by some earlier daemon, whose pid now belongs to an unrelated process.
    sleeper = subprocess.Popen(["sleep", "60"])
    stranger = env.workspace / ".partir" / "jobs" / "20250101-000000-0a0b0c"
    stranger.mkdir()
    (stranger / "job.json").write_text(json.dumps(P.to_json(P.JobInfo(
        stranger.name, "running", str(env.workspace / SCHEDULE), 10, time.time() - 60,
        started=time.time() - 60, pid=sleeper.pid, record_path=str(stranger / "job.json"),
        log_path=str(stranger / "log.txt")))))
    try:
        os.kill(daemon, signal.SIGKILL)
        # The runner dies with its daemon at once (parent-death signal), as do compilers.
        assert wait_until(lambda: not pid_alive(job.pid), timeout=5)
        assert wait_until(lambda: not any(pid_alive(p) for p in compilers), timeout=5)
        assert wait_until(lambda: not processes_mentioning(str(env.workspace)), timeout=10)
        client.close()
        restarted = env.connect()
        assert restarted.status().pid != daemon
        jobs = {j.id: j for j in restarted.jobs()}
        assert {job.id, stranger.name} <= set(jobs)  # no record lost
        assert jobs[job.id].state == "interrupted" and "running" in jobs[job.id].error
        assert jobs[stranger.name].state == "interrupted"
        records = _records(env)
        assert records[job.id]["state"] == records[stranger.name]["state"] == "interrupted"
        assert all(r["state"] in P.FINAL_JOB_STATES for r in records.values())
        assert sleeper.poll() is None, "the daemon signalled a process it did not start"
    finally:
        sleeper.kill()
        sleeper.wait()


STAGES = ["loading the schedule file", "tracing", "tactic 2/3",
          "collectives after tactic 1"]


@pytest.mark.slow
@pytest.mark.parametrize("stage", STAGES, ids=["load", "trace", "tactic", "lower"])
def test_a_compiler_killed_at_a_stage_is_a_clear_error_then_recovers(
        env, monkeypatch, tmp_path, stage):
    kill_at = tmp_path / "kill-at"
    kill_at.write_text(stage)
    monkeypatch.setenv("PARTIR_DAEMON_KILL_AT", str(kill_at))
    client = env.connect()
    seen = []
    if stage == STAGES[0]:  # the user's code crashing it: a diagnostic of the file
        (d,) = client.partition(SCHEDULE, on_partial=seen.append).diagnostics
        assert d.kind == "execution" and "compiler process exited" in d.message
        assert "SIGKILL" in d.message
    else:
        with pytest.raises(RequestError) as e:
            client.partition(SCHEDULE, on_partial=seen.append)
        assert e.value.code == P.WORKER_CRASHED
        assert "compiler process exited" in e.value.message
        assert "restarted" in e.value.message
    assert not kill_at.exists()  # it was killed there
    result = client.partition(SCHEDULE)  # served by a new compiler process
    assert result.ok and len(result.tactics) == 3
    assert all(t.metadata.get("collectives") is not None for t in result.tactics)
    assert len(_compilers(env)) <= env.config.compiler_processes


GRANDCHILD = '''
import os
import subprocess
import sys

if os.environ.get("PARTIR_JOB_ID"):  # in the job, not when the daemon analyses the file
    subprocess.Popen([sys.executable, "-c", "import os, time; os.setsid(); time.sleep(120)",
                      __file__ + "-grandchild"], stdout=subprocess.DEVNULL)
'''


def _job_with_a_setsid_grandchild(env, name: str):
    """A running job whose code started a child that left the job's session: (client,
    job, the text the grandchild's command line holds)."""
    path = env.write(name, BP_MP_Z3 + GRANDCHILD)
    marker = path + "-grandchild"
    client = env.connect()
    job = client.run(path, steps=LONG)
    assert wait_until(lambda: _running(client, job.id), timeout=120)
    assert wait_until(lambda: any(os.getsid(p) != job.pid
                                  for p in processes_mentioning(marker)), timeout=10)
    return client, job, marker


@pytest.mark.slow
def test_cancelling_a_job_ends_its_setsid_grandchild(env):
    client, job, marker = _job_with_a_setsid_grandchild(env, "setsid.partir.py")
    result = client.cancel(job.id)
    assert result.cancelled and result.job.state == "cancelled"
    assert wait_until(lambda: not processes_mentioning(marker), timeout=5)
    assert not pid_alive(job.pid)
    assert _records(env)[job.id]["state"] == "cancelled"


@pytest.mark.slow
def test_a_daemon_killed_mid_job_takes_the_jobs_setsid_grandchild_along(env):
    client, job, marker = _job_with_a_setsid_grandchild(env, "orphan.partir.py")
    os.kill(client.status().pid, signal.SIGKILL)
    client.close()
    # the runner dies with the daemon, and its reaper ends what the job started
    assert wait_until(lambda: not pid_alive(job.pid), timeout=5)
    assert wait_until(lambda: not processes_mentioning(marker), timeout=5)
    assert wait_until(lambda: not processes_mentioning(f"partir_daemon.reaper {job.id}"),
                      timeout=5)
