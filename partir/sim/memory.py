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
(without donation). A temporary is live from the kernel that writes it to the last kernel
that reads it (directly or through fused producers), in the order XLA's CPU scheduler runs
them: breadth first, each kernel as soon as the kernels it reads from have run
(`_breadth_first`), which is not the program order (a ZeRO-3 gather runs at the start; a
weight's gradient and its update right after the backward step that yields them). An
op's result may reuse the buffer of an operand of the same size whose last read is that
op, when the op is fusible (XLA's in-place buffer sharing for elementwise users).
Constants are part of the executable, not temporaries. A gather or reduce-scatter along an
inner dimension also needs a transposed copy while it runs (`_layout_copy_bytes`). Ops
whose results nobody reads are dead code, which XLA removes: they cost nothing.
Temporaries may live in the results' allocations before their writers run (`_Scan`).

Checked against XLA's buffer assignment and schedule (the dumps of `--xla_dump_to`) on the
programs of `benchmarks/simulator_accuracy.py`. Kernels that become ready together keep
their program order, which stands in for the order of XLA's instruction lists, and XLA's
bitcasts and tuple accesses, which delay their users by a step of the breadth-first walk,
are not modelled.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from partir.ir import Function, Op, TensorType, Value
from partir.ir.dtypes import itemsize
from partir.ir.monoids import MONOIDS
from partir.ir.opnames import CONSTANT
from partir.sim.cost import (
    COST_RULES,
    FUSIBLE_CONSUMERS,
    FUSIBLE_PRODUCERS,
    UNKNOWN_RULE,
    CostRule,
    Kind,
)

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
                 explain: bool = False) -> BufferPlan:
    """The buffer plan of `fn`; `explain` also lists the temporaries live at the peak.
    `library_reduction_elements` is the device's `DeviceSpec` field of that name."""
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
        # returned, read by fusible consumers only, and by one or cheap to repeat.
        fusible = kind in FUSIBLE_PRODUCERS
        for r in op.results:
            users = consumers.get(r) if fusible else None
            if (users and r not in outputs
                    and FUSIBLE_CONSUMERS.issuperset(users)
                    and (len(users) == 1 or (not rules[i].primitive.expensive
                         and r not in reduced))):
                sources[r] = tuple(dict.fromkeys(read))
            else:
                written += sizes(r.type)[1]
                kernel[i] = True
        op_bytes[i] = direct + written
        if op.name in _DIM_COLLECTIVES:
            transient[i] = _layout_copy_bytes(op, sizes)
        reads[i] = tuple(read)

    # Pass 3: the temporaries live in the order XLA's scheduler runs the kernels; a
    # result's allocation is free until its writer runs.
    order = _breadth_first(kernel, reads, producer)
    position: dict[int, int] = {}
    last_read: dict[Value, int] = {}
    for t, i in enumerate(order):
        position[i] = t
        for b in reads[i]:
            last_read[b] = t
    allocations = [_ResultAllocation(sizes(v.type)[1], position[w], frozenset(reads[w]))
                   for v, w in sorted(((v, producer.get(v, -1)) for v in outputs),
                                      key=lambda vw: vw[1]) if w >= 0]
    scan = _Scan(ops, order, kinds, reads, last_read, sources, consumers, outputs,
                 allocations, transient, sizes)
    peak, peak_op = scan.run()
    at_peak: list[tuple[int, int]] = []
    if explain and peak_op >= 0:
        again = _Scan(ops, order, kinds, reads, last_read, sources, consumers, outputs,
                      allocations, transient, sizes)
        again.run(stop_at=peak_op)
        at_peak = sorted(((sizes(b.type)[1], j) for b, j in again.holder.items()
                          if again.placed.get(b) is None), reverse=True)
    argument_bytes = sum(sizes(a.type)[1] for a in fn.args)
    output_bytes = sum(sizes(v.type)[1] for v in outputs)
    return BufferPlan(rules, kinds, live, kernel, op_bytes, argument_bytes, output_bytes,
                      peak, peak_op, at_peak)


def _breadth_first(kernel: list[bool], reads: list[tuple[Value, ...]],
                   producer: dict[Value, int]) -> list[int]:
    """The kernels in the order of XLA's CPU scheduler (its BFS scheduler, the default
    while `xla_cpu_enable_concurrency_optimized_scheduler` is): a kernel runs once the
    kernels writing the buffers it reads have, first come first served, so every kernel
    runs as early as its inputs allow. Kernels that become ready together keep their
    program order, which stands in for the order of XLA's instruction and user lists.
    XLA's GPU and TPU schedulers minimize memory instead, which this order can only
    over-estimate: the safe side."""
    users: dict[int, list[int]] = {}
    waiting = [0] * len(kernel)
    ready: deque[int] = deque()
    for i, runs in enumerate(kernel):
        if not runs:
            continue
        # Buffers no kernel writes (arguments, an axis index) are there from the start.
        inputs = {j for j in (producer.get(b, -1) for b in reads[i]) if j >= 0 and kernel[j]}
        waiting[i] = len(inputs)
        for j in inputs:
            users.setdefault(j, []).append(i)
        if not inputs:
            ready.append(i)
    order = []
    while ready:
        i = ready.popleft()
        order.append(i)
        for j in users.get(i, ()):
            waiting[j] -= 1
            if not waiting[j]:
                ready.append(j)
    return order


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


def _frozen(v: object) -> object:
    """A collective's parameter, hashable: its axes come as lists or tuples."""
    if isinstance(v, list | tuple):
        return tuple(_frozen(x) for x in v)
    return v


@dataclass(frozen=True)
class _ResultAllocation:
    nbytes: int
    free_until: int  # its writer's place in the schedule: the result's bytes are free before
    writer_reads: frozenset[Value]  # the buffers its writer reads: never placed in it


class _Scan:
    """Walks the kernels in schedule order, allocating and freeing temporaries.

    XLA allocates the results before the run, and its buffer assignment places a
    temporary in a result's allocation when their live ranges do not overlap: a
    result's allocation hosts the temporaries that die before its writer runs, those
    its writer reads excepted. A new temporary first goes to such an allocation with
    room for it (the roomiest one, kept in a heap), and only otherwise to the
    temporaries' pool, whose peak is the reported temp bytes. Times are positions in
    `order`; `last_read` and the allocations' `free_until` are given in them.
    """

    def __init__(self, ops: list, order: list[int], kinds: list[Kind],
                 reads: list[tuple[Value, ...]], last_read: dict[Value, int],
                 sources: dict[Value, tuple[Value, ...]], consumers: dict[Value, list[Kind]],
                 outputs: set[Value], allocations: list[_ResultAllocation],
                 transient: list[int], sizes: SizesFn) -> None:
        self.ops, self.order, self.kinds, self.reads = ops, order, kinds, reads
        self.last_read, self.sources, self.consumers = last_read, sources, consumers
        self.outputs, self.allocations, self.sizes = outputs, allocations, sizes
        self.transient = transient
        self.holder: dict[Value, int] = {}  # live temporary -> op that wrote it
        self.placed: dict[Value, int | None] = {}  # temporary -> result allocation or pool
        self.room = [a.nbytes for a in allocations]  # free bytes, by allocation index
        self.heap = [(-room, k) for k, room in enumerate(self.room)]
        heapq.heapify(self.heap)

    def _fits(self, k: int, b: Value, until: int) -> bool:
        a = self.allocations[k]
        return a.free_until > until and b not in a.writer_reads

    def _place(self, b: Value, nbytes: int, until: int) -> int | None:
        """A result allocation that may hold temporary `b`, last read at op `until`, with
        room for its `nbytes`, taking the room; None if there is none."""
        skipped = []
        found = None
        while self.heap:
            neg, k = self.heap[0]
            if -neg != self.room[k]:  # a stale entry
                heapq.heappop(self.heap)
                continue
            if self.room[k] < nbytes:
                break
            heapq.heappop(self.heap)
            if self._fits(k, b, until):
                found = k
                self.room[k] -= nbytes
                heapq.heappush(self.heap, (-self.room[k], k))
                break
            skipped.append((neg, k))
        for entry in skipped:
            heapq.heappush(self.heap, entry)
        return found

    def _release(self, b: Value) -> int:
        """Free a temporary; the bytes the pool gets back."""
        del self.holder[b]
        w = self.placed.pop(b)
        nbytes = self.sizes(b.type)[1]
        if w is None:
            return nbytes
        self.room[w] += nbytes
        heapq.heappush(self.heap, (-self.room[w], w))
        return 0

    def run(self, stop_at: int | None = None) -> tuple[int, int]:
        current = peak = 0
        peak_op = -1
        sizes, holder, placed = self.sizes, self.holder, self.placed
        for t, i in enumerate(self.order):
            op = self.ops[i]
            # A list in read order, not a set: the donor choice must not depend on hashes.
            dying = [b for b in dict.fromkeys(self.reads[i])
                     if self.last_read.get(b) == t and b in holder]
            for r in op.results:
                if r in self.sources or r in self.outputs or r not in self.consumers \
                        or op.name == CONSTANT:
                    continue
                nbytes = sizes(r.type)[1]
                if self.kinds[i] in FUSIBLE_PRODUCERS:
                    donor = next((b for b in dying if sizes(b.type)[1] == nbytes), None)
                    if donor is not None and (
                            placed[donor] is None
                            or self._fits(placed[donor], r, self.last_read.get(r, t))):
                        # In place: the result takes the operand's buffer.
                        dying.remove(donor)
                        del holder[donor]
                        holder[r] = i
                        placed[r] = placed.pop(donor)
                        continue
                holder[r] = i
                placed[r] = where = self._place(r, nbytes, self.last_read.get(r, t))
                if where is None:
                    current += nbytes
            if current + self.transient[i] > peak:
                peak, peak_op = current + self.transient[i], i
            if i == stop_at:
                break
            for b in dying:
                current -= self._release(b)
        return peak, peak_op
