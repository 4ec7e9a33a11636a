"""Tests of the examples; `counts` builds the collective counts they compare with."""

from __future__ import annotations


def counts(ag: int = 0, ar: int = 0, rs: int = 0, a2a: int = 0, cp: int = 0,
           slices: int = 0) -> dict[str, int]:
    """A program's collective counts, as `Metadata.collectives` gives them."""
    return {"all_gather": ag, "all_reduce": ar, "reduce_scatter": rs, "all_to_all": a2a,
            "collective_permute": cp, "all_slice": slices}
