"""PipelinePartition: the layers of a scan over layers split into stages over a mesh
axis, run as a GPipe schedule of microbatches.

A pipeline changes the program, not only how it is laid out: before any tactic applies,
`pipelined` rewrites each scan over the selected stacked layers, forward and backward
(the reversed scan autodiff makes), into the schedule of `partir.tactics.gpipe`; the
program computes the same function. At its place in the schedule the tactic then tiles
the selected inputs' layer dimension over its axis, and propagation carries the stages
through the rewritten scans: each device holds its stage's layers, the activations it
works on, and the residuals and gradients of its layers.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from partir.errors import InvalidTacticError, NotPipelineableError
from partir.frontend import TracedProgram
from partir.ir import Function, Location, Op, Value
from partir.ir.opnames import TAG
from partir.mesh import Mesh
from partir.rules.catalogue import CATALOGUE, OpView, region_ops
from partir.rules.factors import PASS
from partir.tactics.base import Tactic, TacticResult
from partir.tactics.gpipe import PerMicrobatch, gpipe, microbatch_layout, reassemble
from partir.tactics.manual import ActionSpec, caller_location, issue, select

if TYPE_CHECKING:
    from partir.core.module import CoreModule


@dataclass
class PipelinePartition(Tactic):
    """Split the stacked layer dimension (0) of the inputs `inputs` selects (e.g.
    `{"params/layers": 0}`) over `axis` into stages, and run the scans over those layers
    as a pipeline of `microbatches` microbatches of their carries' batch."""

    inputs: Mapping[str, int]
    axis: str
    microbatches: int = 1
    name: str | None = None
    loc: Location = field(default_factory=caller_location, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.inputs, Mapping) or not self.inputs:
            raise InvalidTacticError(
                f"PipelinePartition inputs must be a non-empty dict of name -> the stacked "
                f"layer dimension (0), got {self.inputs!r}", tactic=self.label, loc=self.loc)
        for key, dim in self.inputs.items():
            if isinstance(dim, bool) or dim != 0:
                raise InvalidTacticError(
                    f"input {key!r}: a scan iterates over dimension 0 of its stacked "
                    f"layers, so PipelinePartition splits dimension 0; got {dim!r}",
                    tactic=self.label, loc=self.loc)
        if not isinstance(self.axis, str):
            raise InvalidTacticError(f"PipelinePartition axis must be a mesh axis name, got "
                                     f"{self.axis!r}", tactic=self.label, loc=self.loc)
        m = self.microbatches
        if isinstance(m, bool) or not isinstance(m, int) or m < 1:
            raise InvalidTacticError(f"PipelinePartition microbatches must be a positive "
                                     f"int, got {m!r}", tactic=self.label, loc=self.loc)

    @property
    def label(self) -> str:
        return self.name or f"PipelinePartition({self.axis!r})"

    @property
    def axis_label(self) -> str:
        return self.axis

    def key_items(self) -> list[tuple[str, Any]]:
        return [*self.inputs.items(), ("microbatches", self.microbatches)]

    def run(self, module: CoreModule, names: Mapping[str, list[Value]]) -> TacticResult:
        selected = select(self.inputs.items(), names, self.label, self.loc)
        specs = [ActionSpec("tile", n, v, self.axis, 0) for n, v, _ in selected]
        actions, prop_s = issue(module, specs, self.label, self.loc)
        stages, m = module.mesh.check_axis(self.axis), self.microbatches
        per_stage = selected[0][1].type.shape[0] // stages
        notes = [f"{stages} stages of {_plural(per_stage, 'layer')}, "
                 f"{_plural(m, 'microbatch')}: {_plural(m + stages - 1, 'step')}, of which "
                 f"each stage idles {stages - 1} (the bubble, "
                 f"{bubble(stages, m):.0%} of its steps)"]
        schedule = {"stages": stages, "layers_per_stage": per_stage, "microbatches": m,
                    "steps": m + stages - 1, "bubble": bubble(stages, m)}
        return TacticResult(actions, notes, prop_s, pipeline=schedule)


def bubble(stages: int, microbatches: int) -> float:
    """The fraction of a GPipe schedule's steps each stage idles: (S - 1) / (M + S - 1)."""
    return (stages - 1) / (microbatches + stages - 1)


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}{'es' if word.endswith('ch') else 's'}"


