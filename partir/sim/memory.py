"""Which values of a device-local program get a buffer, and the peak bytes per device.

Fusion heuristic (what XLA's fusion passes do to elementwise chains, simplified):
* reshapes, squeezes, `tag`s and other FREE ops are bitcasts: their result is their
  operand's buffer;
* the result of a fusible producer (elementwise op, broadcast, iota, scalar constant,
  transpose, slice, pad, concatenate, all_slice) gets no buffer when every consumer is
  fusible too (those producers, or a reduction) and either there is one consumer (an
  elementwise chain fuses into one loop) or the producer is cheap (XLA duplicates cheap
  producers into every consumer rather than store them; it does not duplicate
  transcendentals such as exp, log, tanh, rsqrt). The fused consumer then reads the
  buffers the fused producers read. Where the device runs large reductions as library
  calls (`DeviceSpec.library_reduction_elements`: XLA's CPU backend and YNNPACK), a
  producer such a call reads, directly or through a chain of single-consumer producers,
  is materialized when it has other consumers;
* everything else is materialized: matmuls, gathers, scatters, collectives, values used
  by several consumers or by a non-fusible one, and the program's results.

Common subexpressions. XLA's CSE merges a collective identical to an earlier one (same
operand, same axes): the ZeRO-3 re-gather of a parameter for the backward pass is the
forward's gather, whose buffer then stays live from the forward to the backward. Such a
collective is the earlier one's buffer here (no kernel, no traffic), which is what
XLA's buffer assignment shows: every gathered parameter live across the step.

Live ranges. XLA allocates the arguments, the results and one pool of temporaries before
the program runs, so

    peak = arguments + results + peak of the live temporaries,

which is what `compiled.memory_analysis()` reports as argument + output + temp sizes
(without donation).

Schedule. A temporary is live from the kernel that writes it to the last kernel that
reads it (directly or through fused producers), in the order XLA's CPU scheduler runs
them: breadth first, each kernel as soon as the kernels it reads from have run
(`_breadth_first`), which is not the program order (a ZeRO-3 gather runs at the start; a
weight's gradient and its update right after the backward step that yields them). A
group of collectives XLA combines (`DeviceSpec.combined_collectives`) is one step, run
once all its operands are written. Where XLA's order among kernels ready together cannot
be predicted, the one freeing the fewest bytes runs first (the safe side).

Buffers. An op's result may reuse the buffer of an operand of the same size whose last
read is that op, when the op is fusible (XLA's in-place buffer sharing for elementwise
users). Constants are part of the executable, not temporaries. XLA's buffer assignment
puts temporaries into the results' allocations, largest first, each into the smallest
one whose result is written after it dies (`_into_results`); the rest share the pool,
whose peak over the steps is the temp bytes. A gather or reduce-scatter along an inner
dimension also needs a transposed copy while it runs (`_layout_copy_bytes`), a loop or a
branch its region's buffers (`_region_bytes`); a broadcast constant that only loops read
has no buffer outside them (XLA sinks it into their bodies, `_sunk_into_loops`). A
matmul operand that XLA's dot canonicalization transposes gets a copy
(`_dot_operand_copies`): a weight read in another layout by the backward pass is
transposed once, at the start, and the copy lives until the last matmul reading it; a
loop fusion writes its result in the layout a matmul wants at once. Ops whose results
nobody reads are dead code, which XLA removes: they cost nothing.

Checked against XLA's schedule and buffer assignment (the dumps of `--xla_dump_to`) on
the programs of `benchmarks/simulator_accuracy.py`. Not modelled: the bitcasts and tuple
accesses that delay their users by a step of the breadth-first walk.
"""

from __future__ import annotations

import bisect
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from partir.ir import Function, Op, Region, TensorType, Value
from partir.ir.dtypes import itemsize
from partir.ir.monoids import MONOIDS
from partir.ir.opnames import CONSTANT
from partir.rules.catalogue import data_flow
from partir.sim.collectives import Combiner
from partir.sim.cost import (
    COST_RULES,
    FUSIBLE_CONSUMERS,
    FUSIBLE_PRODUCERS,
    UNKNOWN_RULE,
    CostRule,
    Kind,
)

DOT_GENERAL = "dot_general"

# (elements, bytes) of a value's type.
SizesFn = Callable[[TensorType], tuple[int, int]]


