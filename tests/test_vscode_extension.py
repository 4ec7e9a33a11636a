"""The VS Code extension (vscode-extension/): installs from package-lock.json, type-checks,
bundles, passes its unit tests and packages as a .vsix; and its protocol-level test drives
the real language server (`python -m partir_lsp`, this interpreter) over stdio.

Needs Node.js and npm; skipped with a message when npm is not on PATH."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import pytest

from partir_daemon.client import stop_daemon
from tests.daemon.support import processes_mentioning, wait_until

ROOT = Path(__file__).resolve().parent.parent
EXTENSION = ROOT / "vscode-extension"
NPM = shutil.which("npm")

pytestmark = [
    pytest.mark.skipif(
        NPM is None,
        reason="npm is not on PATH: the VS Code extension's build and tests need Node.js 20 "
               "and npm"),
    # Both tests build in vscode-extension/: one xdist worker runs them, one after the other
    # (as `--dist loadfile` does anyway; this keeps it so under `--dist loadgroup`).
    pytest.mark.xdist_group("vscode-extension"),
]


def _npm(*args: str, timeout: float = 300, extra_env: dict[str, str] | None = None
         ) -> subprocess.CompletedProcess[str]:
    assert NPM is not None
    env = {**os.environ, "PARTIR_PYTHON": sys.executable,
           "NO_COLOR": "1", "npm_config_update_notifier": "false", **(extra_env or {})}
    try:
        result = subprocess.run([NPM, *args], cwd=EXTENSION, env=env, capture_output=True,
                                text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"npm {' '.join(args)} did not finish in {timeout} s\n"
                    f"--- stdout\n{e.stdout}\n--- stderr\n{e.stderr}")
    assert result.returncode == 0, (
        f"npm {' '.join(args)} exited with {result.returncode}\n"
        f"--- stdout (tail)\n{result.stdout[-12000:]}\n--- stderr (tail)\n{result.stderr[-6000:]}")
    return result


@pytest.fixture(scope="module")
def installed() -> None:
    """`npm ci`: node_modules exactly as package-lock.json pins them."""
    _npm("ci", "--no-audit", "--no-fund")


@pytest.mark.slow
def test_extension_typechecks_builds_tests_and_packages(installed: None) -> None:
    _npm("run", "typecheck")
    _npm("run", "build")
    bundle = (EXTENSION / "dist" / "extension.js").read_text(encoding="utf-8")
    # Everything but the editor API and Node's own modules is bundled: the .vsix ships no
    # node_modules.
    builtins = set(json.loads(subprocess.run(
        ["node", "-p", "JSON.stringify(require('module').builtinModules)"],
        capture_output=True, text=True, check=True).stdout))
    required = set(re.findall(r"""require\(["']([^"']+)["']\)""", bundle))
    assert "vscode" in required
    assert {m for m in required - {"vscode"} if m.removeprefix("node:") not in builtins} == set()
    _npm("test")
    for old in EXTENSION.glob("*.vsix"):
        old.unlink()
    _npm("run", "package")
    packages = list(EXTENSION.glob("partir-*.vsix"))
    assert len(packages) == 1, f"expected one partir-*.vsix, found {packages}"
    with zipfile.ZipFile(packages[0]) as vsix:
        names = set(vsix.namelist())
    assert {"extension/package.json", "extension/dist/extension.js"} <= names, sorted(names)
    assert not any(n.startswith(("extension/src/", "extension/node_modules/", "extension/out/"))
                   for n in names), sorted(names)


@pytest.mark.slow
def test_protocol_against_the_python_language_server(installed: None,
                                                     tmp_path: Path) -> None:
    if not (ROOT / "lsp" / "partir_lsp" / "__main__.py").is_file():
        pytest.skip("lsp/ (the language server started as `python -m partir_lsp`) is not in this "
                    "checkout: nothing to drive over stdio")
    # The workspace is a copy of the examples, not this checkout: one daemon serves a
    # workspace, and a developer's editor (or another test run) may be serving the
    # checkout right now. The server starts a daemon for it in a runtime directory of the
    # test's own, stopped afterwards, so that none outlives the test or meets the user's.
    workspace = tmp_path / "workspace"
    shutil.copytree(ROOT / "examples", workspace / "examples",
                    ignore=shutil.ignore_patterns("__pycache__", ".partir"))
    runtime = Path(tempfile.mkdtemp(prefix="pdrt"))
    runtime.chmod(0o700)
    try:
        _npm("run", "test:protocol", timeout=600,
             extra_env={"PARTIR_DAEMON_DIR": str(runtime), "PARTIR_WORKSPACE": str(workspace)})
    finally:
        stop_daemon(workspace, runtime_dir=runtime)
        assert wait_until(lambda: not processes_mentioning(str(runtime)), timeout=30), \
            "the language server's daemon outlived the protocol test"
        shutil.rmtree(runtime, ignore_errors=True)
