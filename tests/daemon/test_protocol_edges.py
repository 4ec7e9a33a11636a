"""Hostile protocol input (issue 15): each case gets a JSON-RPC answer (or, for a
notification, none) and the connection keeps serving; nothing reads without bound."""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path

import pytest

from partir_daemon import protocol as P
from tests.daemon.support import (
    STUBBORN,
    raw_connection,
    read_reply,
    wait_until,
)


def _still_serving(env, sock: socket.socket) -> None:
    sock.sendall(P.encode(P.request(99, "status", P.StatusParams())))
    reply = read_reply(sock)
    assert reply["id"] == 99 and reply["result"]["pid"] == env.daemon_pid(), reply


def _call(sock: socket.socket, method: str, params: str) -> dict:
    sock.sendall(b'{"jsonrpc": "2.0", "id": 7, "method": "%s", "params": %s}\n'
                 % (method.encode(), params.encode()))
    return read_reply(sock)


@pytest.mark.parametrize("line", [
    b"[" * 100_000 + b"]" * 100_000 + b"\n",
    b"{\"a\":" * 100_000 + b"1" + b"}" * 100_000 + b"\n",
    b'{"jsonrpc": "2.0", "id": 3, "method": "status", "params": {"x": '
    + b"[" * 100_000 + b"]" * 100_000 + b"}}\n",
], ids=["list", "object", "in-params"])
def test_deeply_nested_json_is_a_parse_error(shared, line):
    with raw_connection(shared) as sock:
        sock.sendall(line)
        reply = read_reply(sock)
        assert reply["error"]["code"] == P.PARSE_ERROR, reply
        assert "nested too deeply" in reply["error"]["message"]
        _still_serving(shared, sock)


@pytest.mark.parametrize("params", [
    '[1]', '"1"', '3', 'null', '{}', '{"id": null}', '{"id": 1.5}', '{"id": true}',
    '{"id": [1]}', '{"id": {"a": 1}}', '{"id": 1, "extra": 2}',
])
def test_a_malformed_cancel_request_is_ignored(shared, params):
    with raw_connection(shared) as sock:
        sock.sendall(b'{"jsonrpc": "2.0", "method": "$/cancelRequest", "params": %s}\n'
                     % params.encode())
        sock.sendall(b'{"jsonrpc": "2.0", "method": "$/cancelRequest"}\n')
        # A notification gets no answer: the next reply is the status request's.
        _still_serving(shared, sock)


@pytest.mark.parametrize("method, params, name", [
    ("run", '{"path": "x.py", "timeout_s": NaN}', "RunParams.timeout_s"),
    ("run", '{"path": "x.py", "timeout_s": Infinity}', "RunParams.timeout_s"),
    ("run", '{"path": "x.py", "timeout_s": -Infinity}', "RunParams.timeout_s"),
    ("run", '{"path": "x.py", "timeout_s": -1}', "RunParams.timeout_s"),
    ("run", '{"path": "x.py", "timeout_s": 0}', "RunParams.timeout_s"),
    ("run", '{"path": "x.py", "timeout_s": "10"}', "RunParams.timeout_s"),
    ("run", '{"path": "x.py", "timeout_s": true}', "RunParams.timeout_s"),
    ("run", '{"path": "x.py", "timeout_s": null}', "RunParams.timeout_s"),
    ("run", '{"path": "x.py", "steps": -1}', "RunParams.steps"),
    ("run", '{"path": "x.py", "steps": 1.5}', "RunParams.steps"),
    ("job", '{"id": "x", "log_tail": -5}', "JobParams.log_tail"),
    # Files: no NUL byte; a run's inputs a keyword or an .npz that is there.
    ("partition", '{"path": "mlp/a\\u0000.partir.py"}', "PartitionParams.path"),
    ("ir", '{"path": "\\u0000"}', "IrParams.path"),
    ("explain", '{"path": "mlp/bp_mp_z3.partir.py", "file": "m\\u0000.py"}',
     "ExplainParams.file"),
    ("run", '{"path": "mlp/bp\\u0000.partir.py"}', "RunParams.path"),
    ("run", '{"path": "mlp/bp_mp_z3.partir.py", "inputs": "a\\u0000.npz"}',
     "RunParams.inputs"),
    ("run", '{"path": "mlp/bp_mp_z3.partir.py", "seed": -1}', "RunParams.seed"),
    ("run", '{"path": "mlp/bp_mp_z3.partir.py", "inputs": "--no-check"}',
     "RunParams.inputs"),
    ("run", '{"path": "mlp/bp_mp_z3.partir.py", "inputs": "nowhere.npz"}',
     "RunParams.inputs"),
])
def test_bad_params_are_invalid_params(shared, method, params, name):
    with raw_connection(shared) as sock:
        reply = _call(sock, method, params)
        assert reply["id"] == 7 and reply["error"]["code"] == P.INVALID_PARAMS, reply
        assert name in reply["error"]["message"], reply
        _still_serving(shared, sock)


