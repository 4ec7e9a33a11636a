"""The language server's link to the workspace's compiler daemon: connects lazily
(starting the daemon when none runs), reconnects after the daemon exits, and turns the
client's blocking calls and futures into awaitables so that the event loop never waits
on the daemon. Cancelling an awaiting task cancels the daemon request."""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import logging
import time
from collections.abc import Callable
from typing import Any

from partir_daemon import protocol as P
from partir_daemon.client import DaemonClient, DaemonConnectionLost, DaemonError

log = logging.getLogger("partir_lsp.daemon")

# After a failed start, calls fail at once for this long instead of trying again.
RETRY_AFTER_S = 10.0


class DaemonUnavailable(Exception):
    """The daemon is not running and could not be started."""


class DaemonLink:
    def __init__(self, workspace: str, *,
                 on_progress: Callable[[P.ProgressParams], None] | None = None,
                 on_notification: Callable[[str, Any], None] | None = None,
                 config: P.DaemonConfig | None = None) -> None:
        self.workspace = workspace
        self.config = config
        self._on_progress = on_progress
        self._on_notification = on_notification
        self._client: DaemonClient | None = None
        self._lock = asyncio.Lock()
        self.failure: str | None = None
        self._failed_at = 0.0
        self.started_by_us = False

    async def client(self) -> DaemonClient:
        async with self._lock:
            if self._client is not None:
                return self._client
            if self.failure is not None and time.monotonic() - self._failed_at < RETRY_AFTER_S:
                raise DaemonUnavailable(self.failure)
            loop = asyncio.get_running_loop()
            connect = functools.partial(
                DaemonClient.connect, self.workspace, autostart=True, config=self.config,
                timeout=None, on_progress=self._on_progress,
                on_notification=self._on_notification)
            try:
                self._client = await loop.run_in_executor(None, connect)
            except (DaemonError, OSError) as e:
                self.failure = f"the PartIR compiler daemon for {self.workspace} could not " \
                               f"be started: {e}"
                self._failed_at = time.monotonic()
                raise DaemonUnavailable(self.failure) from None
            self.failure = None
            return self._client

    def _drop(self, client: DaemonClient) -> None:
        if self._client is client:
            self._client = None
        client.close()

    async def call(self, method: str, params: Any, *,
                   on_partial: Callable[[Any], None] | None = None) -> Any:
        """Send a request and await its result dataclass; `on_partial` runs on the event
        loop with each partial result first. A lost connection (the daemon exited or
        crashed) is retried once on a new connection (the daemon is started again).
        Raises DaemonUnavailable, or the client's errors."""
        loop = asyncio.get_running_loop()
        relay = None if on_partial is None else \
            (lambda result: loop.call_soon_threadsafe(on_partial, result))
        for attempt in range(2):
            client = await self.client()
            future = client.request_future(method, params, on_partial=relay)
            try:
                return await _await(future, client)
            except DaemonConnectionLost:
                log.warning("connection to the daemon lost during %s; reconnecting", method)
                await asyncio.get_running_loop().run_in_executor(None, self._drop, client)
                if attempt:
                    raise
        raise AssertionError("unreachable")

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None

    @property
    def connected(self) -> DaemonClient | None:
        return self._client


async def _await(future: concurrent.futures.Future, client: DaemonClient) -> Any:
    # Shielded: the client's future must not be cancelled (its reader thread sets its
    # result when the daemon answers); cancelling the task asks the daemon instead.
    inner = asyncio.wrap_future(future)
    # Its outcome is read here, or dropped when the task was cancelled (no warning then).
    inner.add_done_callback(lambda f: f.cancelled() or f.exception())
    try:
        return await asyncio.shield(inner)
    except asyncio.CancelledError:
        client.cancel_request(future.request_id)  # type: ignore[attr-defined]
        raise
