"""Helpers of the language server tests: a workspace with copies of the examples and a
private daemon runtime directory, the real server (`python -m partir_lsp`) started over stdio
with pytest-lsp's client, and waits on what it publishes."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lsprotocol import types as T
from partir_lsp.render import LOWERING
from pygls.protocol import default_converter
from pytest_lsp import LanguageClient
from pytest_lsp.client import DEFAULT_CLIENT_FEATURES, register_lsp_features

from partir_daemon.client import stop_daemon
from tests.daemon.support import BP_MP_Z3, remove_workspace

ROOT = Path(__file__).resolve().parents[2]

# The MLP under BP, MP and Z3, as the daemon tests write it.
MLP_BP_MP_Z3 = BP_MP_Z3

# The tiny transformer with abstract inputs (no jitted warm-up step at load) and the
# paper's tactics written out, so that their input keys have source ranges.
TINY_BP_MP_Z3 = '''\
import model
from schedules import megatron

import partir
from partir import FIRST_DIVISIBLE_DIM

program = partir.Program(model.train_step, *model.abstract_inputs(model.TINY))
mesh = {"batch": 4, "model": 2}
schedule = [
    partir.ManualPartition({"batch": 0}, axis="batch", name="BP"),
    partir.ManualPartition({"params": megatron, "opt_state": megatron}, axis="model",
                           name="MP"),
    partir.ManualPartition({"params": FIRST_DIVISIBLE_DIM, "opt_state": FIRST_DIVISIBLE_DIM},
                           axis="batch", name="Z3"),
]
'''
# The scan-over-layers variant under BP+MP: the blocks' sums are inside the scan's body.
TINY_SCAN_BP_MP = '''\
import model
from schedules import BP, MESH, MP

import partir

program = partir.Program(model.train_step_scanned, *model.make_scanned_inputs(model.TINY))
mesh = MESH
schedule = [BP, MP]
'''

# A model whose host callback has no tile-mapping rule: propagation of BP stops there.
BLOCKED_MODEL = '''\
import jax
import numpy as np


def spectrum(x, w):
    y = x @ w
    return jax.pure_callback(np.tanh, jax.ShapeDtypeStruct(y.shape, y.dtype), y)


def example_args():
    return np.ones((16, 8), np.float32), np.ones((8, 4), np.float32)
'''

BLOCKED_SCHEDULE = '''\
from blocked import example_args, spectrum

import partir

program = partir.Program(spectrum, *example_args())
mesh = {"batch": 4}
schedule = [
    partir.ManualPartition({"x": 0}, axis="batch", name="BP"),
]
'''


@dataclass
class Workspace:
    root: Path
    runtime: Path

    @classmethod
    def create(cls) -> Workspace:
        # Short paths: a Unix socket path has at most 107 bytes.
        root = Path(tempfile.mkdtemp(prefix="plws"))
        runtime = Path(tempfile.mkdtemp(prefix="plrt"))
        runtime.chmod(0o700)
        shutil.copytree(ROOT / "examples" / "mlp", root / "mlp",
                        ignore=shutil.ignore_patterns("__pycache__"))
        (root / "mlp" / "bp_mp_z3.partir.py").write_text(MLP_BP_MP_Z3)
        (root / "mlp" / "blocked.py").write_text(BLOCKED_MODEL)
        (root / "mlp" / "blocked.partir.py").write_text(BLOCKED_SCHEDULE)
        (root / "transformer").mkdir()
        for name in ("model.py", "schedules.py"):
            shutil.copy(ROOT / "examples" / "transformer" / name, root / "transformer" / name)
        (root / "transformer" / "tiny.partir.py").write_text(TINY_BP_MP_Z3)
        (root / "transformer" / "scan.partir.py").write_text(TINY_SCAN_BP_MP)
        return cls(root, runtime)

    def path(self, name: str) -> Path:
        return self.root / name

    def uri(self, name: str) -> str:
        return self.path(name).as_uri()

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env["PARTIR_DAEMON_DIR"] = str(self.runtime)
        env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [
            env.get("PYTHONPATH")])])
        env.setdefault("JAX_PLATFORMS", "cpu")
        return env

    def teardown(self) -> None:
        with contextlib.suppress(Exception):
            stop_daemon(self.root, runtime_dir=self.runtime, timeout=20)
        remove_workspace(self.root, self.runtime)


@dataclass
class Published:
    uri: str
    version: int | None
    diagnostics: list[T.Diagnostic]


@dataclass
class Session:
    """A client connected to a real server, recording what the server publishes."""

    client: LanguageClient
    workspace: Workspace
    published: list[Published] = field(default_factory=list)
    lens_refreshes: int = 0
    versions: dict[str, int] = field(default_factory=dict)
    # Index in `published` where the current session of each document began: what was
    # published before its last didOpen belongs to an earlier one.
    opened_at: dict[str, int] = field(default_factory=dict)
    _changed: asyncio.Event = field(default_factory=asyncio.Event)

    def notify_changed(self) -> None:
        self._changed.set()

    async def wait_until(self, what: str, predicate: Callable[[], Any],
                         timeout: float = 90.0) -> Any:
        deadline = time.monotonic() + timeout
        while True:
            value = predicate()
            if value:
                return value
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise AssertionError(f"timed out after {timeout} s waiting for {what}; "
                                     f"last published: {self.describe()}")
            self._changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), min(remaining, 0.5))

    def describe(self) -> str:
        def brief(p: Published) -> str:
            diags = [(d.range.start.line, d.severity, d.message[:80]) for d in p.diagnostics]
            return f"  {p.uri.rsplit('/', 1)[-1]} v{p.version}: {diags}"

        return "\n".join(brief(p) for p in self.published[-5:])

    def latest(self, uri: str) -> Published | None:
        since = self.opened_at.get(uri, 0)
        return next((p for p in reversed(self.published[since:]) if p.uri == uri), None)

    async def diagnostics_for(self, uri: str, version: int | None = None,
                              timeout: float = 90.0) -> list[T.Diagnostic]:
        """The diagnostics published for `version` of `uri` (default: the version last
        sent)."""
        version = self.versions.get(uri) if version is None else version

        def found() -> Published | None:
            p = self.latest(uri)
            return p if p is not None and p.version == version else None

        return (await self.wait_until(f"diagnostics of {uri} v{version}", found,
                                      timeout)).diagnostics

    def open(self, name: str, text: str | None = None) -> str:
        uri = self.workspace.uri(name)
        text = self.workspace.path(name).read_text() if text is None else text
        self.versions[uri] = 1
        self.opened_at[uri] = len(self.published)
        self.client.text_document_did_open(T.DidOpenTextDocumentParams(
            T.TextDocumentItem(uri, "python", 1, text)))
        return uri

    def change(self, uri: str, text: str) -> int:
        version = self.versions[uri] = self.versions[uri] + 1
        self.client.text_document_did_change(T.DidChangeTextDocumentParams(
            T.VersionedTextDocumentIdentifier(version, uri),
            [T.TextDocumentContentChangeWholeDocument(text)]))
        return version

    def close(self, uri: str) -> None:
        self.versions.pop(uri, None)
        self.client.text_document_did_close(T.DidCloseTextDocumentParams(
            T.TextDocumentIdentifier(uri)))

    async def lenses(self, uri: str) -> list[T.CodeLens]:
        return await self.client.text_document_code_lens_async(T.CodeLensParams(
            T.TextDocumentIdentifier(uri))) or []

    async def lowered_lenses(self, uri: str, refreshes: int,
                             timeout: float = 90.0) -> list[T.CodeLens]:
        """The lenses of `uri` after the lens refreshes that follow the first `refreshes`,
        once none is of a tactic not lowered yet: a long lowering refreshes them with the
        tactics lowered so far first."""
        deadline = time.monotonic() + timeout
        while True:
            await self.wait_until("a code lens refresh",
                                  lambda seen=refreshes: self.lens_refreshes > seen,
                                  max(0.0, deadline - time.monotonic()))
            refreshes = self.lens_refreshes
            lenses = await self.lenses(uri)
            if not any(lens.command.title.endswith(LOWERING) for lens in lenses):
                return lenses

    async def hover(self, uri: str, line: int, character: int) -> str | None:
        result = await self.client.text_document_hover_async(T.HoverParams(
            T.TextDocumentIdentifier(uri), T.Position(line, character)))
        return result.contents.value if result is not None else None


CAPABILITIES = T.ClientCapabilities(
    text_document=T.TextDocumentClientCapabilities(
        synchronization=T.TextDocumentSyncClientCapabilities(did_save=True),
        publish_diagnostics=T.PublishDiagnosticsClientCapabilities(
            related_information=True, version_support=True),
        hover=T.HoverClientCapabilities(content_format=[T.MarkupKind.Markdown]),
        code_lens=T.CodeLensClientCapabilities(),
        inlay_hint=T.InlayHintClientCapabilities()),
    workspace=T.WorkspaceClientCapabilities(
        configuration=True,
        code_lens=T.CodeLensWorkspaceClientCapabilities(refresh_support=True),
        inlay_hint=T.InlayHintWorkspaceClientCapabilities(refresh_support=True)),
    window=T.WindowClientCapabilities(work_done_progress=True))


async def start_session(workspace: Workspace, options: dict[str, Any] | None = None,
                        env: dict[str, str] | None = None) -> Session:
    client = LanguageClient(converter_factory=default_converter)
    features = dict(DEFAULT_CLIENT_FEATURES)
    session_box: list[Session] = []

    def publish(client: LanguageClient, params: T.PublishDiagnosticsParams) -> None:
        client.diagnostics[params.uri] = params.diagnostics
        session_box[0].published.append(Published(params.uri, params.version,
                                                  list(params.diagnostics)))
        session_box[0].notify_changed()

    def lens_refresh(client: LanguageClient, params: None) -> None:
        session_box[0].lens_refreshes += 1
        session_box[0].notify_changed()

    def hint_refresh(client: LanguageClient, params: None) -> None:
        session_box[0].notify_changed()

    features[T.TEXT_DOCUMENT_PUBLISH_DIAGNOSTICS] = publish
    features[T.WORKSPACE_CODE_LENS_REFRESH] = lens_refresh
    features[T.WORKSPACE_INLAY_HINT_REFRESH] = hint_refresh
    register_lsp_features(client, features)
    session = Session(client, workspace)
    session_box.append(session)
    client.set_configuration({"collectiveMarkersInModel": False, "debounceMs": 50},
                             section="partir")
    await client.start_io(sys.executable, "-m", "partir_lsp", env=env or workspace.env(),
                          cwd=str(workspace.root))
    await client.initialize_session(T.InitializeParams(
        capabilities=CAPABILITIES, root_uri=workspace.root.as_uri(),
        workspace_folders=[T.WorkspaceFolder(workspace.root.as_uri(), "ws")],
        initialization_options=options or {"collectiveMarkersInModel": False,
                                           "debounceMs": 50}))
    return session


async def stop_session(session: Session) -> None:
    server = session.client._server  # the server process, to check its exit status
    await session.client.shutdown_session()
    await session.client.stop()
    if server is not None:
        assert server.returncode == 0, f"the server exited with {server.returncode}"


def apply_edit(text: str, edit: T.TextEdit) -> str:
    """`text` with a single-line edit applied, as an editor would."""
    lines = text.splitlines(keepends=True)
    r = edit.range
    assert r.start.line == r.end.line
    line = lines[r.start.line]
    lines[r.start.line] = line[:r.start.character] + edit.new_text + line[r.end.character:]
    return "".join(lines)
