"""The IR shared by every stage: typed SSA values, ops with regions, functions."""

from partir.ir.function import Function
from partir.ir.location import UNKNOWN_LOCATION, Location
from partir.ir.ops import Op, Region
from partir.ir.printer import print_function
from partir.ir.types import RangeType, TensorType, Type
from partir.ir.values import Value
from partir.ir.verifier import VerificationError, verify

__all__ = [
    "UNKNOWN_LOCATION",
    "Function",
    "Location",
    "Op",
    "RangeType",
    "Region",
    "TensorType",
    "Type",
    "Value",
    "VerificationError",
    "print_function",
    "verify",
]
