"""PartIR:HLO: device-local programs with collectives over mesh axes, the lowering from
PartIR:SPMD, the collective fusion passes, and a reference interpreter that simulates
every device of the mesh."""

from partir.hlo.fusion import optimize
from partir.hlo.interpreter import HloInterpreterError, interpret_hlo
from partir.hlo.lowering import HloLoweringError, locate_by_users, lower_spmd_to_hlo
from partir.hlo.ops import count_collectives, verify_hlo
from partir.hlo.printing import print_hlo

__all__ = ["HloInterpreterError", "HloLoweringError", "count_collectives", "interpret_hlo",
           "locate_by_users", "lower_spmd_to_hlo", "optimize", "print_hlo", "verify_hlo"]
