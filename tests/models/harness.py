"""What the library-model tests share: one call per (model, schedule) that partitions a
training step with `partir.jit`, compares its loss and gradients with `jax.jit` of the
same step, and checks from partir's `Metadata` that the sharding asked for held.

A step returns `(loss, grads, ...)`: the loss and gradients are compared with `jax.jit`
(anything after them, e.g. Adam-updated parameters, is not: Adam's first step divides a
gradient by its own magnitude, which amplifies the rounding of near-zero gradients). The
checks, each one field of `Expect` that the test spells out:

- `sharded`: for a parameter of the step, the axis its leaves (those with a dimension the
  axis divides) must be sharded over: the parameters and optimizer state under ZeRO-3.
- `specs`: exact `PartitionSpec`s of inputs, by name as tactics name them
  ("params/Dense_0/kernel").
- `grads_like`: the gradients output (position 1 of the result) laid out like the
  parameter of the step they differentiate (`md.out_specs[1]` equal to its `md.in_specs`).
- `max_flops_ratio`: the per-device FLOPs of the partitioned program over those of the
  unpartitioned one (the same function under an empty schedule), about 1/N under BP.
- `batch`: the global batch size, which no all_gather may produce: an all_gather of a
  dimension of that size is one of the batch (the input itself or an activation); the
  models' other dimensions are chosen to differ from it. (Under plain BP the tests also
  assert there is no all_gather at all, those in loop bodies included.)

`check_bp`, `check_zero3` and `check_megatron` are `check_step` with the schedule and the
expectations each of the three schedules shares across the libraries.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import jax
import numpy as np
from jax.sharding import PartitionSpec

import partir
from partir import FIRST_DIVISIBLE_DIM, ManualPartition
from tests.oracles import assert_tree_close

BP8 = {"batch": 8}
BP4_MP2 = {"batch": 4, "model": 2}


@dataclass(frozen=True)
class Expect:
    sharded: Mapping[str, str] = field(default_factory=dict)  # step parameter -> axis
    specs: Mapping[str, PartitionSpec] = field(default_factory=dict)  # input name -> spec
    grads_like: str | None = None  # the step parameter the gradients are laid out like
    max_flops_ratio: float | None = None
    batch: int | None = None  # the global batch size, which no all_gather may produce
    # Inputs a concatenate along the batch gathers, once each (issue 27 item 6: one
    # collective per operand of a concatenate along a sharded dimension).
    concatenated: tuple[str, ...] = ()


@dataclass(frozen=True)
class Checked:
    """A step's partitioned result, `jax.jit`'s, and partir's metadata."""

    result: Any
    expected: Any
    md: partir.Metadata


def check_step(step: Callable, args: Sequence[Any], mesh: Mapping[str, int],
               schedule: Sequence[partir.ManualPartition], expect: Expect,
               out_shardings: Any = None) -> Checked:
    """Partition `step` on `mesh` by `schedule` (and `out_shardings`, when given), run it
    on `args`, and assert the loss and gradients equal `jax.jit`'s and each check of
    `expect` holds (all failures reported together)."""
    expected = jax.jit(step)(*args)
    options = {} if out_shardings is None else {"out_shardings": out_shardings}
    fn, md = partir.jit(step, mesh, schedule, **options)
    result = fn(*args)
    assert_tree_close(result[:2], expected[:2])
    unsupported = [c for t in md.tactics for c in t.conflicts if c["kind"] == "unsupported"]
    failures = [f"unsupported primitives: {unsupported}"] if unsupported else []
    params = list(inspect.signature(step).parameters)
    for name, axis in expect.sharded.items():
        pos = params.index(name)
        missing = unsharded(md.in_specs[pos], args[pos], axis, mesh[axis])
        if missing:
            failures.append(f"{name}: not sharded over {axis!r}: {missing}")
    in_specs = named_specs(md.in_specs, params)
    for name, spec in expect.specs.items():
        got = in_specs.get(name)
        if got is None or normalized(got) != normalized(spec):
            failures.append(f"{name}: {got}, expected {spec}")
    if expect.grads_like is not None:
        like = expect.grads_like
        grads = named_specs((md.out_specs[1],), [like])
        wrong = {name: (grads.get(name), spec) for name, spec in in_specs.items()
                 if name.startswith(f"{like}/")
                 and normalized(grads.get(name, PartitionSpec())) != normalized(spec)}
        if wrong:
            failures.append(f"gradients not laid out like {like} (gradient, {like}): {wrong}")
    if expect.max_flops_ratio is not None:
        whole = partir.partition(step, mesh, [], *args, device=md.cost.device).cost.flops
        ratio = md.cost.flops / whole
        if ratio > expect.max_flops_ratio:
            failures.append(f"per-device FLOPs {ratio:.3f} of the unpartitioned program's, "
                            f"more than {expect.max_flops_ratio}")
    if expect.batch is not None:
        of_batch = [g for g in all_gathers(md) if expect.batch in g[1]]
        if sorted(g[0] for g in of_batch) == sorted(expect.concatenated):
            of_batch = []
        if of_batch:
            failures.append(f"all_gathers of the batch (operand, gathered sizes): {of_batch}")
    assert not failures, "\n".join(failures)
    return Checked(result, expected, md)


