"""A PartIR:HLO program as a JAX callable: `jax.jit(jax.shard_map(local_fn, ...))`.

The program's values are device-local; its `in_shardings`/`out_shardings` say how the
local arguments and results tile global arrays over the mesh. The executable takes and
returns the global arrays: shard_map hands every device its tile and reassembles the
results, so the program runs wherever JAX has devices, including across processes under
`jax.distributed` (the mesh is built from `jax.devices()`, which then lists every
process's devices).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
from jax.sharding import NamedSharding

from partir.errors import ProgramError
from partir.ir import Function, TensorType
from partir.ir.dtypes import canonical
from partir.mesh import Mesh
from partir.runtime.errors import ArgumentError, DeviceCountError
from partir.runtime.local import run_local
from partir.runtime.specs import (
    Sharding,
    format_sharding,
    global_type,
    normalize,
    partition_spec,
)


class Executable:
    """Runs a PartIR:HLO program on a `jax.sharding.Mesh`.

    `in_axes`/`out_axes` are the program's shardings (per dimension, the mesh axes major
    to minor); `in_specs`/`out_specs` the `PartitionSpec`s of the flat global inputs and
    outputs; `input_shardings`/`output_shardings` the matching `NamedSharding`s on
    `jax_mesh`; `global_in_types`/`global_out_types` their global shapes and dtypes.
    `fun` is the jitted function of already placed global arrays.
    """

    def __init__(self, fn: Function, mesh: Mesh, jax_mesh: jax.sharding.Mesh,
                 in_shardings: Sequence[Sharding], out_shardings: Sequence[Sharding],
                 **jit_options: Any) -> None:
        self.fn = fn
        self.mesh = mesh
        self.jax_mesh = jax_mesh
        self.in_axes = tuple(in_shardings)
        self.out_axes = tuple(out_shardings)
        self.in_specs = tuple(partition_spec(s) for s in in_shardings)
        self.out_specs = tuple(partition_spec(s) for s in out_shardings)
        self.input_shardings = tuple(NamedSharding(jax_mesh, s) for s in self.in_specs)
        self.output_shardings = tuple(NamedSharding(jax_mesh, s) for s in self.out_specs)
        # Where the axes pad a dimension, the program's global argument (result) is the
        # padded array; the executable takes (returns) the unpadded one, whose shapes
        # the `in_sizes` (`out_sizes`) attribute gives.
        self.padded_in_types = tuple(global_type(a.type, s, mesh)
                                     for a, s in zip(fn.args, in_shardings, strict=True))
        self.in_sizes = _sizes(fn, "in_sizes", len(fn.args))
        self.out_sizes = _sizes(fn, "out_sizes", len(fn.results))
        self.global_in_types = tuple(t if n is None else t.with_shape(n)
                                     for t, n in zip(self.padded_in_types, self.in_sizes,
                                                     strict=True))
        self.global_out_types = tuple(
            global_type(r.type, s, mesh) if n is None else r.type.with_shape(n)
            for r, s, n in zip(fn.results, out_shardings, self.out_sizes, strict=True))

        def local_fn(*args: Any) -> tuple[Any, ...]:
            return tuple(run_local(fn, mesh, args))

        # check_vma=False: whether a value is replicated over an axis is PartIR's typing
        # (the out_shardings), which JAX's varying-axes inference cannot always see, e.g.
        # a tiled all_gather's result is typed as varying although all devices hold it.
        spmd = jax.shard_map(local_fn, mesh=jax_mesh, in_specs=self.in_specs,
                             out_specs=self.out_specs, check_vma=False)
        if any(n is not None for n in self.out_sizes):
            sizes = self.out_sizes

            def unpadded(*args: Any) -> tuple[Any, ...]:
                # A padded result is cut back to its size (the padding holds garbage).
                return tuple(o if n is None else o[tuple(slice(0, m) for m in n)]
                             for o, n in zip(spmd(*args), sizes, strict=True))

            self.fun = jax.jit(unpadded, **jit_options)
        else:
            self.fun = jax.jit(spmd, **jit_options)

    def __call__(self, *args: Any) -> list[jax.Array]:
        """The program's global results on the global arguments."""
        return list(self.fun(*self.place(*args)))

    def lower(self, *args: Any) -> jax.stages.Lowered:
        """The lowered program (`.compile()`, `.as_text()`, `.compile().memory_analysis()`)
        for these arguments or, without any, for the program's global input types.
        Arguments may be abstract (`jax.ShapeDtypeStruct`); none is transferred."""
        if args:
            self._check_count(args)
            for i, x in enumerate(args):
                self._check_arg(i, x)
        abstract = [jax.ShapeDtypeStruct(t.shape, t.dtype, sharding=s)
                    for t, s in zip(self.padded_in_types, self.input_shardings, strict=True)]
        return self.fun.lower(*abstract)

    def place(self, *args: Any) -> list[Any]:
        """The arguments checked against the program's inputs and laid out on the mesh:
        arrays already sharded as the program needs pass through untouched, others are
        transferred (or resharded) with `jax.device_put`. Only avals are read: no device
        array moves to the host."""
        self._check_count(args)
        return self.layout([self._check_arg(i, x) for i, x in enumerate(args)])

    def layout(self, args: Sequence[Any]) -> list[Any]:
        """`place` without the checks, for callers that know the arguments' avals match
        (`partir.jit` caches executables by them). An argument whose axes pad a dimension
        is padded (with zeros) to the multiple of their size first: JAX lays out only
        arrays that the mesh axes divide, and the program's tiles are the padded array's."""
        if any(n is not None for n in self.in_sizes):
            args = [x if n is None else _pad(x, t.shape)
                    for x, n, t in zip(args, self.in_sizes, self.padded_in_types, strict=True)]
        return [x if isinstance(x, jax.core.Tracer) or _laid_out(x, s) else jax.device_put(x, s)
                for x, s in zip(args, self.input_shardings, strict=True)]

    def _check_count(self, args: Sequence[Any]) -> None:
        if len(args) != len(self.fn.args):
            raise ArgumentError(f"{self.fn.name} takes {len(self.fn.args)} arguments "
                                f"({', '.join(self.fn.arg_names)}), got {len(args)}")

    def _check_arg(self, i: int, x: Any) -> Any:
        """x, as an array or scalar JAX takes, if its shape and dtype are the input's. Host
        values take JAX's default dtypes (float64 -> float32 without x64) as with jax.jit,
        which `typeof` gives."""
        if isinstance(x, list | tuple):  # nested host sequences, which JAX would flatten
            x = np.asarray(x)
        try:
            aval = jax.typeof(x)
        except TypeError as e:
            raise ArgumentError(f"argument {self.fn.arg_names[i]!r} of {self.fn.name} is "
                                f"not an array: {e}") from None
        want = self.global_in_types[i]
        if aval.shape != want.shape or aval.dtype != canonical(want.dtype):
            raise ArgumentError(
                f"argument {self.fn.arg_names[i]!r} of {self.fn.name} is "
                f"{TensorType(tuple(aval.shape), aval.dtype)}; the program expects the "
                f"global {want} (device-local {self.fn.args[i].type} sharded "
                f"{format_sharding(self.in_axes[i])})")
        return x


