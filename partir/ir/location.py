"""Source locations: the user's file and line an op comes from."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Location:
    file: str
    line: int
    function: str = ""

    def __str__(self) -> str:
        return f"{self.file}:{self.line}"


UNKNOWN_LOCATION = Location("<unknown>", 0)
