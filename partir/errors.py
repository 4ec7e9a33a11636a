"""Errors users see. Each names the input or op, the tactic, and the user's source line."""

from __future__ import annotations

from partir.ir.location import Location


class PartitionError(Exception):
    """Base class of every error partir raises for bad input."""

    def __init__(self, message: str, *, tactic: str | None = None,
                 loc: Location | None = None) -> None:
        self.message = message
        self.tactic = tactic
        self.loc = loc
        super().__init__(self._format())

    def _format(self) -> str:
        text = self.message
        if self.tactic is not None:
            text = f"tactic {self.tactic}: {text}"
        if self.loc is not None and self.loc.line:
            text = f"{text} (at {self.loc})"
        return text


class UnknownInputError(PartitionError):
    """A tactic names an input or tag the function does not have."""


class DimensionOutOfRangeError(PartitionError):
    """A tactic asks for a dimension the value does not have."""


class AxisNotInMeshError(PartitionError):
    """A tactic names a mesh axis the mesh does not have."""


class SubAxisOverlapError(PartitionError):
    """A tactic names a sub-axis that the sub-axes an earlier tactic or propagation split
    its axis into cannot make up: it starts or ends inside one of them, where no further
    split can put a boundary."""


class IndivisibleDimensionError(PartitionError):
    """The axis size does not divide the (local) dimension size."""


class NotShardableError(PartitionError):
    """A tactic asks to shard a dimension the program must keep whole there (a value in
    a loop body whose loop cannot be sliced on it)."""


class AlreadyTiledError(PartitionError):
    """A value is tiled (or kept replicated) twice on the same axis."""


class NotPipelineableError(PartitionError):
    """A pipeline tactic meets a scan over layers it cannot run as a pipeline: no stacked
    layer dimension, stages that do not divide the layers, a carry without a batch, or a
    layer that mixes a batch's examples."""


class InvalidTacticError(PartitionError):
    """A tactic is malformed: wrong value forms, bad callable results, empty inputs..."""


class ProgramError(PartitionError):
    """A program is malformed or uses an op that neither the runtime nor the interpreters
    can evaluate."""


class TracingError(PartitionError):
    """The function could not be traced or its arguments do not match."""