def size_table() -> SizesFn:
    """A memoized (elements, bytes) of a type: programs repeat a few types many times.
    Keyed by identity, which is cheaper than hashing the type, and safe as the table
    keeps every type it has seen alive (their ids are not reused)."""
    cache: dict[int, tuple[int, int]] = {}
    seen: list[object] = []

    def sizes(t: TensorType) -> tuple[int, int]:
        found = cache.get(id(t))
        if found is None:
            n = 1
            for d in t.shape:
                n *= d
            found = (n, n * itemsize(t.dtype))
            cache[id(t)] = found
            seen.append(t)
        return found

    return sizes


@dataclass
class BufferPlan:
    """What the fusion heuristic and the live-range analysis found, per op index."""

    rules: list[CostRule]  # per op: UNKNOWN_RULE where its primitive has none
    kinds: list[Kind]  # per op
    live: list[bool]  # per op: False for dead ops and FREE ops (no kernel)
    kernel: list[bool]  # per op: it launches a kernel (a materialized fusion root)
    # Per op: the first collective of the group XLA's combiners merge it into, the op
    # itself for every other op (`Combiner`).
    group: list[int]
    op_bytes: list[int]  # per op: bytes of the buffers it reads and writes
    argument_bytes: int
    output_bytes: int
    temp_bytes: int  # peak of the live temporaries
    peak_op: int  # index of the op at which the temporaries peak (-1: none)
    # With explain=True: (bytes, index of the op writing it) of the temporaries at the peak.
    at_peak: list[tuple[int, int]]

    @property
    def peak_bytes(self) -> int:
        return self.argument_bytes + self.output_bytes + self.temp_bytes