def _sizes(fn: Function, key: str, n: int) -> tuple[tuple[int, ...] | None, ...]:
    sizes = fn.attributes.get(key)
    if sizes is None:
        return (None,) * n
    if len(sizes) != n:
        raise ProgramError(f"function {fn.name} has {n} values but {len(sizes)} {key}")
    return tuple(None if s is None else tuple(s) for s in sizes)


def _pad(x: Any, shape: tuple[int, ...]) -> Any:
    """x padded with zeros at the end of each dimension to `shape`: on the host for host
    values, else with jax.numpy (on the devices, or traced)."""
    widths = [(0, m - n) for n, m in zip(np.shape(x), shape, strict=True)]
    if isinstance(x, jax.core.Tracer):
        # Traced, the pad is compiled with the program: XLA (jax 0.10 on CPU) then folds
        # each device's slice of the padded array into the program's own dynamic slices,
        # and a scatter's out-of-range index, dropped on the tile, writes a neighbouring
        # tile's element instead (fuzzer seed 3740). The barrier keeps the pad a value.
        return jax.lax.optimization_barrier(jax.numpy.pad(x, widths))
    if isinstance(x, jax.Array):
        return jax.numpy.pad(x, widths)
    return np.pad(np.asarray(x), widths)


def _laid_out(x: Any, sharding: NamedSharding) -> bool:
    # Equality is the fast path; equivalence also accepts the same layout on a mesh with
    # other axis types (jax.make_mesh's explicit axes) or a spec with trailing Nones.
    return isinstance(x, jax.Array) and (x.sharding == sharding or
                                         x.sharding.is_equivalent_to(sharding, x.ndim))


