"""The PartIR language server (pygls): a thin protocol layer over the compiler daemon.

Schedule files (`*.partir.py`) are sent to the daemon, with their unsaved text and
version, a debounce after each open, change or save. The server keeps, per document, the
last result (a snapshot: version, text, result), drops results for stale versions and
cancels requests a newer version supersedes (the daemon also cancels them), so the event
loop never waits on compiler work: every daemon call is awaited on a future the client's
reader thread resolves. Results become diagnostics, code lenses, inlay hints and hovers
(`partir_lsp.render`); lenses, hints and hovers on input keys and tactics are answered
from the last snapshot at once (mapped onto the lines that did not change since), never
waiting for an analysis, except on a document that has no snapshot yet: those wait for
the analysis in flight (its first partial result, which has no collectives, is only
published as diagnostics; one sent during the lowering, with the counts of the tactics
lowered so far, is a snapshot), until it ends one way or another. `partir/ir`, the
`partir.showIr` and `partir.runJob` commands and model-line hovers are forwarded to the
daemon. See vscode-extension/PROTOCOL.md for what the extension expects.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

from lsprotocol import types as lsp
from pygls.exceptions import JsonRpcContentModified, JsonRpcException, JsonRpcInvalidParams
from pygls.lsp.server import LanguageServer
from pygls.protocol import LanguageServerProtocol

from partir_daemon import protocol as P
from partir_daemon.client import DaemonError, RequestCancelled, RequestError
from partir_lsp import actions, completion, navigation, render, symbols
from partir_lsp.daemon import DaemonLink, DaemonUnavailable
from partir_lsp.positions import LineMap, Lines, contains, to_range
from partir_lsp.settings import Settings

log = logging.getLogger("partir_lsp")

IR_REQUEST = "partir/ir"
REQUEST_FAILED = -32803
SCHEDULE_SUFFIX = ".partir.py"
# Where `partir.showIr` writes the IR it shows, under the workspace.
IR_DIR = Path(".partir", "ir")
JOB_POLL_S = 0.25


class RequestFailed(JsonRpcException):
    CODE = REQUEST_FAILED


def path_of(uri: str) -> str | None:
    parsed = urlparse(uri)
    if parsed.scheme != "file":
        return None
    return os.path.normpath(unquote(parsed.path))


def is_schedule(path: str | None) -> bool:
    return path is not None and path.endswith(SCHEDULE_SUFFIX)


def dependencies(result: P.PartitionResult) -> set[str]:
    """The real paths of the user's modules a partition result depends on: those the
    schedule file imported (listed also when it failed to load), else those its program's
    trace covers (a daemon that does not list the former)."""
    files = result.dependencies or (result.trace.dependencies if result.trace else [])
    return {os.path.realpath(f) for f in files}


@dataclass
class Snapshot:
    """A partition result with the version and text it was computed for."""

    version: int
    text: str
    lines: Lines
    result: P.PartitionResult
    at: float
    # Its tactics written in other modules (`from schedules import Z3`).
    sites: list[navigation.Site] = field(default_factory=list)


@dataclass
class Document:
    uri: str
    path: str
    version: int
    text: str
    task: asyncio.Task | None = None
    snapshot: Snapshot | None = None
    # The last snapshot whose program was traced (it has values): what completion, go to
    # definition and quick fixes use while the text being typed does not load.
    traced: Snapshot | None = None
    # The last snapshot with tactics: lenses and hints show it, marked stale, while the
    # text does not load (a transient syntax error), rather than vanish.
    tactics: Snapshot | None = None
    markers: dict[str, list[lsp.Diagnostic]] = field(default_factory=dict)  # model uri ->
    # The diagnostics of its tactics written in other modules, by their uri.
    written: dict[str, list[lsp.Diagnostic]] = field(default_factory=dict)
    # Snapshots' lines matched to the current text's, by (the snapshot's version, the
    # document's version it was computed for): only the current version's are kept.
    _moved: dict[tuple[int, int], LineMap] = field(default_factory=dict)

    def placed(self, snap: Snapshot) -> LineMap:
        """Where the lines of `snap` (one of this document's) are in the current text."""
        key = (snap.version, self.version)
        if key not in self._moved:
            self._moved = {k: m for k, m in self._moved.items() if k[1] == self.version}
            self._moved[key] = LineMap(snap.lines, snap.lines if snap.version == self.version
                                       else Lines.of(self.text))
        return self._moved[key]

    def latest(self) -> tuple[Snapshot, LineMap] | None:
        """The last analysis, and where its lines are in the current text."""
        snap = self.snapshot
        return None if snap is None else (snap, self.placed(snap))

    def shown(self) -> tuple[Snapshot, LineMap, bool] | None:
        """What lenses and hints show: the last analysis, or the last with tactics when
        it failed to load (then stale), and where its lines are now."""
        snap = self.snapshot
        if snap is not None and not snap.result.tactics and not snap.result.ok and \
                self.tactics is not None:
            return self.tactics, self.placed(self.tactics), True
        return None if snap is None else (snap, self.placed(snap), False)


class PartirProtocol(LanguageServerProtocol):
    def _handle_cancel_notification(self, msg_id: Any) -> None:
        # A running `partir.runJob` is cancelled by cancelling its job, and still answers
        # (with status "cancelled"); other requests are cancelled by pygls.
        hook = self._server.cancel_hooks.pop(msg_id, None)  # type: ignore[attr-defined]
        if hook is not None:
            hook()
            return
        super()._handle_cancel_notification(msg_id)


class PartirServer(LanguageServer):
    def __init__(self) -> None:
        from partir_lsp import __version__

        super().__init__("partir-lsp", __version__, protocol_cls=PartirProtocol,
                         text_document_sync_kind=lsp.TextDocumentSyncKind.Incremental)
        self.settings = Settings()
        self.documents: dict[str, Document] = {}
        self.daemon: DaemonLink | None = None
        self.workspace_root = os.getcwd()
        self.cancel_hooks: dict[Any, Any] = {}
        self._daemon_error_shown: str | None = None
        self._model_published: set[str] = set()

    # -- set-up --------------------------------------------------------------------------
    def link(self) -> DaemonLink:
        if self.daemon is None:
            loop = asyncio.get_running_loop()

            def on_notification(method: str, params: Any) -> None:
                if method == P.INVALIDATED and isinstance(params, dict):
                    loop.call_soon_threadsafe(self.invalidated, params.get("paths") or [])

            self.daemon = DaemonLink(self.workspace_root, on_notification=on_notification)
        return self.daemon

    def capability(self, *path: str) -> Any:
        node: Any = self.client_capabilities
        for name in path:
            node = getattr(node, name, None) if node is not None else None
        return node

    def daemon_failed(self, message: str) -> None:
        log.error("%s", message)
        if self._daemon_error_shown != message:
            self._daemon_error_shown = message
            self.window_show_message(lsp.ShowMessageParams(lsp.MessageType.Error,
                                                           f"PartIR: {message}"))

    # -- documents -----------------------------------------------------------------------
    def opened(self, uri: str, version: int, text: str) -> None:
        path = path_of(uri)
        if not is_schedule(path):
            return
        doc = self.documents.get(uri)
        if doc is None:
            doc = self.documents[uri] = Document(uri, path, version, text)
        doc.version, doc.text = version, text
        self.schedule(doc)

    def schedule(self, doc: Document, delay: float | None = None) -> None:
        """(Re)start the analysis of the document's current version after the debounce,
        cancelling the one in progress (and its daemon request)."""
        if doc.task is not None and not doc.task.done():
            doc.task.cancel()
        delay = self.settings.debounce_s if delay is None else delay
        doc.task = asyncio.get_running_loop().create_task(
            self.analyze(doc, doc.version, doc.text, delay))

    def closed(self, uri: str) -> None:
        doc = self.documents.pop(uri, None)
        if doc is None:
            return
        if doc.task is not None:
            doc.task.cancel()
        self.text_document_publish_diagnostics(lsp.PublishDiagnosticsParams(uri, []))
        doc.markers.clear()
        doc.written.clear()
        self.publish_markers()

    def invalidated(self, paths: list[str]) -> None:
        """Model files changed on disk: analyse again, at once, the schedule files that
        use them (also those that failed to load: a fixed model fixes them)."""
        changed = {os.path.realpath(p) for p in paths}
        for doc in list(self.documents.values()):
            if doc.snapshot is not None and dependencies(doc.snapshot.result) & changed:
                self.schedule(doc, 0.0)

    async def analyze(self, doc: Document, version: int, text: str, delay: float) -> None:
        """One request, answered twice or more: first with the tactics alone applied (a
        partial result: errors and conflicts, published as diagnostics at once), then with
        their lowering and cost (collective counts for lenses, hints and hovers). Tactics
        lowered before come with their counts in the first answer, which is then the only
        one if none is left to lower. A long lowering sends partial results with the
        tactics lowered so far (in order) meanwhile: one with any counts is taken as the
        document's snapshot at once, so that lenses show the first tactics' counts (and
        the others' "lowering…") before the last is lowered."""
        lines = Lines.of(text)
        published: list[lsp.Diagnostic] | None = None
        sites: list[navigation.Site] = []  # read after the debounce, off every keystroke

        def publish(result: P.PartitionResult) -> None:
            nonlocal published
            if not self.is_current(doc, version):
                return  # the document changed (or closed) meanwhile: drop the result
            self._daemon_error_shown = None
            diagnostics = render.schedule_diagnostics(result, lines, sites)
            if diagnostics != published:
                self.text_document_publish_diagnostics(lsp.PublishDiagnosticsParams(
                    doc.uri, diagnostics, version))
                published = diagnostics
            written = {render.uri_of(path): found for path, found
                       in render.written_diagnostics(result, sites).items()}
            if written != doc.written:
                doc.written = written
                self.publish_markers()
            self.log_timings(doc, version, result)

        def partial(result: P.PartitionResult) -> None:
            publish(result)
            if self.is_current(doc, version) and \
                    any(P.is_lowered(t.metadata) for t in result.tactics):
                self.take(doc, Snapshot(version, text, lines, result, time.monotonic(),
                                        sites))

        try:
            if delay > 0:
                await asyncio.sleep(delay)
            sites = navigation.written_elsewhere(doc.path, text, self.workspace_root)
            result: P.PartitionResult = await self.link().call(
                "partition", P.PartitionParams(doc.path, text, version, partial=True),
                on_partial=partial)
        except asyncio.CancelledError:
            raise
        except DaemonUnavailable as e:
            self.daemon_failed(str(e))
            return
        except RequestCancelled:
            # Superseded by a newer version (that one's task publishes), or cancelled in
            # the daemon for another reason: keep the previous results.
            return
        except DaemonError as e:
            log.error("partition of %s failed: %s", doc.path, e)
            self.window_log_message(lsp.LogMessageParams(
                lsp.MessageType.Error, f"PartIR: analysing {doc.path} failed: {e}"))
            return
        if not self.is_current(doc, version):
            return
        publish(result)
        self.take(doc, Snapshot(version, text, lines, result, time.monotonic(), sites))
        if self.settings.collective_markers_in_model:
            self.update_markers(doc, doc.snapshot)
        elif doc.markers:
            doc.markers.clear()
            self.publish_markers()

    def take(self, doc: Document, snap: Snapshot) -> None:
        """`snap` is the document's last analysis now: what requests answer from."""
        doc.snapshot = snap
        if snap.result.values:
            doc.traced = snap
        if snap.result.tactics:
            doc.tactics = snap
        self.refresh()

    def is_current(self, doc: Document, version: int) -> bool:
        return self.documents.get(doc.uri) is doc and doc.version == version

    def log_timings(self, doc: Document, version: int, result: P.PartitionResult) -> None:
        t = result.timings
        self.window_log_message(lsp.LogMessageParams(lsp.MessageType.Log, (
            f"PartIR: {os.path.basename(doc.path)} v{version}: {t.total_s:.3f} s in the "
            f"daemon (load {t.load_s:.3f}, trace {t.trace_s:.3f}, tactics {t.tactics_s:.3f}, "
            f"collectives {t.metadata_s:.3f}); reused {result.reused or '-'}, applied "
            f"{result.reapplied or '-'}")))

    def refresh(self) -> None:
        if self.capability("workspace", "code_lens", "refresh_support"):
            self.workspace_code_lens_refresh(None)
        if self.capability("workspace", "inlay_hint", "refresh_support"):
            self.workspace_inlay_hint_refresh(None)

    async def first_analysis(self, uri: str) -> None:
        """Returns once the document has a snapshot, or at once if it has one. Else waits
        for the analysis in flight (its debounce included), whose partial result gave the
        diagnostics but no snapshot: a request arriving after that answer (which has no
        collective counts to show) waits for the complete one, not answering null. The
        wait ends however that analysis ends: with its result, a failure, a newer version
        superseding it (whose own analysis is not waited for), or the document closing;
        the request then answers from what there is. (A request arriving after a partial
        result with counts answers from it at once: it is the snapshot.)"""
        doc = self.documents.get(uri)
        if doc is None or doc.snapshot is not None or doc.task is None or doc.task.done():
            return
        # asyncio.wait neither raises the task's outcome nor cancels it with the request.
        await asyncio.wait([doc.task])

    def latest(self, uri: str) -> tuple[Document, Snapshot, LineMap] | None:
        """The document's last analysis, whatever version it was for (requests wait only
        for a document's first one, see `first_analysis`), and where its lines are now;
        None for documents that are not schedule files or have none yet."""
        doc = self.documents.get(uri)
        found = doc.latest() if doc is not None else None
        return None if found is None else (doc, *found)

    # -- collective markers in model files -----------------------------------------------
    def update_markers(self, doc: Document, snap: Snapshot) -> None:
        markers = render.collective_markers(snap.result.collectives, doc.path)
        doc.markers = {render.uri_of(file): diags for file, diags in markers.items()
                       if not is_schedule(file) and os.path.isfile(file)}
        self.publish_markers()

    def publish_markers(self) -> None:
        """The diagnostics of files other than schedule files: collective markers (when
        set) and those of tactics written there, each once however many open schedule
        files have it."""
        merged: dict[str, list[lsp.Diagnostic]] = {}
        for doc in self.documents.values():
            sources = [doc.written, doc.markers] if self.settings.collective_markers_in_model \
                else [doc.written]
            for source in sources:
                for uri, diags in source.items():
                    there = merged.setdefault(uri, [])
                    there += [d for d in diags if d not in there]
        for uri in self._model_published - set(merged):
            self.text_document_publish_diagnostics(lsp.PublishDiagnosticsParams(uri, []))
        for uri, diags in merged.items():
            self.text_document_publish_diagnostics(lsp.PublishDiagnosticsParams(uri, diags))
        self._model_published = set(merged)

    def settings_changed(self, data: Any) -> None:
        markers_before = self.settings.collective_markers_in_model
        self.settings.update(data)
        if self.settings.collective_markers_in_model != markers_before:
            if self.settings.collective_markers_in_model:
                for doc in self.documents.values():
                    if doc.snapshot is not None and doc.snapshot.version == doc.version:
                        self.update_markers(doc, doc.snapshot)
            else:
                for doc in self.documents.values():
                    doc.markers.clear()
                self.publish_markers()

    # -- requests ------------------------------------------------------------------------
    def code_lenses(self, uri: str) -> list[lsp.CodeLens]:
        doc = self.documents.get(uri)
        found = doc.shown() if doc is not None else None
        if found is None:
            return []
        snap, moved, stale = found
        lenses = render.code_lenses(uri, snap.result, snap.lines, stale)
        return [lens for lens in map(moved.lens, lenses) if lens is not None]

    def inlay_hints(self, uri: str, visible: lsp.Range) -> list[lsp.InlayHint]:
        doc = self.documents.get(uri)
        found = doc.shown() if doc is not None else None
        if found is None:
            return []
        snap, moved, stale = found
        hints = map(moved.hint, render.inlay_hints(snap.result, snap.lines, stale))
        return [h for h in hints
                if h is not None and visible.start.line <= h.position.line <= visible.end.line]

    async def outline(self, uri: str) -> list[lsp.DocumentSymbol]:
        """From the last analysis that traced the program, once there is one: it waits
        for the first like lenses, as VS Code asks for the outline (and breadcrumbs) once
        on opening a file and not again until an edit."""
        await self.first_analysis(uri)
        doc = self.documents.get(uri)
        snap = doc.traced if doc is not None else None
        return symbols.outline(snap.result, snap.lines, doc.placed(snap)) \
            if snap is not None else []

    async def hover(self, uri: str, position: lsp.Position) -> lsp.Hover | None:
        path = path_of(uri)
        if path is None:
            return None
        if not is_schedule(path):
            return self.written_hover(path, position) or \
                await self.model_hover(path, position)
        await self.first_analysis(uri)
        found = self.latest(uri)
        if found is None:
            return None
        _, snap, moved = found
        analysed = moved.to_old(position.line)
        if analysed is None:
            return None  # the line changed since the last analysis
        line = analysed + 1
        col = snap.lines.char_col(analysed, position.character)
        for t in snap.result.tactics:
            for key, r in t.inputs.items():
                if contains(r, line, col):
                    text = render.input_hover(render.key_values(snap.result, key), key,
                                              t.index, t.name, snap.result.mesh)
                    return self.markdown(text, moved.span(to_range(r, snap.lines)))
        for t in snap.result.tactics:
            if t.range is not None and contains(t.range, line, col):
                return self.markdown(render.tactic_hover(snap.result, t.index),
                                     moved.span(to_range(t.range, snap.lines)))
        return None

    def writer(self, path: str) -> tuple[Snapshot, list[navigation.Site]] | None:
        """The most recent analysis of an open schedule file with tactics written in the
        module `path`, and those tactics."""
        real = os.path.realpath(path)
        best: tuple[Snapshot, list[navigation.Site]] | None = None
        for doc in self.documents.values():
            snap = doc.traced
            mine = [s for s in snap.sites if os.path.realpath(s.path) == real] if snap else []
            if mine and (best is None or snap.at > best[0].at):
                best = (snap, mine)
        return best

    def written_hover(self, path: str, position: lsp.Position) -> lsp.Hover | None:
        """An input key or the call of a tactic written in this module, explained by the
        schedule file that uses it (the module's text as on disk when analysed)."""
        found = self.writer(path)
        if found is None:
            return None
        snap, sites = found
        result = snap.result
        for site in sites:
            line = position.line + 1
            col = site.lines.char_col(position.line, position.character)
            if not contains(site.call, line, col):
                continue
            name = result.tactics[site.index - 1].name \
                if site.index <= len(result.tactics) else "?"
            for key, r in site.keys.items():
                if contains(r, line, col):
                    text = render.input_hover(render.key_values(result, key), key,
                                              site.index, name, result.mesh)
                    return self.markdown(text, to_range(r, site.lines))
            if site.index <= len(result.tactics):
                return self.markdown(render.tactic_hover(result, site.index),
                                     to_range(site.call, site.lines))
        return None

    async def model_hover(self, path: str, position: lsp.Position) -> lsp.Hover | None:
        """A line of model code: explained by the most recently analysed open schedule
        file whose program depends on it."""
        real = os.path.realpath(path)
        best: Snapshot | None = None
        best_doc: Document | None = None
        for doc in self.documents.values():
            snap = doc.snapshot
            if snap is None or not snap.result.tactics:
                continue
            if real in dependencies(snap.result) and (best is None or snap.at > best.at):
                best, best_doc = snap, doc
        if best is None or best_doc is None:
            return None
        explained: P.ExplainResult = await self.link().call(
            "explain", P.ExplainParams(best_doc.path, best.text, best.version, file=path,
                                       line=position.line + 1))
        text = render.model_line_hover(explained, best_doc.path, position.line + 1)
        return self.markdown(text) if text else None

    @staticmethod
    def markdown(text: str, r: lsp.Range | None = None) -> lsp.Hover:
        return lsp.Hover(lsp.MarkupContent(lsp.MarkupKind.Markdown, text), r)

    async def ir(self, params: Any) -> dict[str, str]:
        uri, path, tactic, level = ir_args(params, IR_REQUEST, default_level=None)
        return {"text": await self.ir_text(uri, path, tactic, level, IR_REQUEST)}

    async def show_ir(self, args: Any) -> dict[str, str]:
        """`partir.showIr`: the IR after a tactic, written to a file of the workspace
        that the client is asked to open (when it can show documents)."""
        uri, path, tactic, level = ir_args(args, render.SHOW_IR, default_level="core")
        text = await self.ir_text(uri, path, tactic, level, render.SHOW_IR)
        out = self.ir_file(path, tactic, level)
        out.parent.mkdir(parents=True, exist_ok=True)
        # Replaced whole, so that an editor showing the file never reads half of it.
        partial = out.with_name(out.name + ".tmp")
        partial.write_text(text)
        partial.replace(out)
        if self.capability("window", "show_document", "support"):
            try:
                await self.window_show_document_async(lsp.ShowDocumentParams(
                    out.as_uri(), take_focus=True))
            except Exception as e:  # the client could not open it: the result says where
                log.warning("window/showDocument %s failed: %s", out, e)
        return {"path": str(out), "text": text}

    def ir_file(self, path: str, tactic: int, level: str) -> Path:
        """`<workspace>/.partir/ir/<dir>/<stem>.after-<N>.<level>.mlir`, `<dir>` the
        schedule file's directory relative to the workspace (two directories may have
        schedule files of one name)."""
        root = Path(os.path.realpath(self.workspace_root))
        folder = Path(os.path.realpath(path)).parent
        relative = folder.relative_to(root) if folder.is_relative_to(root) else Path()
        stem = os.path.basename(path).removesuffix(SCHEDULE_SUFFIX)
        return root / IR_DIR / relative / f"{stem}.after-{tactic}.{level}.mlir"

    async def ir_text(self, uri: str, path: str, tactic: int, level: P.IrLevel,
                      what: str) -> str:
        """The IR after `tactic`, of the text the last analysis of the document had (its
        tactic numbers are those the lenses show), else of its current or saved text."""
        doc = self.documents.get(uri)
        text, version = None, None
        if doc is not None:
            snap = doc.snapshot
            text, version = (snap.text, snap.version) if snap else (doc.text, doc.version)
        try:
            result: P.IrResult = await self.link().call(
                "ir", P.IrParams(path, text, version, level, tactic))
        except DaemonUnavailable as e:
            raise RequestFailed(str(e)) from None
        except RequestCancelled:
            raise JsonRpcContentModified(f"{what}: superseded by a newer version of the "
                                         f"document") from None
        except RequestError as e:
            raise RequestFailed(f"{what}: {e.message}") from None
        if result.after != tactic or (not result.text and result.diagnostics):
            out_of_range = next((d for d in result.diagnostics
                                 if d.message.startswith(f"after={tactic}:")), None)
            if out_of_range is not None:
                raise JsonRpcInvalidParams(f"tactic {tactic} is out of range: "
                                           f"{out_of_range.message}")
            first = result.diagnostics[0] if result.diagnostics else None
            where = f" (line {first.line})" if first and first.line else ""
            raise RequestFailed(f"the schedule file does not load{where}: "
                                f"{first.message if first else 'no program'}")
        return result.text

    async def run_job(self, args: Any) -> dict[str, Any]:
        if not isinstance(args, dict):
            args = _as_dict(args)
        uri = args.get("uri")
        steps = args.get("steps", 10)
        path = path_of(uri) if isinstance(uri, str) else None
        if path is None:
            raise JsonRpcInvalidParams(f"{render.RUN_JOB}: expected [{{\"uri\", \"steps\"}}]")
        if not isinstance(steps, int) or isinstance(steps, bool) or steps < 1:
            raise JsonRpcInvalidParams(f"{render.RUN_JOB}: \"steps\" must be an integer >= 1")
        name = os.path.basename(path)
        loop = asyncio.get_running_loop()
        cancel = asyncio.Event()
        msg_id = self.protocol.msg_id
        if msg_id is not None:
            self.cancel_hooks[msg_id] = cancel.set
        # A client that shows the job itself (the extension: a notification with Cancel)
        # passes its own token, as a `workDoneToken` it creates; else the server creates
        # one, which clients may show where they cannot cancel it.
        token = args.get("progressToken")
        if not isinstance(token, str):
            token = None
        if token is None and self.capability("window", "work_done_progress"):
            token = f"partir-job-{uuid.uuid4()}"
            try:
                await self.work_done_progress.create_async(token)
            except Exception as e:  # the client refused: run without progress
                log.warning("window/workDoneProgress/create failed: %s", e)
                token = None
        if token is not None:
            self.work_done_progress.begin(token, lsp.WorkDoneProgressBegin(
                title="PartIR job", message=f"{name}: starting", cancellable=True,
                percentage=0))
            future = self.work_done_progress.tokens.get(token)
            if future is not None:
                future.add_done_callback(
                    lambda f: loop.call_soon_threadsafe(cancel.set) if f.cancelled() else None)
        status_text = "failed"
        try:
            result = await self._run_job(path, steps, cancel, token)
            status_text = result["status"]
            message = result.pop("_message")
            self.window_log_message(lsp.LogMessageParams(
                lsp.MessageType.Info if result["status"] == "finished" else
                lsp.MessageType.Warning, message))
            return result
        finally:
            if msg_id is not None:
                self.cancel_hooks.pop(msg_id, None)
            if token is not None:
                self.work_done_progress.end(token, lsp.WorkDoneProgressEnd(
                    message=f"{name}: {status_text}"))

    async def _run_job(self, path: str, steps: int, cancel: asyncio.Event,
                       token: str | None) -> dict[str, Any]:
        name = os.path.basename(path)
        try:
            run: P.RunResult = await self.link().call("run", P.RunParams(path, steps))
            info = run.job
            cancelled = False
            last_report = None
            while info.state not in P.FINAL_JOB_STATES:
                if cancel.is_set() and not cancelled:
                    cancelled = True
                    await self.link().call("cancel", P.CancelParams(info.id))
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(cancel.wait(), JOB_POLL_S)
                info = (await self.link().call("job", P.JobParams(info.id, 0))).job
                report = (info.state, info.steps_done)
                if token is not None and report != last_report:
                    last_report = report
                    total = max(info.steps, 1)
                    self.work_done_progress.report(token, lsp.WorkDoneProgressReport(
                        message=f"{name}: {info.state}, step {info.steps_done}/{info.steps}",
                        percentage=min(100, int(100 * info.steps_done / total))))
            log_text = (await self.link().call("job", P.JobParams(info.id, 40))).log
        except (DaemonUnavailable, DaemonError) as e:
            return {"job_id": "", "status": "failed", "step_time_s": None,
                    "max_abs_error": None, "error": str(e),
                    "_message": f"PartIR job ({name}) failed: {e}"}
        return _job_result(info, log_text, name)


def _job_result(info: P.JobInfo, log_text: str, name: str) -> dict[str, Any]:
    status = {"succeeded": "finished", "cancelled": "cancelled"}.get(info.state, "failed")
    m = info.metrics
    out: dict[str, Any] = {
        "job_id": info.id, "status": status,
        "step_time_s": m.step_time_median_s if m else None,
        "max_abs_error": m.max_abs_error if m else None,
    }
    if m is not None:
        out.update(steps=m.steps, devices=m.devices, platform=m.platform,
                   compile_s=m.compile_s, collectives=dict(m.collectives))
        if m.peak_memory_bytes is not None:
            out["peak_memory_bytes"] = m.peak_memory_bytes
    if status == "finished" and out["step_time_s"] is None:
        out["status"], info.error = "failed", "the job reported no step time"
    if out["status"] == "failed":
        out["error"] = info.error or f"the job ended {info.state}"
    if log_text:
        out["output"] = log_text
    out["_message"] = render.job_message(info, name)
    return out


def ir_args(params: Any, what: str,
            default_level: P.IrLevel | None) -> tuple[str, str, int, P.IrLevel]:
    """The uri, path, tactic and level of a `partir/ir` request or `partir.showIr`
    command; `default_level` when it has none (None: the level is required)."""
    if not isinstance(params, dict):
        params = _as_dict(params)
    uri, tactic = params.get("uri"), params.get("tactic")
    level = params.get("level", default_level)
    if not isinstance(uri, str) or (path := path_of(uri)) is None:
        raise JsonRpcInvalidParams(f"{what}: \"uri\" must be a file: URI")
    if not isinstance(tactic, int) or isinstance(tactic, bool) or tactic < 0:
        raise JsonRpcInvalidParams(f"{what}: \"tactic\" must be an integer >= 0")
    if level not in ("core", "spmd", "hlo"):
        raise JsonRpcInvalidParams(f"{what}: \"level\" must be core, spmd or hlo")
    return uri, path, tactic, level


def _as_dict(value: Any) -> dict[str, Any]:
    if hasattr(value, "_asdict"):
        return dict(value._asdict())
    if hasattr(value, "__dict__"):
        return dict(vars(value))
    return {}


def build() -> PartirServer:
    """A server with its features registered."""
    server = PartirServer()

    @server.feature(lsp.INITIALIZE)
    def initialize(ls: PartirServer, params: lsp.InitializeParams) -> None:
        ls.settings.update(params.initialization_options)
        folders = params.workspace_folders or []
        root = path_of(folders[0].uri) if folders else None
        root = root or (path_of(params.root_uri) if params.root_uri else None) or \
            params.root_path
        if root and os.path.isdir(root):
            ls.workspace_root = root

    @server.feature(lsp.INITIALIZED)
    async def initialized(ls: PartirServer, params: lsp.InitializedParams) -> None:
        if ls.capability("workspace", "configuration"):
            try:
                values = await ls.workspace_configuration_async(lsp.ConfigurationParams(
                    [lsp.ConfigurationItem(section="partir")]))
            except Exception as e:  # a client that does not answer: keep the options
                log.warning("workspace/configuration failed: %s", e)
                return
            if values:
                ls.settings_changed(values[0])

    @server.feature(lsp.WORKSPACE_DID_CHANGE_CONFIGURATION)
    def did_change_configuration(ls: PartirServer,
                                 params: lsp.DidChangeConfigurationParams) -> None:
        ls.settings_changed(params.settings)

    @server.feature(lsp.TEXT_DOCUMENT_DID_OPEN)
    def did_open(ls: PartirServer, params: lsp.DidOpenTextDocumentParams) -> None:
        d = params.text_document
        ls.opened(d.uri, d.version, d.text)

    @server.feature(lsp.TEXT_DOCUMENT_DID_CHANGE)
    def did_change(ls: PartirServer, params: lsp.DidChangeTextDocumentParams) -> None:
        uri = params.text_document.uri
        if uri in ls.documents:
            text = ls.workspace.get_text_document(uri).source
            ls.opened(uri, params.text_document.version, text)

    @server.feature(lsp.TEXT_DOCUMENT_DID_SAVE, lsp.SaveOptions(include_text=False))
    def did_save(ls: PartirServer, params: lsp.DidSaveTextDocumentParams) -> None:
        doc = ls.documents.get(params.text_document.uri)
        if doc is not None:
            ls.schedule(doc)

    @server.feature(lsp.TEXT_DOCUMENT_DID_CLOSE)
    def did_close(ls: PartirServer, params: lsp.DidCloseTextDocumentParams) -> None:
        ls.closed(params.text_document.uri)

    @server.feature(lsp.TEXT_DOCUMENT_CODE_LENS)
    async def code_lens(ls: PartirServer, params: lsp.CodeLensParams) -> list[lsp.CodeLens]:
        await ls.first_analysis(params.text_document.uri)
        return ls.code_lenses(params.text_document.uri)

    @server.feature(lsp.TEXT_DOCUMENT_INLAY_HINT)
    async def inlay_hint(ls: PartirServer, params: lsp.InlayHintParams) -> list[lsp.InlayHint]:
        await ls.first_analysis(params.text_document.uri)
        return ls.inlay_hints(params.text_document.uri, params.range)

    @server.feature(lsp.TEXT_DOCUMENT_HOVER)
    async def hover(ls: PartirServer, params: lsp.HoverParams) -> lsp.Hover | None:
        try:
            return await ls.hover(params.text_document.uri, params.position)
        except (DaemonUnavailable, RequestCancelled):
            return None
        except DaemonError as e:
            log.warning("hover: %s", e)
            return None

    # Editor features answered at once from the last analysis and the current text.
    def last_result(doc: Document) -> P.PartitionResult | None:
        return doc.traced.result if doc.traced is not None else None

    def text_and_result(ls: PartirServer,
                        uri: str) -> tuple[str, P.PartitionResult | None] | None:
        """A schedule file's text and last analysis, or a module's where tactics of an
        open schedule file are written and that file's analysis."""
        doc = ls.documents.get(uri)
        if doc is not None:
            return doc.text, last_result(doc)
        path = path_of(uri)
        found = ls.writer(path) if path is not None else None
        if found is None:
            return None
        return ls.workspace.get_text_document(uri).source, found[0].result

    @server.feature(lsp.TEXT_DOCUMENT_COMPLETION,
                    lsp.CompletionOptions(trigger_characters=list(completion.TRIGGERS)))
    def complete(ls: PartirServer, params: lsp.CompletionParams) -> lsp.CompletionList | None:
        found = text_and_result(ls, params.text_document.uri)
        return completion.complete(found[0], params.position, found[1]) \
            if found is not None else None

    @server.feature(lsp.TEXT_DOCUMENT_DEFINITION)
    def definition(ls: PartirServer, params: lsp.DefinitionParams) -> list[lsp.Location]:
        doc = ls.documents.get(params.text_document.uri)
        return navigation.definitions(doc.path, doc.text, params.position, last_result(doc),
                                      ls.workspace_root) if doc is not None else []

    @server.feature(lsp.TEXT_DOCUMENT_DOCUMENT_SYMBOL)
    async def document_symbol(ls: PartirServer,
                              params: lsp.DocumentSymbolParams) -> list[lsp.DocumentSymbol]:
        return await ls.outline(params.text_document.uri)

    @server.feature(lsp.TEXT_DOCUMENT_CODE_ACTION, lsp.CodeActionOptions(
        code_action_kinds=[lsp.CodeActionKind.QuickFix, lsp.CodeActionKind.RefactorRewrite]))
    def code_action(ls: PartirServer, params: lsp.CodeActionParams) -> list[lsp.CodeAction]:
        uri = params.text_document.uri
        known = text_and_result(ls, uri)
        if known is None:
            return []
        text, result = known
        only = params.context.only
        found = []
        if not only or any(lsp.CodeActionKind.QuickFix.value.startswith(k) for k in only):
            found += actions.quick_fixes(uri, text, result, params.context.diagnostics)
        if uri in ls.documents and (not only or any(
                lsp.CodeActionKind.RefactorRewrite.value.startswith(k) for k in only)):
            found += actions.manual_replacements(uri, text, result, params.range)
        return found

    @server.feature(IR_REQUEST)
    async def ir(ls: PartirServer, params: Any) -> dict[str, str]:
        return await ls.ir(params)

    @server.command(render.SHOW_IR)
    async def show_ir(ls: PartirServer, args: Any) -> dict[str, str]:
        return await ls.show_ir(args)

    @server.command(render.RUN_JOB)
    async def run_job(ls: PartirServer, args: Any) -> dict[str, Any]:
        return await ls.run_job(args)

    @server.feature(lsp.SHUTDOWN)
    def shutdown(ls: PartirServer, params: Any) -> None:
        for doc in ls.documents.values():
            if doc.task is not None:
                doc.task.cancel()
        if ls.daemon is not None:
            ls.daemon.close()

    return server


def main(argv: list[str] | None = None) -> int:
    """`python -m partir_lsp` / `partir lsp`: serve over stdio. Logs go to stderr (stdout carries
    only LSP messages)."""
    logging.basicConfig(stream=sys.stderr, level=os.environ.get("PARTIR_LSP_LOG", "WARNING"),
                        format="partir-lsp %(levelname)s %(name)s: %(message)s")
    build().start_io()
    return 0
