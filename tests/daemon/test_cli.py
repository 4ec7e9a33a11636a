"""`partir jobs`: the jobs of a workspace's daemon from the command line (issue 31,
item 6)."""

from __future__ import annotations

import json

import pytest

from partir.cli import main as cli
from tests.daemon.support import wait_until

SCHEDULE = "mlp/bp_mp_z3.partir.py"
LONG = 10_000_000  # steps: the job runs until it is cancelled


@pytest.mark.slow
def test_jobs_list_show_logs_and_cancel(env, monkeypatch, capsys):
    monkeypatch.setenv("PARTIR_DAEMON_DIR", str(env.runtime))
    monkeypatch.chdir(env.workspace)
    assert cli(["jobs"]) == 0  # starts the daemon, which has none
    assert capsys.readouterr().out == f"no jobs in {env.workspace}\n"
    client = env.connect()
    done = client.wait_job(client.run(SCHEDULE, steps=2).id, timeout=180)
    assert done.state == "succeeded", done.error
    running = client.run(SCHEDULE, steps=LONG)
    assert wait_until(lambda: client.job(running.id, log_tail=0).job.steps_done > 0,
                      timeout=120)
    assert cli(["jobs", "list"]) == 0
    header, *rows = capsys.readouterr().out.splitlines()
    assert header.split() == ["ID", "STATE", "STEPS", "CREATED", "FILE", "ERROR"]
    assert [r.split()[:2] for r in rows] == [[done.id, "succeeded"], [running.id, "running"]]
    assert rows[0].split()[2] == "2/2"
    assert all(r.split()[5] == SCHEDULE for r in rows)
    assert cli(["jobs", "show", done.id]) == 0
    shown = capsys.readouterr().out
    assert shown.startswith(f"job {done.id}: succeeded\n") and "check ok: True" in shown
    assert cli(["jobs", "show", done.id, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["metrics"]["devices"] == 8
    assert cli(["jobs", "logs", done.id, "--tail", "1"]) == 0
    assert "step time" in capsys.readouterr().out
    assert cli(["jobs", "cancel", running.id]) == 0
    assert capsys.readouterr().out == f"cancelled job {running.id}\n"
    assert client.job(running.id).job.state == "cancelled"
    assert cli(["jobs", "cancel", running.id]) == 0
    assert "had already finished: cancelled" in capsys.readouterr().out
    assert cli(["jobs", "show", "nope"]) == 2
    assert "no job 'nope'" in capsys.readouterr().err
    assert cli(["jobs", "logs"]) == 2
    assert "needs a job ID" in capsys.readouterr().err