def pipelined(traced: TracedProgram, mesh: Mesh, schedule: Sequence[Any]) -> TracedProgram:
    """The program with the scans the schedule's PipelinePartition pipelines rewritten
    (module docstring); the program itself where the schedule has none."""
    tactics = [t for t in schedule if isinstance(t, PipelinePartition)]
    if not tactics:
        return traced
    if len(tactics) > 1:
        raise InvalidTacticError("a schedule holds one PipelinePartition: the layers split "
                                 "into stages once", tactic=tactics[1].label,
                                 loc=tactics[1].loc)
    (tactic,) = tactics
    stages = mesh.check_axis(tactic.axis, tactic.label, tactic.loc)
    names = {n: [v] for n, v in zip(traced.input_names, traced.function.args, strict=True)}
    selected = select(tactic.inputs.items(), names, tactic.label, tactic.loc)
    layers = {v.type.shape[0] if v.type.rank else 0 for _, v, _ in selected}
    if len(layers) != 1 or 0 in layers:
        raise NotPipelineableError(
            "the selected inputs must all stack the same number of layers in dimension 0, "
            "got " + ", ".join(f"{n} {v.type}" for n, v, _ in selected),
            tactic=tactic.label, loc=tactic.loc)
    (n_layers,) = layers
    if n_layers % stages:
        first, layered = None, {v for _, v, _ in selected}
        for op in traced.function.ops:
            if _over_layers(op, layered, n_layers):
                first = op
                break
            if _per_layer(op, layered, n_layers):
                layered.add(op.results[0])
        raise NotPipelineableError(
            f"{stages} stages do not divide the {n_layers} layers of the scan",
            tactic=tactic.label, loc=first.loc if first is not None else tactic.loc)
    ops, results, found = _rewritten(traced.function, {v for _, v, _ in selected}, n_layers,
                                     stages, tactic)
    if not found:
        raise NotPipelineableError(
            f"no scan of {n_layers} iterations reads the selected layers "
            f"({', '.join(n for n, _, _ in selected)}) as its scanned operands",
            tactic=tactic.label, loc=tactic.loc)
    fn = traced.function
    function = Function(fn.name, fn.args, ops, results, fn.result_names, fn.attributes)
    return dataclasses.replace(traced, function=function, tags=_tags(ops))


def _rewritten(fn: Function, layered: set[Value], n_layers: int, stages: int,
               tactic: PipelinePartition) -> tuple[list[Op], list[Value], int]:
    """The function's ops with each scan over the layers (reading them, values made of
    them layer by layer, or a pipelined scan's stacked results) pipelined, its results,
    and how many scans were. A pipelined scan's stacked result that keeps the batch is
    put back together only where an op other than a pipelined scan reads it
    (`gpipe.reassemble`)."""
    renamed: dict[Value, Value] = {}
    pending: dict[Value, PerMicrobatch] = {}  # results not put back together (yet)
    ops: list[Op] = []
    found = 0
    m = tactic.microbatches

    def whole(v: Value, loc: Location) -> Value:
        made, value = reassemble(pending.pop(v), m, loc)
        ops.extend(made)
        renamed[v] = value
        return value

    for op in fn.ops:
        pipelined = _over_layers(op, layered, n_layers)
        layout = microbatch_layout(op, m, tactic.label) if pipelined else None
        kept: dict[int, PerMicrobatch] = {}
        for i, v in enumerate(op.operands):
            if v not in pending:
                continue
            j = i - op.params["num_consts"] - op.params["num_carry"] if pipelined else -1
            if layout is not None and j >= 0 and layout.xs[j] == pending[v].dim + 1:
                kept[i] = pending[v]
            else:
                whole(v, op.loc)
        if any(v in renamed for v in op.operands):
            op = dataclasses.replace(op, operands=[renamed.get(v, v) for v in op.operands])
        if layout is None:
            ops.append(op)
            if _per_layer(op, layered, n_layers):
                layered.add(op.results[0])
            continue
        made = gpipe(op, layout, stages, m, kept)
        ops += made.ops
        for k, (v, new) in enumerate(zip(op.results, made.results, strict=True)):
            layered.add(v)
            if new is None:
                pending[v] = made.kept[k]
            else:
                renamed[v] = new
        found += 1
    for v in fn.results:
        if v in pending:
            whole(v, Location("<return>", 0))
    return ops, [renamed.get(v, v) for v in fn.results], found


def _per_layer(op: Op, layered: set[Value], n_layers: int) -> bool:
    """Whether op makes a value of the layers layer by layer from the layers it reads:
    its result's dimension 0 and theirs are one pass-through factor of its rule (a cast
    of the stacked parameters to another precision, a scale), so the scan reading its
    result reads the layers (and the stages tiling them propagate to it alike)."""
    if op.regions or len(op.results) != 1 or not layered.intersection(op.operands):
        return False
    declared = CATALOGUE.get(op.name)
    if declared is None or declared.rule is None or declared.positional:
        return False
    (result,) = op.results
    if not result.type.rank or result.type.shape[0] != n_layers:
        return False
    rule = declared.rule(OpView.of(op))
    lead = rule.results[0][0]
    if len(lead) != 1 or rule.factors[lead[0]].kind != PASS:
        return False
    (f,) = lead
    # Every operand with the factor has it as its own dimension 0, and is of the layers.
    return all(dims and dims[0] == (f,) and v in layered
               for v, dims in zip(op.operands, rule.operands, strict=True)
               if any(f in d for d in dims))


def _over_layers(op: Op, layered: set[Value], n_layers: int) -> bool:
    if op.name != "scan" or op.params["length"] != n_layers:
        return False
    scanned = op.operands[op.params["num_consts"] + op.params["num_carry"]:]
    return any(v in layered for v in scanned)


def _tags(ops: Sequence[Op]) -> dict[str, list[Value]]:
    """Each tag's values in program order, those in regions too (as the frontend keeps
    them)."""
    tags: dict[str, list[Value]] = {}
    for op in ops:
        for o in (op, *(inner for inner, _ in region_ops(op))):
            if o.name == TAG:
                tags.setdefault(o.params["name"], []).append(o.results[0])
    return tags
