"""Printing PartIR:HLO functions: the shared IR printer, with the shardings of the inputs
and outputs in the notation of the collectives (`[{"B"}, {}]` per value)."""

from __future__ import annotations

from dataclasses import replace

from partir.hlo.ops import format_axes_per_dim
from partir.ir import Function, print_function


def format_shardings(shardings: tuple) -> str:
    return "[" + ", ".join(format_axes_per_dim(s) for s in shardings) + "]"


def print_hlo(fn: Function) -> str:
    attributes = {k: format_shardings(v) if k in ("in_shardings", "out_shardings") else v
                  for k, v in fn.attributes.items()}
    return print_function(replace(fn, attributes=attributes))
