"""The extension in a real VS Code: code-server 4.100.3 (VS Code 1.100.3, the last release
on Node 20) with the built .vsix installed, driven from Debian's headless Chromium with
selenium, on a copy of the examples. It opens the MLP and transformer schedule files and
checks what a user sees: lenses per tactic on a one-line schedule list, the outline right
after opening, a hover on an input key with its sharding picture, a squiggle and its quick
fix, completion of a pytree path, lenses kept (stale) while a line is typed, the IR view
beside the file, and a job run from its lens and cancelled from its notification.

A screenshot of each step is saved under the directory the test prints
(`PARTIR_E2E_ARTIFACTS`, else the test's temporary directory). `.ci/run` installs what it
needs (`scripts/install_code_server.sh`, Chromium and chromedriver with apt); without
them the test skips, saying what is missing."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
from partir_lsp.render import LOWERING

from partir_daemon.client import stop_daemon
from tests.lsp.support import MLP_BP_MP_Z3, TINY_BP_MP_Z3, Workspace
from tests.test_vscode_extension import EXTENSION, ROOT, _npm, installed  # noqa: F401

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("vscode-extension")]

CODE_SERVER_VERSION = "4.100.3"
# Where scripts/install_code_server.sh installs it by default.
CODE_SERVER_HOME = Path(os.environ.get(
    "PARTIR_CODE_SERVER_HOME", Path.home() / ".cache" / "partir-e2e" / "code-server"))
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                  "--no-first-run", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--window-size=1600,1000"]
# The first analysis imports JAX and traces the model in the daemon.
ANALYSIS_S = 180.0
UI_S = 30.0
SETTINGS = {
    "partir.debounceMs": 100,
    "workbench.startupEditor": "none",
    "security.workspace.trust.enabled": False,
    "telemetry.telemetryLevel": "off",
    "extensions.autoUpdate": False,
    "extensions.autoCheckUpdates": False,
    "update.mode": "none",
    "workbench.enableExperiments": False,
    "workbench.tips.enabled": False,
    "git.enabled": False,
    "editor.inlayHints.enabled": "on",
    "editor.hover.delay": 100,
    "editor.autoClosingQuotes": "never",
    "editor.autoClosingBrackets": "never",
    "editor.acceptSuggestionOnEnter": "off",
}

T = TypeVar("T")


def _missing() -> str | None:
    """Why the test cannot run here, or None."""
    if not (CODE_SERVER_HOME / f".installed-{CODE_SERVER_VERSION}").is_file():
        return (f"code-server {CODE_SERVER_VERSION} is not installed in {CODE_SERVER_HOME} "
                f"(scripts/install_code_server.sh installs it; .ci/run runs it)")
    for tool, package in (("node", "nodejs"), ("chromium", "chromium"),
                          ("chromedriver", "chromium-driver")):
        if shutil.which(tool) is None:
            return f"no {tool} on PATH (apt-get install {package}; .ci/run does as root)"
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed (pip install -e '.[dev]')"
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait(what: str, found: Callable[[], T], timeout: float = UI_S) -> T:
    deadline = time.monotonic() + timeout
    while True:
        value = found()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.25)


@pytest.fixture(scope="module")
def tools() -> None:
    """Skips (before `npm ci` and the build) where the test cannot run."""
    missing = _missing()
    if missing is not None:
        pytest.skip(missing)


@pytest.fixture(scope="module")
def vsix(tools: None, installed: None) -> Path:  # noqa: F811
    for old in EXTENSION.glob("*.vsix"):
        old.unlink()
    _npm("run", "package")
    (package,) = EXTENSION.glob("partir-*.vsix")
    return package


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = Path(os.environ.get("PARTIR_E2E_ARTIFACTS") or
                  tmp_path_factory.mktemp("vscode-e2e")) / "screenshots"
    folder.mkdir(parents=True, exist_ok=True)
    print(f"\nscreenshots of the VS Code end-to-end test: {folder}")
    return folder


@contextlib.contextmanager
def code_server(workspace: Workspace, vsix: Path, home: Path) -> Iterator[str]:
    """code-server serving `workspace` with the extension installed: its URL."""
    entry = CODE_SERVER_HOME / "node_modules" / "code-server" / "out" / "node" / "entry.js"
    data, extensions = home / "data", home / "extensions"
    (data / "User").mkdir(parents=True)
    (data / "User" / "settings.json").write_text(json.dumps(
        {**SETTINGS, "partir.pythonPath": sys.executable}))
    config = home / "config.yaml"
    config.write_text("auth: none\ncert: false\n")
    env = {**workspace.env(), "HOME": str(home)}
    common = ["node", str(entry), "--config", str(config), "--user-data-dir", str(data),
              "--extensions-dir", str(extensions)]
    subprocess.run([*common, "--install-extension", str(vsix)], env=env, check=True,
                   capture_output=True, timeout=120)
    port = _free_port()
    log = (home / "code-server.log").open("w")
    process = subprocess.Popen(
        [*common, "--auth", "none", "--bind-addr", f"127.0.0.1:{port}",
         "--disable-telemetry", "--disable-update-check", "--disable-workspace-trust",
         "--disable-getting-started-override", str(workspace.root)],
        env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        def listening() -> bool:
            with socket.socket() as s:
                return s.connect_ex(("127.0.0.1", port)) == 0
        _wait("code-server to listen", listening, 60)
        yield f"http://127.0.0.1:{port}/?folder={workspace.root}"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(10)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        log.close()


class Editor:
    """VS Code in the browser, driven with the keyboard as a user would."""

    def __init__(self, driver: Any, artifacts: Path) -> None:
        from selenium.webdriver.common.action_chains import ActionChains
        from selenium.webdriver.common.by import By
        from selenium.webdriver.common.keys import Keys

        self.driver, self.artifacts = driver, artifacts
        self.By, self.Keys, self.ActionChains = By, Keys, ActionChains
        self.shots: list[str] = []

    def shot(self, name: str) -> None:
        path = self.artifacts / f"{len(self.shots) + 1:02d}-{name}.png"
        self.driver.save_screenshot(str(path))
        self.shots.append(path.name)

    def all(self, css: str) -> list[Any]:
        return self.driver.find_elements(self.By.CSS_SELECTOR, css)

    def texts(self, css: str) -> list[str]:
        # The text content, read in one script: selenium's `text` leaves out what is
        # clipped out of view (the end of a long row of lenses), and an element read one
        # call after it was found may have been replaced meanwhile.
        return self.driver.execute_script(
            "return [...document.querySelectorAll(arguments[0])]"
            ".map(e => e.textContent.replace(/\\u00a0/g, ' '))", css)

    def keys(self, *keys: str, held: tuple[str, ...] = ()) -> None:
        """Type `keys` with the modifiers `held` down."""
        chain = self.ActionChains(self.driver)
        for modifier in held:
            chain = chain.key_down(modifier)
        for k in keys:
            chain = chain.send_keys(k)
        for modifier in reversed(held):
            chain = chain.key_up(modifier)
        chain.perform()
        time.sleep(0.3)

    def ctrl(self, *keys: str) -> None:
        self.keys(*keys, held=(self.Keys.CONTROL,))

    def quick_input(self, prefix_keys: Callable[[], None], text: str) -> list[str]:
        prefix_keys()
        _wait("the quick input", lambda: self.all(".quick-input-widget .input"))
        self.keys(text)
        return _wait(f"quick input rows for {text!r}",
                     lambda: self.texts(".quick-input-list .monaco-list-row"))

    def open(self, relative: str) -> None:
        self.quick_input(lambda: self.ctrl("p"), relative)
        self.keys(self.Keys.ENTER)
        _wait(f"the tab of {relative}", lambda: any(
            os.path.basename(relative) in t for t in self.texts(".tab.active")))

    def go_to(self, line: int, column: int) -> None:
        """Put the cursor at 1-based `line` and `column`."""
        self.quick_input(lambda: self.ctrl("g"), f"{line}:{column}")
        self.keys(self.Keys.ENTER)

    def lenses(self) -> list[str]:
        return [t for t in self.texts(".codelens-decoration a") if t]

    def click_lens(self, title: str) -> None:
        from selenium.common.exceptions import StaleElementReferenceException

        def clicked() -> bool:
            # Lenses are redrawn as analyses land: a link found may be gone when clicked.
            try:
                link = next((a for a in self.all(".codelens-decoration a")
                             if a.get_attribute("textContent") == title), None)
                if link is not None:
                    link.click()
                return link is not None
            except StaleElementReferenceException:
                return False
        _wait(f"the lens {title!r}", clicked)

    def hover_text(self) -> str:
        return " ".join(self.texts(".monaco-hover-content"))


def _position(text: str, marked: str) -> tuple[int, int]:
    """1-based line and column of the "|" in `marked`, found in `text` without it."""
    before, after = marked.split("|")
    start = text.index(before + after) + len(before)
    return text.count("\n", 0, start) + 1, start - (text.rfind("\n", 0, start) + 1) + 1


def test_the_extension_in_code_server(vsix: Path, artifacts: Path,
                                      tmp_path: Path) -> None:
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    workspace = Workspace.create()
    # The shipped transformer schedule: its tactics come from schedules.py, one line.
    shutil.copy(ROOT / "examples" / "transformer" / "bp_mp_z3.partir.py",
                workspace.path("transformer/bp_mp_z3.partir.py"))
    options = Options()
    options.binary_location = shutil.which("chromium") or ""
    for flag in [*CHROMIUM_FLAGS, f"--user-data-dir={tmp_path / 'chromium'}"]:
        options.add_argument(flag)
    driver = None
    try:
        with code_server(workspace, vsix, tmp_path / "code-server") as url:
            driver = webdriver.Chrome(options=options,
                                      service=Service(shutil.which("chromedriver")))
            driver.get(url)
            _wait("the workbench", lambda: driver.find_elements("css selector",
                                                                ".monaco-workbench"), 60)
            editor = Editor(driver, artifacts)
            try:
                _drive(editor)
            except BaseException:
                editor.shot("failure")
                raise
    finally:
        if driver is not None:
            driver.quit()
        with contextlib.suppress(Exception):
            stop_daemon(workspace.root, runtime_dir=workspace.runtime, timeout=20)
        workspace.teardown()


def _drive(ed: Editor) -> None:
    keys = ed.Keys
    # 1. The shipped transformer file, `schedule = [BP, MP, Z3]`: every lens names its
    # tactic, and one runs the job.
    ed.open("transformer/bp_mp_z3.partir.py")
    # (a long lowering shows the tactics lowered so far first, the others "lowering…")
    lenses = _wait("the transformer's lenses", lambda: len(ed.lenses()) >= 7 and not any(
        t.endswith(LOWERING) for t in ed.lenses()) and ed.lenses(), ANALYSIS_S)
    ed.shot("transformer-one-line-lenses")
    for name in ("BP", "MP", "Z3"):
        assert any(t.startswith(f"{name}: +AG ") for t in lenses), lenses
        assert f"Show IR after {name}" in lenses, lenses
    assert lenses.count("Run partitioned job") == 1, lenses
    # Each tactic's hint right after its name, none cut: Z3's conflicts show.
    row = _wait("the hints of the schedule line", lambda: next(
        (t for t in ed.texts(".view-line") if t.startswith("schedule = [BP") and "⚠" in t),
        None))
    # (VS Code pads a hint with a hair space.)
    assert re.fullmatch(r"schedule = \[BP\s[\d.]+ ms, MP\s[\d.]+ ms, Z3\s[\d.]+ ms · ⚠ \d+\]",
                        row), row

    # 2. The outline, asked for once on opening (no edit since).
    ed.open("mlp/bp_mp_z3.partir.py")
    _wait("the MLP's lenses", lambda: "Show IR after Z3" in ed.lenses(), ANALYSIS_S)
    symbols = ed.quick_input(lambda: ed.keys("o", held=(keys.CONTROL, keys.SHIFT)), "")
    ed.shot("mlp-outline")
    assert any("schedule" in s for s in symbols), symbols
    assert any("3. Z3" in s for s in symbols), symbols
    ed.keys(keys.ESCAPE)

    # 3. A hover on an input key: its sharding in both notations and its tiles.
    mlp = MLP_BP_MP_Z3
    ed.go_to(*_position(mlp, 'ManualPartition({"w|1": 0, "w2": 1}'))
    ed.ctrl("k")
    ed.ctrl("i")
    hover = _wait("the hover on w1", ed.hover_text)
    ed.shot("mlp-hover-w1")
    assert "tensor<8x16xf32>" in hover and "P('batch', 'model')" in hover, hover
    assert "🟥" in hover, hover
    ed.keys(keys.ESCAPE)

    # 4. A squiggle on a typo, and its quick fix.
    line, column = _position(mlp, '{"w1": 0, "w2|": 1}')
    ed.go_to(line, column)
    ed.keys("2")
    _wait("the squiggle on w22", lambda: ed.all(".squiggly-error"), ANALYSIS_S)
    ed.shot("mlp-squiggle")
    ed.go_to(line, column)
    ed.ctrl(".")
    fixes = _wait("the quick fixes", lambda: ed.texts(".action-widget .monaco-list-row"))
    ed.shot("mlp-quick-fix")
    assert any("Replace with 'w2'" in f for f in fixes), fixes
    ed.keys(keys.ENTER)
    _wait("the squiggle to clear", lambda: not ed.all(".squiggly-error"), ANALYSIS_S)

    # 5. While a line is being typed (the file does not parse), the lenses stay, stale.
    ed.go_to(line, 1)
    ed.keys("(")
    _wait("stale lenses", lambda: any(t.startswith("(stale) ") for t in ed.lenses()),
          ANALYSIS_S)
    ed.shot("mlp-stale-lenses")
    ed.keys(keys.BACK_SPACE)
    _wait("fresh lenses", lambda: ed.lenses() and not any(
        t.startswith("(stale) ") for t in ed.lenses()), ANALYSIS_S)

    # 6. Completion of a pytree path in the tiny transformer.
    ed.open("transformer/tiny.partir.py")
    _wait("the tiny transformer's lenses", lambda: "Show IR after Z3" in ed.lenses(),
          ANALYSIS_S)
    ed.go_to(*_position(TINY_BP_MP_Z3, '{"batch": 0|}'))
    ed.keys(', "params/layers/0/')
    ed.ctrl(keys.SPACE)
    items = _wait("completions", lambda: ed.texts(".suggest-widget .monaco-list-row"))
    ed.shot("transformer-completion")
    assert any("params/layers/0/w_up" in i for i in items), items
    ed.keys(keys.ESCAPE)
    ed.ctrl("z")

    # 7. Show IR from a lens: one read-only view, beside the file.
    ed.open("mlp/bp_mp_z3.partir.py")
    ed.click_lens("Show IR after Z3")
    _wait("the IR view", lambda: any("after tactic 3" in t for t in ed.texts(".tab")),
          ANALYSIS_S)
    ed.shot("mlp-ir-beside")
    assert len(ed.all(".editor-group-container")) == 2
    ed.ctrl("w")  # the IR view, and with it its group
    _wait("one editor group", lambda: len(ed.all(".editor-group-container")) == 1)

    # 8. A job from its lens, in a notification whose Cancel cancels it.
    ed.click_lens("Run partitioned job")
    cancel = _wait("the job's Cancel button", lambda: next(
        (b for b in ed.all(".notification-toast .monaco-button") if b.text == "Cancel"),
        None), ANALYSIS_S)
    ed.shot("mlp-job-running")
    cancel.click()
    _wait("the job cancelled", lambda: any(
        "cancelled" in t for t in ed.texts(".notification-toast")), ANALYSIS_S)
    ed.shot("mlp-job-cancelled")
    ed.click_lens("Run partitioned job")
    _wait("the job finished", lambda: any(
        "finished" in t for t in ed.texts(".notification-toast")), ANALYSIS_S)
    ed.shot("mlp-job-finished")

