"""The server's settings: `initializationOptions` at start-up, then
`workspace/didChangeConfiguration` (`{"settings": {"partir": {...}}}`) or the client's
answer to `workspace/configuration` for section "partir" (see vscode-extension/PROTOCOL.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

DEFAULT_DEBOUNCE_MS = 300
MAX_DEBOUNCE_MS = 5000


@dataclass
class Settings:
    collective_markers_in_model: bool = False
    debounce_ms: int = DEFAULT_DEBOUNCE_MS

    def update(self, data: Any) -> bool:
        """Apply the keys of `data` it knows (others, e.g. pythonPath, are the client's);
        returns whether anything changed. Malformed values are ignored."""
        if not isinstance(data, dict):
            return False
        if isinstance(data.get("partir"), dict):  # {"partir": {...}}: the section itself
            data = data["partir"]
        before = (self.collective_markers_in_model, self.debounce_ms)
        markers = data.get("collectiveMarkersInModel")
        if isinstance(markers, bool):
            self.collective_markers_in_model = markers
        debounce = data.get("debounceMs")
        if isinstance(debounce, int | float) and not isinstance(debounce, bool):
            self.debounce_ms = int(min(max(round(debounce), 0), MAX_DEBOUNCE_MS))
        return before != (self.collective_markers_in_model, self.debounce_ms)

    @property
    def debounce_s(self) -> float:
        return self.debounce_ms / 1000.0