def test_numbers_within_bounds_are_accepted():
    # The check in parse_params, which every method's params go through.
    params = P.parse_params("run", {"path": "x.py", "timeout_s": 0.5, "steps": 0})
    assert params.timeout_s == 0.5 and params.steps == 0
    assert P.parse_params("job", {"id": "x", "log_tail": 0}).log_tail == 0
    assert P.parse_params("ir", {"path": "x.py", "after": 0, "version": -3}).version == -3


def test_the_default_processes_are_no_more_than_the_usable_cores(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {3})
    one_core = P.DaemonConfig()
    assert (one_core.compiler_processes, one_core.lowering_processes) == (1, 1)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(16)))
    many = P.DaemonConfig()
    assert (many.compiler_processes, many.lowering_processes) == (2, 2)
    assert P.DaemonConfig(lowering_processes=4).lowering_processes == 4  # asked for


def test_file_params_must_be_bounded_regular_files(shared):
    big = shared.workspace / "mlp" / "big.partir.py"
    with open(big, "wb") as f:  # sparse: no disk space used
        f.truncate(P.MAX_SOURCE_FILE_BYTES + 1)
    fifo = shared.workspace / "mlp" / "fifo.partir.py"
    os.mkfifo(fifo)
    with raw_connection(shared) as sock:
        for method in ("partition", "ir", "explain", "run"):
            extra = ', "name": "x"' if method == "explain" else ""
            for path, words in [("/dev/zero", ["not a regular file"]),
                                (str(fifo), ["not a regular file"]),
                                (str(shared.workspace / "mlp"), ["not a regular file"]),
                                (str(big), ["limit of 16777216 bytes", "16 MiB"])]:
                reply = _call(sock, method, f'{{"path": {json.dumps(path)}{extra}}}')
                error = reply["error"]
                assert error["code"] == P.INVALID_PARAMS, (method, path, reply)
                assert f"Params.path: {path}" in error["message"], error
                for word in words:
                    assert word in error["message"], error
        zero = shared.workspace / "mlp" / "zero.npz"
        zero.symlink_to("/dev/zero")
        reply = _call(sock, "run", '{"path": "mlp/bp_mp_z3.partir.py", '
                                   '"inputs": "zero.npz"}')
        assert reply["error"]["code"] == P.INVALID_PARAMS
        assert f"RunParams.inputs: {zero} is not a regular file" in reply["error"]["message"]
        _still_serving(shared, sock)
    # A file that is not there is still the worker's "read" diagnostic.
    (d,) = shared.connect().partition(str(shared.workspace / "nope.partir.py")).diagnostics
    assert d.kind == "read"


@pytest.mark.slow
def test_requests_while_shutting_down_get_an_error(env):
    client = env.connect()
    path = env.write("stubborn.partir.py", STUBBORN)
    job = client.run(path, steps=1)
    assert wait_until(lambda: "SIGTERM-IGNORED" in Path(job.log_path).read_text(), timeout=60)
    pid = env.daemon_pid()
    with raw_connection(env) as before:
        _still_serving(env, before)
        client.shutdown()
        start = time.monotonic()
        # A connection made while the daemon stops, and one made before.
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as during:
            during.settimeout(30)
            during.connect(str(env.paths.socket))
            for sock in (during, before):
                sock.sendall(P.encode(P.request(5, "status", P.StatusParams())))
                reply = read_reply(sock)
                assert reply["id"] == 5 and reply["error"]["code"] == P.SHUTTING_DOWN, reply
                assert "shutting down" in reply["error"]["message"]
            assert time.monotonic() - start < 2, "the window closed: the test proves nothing"
            # Then the daemon closes them, and exits.
            assert during.recv(1) == b""
    assert wait_until(lambda: env.daemon_pid() != pid or not os.path.exists(f"/proc/{pid}"),
                      timeout=30)

