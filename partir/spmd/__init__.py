"""PartIR:SPMD: distributed tensor types, the execute/tile_reduce/redistribute ops, the
lowering from PartIR:Core (paper, App. C) and an interpreter of its semantics."""

from partir.spmd.interpreter import SpmdInterpreterError, interpret_spmd
from partir.spmd.lowering import lower_core_to_spmd
from partir.spmd.types import DTensorType

__all__ = ["DTensorType", "SpmdInterpreterError", "interpret_spmd", "lower_core_to_spmd"]
