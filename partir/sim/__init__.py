"""The analytical simulator (PartIR paper, appendix A): device specs, per-op cost rules,
collective costs, live-range peak memory, and `simulate`, which estimates the per-device
cost of a PartIR:HLO program."""

from partir.sim.collectives import KINDS, CollectiveCost, collective_cost
from partir.sim.cost import COST_RULES, CostRule, Kind
from partir.sim.devices import (
    DeviceSpec,
    LinkSpec,
    UnknownDeviceError,
    get_device,
    register_device,
    registered_devices,
)
from partir.sim.memory import BufferPlan, plan_buffers
from partir.sim.simulator import DEFAULT_DEVICE, Cost, simulate

__all__ = [
    "COST_RULES",
    "DEFAULT_DEVICE",
    "KINDS",
    "BufferPlan",
    "CollectiveCost",
    "Cost",
    "CostRule",
    "DeviceSpec",
    "Kind",
    "LinkSpec",
    "UnknownDeviceError",
    "collective_cost",
    "get_device",
    "plan_buffers",
    "register_device",
    "registered_devices",
    "simulate",
]