def plan_buffers(fn: Function, sizes: SizesFn | None = None, *,
                 library_reduction_elements: int | None = None,
                 combined_collectives: frozenset[str] = frozenset(),
                 explain: bool = False) -> BufferPlan:
    """The buffer plan of `fn`; `explain` also lists the temporaries live at the peak.
    `library_reduction_elements` and `combined_collectives` are the device's
    `DeviceSpec` fields of those names."""
    sizes = sizes or size_table()
    ops = fn.ops
    n_ops = len(ops)
    # Each op's rule, resolved here once for the simulator too (`BufferPlan.rules`).
    rule_of = COST_RULES.get
    rules = [rule_of(op.name, UNKNOWN_RULE) for op in ops]
    kinds = [rule.primitive.kind for rule in rules]

    # Pass 1: buffers (FREE results are their operand's buffer, a repeated collective's
    # the first one's) and their consumers' kinds.
    root: dict[Value, Value] = {}
    consumers: dict[Value, list[Kind]] = {}
    producer: dict[Value, int] = {}
    collectives: dict[tuple, Op] = {}
    repeated = [False] * n_ops
    loop_reads: dict[Value, int] = {}  # buffer -> how many loops read it
    for i, op in enumerate(ops):
        kind = kinds[i]
        if kind is Kind.FREE and op.operands and isinstance(op.operands[0].type, TensorType):
            base = op.operands[0]
            base = root.get(base, base)
            for r in op.results:
                root[r] = base
            continue
        if kind is Kind.COLLECTIVE:
            key = (op.name, tuple(root.get(u, u) for u in op.operands),
                   tuple(sorted((k, _frozen(v)) for k, v in op.params.items())))
            first = collectives.setdefault(key, op)
            if first is not op:
                repeated[i] = True
                for r, f in zip(op.results, first.results, strict=True):
                    root[r] = root.get(f, f)
                continue
        for r in op.results:
            producer[r] = i
        for u in op.operands:
            consumers.setdefault(root.get(u, u), []).append(kind)
        if op.regions and not data_flow(op).alternatives:
            for u in op.operands:
                b = root.get(u, u)
                loop_reads[b] = loop_reads.get(b, 0) + 1

    outputs = {root.get(v, v) for v in fn.results}
    reduced = (set() if library_reduction_elements is None else
               _library_reduced(ops, kinds, root, consumers, sizes,
                                library_reduction_elements))

    # Pass 2: per op, the materialized buffers it reads (through fused producers), the
    # bytes it moves, and the last reader of every buffer.
    reads: list[tuple[Value, ...]] = [()] * n_ops
    sources: dict[Value, tuple[Value, ...]] = {}  # fused value -> buffers it reads
    live = [False] * n_ops
    kernel = [False] * n_ops
    op_bytes = [0] * n_ops
    transient = [0] * n_ops  # bytes an op needs only while it runs
    for i, op in enumerate(ops):
        kind = kinds[i]
        # Dead: no result is read or returned (set tests in C rather than a generator).
        if kind is Kind.FREE or repeated[i] or (consumers.keys().isdisjoint(op.results)
                                 and outputs.isdisjoint(op.results)):
            continue
        live[i] = True
        direct = 0
        read: list[Value] = []
        for u in op.operands:
            b = root.get(u, u)
            src = sources.get(b)
            if src is None:
                read.append(b)
                direct += sizes(b.type)[1]
            else:
                read.extend(src)
        written = 0
        # Whether each result is fused into its consumers: a fusible producer's, not
        # returned, read by fusible consumers only, and by one or cheap to repeat; or a
        # constant broadcast that loops alone read, which XLA moves into their bodies.
        fusible = kind in FUSIBLE_PRODUCERS
        for r in op.results:
            users = consumers.get(r) if fusible else None
            if users and r not in outputs and (
                    (FUSIBLE_CONSUMERS.issuperset(users)
                     and (len(users) == 1 or (not rules[i].primitive.expensive
                                              and r not in reduced)))
                    or _sunk_into_loops(op, r, ops, producer, loop_reads, users)):
                sources[r] = tuple(dict.fromkeys(read))
            else:
                written += sizes(r.type)[1]
                kernel[i] = True
        op_bytes[i] = direct + written
        if op.name in _DIM_COLLECTIVES:
            transient[i] = _layout_copy_bytes(op, sizes)
        elif op.regions:
            # A loop's or a branch's own buffers, while it runs.
            transient[i] = max(_region_bytes(op, r, sizes, library_reduction_elements,
                                             combined_collectives) for r in op.regions)
        reads[i] = tuple(read)

    # Pass 3: the temporaries live in the order XLA's scheduler runs the kernels, a
    # combined group of collectives as one step; those that fit in a result's allocation
    # before its writer runs go there, the others to the pool.
    group = _combined_groups(ops, kinds, live, combined_collectives)
    steps = _breadth_first(kernel, reads, producer, group, outputs, sizes)
    position: dict[int, int] = {}
    last_read: dict[Value, int] = {}
    for t, step in enumerate(steps):
        for i in step:
            position[i] = t
            for b in reads[i]:
                last_read[b] = t
    temporaries = _temporaries(ops, steps, kinds, reads, last_read, sources, consumers,
                               outputs, sizes)
    temporaries += _dot_operand_copies(ops, live, root, producer, kinds, consumers,
                                       position, outputs, transient, sizes)
    _into_results(temporaries, [(sizes(v.type)[1], position[producer[v]], producer[v])
                                for v in outputs if producer.get(v, -1) in position],
                  _post_order([root.get(v, v) for v in fn.results], reads, producer))
    peak, peak_op, at_peak = _pool_peak(temporaries, steps, transient, explain)
    argument_bytes = sum(sizes(a.type)[1] for a in fn.args)
    output_bytes = sum(sizes(v.type)[1] for v in outputs)
    return BufferPlan(rules, kinds, live, kernel, group, op_bytes, argument_bytes,
                      output_bytes, peak, peak_op, at_peak)


def _sunk_into_loops(op: Op, r: Value, ops: list[Op], producer: dict[Value, int],
                     loop_reads: dict[Value, int], users: list[Kind]) -> bool:
    """Whether r, a constant broadcast only loops read, is one XLA moves into their bodies
    (`WhileLoopConstantSinking`), where it fuses into its readers: no buffer outside."""
    if op.name != "broadcast_in_dim" or loop_reads.get(r, 0) != len(users):
        return False
    j = producer.get(op.operands[0], -1)
    return j >= 0 and ops[j].name == CONSTANT


