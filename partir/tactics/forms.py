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
# a propagation barrier on the axis (Shardy's `sdy.propagation_barrier`): the value is
# whole there, gathered where its producer is sharded, and the ops that read it shard as
# their other operands say, each taking the slice it needs; so the two sides of a value
# can be sharded differently (an all_to_all between them), which REPLICATED forbids by
# keeping its readers whole too. The `barrier` action.
BARRIER = _Form("BARRIER")
class _FirstDivisible(_Form):
    """The first dimension, from `start` on, that the axis size divides and that is not
    yet sharded."""

    def __init__(self, start: int = 0) -> None:
        super().__init__("FIRST_DIVISIBLE_DIM")
        self.start = start

    def after(self, dim: int) -> _FirstDivisible:
        """The first such dimension after `dim`: `FIRST_DIVISIBLE_DIM.after(0)` leaves the
        layer dimension of a scan over layers' stacked parameters, which a scan iterates
        over and no loop can slice."""
        return _FirstDivisible(dim + 1)

    def __repr__(self) -> str:
        return "partir.FIRST_DIVISIBLE_DIM" + (f".after({self.start - 1})" if self.start
                                               else "")

    def __reduce__(self) -> str | tuple:
        return self._name if not self.start else (_FirstDivisible, (self.start,))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _FirstDivisible) and other.start == self.start

    def __hash__(self) -> int:
        return hash(("FIRST_DIVISIBLE_DIM", self.start))


FIRST_DIVISIBLE_DIM = _FirstDivisible()
# no action: let propagation decide
UNKNOWN = _Form("UNKNOWN")
