"""The value forms a ManualPartition input dict accepts, besides an int dimension."""

from __future__ import annotations


class _Form:
    def __init__(self, name: str) -> None:
        self._name = name

    def __repr__(self) -> str:
        return f"partir.{self._name}"

    def __reduce__(self) -> str:
        return self._name


# keep the value replicated on the axis: the `atomic` action
REPLICATED = _Form("REPLICATED")
# the first dimension the axis size divides and that is not yet sharded
FIRST_DIVISIBLE_DIM = _Form("FIRST_DIVISIBLE_DIM")
# no action: let propagation decide
UNKNOWN = _Form("UNKNOWN")