def _region_bytes(op: Op, region: Region, sizes: SizesFn,
                  library_reduction_elements: int | None,
                  combined_collectives: frozenset[str]) -> int:
    """The bytes a region needs while its op runs: its temporaries' peak and, for a scan,
    the per-iteration values it stacks that get a buffer of their own before XLA's
    dynamic-update-slice copies them into the stacked results (those a kernel other
    than a fusible producer writes, or that other ops read too: a fusible producer
    stacked only is fused into that copy). A new carry takes the old one's buffer."""
    plan = plan_buffers(Function("region", region.args, region.ops, region.yields), sizes,
                        library_reduction_elements=library_reduction_elements,
                        combined_collectives=combined_collectives)
    flow = data_flow(op)
    stacked_yields = [region.yields[e.position] for e in (flow.exits if flow else ())
                      if e.lead and op.regions[e.region] is region]
    if not stacked_yields:
        return plan.temp_bytes
    writer = {r: i for i, inner in enumerate(region.ops) for r in inner.results}
    read = {u for inner in region.ops for u in inner.operands}
    stacked = 0
    for y in dict.fromkeys(stacked_yields):
        i = writer.get(y)
        while i is not None and plan.kinds[i] is Kind.FREE:  # a view of its operand
            y = region.ops[i].operands[0]
            i = writer.get(y)
        if i is not None and (plan.kinds[i] not in FUSIBLE_PRODUCERS or y in read):
            stacked += sizes(y.type)[1]
    return plan.temp_bytes + stacked


def _combined_groups(ops: list[Op], kinds: list[Kind], live: list[bool],
                     combined: frozenset[str]) -> list[int]:
    """`BufferPlan.group`: the live collectives of the `combined` kinds grouped the way
    XLA's combiners merge them."""
    group = list(range(len(ops)))
    if not combined:
        return group
    combiner = Combiner(combined)
    first: dict[int, int] = {}  # group id -> its first collective
    for i, op in enumerate(ops):
        merged = combiner.visit(op)
        if kinds[i] is not Kind.COLLECTIVE:
            combiner.propagate(op, merged)
        elif live[i]:  # not dead, nor a repeat XLA merges with the first
            g = combiner.join(op, merged)
            if g >= 0:
                group[i] = first.setdefault(g, i)
    return group


def _breadth_first(kernel: list[bool], reads: list[tuple[Value, ...]],
                   producer: dict[Value, int], group: list[int], outputs: set[Value],
                   sizes: SizesFn) -> list[list[int]]:
    """The kernels in the order of XLA's CPU scheduler (its BFS scheduler, the default
    while `xla_cpu_enable_concurrency_optimized_scheduler` is), as steps: a kernel runs
    once the kernels writing the buffers it reads have, first come first served, so
    every kernel runs as early as its inputs allow. A combined group of collectives is
    one step, run once every member's inputs are ready (a step's gradient all_reduces
    after the whole backward pass).

    XLA queues the kernels that one kernel makes ready in the order of its users list,
    which its passes rewrite beyond prediction; here they queue by the bytes of the
    temporaries they are the last to read, fewest first (program order among equals), so
    that a buffer lives as long as an order of theirs can keep it (the gathered weight a
    backward step reads stays live while the weight's gradient is computed beside it).
    XLA's GPU and TPU schedulers minimize memory instead, which this order tends to
    over-estimate: the safe side."""
    members: dict[int, list[int]] = {}  # step (its first kernel) -> its kernels
    for i, runs in enumerate(kernel):
        if runs:
            members.setdefault(group[i], []).append(i)
    users: dict[int, list[int]] = {}
    waiting: dict[int, int] = {}
    ready: deque[int] = deque()
    temporaries: dict[int, set[Value]] = {}  # step -> the temporaries it reads
    readers: dict[Value, int] = {}  # temporary -> steps reading it not yet run
    for step, kernels in members.items():
        # Buffers no kernel writes (arguments, an axis index) are there from the start.
        inputs = set()
        temporaries[step] = read = set()
        for i in kernels:
            for b in reads[i]:
                j = producer.get(b, -1)
                if j >= 0 and kernel[j]:
                    inputs.add(group[j])
                    if b not in outputs:
                        read.add(b)
        for b in read:
            readers[b] = readers.get(b, 0) + 1
        inputs.discard(step)
        waiting[step] = len(inputs)
        for j in inputs:
            users.setdefault(j, []).append(step)
        if not inputs:
            ready.append(step)

    def freed(step: int) -> int:
        return sum(sizes(b.type)[1] for b in temporaries[step] if readers[b] == 1)

    steps = []
    while ready:
        step = ready.popleft()
        steps.append(members[step])
        for b in temporaries[step]:
            readers[b] -= 1
        now = []
        for j in users.get(step, ()):
            waiting[j] -= 1
            if not waiting[j]:
                now.append(j)
        ready.extend(sorted(now, key=freed) if len(now) > 1 else now)
    if len(steps) < len(members):
        # Groups that wait on each other (`Combiner` tracks dependencies per kind and
        # axes only, XLA's combiners never form such groups): the collectives run alone.
        return _breadth_first(kernel, reads, producer, list(range(len(kernel))), outputs,
                              sizes)
    return steps


