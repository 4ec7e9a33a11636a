"""The language server in a real editor nobody here wrote: Neovim's built-in LSP client
(`nvim --headless`) starts `python -m partir_lsp` on a workspace, opens a schedule file
with an unknown input name, waits for the diagnostic, asks for a hover on an input key,
stops the server and quits; the Lua client writes what it got as JSON for the asserts.

Written for Debian 12's Neovim 0.7 (no `vim.lsp.start`, which came with 0.8):
`vim.lsp.start_client` and `vim.lsp.buf_attach_client`. Skipped with a message where
`nvim` is not on PATH (`.ci/run` installs it with apt when it can)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.lsp.support import Workspace

NVIM = shutil.which("nvim")

pytestmark = pytest.mark.skipif(
    NVIM is None, reason="nvim is not on PATH: install Neovim (Debian: apt-get install neovim) "
    "to test the server with its LSP client")

SCHEDULE_NAME = "mlp/nvim.partir.py"
# BP is valid; MP names an input the MLP does not have (`xx`), which the server reports on
# the key, with a suggestion.
SCHEDULE = '''\
from model import example_args, mlp

import partir

program = partir.Program(mlp, *example_args())
mesh = {"batch": 4, "model": 2}
schedule = [
    partir.ManualPartition({"x": 0}, axis="batch", name="BP"),
    partir.ManualPartition({"xx": 0}, axis="model", name="MP"),
]
'''

# Overall budget of the Lua client (the daemon's first analysis imports jax and traces
# the model); the subprocess gets a minute more before it is killed.
CLIENT_TIMEOUT_S = 180

# Run by `nvim --headless -u NONE -c "luafile <this>"`: no user configuration or plugins.
# Everything it needs comes from PARTIR_NVIM_* variables; whatever happens, it writes the
# JSON report and quits, so the test never waits on an editor stuck in a prompt.
CLIENT_LUA = r'''
local env = vim.env
local report = { diagnostics = {}, errors = {} }
local deadline = vim.loop.now() + tonumber(env.PARTIR_NVIM_TIMEOUT_MS)

local function remaining()
  return math.max(0, deadline - vim.loop.now())
end

local function run()
  vim.cmd("edit " .. vim.fn.fnameescape(env.PARTIR_NVIM_SCHEDULE))
  local bufnr = vim.api.nvim_get_current_buf()
  local client_id = vim.lsp.start_client({
    name = "partir",
    cmd = { env.PARTIR_NVIM_PYTHON, "-m", "partir_lsp" },
    cmd_cwd = env.PARTIR_NVIM_ROOT,
    root_dir = env.PARTIR_NVIM_ROOT,
    workspace_folders = { { uri = vim.uri_from_fname(env.PARTIR_NVIM_ROOT), name = "ws" } },
    init_options = { collectiveMarkersInModel = false, debounceMs = 50 },
    on_exit = function(code, signal)
      report.server_exit = { code = code, signal = signal }
    end,
  })
  assert(client_id, "vim.lsp.start_client returned nil")
  assert(vim.lsp.buf_attach_client(bufnr, client_id), "vim.lsp.buf_attach_client failed")

  local errors = function()
    return vim.diagnostic.get(bufnr, { severity = vim.diagnostic.severity.ERROR })
  end
  report.diagnostics_arrived = vim.wait(remaining(), function() return #errors() > 0 end, 100)
  for _, d in ipairs(vim.diagnostic.get(bufnr)) do
    table.insert(report.diagnostics, {
      lnum = d.lnum, col = d.col, end_col = d.end_col,
      severity = d.severity, message = d.message,
    })
  end

  local params = {
    textDocument = { uri = vim.uri_from_bufnr(bufnr) },
    position = {
      line = tonumber(env.PARTIR_NVIM_HOVER_LINE),
      character = tonumber(env.PARTIR_NVIM_HOVER_CHAR),
    },
  }
  local responses, err = vim.lsp.buf_request_sync(bufnr, "textDocument/hover", params, remaining())
  if err then
    table.insert(report.errors, "hover: " .. tostring(err))
  end
  local response = (responses or {})[client_id]
  if response and response.err then
    table.insert(report.errors, "hover: " .. vim.inspect(response.err))
  end
  local hover = response and response.result
  report.hover = hover and hover.contents and (hover.contents.value or hover.contents) or vim.NIL

  -- shutdown + exit, as Neovim does at :quit, but waited for, to see the exit status.
  vim.lsp.stop_client(client_id)
  report.server_stopped = vim.wait(math.min(remaining(), 20000), function()
    return report.server_exit ~= nil
  end, 50)
end

local ok, err = xpcall(run, debug.traceback)
if not ok then
  table.insert(report.errors, tostring(err))
end
local file = assert(io.open(env.PARTIR_NVIM_REPORT, "w"))
file:write(vim.fn.json_encode(report))
file:close()
vim.cmd("qa!")
'''


def _position(text: str, needle: str) -> tuple[int, int]:
    """0-based line and column of the middle of the first `needle` (ASCII: the UTF-16
    column Neovim sends is the byte column)."""
    start = text.index(needle)
    line = text.count("\n", 0, start)
    return line, start - (text.rfind("\n", 0, start) + 1) + len(needle) // 2


@pytest.fixture
def workspace() -> Iterator[Workspace]:
    """A private workspace and daemon runtime directory; the daemon the server started is
    stopped and the directories removed afterwards (failing on leftover processes)."""
    ws = Workspace.create()
    yield ws
    ws.teardown()


@pytest.mark.slow
def test_neovim_lsp_client_gets_diagnostic_and_hover(workspace: Workspace,
                                                     tmp_path: Path) -> None:
    assert NVIM is not None
    schedule = workspace.path(SCHEDULE_NAME)
    schedule.write_text(SCHEDULE)
    line, char = _position(SCHEDULE, '"x"')
    script = tmp_path / "client.lua"
    script.write_text(CLIENT_LUA)
    report_path = tmp_path / "report.json"
    # Neovim's LSP log and other state stay in the test's directory, not the user's.
    xdg = tmp_path / "xdg"
    env = {
        **workspace.env(),
        "XDG_CONFIG_HOME": str(xdg / "config"), "XDG_DATA_HOME": str(xdg / "data"),
        "XDG_STATE_HOME": str(xdg / "state"), "XDG_CACHE_HOME": str(xdg / "cache"),
        "PARTIR_NVIM_PYTHON": sys.executable,
        "PARTIR_NVIM_ROOT": str(workspace.root),
        "PARTIR_NVIM_SCHEDULE": str(schedule),
        "PARTIR_NVIM_HOVER_LINE": str(line),
        "PARTIR_NVIM_HOVER_CHAR": str(char),
        "PARTIR_NVIM_TIMEOUT_MS": str(CLIENT_TIMEOUT_S * 1000),
        "PARTIR_NVIM_REPORT": str(report_path),
    }
    try:
        nvim = subprocess.run(
            [NVIM, "--headless", "-n", "-i", "NONE", "-u", "NONE", "-c", f"luafile {script}"],
            env=env, cwd=workspace.root, stdin=subprocess.DEVNULL, capture_output=True,
            text=True, timeout=CLIENT_TIMEOUT_S + 60, check=False)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"nvim did not quit in {CLIENT_TIMEOUT_S + 60} s\n--- stdout\n{e.stdout}\n"
                    f"--- stderr\n{e.stderr}")
    context = f"nvim exited with {nvim.returncode}\n--- stdout\n{nvim.stdout}\n--- stderr\n" \
              f"{nvim.stderr}"
    assert report_path.is_file(), f"the Lua client wrote no report\n{context}"
    report: dict[str, Any] = json.loads(report_path.read_text())
    context = f"report: {json.dumps(report, indent=1)}\n{context}"

    assert report["errors"] == [], context
    assert report["diagnostics_arrived"], f"no error diagnostic within the timeout\n{context}"
    mp_line = SCHEDULE.splitlines().index(
        '    partir.ManualPartition({"xx": 0}, axis="model", name="MP"),')
    errors = [d for d in report["diagnostics"] if d["severity"] == 1]
    assert [(d["lnum"], SCHEDULE.splitlines()[mp_line][d["col"]:d["end_col"]])
            for d in errors] == [(mp_line, '"xx"')], context
    assert "no input, output or tag named 'xx'" in errors[0]["message"], context

    hover = report["hover"]
    assert isinstance(hover, str), f"no hover on the input key \"x\"\n{context}"
    assert "`tensor<256x8xf32>`" in hover, context  # x is 256 x 8
    # BP shards x's dimension 0 over the 4 "batch" devices: 64 x 8 each.
    assert ('| after tactic 1 (BP) | `[{"batch"}, {}]` | `P(\'batch\', None)` | `[64, 8]` | '
            '2.0 KiB |') in hover, context

    # Neovim's shutdown and exit end the server cleanly; the daemon lives on until the
    # fixture stops it.
    assert report["server_stopped"], f"the server did not exit after shutdown\n{context}"
    assert report["server_exit"] == {"code": 0, "signal": 0}, context
