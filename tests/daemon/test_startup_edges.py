"""Start-up and permission edges (issue 15, item 4): private job files whatever the
umask, a workspace that shadows standard modules, socket paths over the AF_UNIX limit,
and something other than the daemon listening on the socket."""

from __future__ import annotations

import os
import stat

import pytest

from tests.daemon.support import make_env

SCHEDULE = "mlp/bp_mp_z3.partir.py"


def _mode(path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


@pytest.mark.parametrize("umask", [0o022, 0o000], ids=["umask022", "umask000"])
def test_job_directories_and_files_are_private_whatever_the_umask(umask):
    old = os.umask(umask)
    env = make_env()
    try:
        client = env.connect()  # the daemon inherits the umask
        done = client.wait_job(client.run(SCHEDULE, steps=2).id, timeout=180)
        assert done.state == "succeeded", done.error
        assert done.metrics is not None  # the results are in the record
        failed = client.run("mlp/missing.partir.py", steps=1)  # a job that never started
        job_dir = env.workspace / ".partir" / "jobs" / done.id
        assert _mode(env.workspace / ".partir" / "jobs") == 0o700
        for d in (job_dir, os.path.dirname(failed.record_path)):
            assert _mode(d) == 0o700, d
        files = sorted(job_dir.iterdir())
        assert {f.name for f in files} >= {"job.json", "log.txt"}
        for f in [*files, failed.record_path]:
            assert _mode(f) == 0o600, f
    finally:
        os.umask(old)
        env.teardown()


SHADOWING = ("random", "logging", "queue")


def test_a_workspace_shadowing_standard_modules_breaks_neither_daemon_nor_compiler():
    import partir
    from examples.mlp.model import example_args, mlp
    from partir.tactics import ManualPartition

    env = make_env()
    try:
        # At the workspace's root (the daemon's and compiler's working directory) and
        # next to the schedule file: importing any of them is a failure.
        for directory in (env.workspace, env.workspace / "mlp"):
            for name in SHADOWING:
                (directory / f"{name}.py").write_text(
                    f"raise RuntimeError('the workspace\\'s {name}.py was imported "
                    f"instead of the standard library\\'s')\n")
        client = env.connect()
        result = client.partition(SCHEDULE)
        assert result.ok, result.diagnostics
        assert [t.name for t in result.tactics] == ["BP", "MP", "Z3"]
        schedule = [ManualPartition({"x": 0}, axis="batch", name="BP"),
                    ManualPartition({"w1": 1}, axis="model", name="MP"),
                    ManualPartition({"w1": 0, "w2": 1}, axis="batch", name="Z3")]
        meta = partir.partition(mlp, {"batch": 4, "model": 2}, schedule, *example_args())
        assert [t.metadata["collectives"] for t in result.tactics] == \
            [t.collectives for t in meta.tactics]
        # The user's own modules still import (the schedule imports `model`), and a job
        # runs too.
        done = client.wait_job(client.run(SCHEDULE, steps=1).id, timeout=180)
        assert done.state == "succeeded", done.error
        log = env.paths.log.read_text()
        assert "instead of the standard library" not in log
    finally:
        env.teardown()