_LIBRARY_REDUCTIONS = frozenset(MONOIDS[m].reduce for m in ("add", "max", "min"))


def _library_reduced(ops: list[Op], kinds: list[Kind], root: dict[Value, Value],
                     consumers: dict[Value, list[Kind]], sizes: SizesFn,
                     threshold: int) -> set[Value]:
    """The values a library reduction's fusion reads: the operands of a float32 sum, max
    or min of at least `threshold` elements, and those of a fusible producer whose one
    consumer is such a fusion. XLA forms those fusions before its loop fusions and does
    not repeat a producer with other consumers into them, so such a producer is
    materialized however cheap it is (a layer norm's `x - mean`, read by the variance's
    sum and by the normalization)."""
    reduced: set[Value] = set()
    for i in range(len(ops) - 1, -1, -1):
        op, kind = ops[i], kinds[i]
        if kind is Kind.REDUCTION:
            x = op.operands[0]
            if (op.name in _LIBRARY_REDUCTIONS and x.type.dtype == np.float32
                    and sizes(x.type)[0] >= threshold):
                reduced.update(root.get(u, u) for u in op.operands)
        elif (kind in FUSIBLE_PRODUCERS and len(op.results) == 1
                and op.results[0] in reduced and len(consumers[op.results[0]]) == 1):
            reduced.update(root.get(u, u) for u in op.operands)
    return reduced


_DIM_COLLECTIVES = frozenset({"hlo.all_gather", "hlo.reduce_scatter"})


def _layout_copy_bytes(op: Op, sizes: SizesFn) -> int:
    """The copy XLA's layout assignment makes for a gather or reduce-scatter along a
    dimension that is not the outermost one of size > 1: the collective works on the
    split dimension made major, so the larger side of it exists transposed as well."""
    shape = op.operands[0].type.shape
    split = [d for d, axes in enumerate(op.params["axes"]) if axes]
    if not split or all(n == 1 for n in shape[:split[0]]):
        return 0
    return max(sizes(op.operands[0].type)[1], sizes(op.results[0].type)[1])


def _transposed_operands(op: Op) -> list[tuple[int, tuple[int, ...]]]:
    """(operand index, the order of its dimensions in the copy) of each operand of a
    dot_general that XLA's CPU pipeline copies into another layout. An operand is
    canonical with one contracting dimension, at most one free one and the batch
    dimensions leading; where either is not, `DotDecomposer` transposes both, the lhs to
    [batch, free, contracting] and the rhs to [batch, contracting, free], and the transpose
    stays a copy unless it is the identity or, with one free and one contracting
    dimension, a swap of the two, which `TransposeFolding` folds into the matmul call.
    Dimensions of size 1 are left out: moving them is a bitcast."""
    copies, canonical = [], True
    for side, (u, contracting, batch) in enumerate(zip(
            op.operands, *op.params["dimension_numbers"], strict=True)):
        shape = u.type.shape
        kept = [d for d in range(len(shape)) if shape[d] > 1]
        con = [d for d in contracting if shape[d] > 1]
        bat = [d for d in batch if shape[d] > 1]
        free = [d for d in kept if d not in con and d not in bat]
        leading = kept[:len(bat)] == bat
        canonical &= len(con) <= 1 and len(free) <= 1 and leading
        order = bat + (free + con if side == 0 else con + free)
        if kept != order and not (len(con) == 1 and len(free) == 1 and leading):
            copies.append((side, tuple(order)))
    return [] if canonical else copies


