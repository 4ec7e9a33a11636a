"""Source locations: the user's file and line an op comes from."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Location:
    file: str
    line: int
    function: str = ""
    # Whether the op is in a backward pass (JAX's transpose of the user's line): the same
    # line, not another place, so equality ignores it. ZeRO-3 gathers parameters again
    # for the backward pass (`partir.hlo.fusion.regather_for_backward`).
    backward: bool = field(default=False, compare=False, repr=False)

    def __str__(self) -> str:
        return f"{self.file}:{self.line}"


UNKNOWN_LOCATION = Location("<unknown>", 0)
