"""Tactics and the schedule driver."""

from partir.tactics.auto import AutomaticPartition, manual_tactics
from partir.tactics.base import Tactic
from partir.tactics.driver import TacticRecord, apply_schedule, as_schedule
from partir.tactics.forms import FIRST_DIVISIBLE_DIM, REPLICATED, UNKNOWN
from partir.tactics.manual import ManualPartition
from partir.tactics.outputs import OutShardings

__all__ = ["FIRST_DIVISIBLE_DIM", "REPLICATED", "UNKNOWN", "AutomaticPartition",
           "ManualPartition", "OutShardings", "Tactic", "TacticRecord", "apply_schedule",
           "as_schedule", "manual_tactics"]
