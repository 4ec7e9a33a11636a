"""Bad schedule files give structured diagnostics (file and line) and the daemon keeps
serving; malformed JSON-RPC gets JSON-RPC errors."""

from __future__ import annotations

import pytest

from partir_daemon import protocol as P
from tests.daemon.support import BP_MP_Z3, raw_connection, read_reply

GOOD = "mlp/bp_mp_z3.partir.py"

# (name, text, kind, line, words in the message)
CASES = [
    ("syntax", BP_MP_Z3.replace('mesh = {"batch": 4, "model": 2}',
                                'mesh = {"batch": 4, "model": 2'),
     "syntax", 6, ["SyntaxError"]),
    ("raises", BP_MP_Z3.replace("import partir\n", "import partir\n\n1 / 0\n"),
     "execution", 5, ["ZeroDivisionError"]),
    ("loops", BP_MP_Z3.replace("import partir\n", "import partir\n\nwhile True:\n"
                               "    pass\n"),
     "timeout", (5, 6), ["did not finish within 2 s"]),
    ("sleeps", BP_MP_Z3.replace("import partir\n", "import partir\nimport time\n\n"
                                "time.sleep(3600)\n"),
     "timeout", 6, ["did not finish"]),
    ("missing", BP_MP_Z3.replace('mesh = {"batch": 4, "model": 2}\n', ""),
     "missing", 1, ["`mesh`"]),
    ("missing-all", "import partir\n", "missing", 1, ["`program`", "`mesh`", "`schedule`"]),
    ("not-a-program", BP_MP_Z3.replace("partir.Program(mlp, *example_args())", "mlp"),
     "type", 5, ["partir.Program"]),
    ("unknown-input", BP_MP_Z3.replace('{"w1": 1}', '{"w7": 1}'),
     "tactic", 9, ["tactic 2 (MP)", "w7"]),
    ("bad-axis", BP_MP_Z3.replace('axis="model", name="MP"', 'axis="modle", name="MP"'),
     "tactic", 9, ["modle"]),
    ("bad-dim", BP_MP_Z3.replace('{"w1": 0, "w2": 1}', '{"w1": 5}'),
     "tactic", 10, ["w1"]),
]


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_bad_schedule_files_give_diagnostics_and_the_daemon_keeps_serving(shared, case):
    name, text, kind, line, words = case
    client = shared.connect()
    path = shared.write(f"{name}.partir.py", text)
    result = client.partition(path)
    assert not result.ok
    (d,) = result.diagnostics
    lines = line if isinstance(line, tuple) else (line,)
    assert (d.kind, d.file) == (kind, path) and d.line in lines, d
    assert d.range is not None and d.range.line == d.line
    for word in words:
        assert word in d.message, d.message
    # Unsaved text is reported the same way, and the good file still partitions.
    assert client.partition(path, text).diagnostics[0].line == d.line
    assert client.partition(GOOD).ok


def test_a_failing_tactic_keeps_the_tactics_before_it(shared):
    client = shared.connect()
    text = BP_MP_Z3.replace('"w2": 1', '"w9": 1')
    path = shared.write("third.partir.py", text)
    result = client.partition(path)
    assert [t.name for t in result.tactics] == ["BP", "MP"]
    (d,) = result.diagnostics
    assert d.tactic == 3 and d.kind == "tactic" and d.exc_type == "UnknownInputError"
    # The range is the unknown key itself.
    line = text.splitlines()[9]
    assert line[d.range.col:d.range.end_col] == '"w9"'


def test_an_exception_in_the_model_module_names_both_places(shared):
    client = shared.connect()
    (shared.workspace / "mlp" / "badmodel.py").write_text(
        "import jax\n\n\ndef helper():\n    raise RuntimeError('model is broken')\n\n\n"
        "helper()\n")
    path = shared.write("badmodel.partir.py", "import badmodel  # noqa\n" + BP_MP_Z3)
    (d,) = client.partition(path).diagnostics
    assert d.kind == "execution" and d.line == 1 and "model is broken" in d.message
    assert d.inner.file.endswith("badmodel.py") and d.inner.line == 5


def test_a_function_that_fails_to_trace(shared):
    client = shared.connect()
    text = BP_MP_Z3.replace("program = partir.Program(mlp, *example_args())",
                            "def f(x, w1, w2):\n    return x @ w2\n\n\n"
                            "program = partir.Program(f, *example_args())")
    path = shared.write("trace.partir.py", text)
    (d,) = client.partition(path).diagnostics
    assert d.kind == "tracing" and d.line == 9 and "TypeError" in d.message
    assert d.inner == P.SourceLocation(path, 6, "f")


@pytest.mark.parametrize("line, code", [
    (b"{not json\n", P.PARSE_ERROR),
    (b"\xff\xfe\n", P.PARSE_ERROR),
    (b"[1, 2]\n", P.INVALID_REQUEST),
    (b'{"jsonrpc": "1.0", "id": 1, "method": "status"}\n', P.INVALID_REQUEST),
    (b'{"jsonrpc": "2.0", "id": 4, "method": "frobnicate"}\n', P.METHOD_NOT_FOUND),
    (b'{"jsonrpc": "2.0", "id": 5, "method": "partition", "params": {"paht": "x"}}\n',
     P.INVALID_PARAMS),
    (b'{"jsonrpc": "2.0", "id": 6, "method": "ir", "params": {"path": "x", '
     b'"level": "llvm"}}\n', P.INVALID_PARAMS),
    (b'{"jsonrpc": "2.0", "id": 7, "method": "job", "params": {"id": "nope"}}\n',
     P.NOT_FOUND),
])
def test_malformed_requests_get_json_rpc_errors(shared, line, code):
    with raw_connection(shared) as sock:
        sock.sendall(line)
        reply = read_reply(sock)
        assert reply["jsonrpc"] == "2.0" and reply["error"]["code"] == code
        # The connection and the daemon keep serving.
        sock.sendall(P.encode(P.request(99, "status", P.StatusParams())))
        assert read_reply(sock)["result"]["pid"] == shared.daemon_pid()


@pytest.mark.slow
def test_an_infinite_loop_in_an_imported_model_module(shared):
    client = shared.connect()
    (shared.workspace / "mlp" / "loopmodel.py").write_text(
        "x = 0\nwhile True:\n    x += 1\n")
    path = shared.write("loopmodel.partir.py", "import loopmodel  # noqa\n" + BP_MP_Z3)
    (d,) = client.partition(path).diagnostics
    assert d.kind == "timeout" and d.line == 1
    assert d.inner.file.endswith("loopmodel.py") and d.inner.line in (2, 3)
    assert "loopmodel.py" in d.message
    assert client.partition(GOOD).ok
