"""Named device specs for the simulator, and a registry users can extend.

A `DeviceSpec` holds what the analytical cost model reads: peak FLOP/s per element type
for matrix units (`dot_general`, convolutions) and for vector units (everything else),
memory capacity and bandwidth, a per-kernel launch overhead, and the links a mesh axis can
be mapped to. A mesh axis uses `default_link` unless the simulation maps it to another
link by name, e.g. `{"model": "nvlink", "batch": "ethernet"}`.

Figures are the vendors' public dense (no sparsity) peaks; bandwidths are per device and
per direction, in bytes/s:

* A100-40GB (SXM): NVIDIA A100 datasheet: FP32 19.5 TFLOP/s, TF32 tensor 156 (JAX's default
  precision runs f32 matmuls as TF32 on Ampere and later), BF16/FP16 312, INT8 624;
  HBM2 1,555 GB/s; NVLink 3 600 GB/s total = 300 GB/s per direction; PCIe 4 x16 32 GB/s;
  HDR InfiniBand 200 Gb/s = 25 GB/s.
* H100-80GB (SXM): NVIDIA H100 datasheet: FP32 67, TF32 tensor 494.5, BF16/FP16 989.5,
  FP8/INT8 1,979 TFLOP/s; HBM3 3.35 TB/s; NVLink 4 900 GB/s total = 450 per direction;
  PCIe 5 x16 64 GB/s; NDR InfiniBand 400 Gb/s = 50 GB/s.
* H200 (SXM): NVIDIA H200 datasheet: H100's compute, 141 GB HBM3e at 4.8 TB/s.
* TPUv3 (one TensorCore, a JAX device): half a v3 chip (Google Cloud TPU docs: 123 TFLOP/s
  bf16, 32 GiB HBM, 900 GB/s per chip; the PartIR paper's evaluation runs on them);
  inter-chip links 656 Gb/s = 82 GB/s each (Jouppi et al., "A domain-specific
  supercomputer for training deep neural networks", CACM 2020).
* TPUv4 (one chip: its two TensorCores form one JAX device, "megacore"): Google Cloud TPU
  docs: 275 TFLOP/s bf16/int8, 32 GiB HBM2 at 1,200 GB/s; ICI links 50 GB/s each (Jouppi
  et al., "TPU v4", ISCA 2023). On TPUs JAX's default precision multiplies f32 matrices
  in one bf16 pass, so f32 matmuls get the bf16 peak.
* cpu: one of the 8 virtual devices of XLA's host platform on this machine, measured by
  `benchmarks/calibrate_cpu.py` (see `CPU`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from partir.errors import PartitionError

GB = 1e9
TFLOPS = 1e12


class UnknownDeviceError(PartitionError):
    """No device spec (or link of a spec) is registered under this name."""


@dataclass(frozen=True)
class LinkSpec:
    """An interconnect as one device sees it: bytes/s it sends per direction, the latency
    of one message (one step of a ring), and what starting one collective costs however
    many devices take part (the devices' threads meeting at a rendezvous on the CPU)."""

    bandwidth: float
    latency_s: float
    setup_s: float = 0.0


@dataclass(frozen=True)
class DeviceSpec:
    name: str
    matmul_flops: Mapping[str, float]  # dtype name -> FLOP/s of dot_general / convolutions
    vector_flops: Mapping[str, float]  # dtype name -> FLOP/s of elementwise ops, reductions
    memory_bytes: int
    memory_bandwidth: float  # bytes/s
    links: Mapping[str, LinkSpec]
    default_link: str
    kernel_overhead_s: float = 0.0  # launch cost of every kernel (fused group of ops)
    # A kernel whose buffers fit in `cache_bytes` streams them at `cache_bandwidth` (a
    # two-level roofline; 0: a single level, `memory_bandwidth`).
    cache_bytes: int = 0
    cache_bandwidth: float = 0.0
    # Collective kinds the backend's compiler combines when independent (see
    # partir.sim.collectives): XLA combines all three on GPUs and TPUs.
    combined_collectives: frozenset[str] = frozenset({"all_reduce", "all_gather",
                                                      "reduce_scatter"})
    # Float32 add/max/min reductions of at least this many input elements run as library
    # calls (XLA's CPU backend gives them to YNNPACK) whose fusions take producers with no
    # other consumer only: a cheap producer read by one and by anything else is
    # materialized, where loop fusions would repeat it. None: every reduction is a loop
    # fusion.
    library_reduction_elements: int | None = None
    # Whether a combined collective pays its latency (setup and per-peer latency) once.
    # XLA's CPU runtime runs a combined collective's operands one after another, each a
    # rendezvous of the devices' threads: there combining saves no time.
    combined_latency_once: bool = True
    aliases: tuple[str, ...] = field(default=())
    notes: str = ""

    def __post_init__(self) -> None:
        if self.default_link not in self.links:
            raise ValueError(f"device {self.name}: default link {self.default_link!r} is not "
                             f"one of its links {sorted(self.links)}")

    def flops_per_s(self, dtype: str, matmul: bool) -> float:
        """Peak FLOP/s for an element type; types the spec does not list run at its f32
        rate (e.g. int32 index arithmetic on vector units)."""
        table = self.matmul_flops if matmul else self.vector_flops
        return table.get(dtype) or table["float32"]

    def link(self, name: str) -> LinkSpec:
        try:
            return self.links[name]
        except KeyError:
            raise UnknownDeviceError(f"device {self.name} has no link {name!r}; it has "
                                     f"{sorted(self.links)}") from None

    def with_links(self, **links: LinkSpec) -> DeviceSpec:
        return replace(self, links={**self.links, **links})


_REGISTRY: dict[str, DeviceSpec] = {}
_ALIASES: dict[str, str] = {}


def register_device(spec: DeviceSpec, *, overwrite: bool = False) -> DeviceSpec:
    """Make `spec` selectable by its name or aliases (case-insensitive), e.g. in
    `partir.partition(..., device="my-gpu")`."""
    keys = [spec.name.lower(), *(a.lower() for a in spec.aliases)]
    taken = [k for k in keys if k in _ALIASES and _ALIASES[k] != spec.name]
    if taken and not overwrite:
        raise ValueError(f"device names {taken} are already registered; pass overwrite=True")
    _REGISTRY[spec.name] = spec
    for k in keys:
        _ALIASES[k] = spec.name
    return spec


def get_device(device: str | DeviceSpec) -> DeviceSpec:
    if isinstance(device, DeviceSpec):
        return device
    name = _ALIASES.get(device.lower())
    if name is None:
        raise UnknownDeviceError(f"unknown device {device!r}; registered: "
                                 f"{', '.join(sorted(_REGISTRY))}")
    return _REGISTRY[name]


def registered_devices() -> list[str]:
    return sorted(_REGISTRY)


def _gpu_links(nvlink: float, pcie: float, infiniband: float) -> dict[str, LinkSpec]:
    # Latencies: a few microseconds per NCCL ring step within a node, more across nodes.
    return {"nvlink": LinkSpec(nvlink * GB, 5e-6), "pcie": LinkSpec(pcie * GB, 10e-6),
            "infiniband": LinkSpec(infiniband * GB, 10e-6),
            "ethernet": LinkSpec(12.5 * GB, 30e-6)}  # 100 GbE


A100 = register_device(DeviceSpec(
    name="A100-40GB", aliases=("a100",),
    matmul_flops={"float32": 156 * TFLOPS, "bfloat16": 312 * TFLOPS,
                  "float16": 312 * TFLOPS, "int8": 624 * TFLOPS},
    vector_flops={"float32": 19.5 * TFLOPS, "bfloat16": 39 * TFLOPS, "float16": 78 * TFLOPS},
    memory_bytes=40 * 1024 ** 3, memory_bandwidth=1555 * GB,
    links=_gpu_links(nvlink=300, pcie=32, infiniband=25), default_link="nvlink",
    kernel_overhead_s=4e-6))

H100 = register_device(DeviceSpec(
    name="H100-80GB", aliases=("h100",),
    matmul_flops={"float32": 494.5 * TFLOPS, "bfloat16": 989.5 * TFLOPS,
                  "float16": 989.5 * TFLOPS, "int8": 1979 * TFLOPS,
                  "float8_e4m3fn": 1979 * TFLOPS},
    vector_flops={"float32": 67 * TFLOPS, "bfloat16": 134 * TFLOPS, "float16": 134 * TFLOPS},
    memory_bytes=80 * 1024 ** 3, memory_bandwidth=3350 * GB,
    links=_gpu_links(nvlink=450, pcie=64, infiniband=50), default_link="nvlink",
    kernel_overhead_s=3e-6))

H200 = register_device(replace(
    H100, name="H200", aliases=("h200",), memory_bytes=141 * 10 ** 9,
    memory_bandwidth=4800 * GB))


def _tpu_links(ici: float) -> dict[str, LinkSpec]:
    # DCN: the hosts' data-center network between slices, 100 Gb/s per host shared by its
    # devices; ICI hops are a microsecond or so.
    return {"ici": LinkSpec(ici * GB, 1e-6), "dcn": LinkSpec(12.5 * GB, 30e-6)}


TPU_V3 = register_device(DeviceSpec(
    name="TPUv3", aliases=("tpuv3", "tpu-v3", "tpu_v3", "v3"),
    matmul_flops={"bfloat16": 61.5 * TFLOPS, "float32": 61.5 * TFLOPS},
    # The vector unit: an eighth of the MXUs' rate (Jouppi et al. 2020 give 4 MXUs of
    # 128x128 MACs per core against a 32 x 128-lane vector unit).
    vector_flops={"float32": 61.5 / 8 * TFLOPS, "bfloat16": 61.5 / 8 * TFLOPS},
    memory_bytes=16 * 1024 ** 3, memory_bandwidth=450 * GB,
    links=_tpu_links(ici=82), default_link="ici", kernel_overhead_s=1e-6))

TPU_V4 = register_device(DeviceSpec(
    name="TPUv4", aliases=("tpuv4", "tpu-v4", "tpu_v4", "v4"),
    matmul_flops={"bfloat16": 275 * TFLOPS, "float32": 275 * TFLOPS, "int8": 275 * TFLOPS},
    vector_flops={"float32": 275 / 8 * TFLOPS, "bfloat16": 275 / 8 * TFLOPS},
    memory_bytes=32 * 1024 ** 3, memory_bandwidth=1200 * GB,
    links=_tpu_links(ici=50), default_link="ici", kernel_overhead_s=1e-6))

# One of 8 virtual CPU devices (`--xla_force_host_platform_device_count=8`) on this
# machine (2 cores, AMD EPYC, 1 MiB L2 per core, 23 GiB RAM), as measured by
# `python benchmarks/calibrate_cpu.py` with jax 0.10.2: the same kernel runs on the 8
# devices at once and a device's figure is its own work over the wall time, so the
# devices' contention for the 2 cores is part of the figures. Rounded middles of four runs
# (the machine is shared, runs vary by up to ~40%):
#   matmul f32 1.8e10 FLOP/s, vector f32 1.9e9 FLOP/s, memory bandwidth 8.0e8 B/s,
#   cache bandwidth 4.3e9 B/s (64 KiB per device), per-kernel overhead 2.5e-6 s.
# Collectives, three later runs: a psum or all_gather of a few bytes takes ~48 us over 2
# devices, ~82 us over 4, ~117 us over 8, the line 4.1e-5 s setup + 1.1e-5 s per peer;
# collective bandwidth 1.2e9 B/s.
# (One device owning the machine measured ~1.5e11 FLOP/s and ~6e9 B/s.)
# The L2 cache a device gets: 2 x 1 MiB shared by 8 devices. XLA's CPU pipeline combines
# all-reduces only (a compiled batch-parallel step has one tuple all-reduce, while the
# all-gathers and reduce-scatters of ZeRO stay separate), and its runtime meets at one
# rendezvous per operand of a tuple all-reduce: a psum of k tiny arrays takes about k
# times as long as a psum of one (calibrate_cpu.py's "combined psum" line: 0.7 to 1.4 of
# one psum per array, for 2 to 8 arrays). Memory: the RAM over 8 devices.
# A reduction's fusion is a YNNPACK call from 4096 input elements on (3072 still fuse as
# loops; measured with jax 0.10.2 on a device-local shard_map program).
CPU = register_device(DeviceSpec(
    name="cpu", aliases=("host",),
    matmul_flops={"float32": 1.8e10},
    vector_flops={"float32": 1.9e9},
    memory_bytes=23 * 1024 ** 3 // 8, memory_bandwidth=8.0e8,
    cache_bytes=256 * 1024, cache_bandwidth=4.3e9,
    links={"shared-memory": LinkSpec(1.2e9, 1.1e-5, 4.1e-5)}, default_link="shared-memory",
    kernel_overhead_s=2.5e-6, combined_collectives=frozenset({"all_reduce"}),
    library_reduction_elements=4096, combined_latency_once=False,
    notes="one of 8 virtual CPU devices on the calibration machine"))
