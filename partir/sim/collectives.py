"""Bytes each device sends, and the time it takes, per PartIR:HLO collective.

Ring formulas over a group of n devices (the devices that differ only on the collective's
mesh axes, n = product of their sizes), with S the bytes of the *full* (gathered,
unreduced) tensor on one device:

* all_gather: a device sends the other n-1 devices its chunk: (n-1)/n * S, where S is
  the gathered result;
* reduce_scatter: (n-1)/n * S, where S is the unscattered operand;
* all_reduce: a reduce_scatter then an all_gather: 2 (n-1)/n * S;
* all_to_all: a device keeps 1 of its n pieces and sends the others: (n-1)/n * S, where
  S is the operand;
* collective_permute: a device sends its operand S to one other device, one hop: S;
* all_slice: local, nothing sent.

Time. Each mesh axis is mapped to a link of the device spec (`links={"model": "nvlink",
"batch": "ethernet"}`, default: the spec's `default_link`). A collective over several axes
runs hierarchically, one ring phase per axis; the bytes add up to the flat formulas above
(e.g. all_gather over (a, b): (n_b - 1)/n_b * S/n_a on b, then (n_a - 1)/n_a * S on a,
summing to (n_a n_b - 1)/(n_a n_b) * S). The phase moving the most data runs on the
fastest link, as hierarchical implementations order them. A phase over an axis of size
n costs its bytes over the link's bandwidth plus one link latency per peer, (n - 1) *
latency, for every kind of collective (an all_reduce's reduce-scatter and all-gather
halves are pipelined: their latencies are not paid twice; on the calibration machine an
all_reduce and an all_gather of a few bytes take the same time). Starting the collective
costs its links' largest setup, once. all_to_all sends its pieces directly: bytes over
the slowest named link plus its setup and one latency per peer; a collective_permute
sends one message: its bytes over the slowest named link plus its setup and one latency.

Combining. XLA merges collectives of the same kind over the same axes that do not depend
on one another into one (its all-reduce, all-gather and reduce-scatter combiners; e.g.
the gradient all_reduces of batch parallelism become one). A combined collective moves
the sum of the bytes but pays the latency once, unless the runtime still meets once per
operand (XLA's CPU runtime: `DeviceSpec.combined_latency_once`). Which kinds a backend
combines is a property of the device spec (`DeviceSpec.combined_collectives`); the
simulator tracks data dependencies to form the groups (`Combiner`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from partir.hlo.ops import (
    ALL_GATHER,
    ALL_REDUCE,
    ALL_TO_ALL,
    COLLECTIVE_PERMUTE,
    REDUCE_SCATTER,
    flat_axes,
)
from partir.ir import Op
from partir.mesh import split_axis_name
from partir.sim.devices import DeviceSpec, LinkSpec, UnknownDeviceError

# The collectives that communicate, by op name: their kinds key `Cost.bytes_moved` and
# `DeviceSpec.combined_collectives`.
KIND_OF = {ALL_GATHER: "all_gather", ALL_REDUCE: "all_reduce",
           REDUCE_SCATTER: "reduce_scatter", ALL_TO_ALL: "all_to_all",
           COLLECTIVE_PERMUTE: "collective_permute"}
KINDS = tuple(KIND_OF.values())


@dataclass(frozen=True)
class CollectiveCost:
    kind: str
    bytes_sent: float  # per device
    time_s: float  # transfer time plus latency
    latency_s: float  # the latency part of time_s (combined collectives may pay it once)


def axis_links(device: DeviceSpec, mesh_axes: Sequence[str],
               links: Mapping[str, str] | None) -> dict[str, LinkSpec]:
    """The link each mesh axis uses; axes not in `links` use the device's default. A
    sub-axis (`x:(2)2`) uses the link of the axis it is part of."""
    links = links or {}
    bases = {a: split_axis_name(a)[0] for a in mesh_axes}
    unknown = sorted(set(links) - set(bases.values()))
    if unknown:
        raise UnknownDeviceError(f"links name axes {unknown} that are not in the mesh "
                         f"{sorted(set(bases.values()))}")
    return {a: device.link(links.get(base, device.default_link)) for a, base in bases.items()}


def ring_time(full_bytes: float, axes: Sequence[str], mesh: Mapping[str, int],
              link_of: Mapping[str, LinkSpec], passes: int = 1) -> tuple[float, float]:
    """(time, latency part) of an all_gather whose gathered result has `full_bytes`
    (equally, of a reduce_scatter of that operand), one ring phase per axis, the biggest
    phase on the fastest link; `passes=2` for an all_reduce (its bytes go round twice)."""
    # The phase run last moves the most: (n-1)/n of the whole tensor; each earlier phase
    # works on a tensor smaller by the sizes of the phases after it.
    order = sorted((a for a in axes if mesh[a] > 1), key=lambda a: link_of[a].bandwidth)
    time = 0.0
    # One collective, started once whatever its phases.
    latency = max((link_of[a].setup_s for a in order), default=0.0)
    size = full_bytes
    for a in reversed(order):  # from the last (fastest link) phase backwards
        n, link = mesh[a], link_of[a]
        time += passes * (n - 1) / n * size / link.bandwidth
        latency += (n - 1) * link.latency_s
        size /= n
    return time + latency, latency


def all_reduce_cost(axes: Sequence[str], nbytes: int, mesh: Mapping[str, int],
                    link_of: Mapping[str, LinkSpec]) -> CollectiveCost:
    """An all_reduce of an operand of `nbytes` over `axes` (an op's, or one inside a
    loop's body)."""
    n = math.prod(mesh[a] for a in axes)
    return CollectiveCost("all_reduce", 2 * (n - 1) / n * nbytes,
                          *ring_time(nbytes, axes, mesh, link_of, passes=2))


def all_gather_cost(axes: Sequence[str], nbytes: int, mesh: Mapping[str, int],
                    link_of: Mapping[str, LinkSpec]) -> CollectiveCost:
    """An all_gather of an operand (a tile) of `nbytes` over `axes`."""
    n = math.prod(mesh[a] for a in axes)
    full = nbytes * n
    return CollectiveCost("all_gather", (n - 1) / n * full,
                          *ring_time(full, axes, mesh, link_of))


def reduce_scatter_cost(axes: Sequence[str], nbytes: int, mesh: Mapping[str, int],
                        link_of: Mapping[str, LinkSpec]) -> CollectiveCost:
    """A reduce_scatter of an operand (the whole sum's size) of `nbytes` over `axes`."""
    n = math.prod(mesh[a] for a in axes)
    return CollectiveCost("reduce_scatter", (n - 1) / n * nbytes,
                          *ring_time(nbytes, axes, mesh, link_of))


def collective_cost(op: Op, nbytes: int, mesh: Mapping[str, int],
                    link_of: Mapping[str, LinkSpec]) -> CollectiveCost:
    """`nbytes`: the bytes of the op's operand. Raises KeyError for non-collectives."""
    name = op.name
    if name == ALL_REDUCE:
        return all_reduce_cost(op.params["axes"], nbytes, mesh, link_of)
    if name == ALL_GATHER:
        return all_gather_cost(flat_axes(op.params["axes"]), nbytes, mesh, link_of)
    if name == REDUCE_SCATTER:
        return reduce_scatter_cost(flat_axes(op.params["axes"]), nbytes, mesh, link_of)
    if name == ALL_TO_ALL:
        axes = op.params["axes"]
        n = math.prod(mesh[a] for a in axes)
        sent = (n - 1) / n * nbytes
        if n == 1:
            return CollectiveCost("all_to_all", 0.0, 0.0, 0.0)
        slowest = min((link_of[a] for a in axes), key=lambda link: link.bandwidth)
        latency = (max(link_of[a].setup_s for a in axes)
                   + (n - 1) * max(link_of[a].latency_s for a in axes))
        return CollectiveCost("all_to_all", sent, sent / slowest.bandwidth + latency, latency)
    if name == COLLECTIVE_PERMUTE:
        axes = op.params["axes"]
        if not any(s != t for s, t in op.params["pairs"]):
            return CollectiveCost("collective_permute", 0.0, 0.0, 0.0)
        slowest = min((link_of[a] for a in axes), key=lambda link: link.bandwidth)
        latency = max(link_of[a].setup_s + link_of[a].latency_s for a in axes)
        return CollectiveCost("collective_permute", float(nbytes),
                              nbytes / slowest.bandwidth + latency, latency)
    raise KeyError(name)


class Combiner:
    """Groups collectives the way XLA's combiners do, in one pass in program order: a
    collective joins the open group of its (kind, axes) unless it depends, through the
    values it reads, on a member of that group; then it opens a new group.

    Dependencies are tracked per value as {group key: latest group id depended on},
    shared between values when an op adds nothing new (most ops).
    """

    def __init__(self, kinds: frozenset[str]) -> None:
        self.kinds = kinds
        self.open: dict[tuple, int] = {}  # key -> id of its open group
        self.deps: dict[object, dict[tuple, int]] = {}  # value -> key -> group id
        self.groups = 0

    def visit(self, op: Op) -> dict[tuple, int]:
        """The merged dependencies of an op's operands."""
        merged: dict[tuple, int] = {}
        deps = self.deps
        for u in op.operands:
            d = deps.get(u)
            if not d or d is merged:
                continue
            if not merged:
                merged = d
                continue
            merged = {**merged}
            for k, g in d.items():
                if merged.get(k, -1) < g:
                    merged[k] = g
        return merged

    def propagate(self, op: Op, merged: dict[tuple, int]) -> None:
        if merged:
            for r in op.results:
                self.deps[r] = merged

    def join(self, op: Op, merged: dict[tuple, int]) -> int:
        """Record the collective; the id of the group it joins or opens (-1: its kind is
        not combined)."""
        if KIND_OF[op.name] not in self.kinds:
            return -1
        axes = op.params["axes"]
        key = (op.name, axes, op.params.get("monoid"))
        current = self.open.get(key)
        if current is None or merged.get(key) == current:
            current = self.open[key] = self.groups
            self.groups += 1
        self.deps[op.results[0]] = {**merged, key: current}
        return current