def _dot_operand_copies(ops: list[Op], live: list[bool], root: dict[Value, Value],
                        producer: dict[Value, int], kinds: list[Kind],
                        consumers: dict[Value, list[Kind]], position: dict[int, int],
                        outputs: set[Value], transient: list[int],
                        sizes: SizesFn) -> list[_Temporary]:
    """The transposed copies XLA's layout assignment makes of matmul operands
    (`_transposed_operands`), one per buffer and order however many matmuls read it
    (CSE), made once the buffer is written (an argument's at the start, as the
    breadth-first scheduler runs it) and live to the last matmul reading it: a weight
    transposed for the backward pass lives from the start of the step.

    A loop fusion writes its result in the layout its readers want, elementwise ones and
    reductions taking any: one order a matmul wants comes free unless a matmul reads the
    buffer as it is too (or it is a result of the program). A buffer another kernel
    writes, which only matmuls reading one copy consume, exists twice only while the copy
    is made (`transient`)."""
    wanted: dict[Value, dict[tuple, list[int]]] = {}  # buffer -> (view, order) -> matmuls
    as_is: set[Value] = set()  # buffers a matmul reads in their own layout
    for i, op in enumerate(ops):
        if live[i] and op.name == DOT_GENERAL:
            copied = dict(_transposed_operands(op))
            for side, u in enumerate(op.operands):
                b = root.get(u, u)
                if side in copied:
                    wanted.setdefault(b, {}).setdefault((u.type.shape, copied[side]),
                                                        []).append(i)
                else:
                    as_is.add(b)
    copies = []
    for b, orders in wanted.items():
        nbytes = sizes(b.type)[1]
        writer = producer.get(b)
        # (last step, first matmul, matmul reads) of each copy: the copy is an operand of
        # its first matmul, there in XLA's post-order.
        spans = sorted((max(position[i] for i in dots), dots[0], len(dots))
                       for dots in orders.values())
        if writer is not None and b not in outputs:
            if kinds[writer] in FUSIBLE_PRODUCERS:
                if b not in as_is:
                    spans.pop(0)  # written in that order: the shortest-lived comes free
            elif len(spans) == 1 and len(consumers[b]) == spans[0][2]:
                transient[writer] += nbytes
                continue
        start = 0 if writer is None else position.get(writer, 0)
        copies.extend(_Temporary(nbytes, start, end, first, None) for end, first, _ in spans)
    return copies


def _frozen(v: object) -> object:
    """A collective's parameter, hashable: its axes come as lists or tuples."""
    if isinstance(v, list | tuple):
        return tuple(_frozen(x) for x in v)
    return v


@dataclass(eq=False)
class _Temporary:
    """A temporary value, live from the step that writes it to the step that last reads
    it, and where its bytes are: a result's allocation (`hosted`, the temporaries there)
    or the pool (None)."""

    nbytes: int
    start: int
    end: int
    op: int  # the op writing it
    donor: _Temporary | None  # the operand whose buffer it takes in place, if any
    heir: _Temporary | None = None  # the result that takes its buffer in place, if any
    hosted: _Allocation | None = None

    def overlaps(self, other: _Temporary) -> bool:
        # In place, the operand's last step is its heir's first: one buffer, no overlap.
        return (other is not self.donor and other is not self.heir
                and self.start <= other.end and other.start <= self.end)


def _temporaries(ops: list[Op], steps: list[list[int]], kinds: list[Kind],
                 reads: list[tuple[Value, ...]], last_read: dict[Value, int],
                 sources: dict[Value, tuple[Value, ...]], consumers: dict[Value, list[Kind]],
                 outputs: set[Value], sizes: SizesFn) -> list[_Temporary]:
    """The temporaries, in schedule order. A fusible producer's result may take the buffer
    of an operand of its size whose last read is that step (XLA's in-place sharing for
    elementwise users)."""
    temporaries: list[_Temporary] = []
    temporary: dict[Value, _Temporary] = {}
    for t, step in enumerate(steps):
        dying: list[_Temporary] | None = None  # found once a fusible producer asks
        for i in step:
            op = ops[i]
            for r in op.results:
                if r in sources or r in outputs or r not in consumers or op.name == CONSTANT:
                    continue
                nbytes = sizes(r.type)[1]
                donor = None
                if kinds[i] in FUSIBLE_PRODUCERS:
                    if dying is None:
                        # In read order, not a set: the donor must not depend on hashes.
                        read = reads[i] if len(step) == 1 else [b for j in step
                                                                 for b in reads[j]]
                        dying = [temporary[b] for b in dict.fromkeys(read)
                                 if b in temporary and last_read[b] == t]
                    donor = next((d for d in dying if d.nbytes == nbytes), None)
                    if donor is not None:
                        dying.remove(donor)
                temporary[r] = x = _Temporary(nbytes, t, last_read.get(r, t), i, donor)
                if donor is not None:
                    donor.heir = x
                temporaries.append(x)
    return temporaries


