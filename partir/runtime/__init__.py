"""PartIR:HLO programs as JAX callables on local (or distributed) devices."""

from partir.errors import ProgramError
from partir.ir.lax_collectives import COLLECTIVES
from partir.runtime.errors import ArgumentError, DeviceCountError
from partir.runtime.executable import Executable, build_callable

__all__ = ["COLLECTIVES", "ArgumentError", "DeviceCountError", "Executable", "ProgramError",
           "build_callable"]
