"""A workspace that is a partir checkout (issue 31, item 1): its root holds folders named
like partir's own packages, and a schedule file at that root must not make the compiler
process drop the daemon's modules when it imports the user's modules again."""

from __future__ import annotations

import pytest

from tests.daemon.support import BP_MP_Z3

# At the workspace's root, importing the MLP example's model from its folder.
AT_ROOT = BP_MP_Z3.replace("from model import example_args, mlp",
                           "from mlp.model import example_args, mlp")


@pytest.mark.slow
def test_ir_keeps_working_after_a_schedule_at_the_root_of_a_checkout(env):
    for package in ("partir_daemon", "partir_lsp"):
        (env.workspace / package).mkdir()
        (env.workspace / package / "__init__.py").write_text("")
    path = env.workspace / "root.partir.py"
    path.write_text(AT_ROOT)
    client = env.connect()
    # The first request loads the schedule file; `ir` comes after, as an editor sends them.
    assert client.partition(str(path), metadata=False).ok
    for after in (1, 2):  # the second load finds the first one's modules
        result = client.ir(str(path), level="core", after=after)
        assert not result.diagnostics, result.diagnostics
        assert result.tactic == ("BP", "MP")[after - 1] and result.text
    # The schedule file's own edits are imported again, with `ir` still answering.
    path.write_text(AT_ROOT.replace('name="Z3"', 'name="Z3b"'))
    assert client.ir(str(path), level="spmd").tactic == "Z3b"
