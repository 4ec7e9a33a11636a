"""Tactics and the schedule driver."""

from partir.tactics.auto import AutomaticPartition, manual_tactics
from partir.tactics.base import Tactic
from partir.tactics.constraints import ShardingConstraints, annotation_notes
from partir.tactics.driver import TacticRecord, apply_schedule, as_schedule
from partir.tactics.forms import BARRIER, FIRST_DIVISIBLE_DIM, REPLICATED, UNKNOWN
from partir.tactics.manual import ManualPartition, SpecPartition
from partir.tactics.outputs import OutShardings
from partir.tactics.pipelining import PipelinePartition, pipelined

__all__ = ["BARRIER", "FIRST_DIVISIBLE_DIM", "REPLICATED", "UNKNOWN", "AutomaticPartition",
           "ManualPartition", "OutShardings", "PipelinePartition", "ShardingConstraints",
           "SpecPartition", "Tactic", "TacticRecord", "annotation_notes", "apply_schedule",
           "as_schedule", "manual_tactics", "pipelined"]