@dataclass(eq=False)
class _Allocation:
    """A result's allocation: the temporaries it hosts before its writer's step, which
    overlap none of each other's steps but an in-place pair's shared one, so sorted by
    their first steps they are sorted by their last too."""

    written: int
    starts: list[int] = field(default_factory=list)
    hosted: list[_Temporary] = field(default_factory=list)

    def take(self, x: _Temporary) -> bool:
        """Host `x` if it dies before the result is written and overlaps none of the
        temporaries here (those starting by its last step and ending from its first)."""
        if self.written <= x.end:
            return False
        k = bisect.bisect_right(self.starts, x.end)
        j = k - 1
        while j >= 0 and self.hosted[j].end >= x.start:
            if x.overlaps(self.hosted[j]):
                return False
            j -= 1
        self.starts.insert(k, x.start)
        self.hosted.insert(k, x)
        x.hosted = self
        return True


def _into_results(temporaries: list[_Temporary], results: list[tuple[int, int, int]],
                  post: list[int]) -> None:
    """XLA's buffer assignment of temporaries to the results' allocations, which it makes
    before the run: from the largest temporary down, each goes to its in-place donor's
    allocation if it may, else to the smallest allocation it fits in (`_Allocation.take`),
    trying allocations of equal size from the last created. XLA orders values of equal
    size, and so creates the allocations, by their writers' places in the program's
    post-order, `post`. `results`: (bytes, writer's step, writer) of each result. Sets
    `_Temporary.hosted`; the others stay in the pool."""
    by_size: dict[int, list[_Allocation]] = {}  # last created first
    for nbytes, step, _ in sorted(results, key=lambda r: -post[r[2]]):
        by_size.setdefault(nbytes, []).append(_Allocation(step))
    sizes = sorted(by_size)
    for x in sorted(temporaries, key=lambda x: (-x.nbytes, post[x.op])):
        d = x.donor
        if d is not None and d.hosted is not None and d.hosted.take(x):
            continue
        for n in sizes[bisect.bisect_left(sizes, x.nbytes):]:
            if any(a.take(x) for a in by_size[n] if a.written > x.end):
                break


def _post_order(results: list[Value], reads: list[tuple[Value, ...]],
                producer: dict[Value, int]) -> list[int]:
    """Each kernel's place in the post-order of a depth-first walk from the results
    through the buffers each reads, in order (XLA's `MakeInstructionPostOrder` over the
    fused program); other ops come last."""
    n = len(reads)
    post = [n] * n
    count = 0
    for v in results:
        i = producer.get(v)
        if i is None or post[i] < n:
            continue
        post[i] = -1  # on the walk's stack
        stack = [(i, iter(reads[i]))]
        while stack:
            j, inputs = stack[-1]
            for b in inputs:
                k = producer.get(b)
                if k is not None and post[k] == n:
                    post[k] = -1
                    stack.append((k, iter(reads[k])))
                    break
            else:
                stack.pop()
                post[j] = count
                count += 1
    return post


def _pool_peak(temporaries: list[_Temporary], steps: list[list[int]],
               transient: list[int], explain: bool) -> tuple[int, int, list[tuple[int, int]]]:
    """(peak bytes, the last op of its step, and with `explain` the (bytes, writer) of
    the pool's temporaries then) of the temporaries' pool: those live at a step and the
    transposed copies its collectives need while they run; (0, -1, []) for no step."""
    change = [0] * (len(steps) + 1)
    pool = []
    for x in temporaries:
        if x.hosted is None:
            # An operand whose heir takes its buffer in place is its heir from that step.
            end = x.end - 1 if x.heir is not None and x.heir.hosted is None else x.end
            change[x.start] += x.nbytes
            change[end + 1] -= x.nbytes
            pool.append((x, end))
    live = peak = 0
    peak_step = -1
    for t, step in enumerate(steps):
        live += change[t]
        now = live + sum(transient[i] for i in step)
        if now > peak:
            peak, peak_step = now, t
    if peak_step < 0:
        return 0, -1, []
    at_peak = sorted(((x.nbytes, x.op) for x, end in pool if x.start <= peak_step <= end),
                     reverse=True) if explain else []
    return peak, steps[peak_step][-1], at_peak