def check_bp(step: Callable, args: Sequence[Any], bp: ManualPartition, batch: int,
             max_flops_ratio: float = 0.2, concatenated: tuple[str, ...] = ()) -> Checked:
    """BP on 8 devices: about 1/8 of the FLOPs per device (the rest replicated tails such
    as the optimizer's update) and no all_gather at all, loop bodies included, but one of
    each input in `concatenated`."""
    c = check_step(step, args, BP8, [bp], Expect(max_flops_ratio=max_flops_ratio, batch=batch,
                                                 concatenated=concatenated))
    assert c.md.collectives["all_gather"] == len(concatenated), c.md.collectives
    return c


def check_zero3(step: Callable, args: Sequence[Any], bp: ManualPartition, batch: int,
                state: Sequence[str] = ("params", "opt_state"), out_shardings: Any = None,
                max_flops_ratio: float = 0.25, concatenated: tuple[str, ...] = ()) -> Checked:
    """BP then ZeRO-3 on 8 devices: each input in `state` (the parameters first, then the
    optimizer state...) sharded on its first divisible dimension over "batch", and the
    gradients (output 1) laid out like the parameters: asked by the tactic naming output
    "out/1" like an input, or by `out_shardings` when given."""
    asked = {name: FIRST_DIVISIBLE_DIM for name in state}
    if out_shardings is None:
        asked["out/1"] = FIRST_DIVISIBLE_DIM
    z3 = ManualPartition(asked, axis="batch", name="Z3")
    return check_step(step, args, BP8, [bp, z3], Expect(
        sharded=dict.fromkeys(state, "batch"), grads_like=state[0],
        max_flops_ratio=max_flops_ratio, batch=batch, concatenated=concatenated),
        out_shardings=out_shardings)


def check_megatron(step: Callable, args: Sequence[Any], bp: ManualPartition,
                   mp: ManualPartition, specs: Mapping[str, PartitionSpec], batch: int,
                   params: str = "params", max_flops_ratio: float = 0.25) -> Checked:
    """BP over "batch" then Megatron-style MP over "model" on {batch: 4, model: 2}: the
    inputs named in `specs` laid out so, and the gradients like the parameters (a weight
    sharded over "model" keeps its gradient so, with no gather before it is returned)."""
    return check_step(step, args, BP4_MP2, [bp, mp], Expect(
        specs=specs, grads_like=params, max_flops_ratio=max_flops_ratio, batch=batch))


def unsharded(specs: Any, arrays: Any, axis: str, size: int) -> list[str]:
    """The paths of the leaves of `arrays` with a dimension `size` divides whose spec
    (from `specs`, the same pytree) does not use `axis`."""
    flat_specs = jax.tree.leaves(specs, is_leaf=lambda s: isinstance(s, PartitionSpec))
    leaves = jax.tree_util.tree_flatten_with_path(arrays)[0]
    return [jax.tree_util.keystr(path) for (path, a), s in zip(leaves, flat_specs, strict=True)
            if any(d % size == 0 for d in np.shape(a)) and axis not in axes_of(s)]


def named_specs(specs: Sequence[Any], params: Sequence[str]) -> dict[str, PartitionSpec]:
    """Input name -> spec, for the spec pytrees of the parameters `params`: names as
    tactics spell them, the parameter then the leaf's path ("params/Dense_0/kernel")."""
    return {"/".join([param, *map(key_name, path)]): s
            for param, tree in zip(params, specs, strict=True)
            for path, s in jax.tree_util.tree_flatten_with_path(
                tree, is_leaf=lambda s: isinstance(s, PartitionSpec))[0]}


def key_name(key: Any) -> str:
    for attr in ("key", "idx", "name"):
        if hasattr(key, attr):
            return str(getattr(key, attr))
    return str(key)


def axes_of(spec: PartitionSpec) -> set[str]:
    return {a for entry in spec if entry is not None
            for a in (entry if isinstance(entry, tuple) else (entry,))}


def normalized(spec: PartitionSpec) -> tuple:
    """A spec's entries without trailing Nones and with 1-tuples unwrapped, so that
    P("batch"), P("batch", None) and P(("batch",), None) compare equal."""
    entries = [e[0] if isinstance(e, tuple) and len(e) == 1 else e for e in spec]
    while entries and entries[-1] is None:
        entries.pop()
    return tuple(entries)


# `%name = all_gather [{}, {"batch"}] %operand : tensor<1x32xf32>`: the gathered axes of each
# dimension, the operand (an input, `%"params/w"`, or a value) and the result's type.
ALL_GATHER = re.compile(r'= all_gather \[(.*?)\] %("[^"]+"|\S+) : tensor<([^>]*)>')


def all_gathers(md: partir.Metadata) -> list[tuple[str, list[int]]]:
    """Each all_gather of the final program's PartIR:HLO text (outside loop bodies, which
    print as their jaxprs): its operand and the global sizes of the dimensions it gathers."""
    found = []
    for m in ALL_GATHER.finditer(md.hlo_ir):
        dims = re.findall(r"\{([^}]*)\}", m.group(1))
        shape = [int(d) for d in m.group(3).split("x")[:-1]]
        found.append((m.group(2).strip('"'),
                      [n for axes, n in zip(dims, shape, strict=True) if axes.strip()]))
    return found