def build_callable(fn: Function,
                   devices: Sequence[jax.Device] | jax.sharding.Mesh | None = None,
                   **jit_options: Any) -> Executable:
    """The executable of a PartIR:HLO program. `devices` is a `jax.sharding.Mesh` with the
    program's axes, used as it is (its device order and axis types), or devices of which
    the first `mesh.size` are laid out row-major over the mesh axes in order (default:
    `jax.devices()`, every process's devices under `jax.distributed`). `jit_options` go
    to `jax.jit` (`donate_argnums` counts the program's flat arguments)."""
    mesh = fn.attributes.get("mesh")
    if mesh is None:
        raise ProgramError(f"function {fn.name} has no `mesh` attribute")
    mesh = Mesh(mesh)
    in_shardings = _shardings(fn, "in_shardings", fn.args, fn.arg_names, mesh)
    out_shardings = _shardings(fn, "out_shardings", fn.results, _result_names(fn), mesh)
    if isinstance(devices, jax.sharding.Mesh):
        if Mesh(devices) != mesh.user_mesh:
            raise ProgramError(f"{fn.name} is partitioned for the mesh {mesh.user_mesh}, not "
                               f"for the given jax.sharding.Mesh {Mesh(devices)}")
        return Executable(fn, mesh, _refined(devices, mesh), in_shardings, out_shardings,
                          **jit_options)
    devices = list(jax.devices() if devices is None else devices)
    if mesh.size > len(devices):
        kind = f"{devices[0].platform} " if devices else ""
        raise DeviceCountError(
            f"the mesh {mesh} has {mesh.size} devices but only {len(devices)} {kind}"
            f"devices are available to run {fn.name}. partir.partition partitions a "
            f"program (IR, shardings, collectives, cost) without any devices. To run it, "
            f"make {mesh.size} devices visible: on CPU, set XLA_FLAGS="
            f"--xla_force_host_platform_device_count={mesh.size} before importing jax; "
            f"across processes or hosts, call jax.distributed.initialize(...) in each one "
            f"so that jax.devices() lists all of their devices")
    grid = np.empty(len(devices), dtype=object)
    grid[:] = devices
    jax_mesh = jax.sharding.Mesh(grid[:mesh.size].reshape(tuple(mesh.values())),
                                 mesh.axis_names)
    return Executable(fn, mesh, jax_mesh, in_shardings, out_shardings, **jit_options)


def _refined(jax_mesh: jax.sharding.Mesh, mesh: Mesh) -> jax.sharding.Mesh:
    """The user's jax.sharding.Mesh with each axis the program split into sub-axes
    reshaped into them (major to minor: the same devices, in the same order)."""
    if tuple(jax_mesh.axis_names) == mesh.axis_names:
        return jax_mesh
    names, types = [], []
    for axis, kind in zip(jax_mesh.axis_names, jax_mesh.axis_types, strict=True):
        parts = mesh.parts(axis) or (axis,)
        names += parts
        types += [kind] * len(parts)
    return jax.sharding.Mesh(jax_mesh.devices.reshape([mesh[a] for a in names]),
                             tuple(names), axis_types=tuple(types))


def _result_names(fn: Function) -> list[str]:
    names = list(fn.result_names)
    return [names[k] if k < len(names) else f"result {k}" for k in range(len(fn.results))]


def _shardings(fn: Function, key: str, values: Sequence[Any], names: Sequence[str],
               mesh: Mesh) -> list[Sharding]:
    shardings = fn.attributes.get(key)
    if shardings is None:
        raise ProgramError(f"function {fn.name} has no `{key}` attribute")
    shardings = list(shardings)
    if len(shardings) != len(values):
        raise ProgramError(f"function {fn.name} has {len(values)} "
                           f"{'arguments' if key == 'in_shardings' else 'results'} but "
                           f"{len(shardings)} {key}")
    result = []
    for v, name, s in zip(values, names, shardings, strict=True):
        if not isinstance(v.type, TensorType):
            raise ProgramError(f"{name!r} of {fn.name} has type {v.type}, not a tensor")
        result.append(normalize(s, v.type, mesh, f"{name!r} of {fn.name}"))
    return result
