"""The analytical simulator of the PartIR paper's appendix A over a PartIR:HLO program.

One pass over the device-local program, after the fusion and live-range analysis of
`partir.sim.memory`, adds up per device:

* FLOPs of every op (`partir.sim.cost`);
* compute time: per op, the larger of its FLOPs over the device's peak rate (matrix or
  vector units, per element type) and the bytes of the buffers it reads and writes over
  the memory bandwidth (a roofline), plus the spec's launch overhead per kernel (per
  materialized fusion root);
* communication: bytes each device sends per collective kind and the time it takes
  (`partir.sim.collectives`), with each mesh axis mapped to a link of the spec;
* peak memory: arguments + results + peak live temporaries.

Step time = compute + communication - overlap * min(compute, communication). `overlap`
is the fraction of the shorter of the two that is hidden behind the other: 0 (default)
runs collectives and compute one after the other, as XLA does for the synchronous
collectives of the CPU and of a shard_map without async scheduling; 1 assumes perfect
overlap (step time = max of the two), what latency-hiding schedulers on GPUs and TPUs
approach. Values in between interpolate.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

import partir.cancel as cancel
from partir.ir import Function
from partir.ir.dtypes import dtype_name
from partir.mesh import split_axis_name
from partir.rules import CATALOGUE
from partir.rules.catalogue import region_ops
from partir.sim.collectives import (
    KINDS,
    axis_links,
    collective_cost,
)
from partir.sim.cost import UNKNOWN_RULE, Kind
from partir.sim.devices import DeviceSpec, get_device
from partir.sim.memory import plan_buffers, size_table

DEFAULT_DEVICE = "cpu"


@dataclass
class Cost:
    """Estimated cost per device of one run of a device-local program."""

    device: str
    flops: float
    bytes_accessed: float  # memory traffic of the materialized buffers
    bytes_moved: dict[str, float]  # bytes a device sends, by collective kind
    peak_memory_bytes: int
    argument_bytes: int
    output_bytes: int
    temp_bytes: int
    memory_capacity_bytes: int
    compute_time_s: float
    communication_time_s: float
    step_time_s: float
    kernels: int
    # Collectives merged into an earlier one (one latency, where the device's runtime
    # pays it once: `DeviceSpec.combined_latency_once`).
    combined_collectives: int = 0
    overlap: float = 0.0
    links: dict[str, str] = field(default_factory=dict)  # mesh axis -> link name
    unknown_ops: list[str] = field(default_factory=list)  # without a rule, or it failed

    @property
    def fits(self) -> bool:
        return self.peak_memory_bytes <= self.memory_capacity_bytes

    @property
    def total_bytes_moved(self) -> float:
        return sum(self.bytes_moved.values())

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "fits": self.fits}


def simulate(fn: Function, device: str | DeviceSpec = DEFAULT_DEVICE, *,
             links: Mapping[str, str] | None = None, overlap: float = 0.0) -> Cost:
    """Estimate the per-device cost of a PartIR:HLO function on `device` (a registered
    name or a `DeviceSpec`). `links` maps mesh axes to link names of the spec, e.g.
    {"model": "nvlink", "batch": "ethernet"}; `overlap` is documented in the module."""
    if not 0.0 <= overlap <= 1.0:
        raise ValueError(f"overlap must be in [0, 1], got {overlap}")
    spec = get_device(device)
    mesh = fn.attributes.get("mesh") or {}
    link_of = axis_links(spec, list(mesh), links)
    sizes = size_table()
    plan = plan_buffers(fn, sizes, library_reduction_elements=spec.library_reduction_elements,
                        combined_collectives=spec.combined_collectives)
    rules = plan.rules

    flops = compute = comm = 0.0
    bytes_accessed = 0
    moved = dict.fromkeys(KINDS, 0.0)
    unknown: set[str] = set()
    bandwidth = spec.memory_bandwidth
    cache_bytes, cache_bandwidth = spec.cache_bytes, spec.cache_bandwidth
    combined = 0
    rates: dict[tuple[object, bool], float] = {}  # (dtype, matmul) -> FLOP/s

    def elements(t: object) -> int:
        return sizes(t)[0]

    token = cancel.current()
    for i, op in enumerate(fn.ops):
        if token is not None and token.cancelled:
            token.check()
        rule = rules[i]
        if rule is UNKNOWN_RULE:
            unknown.add(op.name)
        if rule.primitive.kind is Kind.COLLECTIVE:
            if not plan.live[i]:  # dead, or a repeat XLA merges with the first
                continue
            c = collective_cost(op, sizes(op.operands[0].type)[1], mesh, link_of)
            moved[c.kind] += c.bytes_sent
            if plan.group[i] != i:  # merged into an earlier collective
                combined += 1
                if spec.combined_latency_once:
                    comm += c.time_s - c.latency_s
                    continue
            comm += c.time_s
            continue
        # A control-flow op's sync points; the test keeps a generator off every other op
        # (this loop runs for each op of each program an automatic search evaluates).
        for inner, times in region_ops(op) if op.regions else ():
            declared = CATALOGUE.get(inner.name)
            if declared is not None and declared.kind is Kind.COLLECTIVE:
                c = collective_cost(inner, sizes(inner.operands[0].type)[1], mesh, link_of)
                moved[c.kind] += c.bytes_sent * (times or 1)
                comm += c.time_s * (times or 1)
        if not plan.live[i]:
            continue
        nbytes = plan.op_bytes[i]
        bytes_accessed += nbytes
        if cache_bytes and nbytes <= cache_bytes:
            nbytes *= bandwidth / cache_bandwidth  # as many DRAM bytes, time-wise
        try:
            f = rule.flops(op, elements)
        except Exception:  # a rule's bug must not stop partitioning: cost it as unknown
            unknown.add(op.name)
            rule = UNKNOWN_RULE
            f = rule.flops(op, elements)
        if f:
            flops += f
            t = (op.operands[0] if op.operands else op.results[0]).type
            matmul = rule.primitive.matmul
            key = (t.dtype, matmul)
            rate = rates.get(key)
            if rate is None:
                rate = rates[key] = spec.flops_per_s(dtype_name(t.dtype), matmul)
            f_time = f / rate
            m_time = nbytes / bandwidth
            compute += f_time if f_time > m_time else m_time
        else:
            compute += nbytes / bandwidth
    kernels = sum(plan.kernel[i] and plan.kinds[i] is not Kind.COLLECTIVE
                  for i in range(len(fn.ops)))
    compute += kernels * spec.kernel_overhead_s
    step = compute + comm - overlap * min(compute, comm)
    return Cost(
        device=spec.name, flops=flops, bytes_accessed=float(bytes_accessed),
        bytes_moved=moved, peak_memory_bytes=plan.peak_bytes,
        argument_bytes=plan.argument_bytes, output_bytes=plan.output_bytes,
        temp_bytes=plan.temp_bytes, memory_capacity_bytes=spec.memory_bytes,
        compute_time_s=compute, communication_time_s=comm, step_time_s=step,
        kernels=kernels, combined_collectives=combined, overlap=overlap,
        links={a: (links or {}).get(a, spec.default_link)
               for a in dict.fromkeys(split_axis_name(a)[0] for a in mesh)},
        unknown_ops=sorted(unknown))
