"""The simulator's formulas on hand-computed cases: FLOPs, collective bytes and times on a
2-axis mesh, collective combining, peak memory, and the device registry."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import partir
from partir.hlo.ops import (
    ALL_REDUCE,
    make_all_gather,
    make_all_reduce,
    make_all_to_all,
    make_collective_permute,
    make_reduce_scatter,
)
from partir.ir import Function, Op, TensorType, Value
from partir.mesh import Mesh
from partir.pipeline import lower
from partir.sim import (
    Cost,
    DeviceSpec,
    LinkSpec,
    UnknownDeviceError,
    collective_cost,
    get_device,
    plan_buffers,
    register_device,
    simulate,
)
from partir.sim.collectives import axis_links

S = jax.ShapeDtypeStruct
F32 = jnp.float32
MESH = {"a": 2, "b": 4}

# A device whose numbers make times easy to compute by hand: 1 GFLOP/s, 1 GB/s memory,
# axis "a" on a slow link, "b" on a fast one.
TOY = DeviceSpec(
    name="toy", matmul_flops={"float32": 1e9}, vector_flops={"float32": 1e9},
    memory_bytes=1 << 20, memory_bandwidth=1e9,
    links={"slow": LinkSpec(1e6, 1e-3), "fast": LinkSpec(1e8, 1e-5)}, default_link="fast",
    kernel_overhead_s=0.0, combined_collectives=frozenset({"all_reduce"}))
TOY_LINKS = {"a": "slow", "b": "fast"}


def hlo(fn, *args, mesh=MESH, schedule=()):
    return lower(partir.core_partition(fn, mesh, list(schedule), *args).program).hlo


# --- FLOPs -----------------------------------------------------------------------------------


def test_matmul_flops():
    # 2 * M * N * K: one multiply and one add per output element and contracted element.
    h = hlo(lambda x, w: x @ w, S((16, 8), F32), S((8, 4), F32))
    assert simulate(h).flops == 2 * 16 * 4 * 8


def test_batched_dot_and_elementwise_flops():
    # einsum bij,bjk->bik: 2 * b * i * k * j; then a tanh of the [3, 5, 2] result.
    h = hlo(lambda x, y: jnp.tanh(jnp.einsum("bij,bjk->bik", x, y)),
            S((3, 5, 7), F32), S((3, 7, 2), F32))
    assert simulate(h).flops == 2 * 3 * 5 * 2 * 7 + 3 * 5 * 2


def test_convolution_and_reduction_flops():
    # [1, 3, 8, 8] * [4, 3, 3, 3] VALID: 4 x 6 x 6 outputs, each 3 x 3 x 3 MACs; then a
    # sum over its 144 elements.
    h = hlo(lambda x, w: jnp.sum(jax.lax.conv_general_dilated(x, w, (1, 1), "VALID")),
            S((1, 3, 8, 8), F32), S((4, 3, 3, 3), F32))
    assert simulate(h).flops == 2 * 144 * 27 + 144


def test_batch_parallel_matmul_divides_flops_and_adds_an_all_reduce():
    def f(x, w):
        return jnp.sum(x @ w)
    args = (S((64, 32), F32), S((32, 16), F32))
    full = simulate(hlo(f, *args, mesh={"a": 8}))
    bp = simulate(hlo(f, *args, mesh={"a": 8},
                      schedule=[partir.ManualPartition({"x": 0}, axis="a")]))
    assert bp.flops * 8 == full.flops
    # The loss's partial sums: one f32 all_reduce over 8 devices, 2 * 7/8 * 4 bytes.
    assert bp.bytes_moved["all_reduce"] == 2 * 7 / 8 * 4 and full.total_bytes_moved == 0


# --- collectives on a 2-axis mesh ------------------------------------------------------------


def x_local() -> Value:
    return Value(TensorType((8, 16), np.dtype("float32")), "x")  # 512 bytes


def cost_of(op, device: DeviceSpec = TOY):
    links = axis_links(device, list(MESH), TOY_LINKS)
    return collective_cost(op, op.operands[0].type.nbytes, MESH, links)


def test_all_reduce_bytes():
    both = cost_of(make_all_reduce(x_local(), ("a", "b")))
    assert both.kind == "all_reduce" and both.bytes_sent == 2 * 7 / 8 * 512
    assert cost_of(make_all_reduce(x_local(), ("b",))).bytes_sent == 2 * 3 / 4 * 512
    assert cost_of(make_all_reduce(x_local(), ("a",))).bytes_sent == 2 * 1 / 2 * 512


def test_all_gather_bytes_and_hierarchical_time():
    c = cost_of(make_all_gather(x_local(), [("a",), ("b",)], MESH))
    # Gathered result: 8 x 512 bytes, of which a device receives (and sends) 7/8.
    assert c.kind == "all_gather" and c.bytes_sent == 7 / 8 * 4096
    # Hierarchically: the big phase on the fast link "b" (3/4 of the 4096 bytes), the
    # small one first on the slow link "a" (1/2 of 4096 / 4), one latency per peer.
    want = 3 / 4 * 4096 / 1e8 + 3 * 1e-5 + 1 / 2 * 1024 / 1e6 + 1 * 1e-3
    assert c.time_s == pytest.approx(want) and c.latency_s == pytest.approx(3e-5 + 1e-3)


def test_a_collective_pays_its_links_setup_once():
    """Starting a collective costs a setup besides the latency per peer (on the CPU the
    devices' threads meet at a rendezvous: 2 devices take about as long as 4 do less
    one peer's latency); over two axes it is still one collective, with the larger
    setup, and combined collectives pay it once, as part of `latency_s`."""
    slow, fast = LinkSpec(1e6, 1e-3, setup_s=5e-3), LinkSpec(1e8, 1e-5, setup_s=2e-5)
    link_of = {"a": slow, "b": fast}
    c = collective_cost(make_all_gather(x_local(), [("a",), ("b",)], MESH), 512, MESH,
                        link_of)
    assert c.latency_s == pytest.approx(5e-3 + 3e-5 + 1e-3)
    assert c.time_s == pytest.approx(3 / 4 * 4096 / 1e8 + 1 / 2 * 1024 / 1e6 + c.latency_s)
    b = collective_cost(make_all_reduce(x_local(), ("b",)), 512, MESH, link_of)
    assert b.latency_s == pytest.approx(2e-5 + 3e-5)
    swap = collective_cost(make_all_to_all(x_local(), 0, 1, ("a", "b"), MESH), 512, MESH,
                           link_of)
    assert swap.latency_s == pytest.approx(5e-3 + 7e-3)
    shift = collective_cost(make_collective_permute(x_local(), ("b",), [(0, 1)]), 512, MESH,
                            link_of)
    assert shift.latency_s == pytest.approx(2e-5 + 1e-5)  # one message: one latency


def test_reduce_scatter_bytes():
    c = cost_of(make_reduce_scatter(x_local(), [("a",), ("b",)], MESH))
    assert c.kind == "reduce_scatter" and c.bytes_sent == 7 / 8 * 512
    assert cost_of(make_reduce_scatter(x_local(), [("a",), ()], MESH)).bytes_sent == 256


def test_all_to_all_bytes_and_time():
    c = cost_of(make_all_to_all(x_local(), 0, 1, ("b",), MESH))
    assert c.kind == "all_to_all" and c.bytes_sent == 3 / 4 * 512
    assert c.time_s == pytest.approx(384 / 1e8 + 3 * 1e-5)
    both = cost_of(make_all_to_all(x_local(), 0, 1, ("a", "b"), MESH))
    # Over both axes: the slowest link's bandwidth and latency.
    assert both.bytes_sent == 7 / 8 * 512
    assert both.time_s == pytest.approx(448 / 1e6 + 7 * 1e-3)


def test_collective_permute_sends_its_operand_one_hop():
    c = cost_of(make_collective_permute(x_local(), ("b",), [(j, (j + 1) % 4) for j in range(4)]))
    assert c.kind == "collective_permute" and c.bytes_sent == 512
    assert c.time_s == pytest.approx(512 / 1e8 + 1e-5)  # one message, one latency
    both = cost_of(make_collective_permute(x_local(), ("a", "b"), [(1, 0)]))
    assert both.time_s == pytest.approx(512 / 1e6 + 1e-3)  # the slowest link's
    assert cost_of(make_collective_permute(x_local(), ("b",), [(0, 0), (1, 1)])).time_s == 0


def test_independent_all_reduces_combine_and_dependent_ones_do_not():
    x, y = x_local(), x_local()
    r1 = make_all_reduce(x, ("b",))
    r2 = make_all_reduce(y, ("b",))  # independent of r1: combined, one latency
    r3 = make_all_reduce(r1.results[0], ("b",))  # reads r1: a new group
    fn = Function("f", [x, y], [r1, r2, r3], [r2.results[0], r3.results[0]],
                  attributes={"mesh": Mesh(MESH), "in_shardings": ((), ()),
                              "out_shardings": ((), ())})
    cost = simulate(fn, TOY, links=TOY_LINKS)
    one = cost_of(r1)
    assert cost.combined_collectives == 1
    assert cost.communication_time_s == pytest.approx(3 * one.time_s - one.latency_s)
    assert cost.bytes_moved["all_reduce"] == 3 * 768
    # A spec that combines nothing pays three latencies.
    apart = simulate(fn, dataclasses.replace(TOY, combined_collectives=frozenset()),
                     links=TOY_LINKS)
    assert apart.communication_time_s == pytest.approx(3 * one.time_s)
    # A runtime that meets once per operand of a combined collective (XLA's CPU) pays
    # every latency although the collectives are combined.
    per_operand = simulate(fn, dataclasses.replace(TOY, combined_latency_once=False),
                           links=TOY_LINKS)
    assert per_operand.combined_collectives == 1
    assert per_operand.communication_time_s == pytest.approx(3 * one.time_s)


def test_cpu_batch_parallel_gradients_pay_a_rendezvous_each():
    """A batch-parallel step's gradient all_reduces are one tuple all-reduce on the CPU,
    whose runtime meets once per operand: each pays its full time."""
    def loss(w, x):
        return jnp.sum(jnp.tanh(x @ w[0]) @ w[1])
    h = hlo(jax.grad(loss), (S((8, 8), F32), S((8, 8), F32)), S((16, 8), F32),
            mesh={"b": 4}, schedule=[partir.ManualPartition({"x": 0}, axis="b")])
    cpu = get_device("cpu")
    link_of = axis_links(cpu, ["b"], None)
    reduces = [op for op in h.ops if op.name == ALL_REDUCE]
    cost = simulate(h, cpu)
    assert len(reduces) == 2 and cost.combined_collectives == 1
    assert cost.communication_time_s == pytest.approx(sum(
        collective_cost(op, 256, {"b": 4}, link_of).time_s for op in reduces))


def test_step_time_adds_compute_and_communication_with_optional_overlap():
    def f(x, w):
        return jnp.sum(x @ w)
    h = hlo(f, S((64, 32), F32), S((32, 16), F32), mesh={"a": 2, "b": 4},
            schedule=[partir.ManualPartition({"x": 0}, axis="b")])
    serial = simulate(h, TOY, links=TOY_LINKS)
    assert serial.step_time_s == pytest.approx(serial.compute_time_s +
                                               serial.communication_time_s)
    hidden = simulate(h, TOY, links=TOY_LINKS, overlap=1.0)
    assert hidden.step_time_s == pytest.approx(max(serial.compute_time_s,
                                                   serial.communication_time_s))
    half = simulate(h, TOY, links=TOY_LINKS, overlap=0.5)
    assert hidden.step_time_s < half.step_time_s < serial.step_time_s
    with pytest.raises(ValueError, match="overlap"):
        simulate(h, TOY, overlap=2.0)
    # The matmul: 2 * 16 * 16 * 32 FLOPs at 1 GFLOP/s vs its 2 + 2 + 1 KiB at 1 GB/s.
    assert serial.flops == 2 * 16 * 16 * 32 + 16 * 16


# --- memory ----------------------------------------------------------------------------------


def test_peak_memory_of_a_small_program():
    def f(x, w):
        y = x @ w  # a temporary, dead before the result is written: in its allocation
        z = jnp.tanh(y)  # read by the op writing the result: needs its own 16 KiB
        return z @ w
    h = hlo(f, S((64, 64), F32), S((64, 64), F32))
    plan = plan_buffers(h, explain=True)
    kib16 = 64 * 64 * 4
    assert plan.argument_bytes == 2 * kib16 and plan.output_bytes == kib16
    assert plan.temp_bytes == kib16 and plan.peak_bytes == 4 * kib16
    assert [h.ops[i].name for _, i in plan.at_peak] == ["tanh"]
    assert simulate(h).peak_memory_bytes == 4 * kib16


def test_elementwise_chain_fuses_and_leaves_no_temporary():
    # exp -> mul -> add -> sum: one fused loop reading x; only the scalar result is written.
    h = hlo(lambda x: jnp.sum(jnp.exp(x) * 2.0 + 1.0), S((256, 256), F32))
    plan = plan_buffers(h)
    assert plan.temp_bytes == 0 and plan.peak_bytes == 256 * 256 * 4 + 4
    cost = simulate(h)
    assert cost.kernels == 1 and cost.bytes_accessed == 256 * 256 * 4 + 4


def test_value_with_two_consumers_of_an_expensive_op_is_materialized():
    # exp(x) feeds a sum and a max: XLA does not compute exp twice, so it is stored.
    def f(x):
        e = jnp.exp(x)
        return jnp.sum(e) + jnp.max(e)
    plan = plan_buffers(hlo(f, S((128, 128), F32)))
    # At the max: exp's 64 KiB, the sum's scalar and the max's scalar.
    assert plan.temp_bytes == 128 * 128 * 4 + 2 * 4


def test_a_repeated_gather_is_the_first_one_kept_live_between():
    """XLA's CSE merges a ZeRO-3 re-gather with the forward's gather: one buffer, live
    from the first use to the last, and one transfer."""
    x = x_local()
    g1 = make_all_gather(x, [("a",), ("b",)], MESH)
    t = Op("tanh", [g1.results[0]], [Value(g1.results[0].type)])
    g2 = make_all_gather(x, [("a",), ("b",)], MESH)  # the same gather, later
    u = Op("mul", [t.results[0], g2.results[0]], [Value(g1.results[0].type)])
    fn = Function("f", [x], [g1, t, g2, u], [u.results[0]],
                  attributes={"mesh": Mesh(MESH), "in_shardings": ((("a",), ("b",)),),
                              "out_shardings": (((), ()),)})
    plan = plan_buffers(fn, explain=True)
    assert plan.live == [True, True, False, True]
    # One gathered buffer (4 KiB), read by the mul that tanh fuses into; two without CSE.
    assert plan.temp_bytes == 4096
    cost = simulate(fn, TOY, links=TOY_LINKS)
    assert cost.bytes_moved["all_gather"] == cost_of(g1).bytes_sent


@pytest.mark.parametrize("axes, copy", [([(), ("b",)], 512), ([("b",), ()], 0)])
def test_a_reduce_scatter_along_an_inner_dimension_needs_a_transposed_copy(axes, copy):
    """XLA makes the scattered dimension major: the 512-byte operand exists transposed
    while the collective runs, unless the dimension is already the outermost one."""
    x = x_local()
    rs = make_reduce_scatter(x, axes, MESH)
    fn = Function("f", [x], [rs], [rs.results[0]],
                  attributes={"mesh": Mesh(MESH), "in_shardings": (((), ()),),
                              "out_shardings": (tuple(tuple(a) for a in axes),)})
    assert plan_buffers(fn).temp_bytes == copy


@pytest.mark.parametrize("spec, w_shape, copy", [
    ("bsd,hkd->bshk", (4, 8, 32), 4096),  # w as [K, N] is [d, (h, k)]: transposed
    ("bsd,dhk->bshk", (32, 4, 8), 0),  # already [d, (h, k)]
    ("bsd,hd->bsh", (32, 32), 0),  # [N, K]: a swap the matmul call takes as it is
])
def test_a_matmul_operand_in_another_layout_gets_a_transposed_copy(spec, w_shape, copy):
    """x has two free dimensions, so XLA canonicalizes the dot: the weight goes to
    [contracting, free], a transposed copy of its 4 KiB unless it is laid out so already
    or one swap away (the temp bytes XLA's `memory_analysis()` reports, 4096, 0, 0)."""
    h = hlo(lambda x, w: jnp.einsum(spec, x, w), S((8, 16, 32), F32), S(w_shape, F32))
    assert plan_buffers(h).temp_bytes == copy


def test_a_loop_fusion_writes_its_result_in_the_layout_a_matmul_wants():
    """tanh(x) [b, s, d] is the rhs of a matmul contracting d, canonically [d, (b, s)]:
    the fusion writing it writes it so, and the sum reading it too reads that layout.
    Only tanh(x)'s 16 KiB, no copy (XLA's temp bytes: 16384)."""
    def f(x, w):
        t = jnp.tanh(x)
        return jax.lax.dot_general(w, t, (((0,), (2,)), ((), ()))), jnp.sum(t, axis=0)
    h = hlo(f, S((8, 16, 32), F32), S((32, 48), F32))
    assert plan_buffers(h).temp_bytes == 8 * 16 * 32 * 4


def test_a_library_reduction_materializes_a_producer_with_other_consumers():
    """A layer norm's x - mean feeds the variance's sum and the normalization: repeated
    into both by loop fusions, stored where the sum is a library call (XLA's CPU and
    YNNPACK from 4096 elements)."""
    def f(x):
        d = x - jnp.mean(x, axis=-1, keepdims=True)
        return d * jax.lax.rsqrt(jnp.mean(d * d, axis=-1, keepdims=True))
    h = hlo(f, S((64, 64), F32))
    sub = next(i for i, op in enumerate(h.ops) if op.name == "sub")
    assert not plan_buffers(h).kernel[sub]
    assert plan_buffers(h, library_reduction_elements=4096).kernel[sub]
    assert not plan_buffers(h, library_reduction_elements=8192).kernel[sub]
    assert get_device("cpu").library_reduction_elements == 4096


def test_a_result_is_written_as_soon_as_its_inputs_are_ready():
    """XLA's CPU scheduler runs a kernel once its inputs are ready (breadth first), so
    sin(x), which needs only an argument, is written first: x @ w and its tanh (in
    place), live after that, cannot use its allocation. 16 KiB of temporaries, what
    `memory_analysis()` reports for this program."""
    def f(x, w):
        a = jnp.sin(x)
        y = x @ w
        return a, jnp.tanh(y) @ w
    h = hlo(f, S((64, 64), F32), S((64, 64), F32))
    assert h.ops[0].name == "sin"
    plan = plan_buffers(h)
    kib16 = 64 * 64 * 4
    assert plan.temp_bytes == kib16 and plan.peak_bytes == 5 * kib16


def test_independent_kernels_run_side_by_side():
    """Breadth first, both matmuls run before either exp's reductions: their 16 KiB
    results (each exp in place) are live together, as in XLA's buffer assignment, where
    program order would reuse one buffer. A ZeRO-3 gather, which needs only an argument,
    likewise runs at the start and stays live through the forward pass."""
    def f(x, w):
        a = jnp.exp(x @ x)
        b = jnp.exp(w @ w)
        return jnp.sum(a) + jnp.max(a), jnp.sum(b) + jnp.max(b)
    plan = plan_buffers(hlo(f, S((64, 64), F32), S((64, 64), F32)), explain=True)
    # The two exps and a scalar reduction (XLA: 32768 bytes, the scalars elsewhere).
    assert sorted(b for b, _ in plan.at_peak) == [4, 64 * 64 * 4, 64 * 64 * 4]


def test_temporaries_fill_the_results_allocations_largest_first():
    """XLA assigns the largest temporaries first, each to the smallest result allocation
    it fits in: y @ y (16 KiB) goes to the 16 KiB result's, x @ x (4 KiB) to the 4 KiB
    one, although x @ x comes first (in program order it would take the larger one and
    leave y @ y no room). Only the two scalar sums need the pool."""
    def f(x, y):
        s = jnp.sum(x @ x) + jnp.sum(y @ y)
        return y * s, x * s
    plan = plan_buffers(hlo(f, S((32, 32), F32), S((64, 64), F32)))
    assert plan.temp_bytes == 2 * 4


def test_kernels_ready_together_run_the_one_freeing_least_first():
    """Once exp(x) is written, both the sum of (w @ w) * exp(x), the last read of w @ w,
    and exp(x) @ exp(x) may run. XLA's order between them follows its users lists, which
    cannot be predicted: the one freeing the fewest bytes runs first, so w @ w stays live
    beside both other 16 KiB matrices (the safe side; the other order needs 32 KiB)."""
    def f(x, w):
        big = w @ w
        p = jnp.exp(x)
        return jnp.sum(big * p) + jnp.sum(jnp.tanh(p @ p))
    plan = plan_buffers(hlo(f, S((64, 64), F32), S((64, 64), F32)))
    assert plan.temp_bytes == 3 * 64 * 64 * 4 + 4


def test_combined_all_reduces_run_together_once_all_their_operands_are_ready():
    """XLA merges the independent all_reduces of a data-parallel step into one, which
    runs once the last of its operands is written: the first partial sum stays live
    through the rest of the step. The step time pays one latency for both."""
    def f(x, w):
        h = jnp.tanh(x @ w) @ w
        return x.T @ x, h.T @ h
    h = hlo(f, S((64, 64), F32), S((64, 64), F32), mesh={"a": 2},
            schedule=[partir.ManualPartition({"x": 0}, axis="a")])
    first, *_ = (i for i, op in enumerate(h.ops) if op.name == "dot_general")
    reduces = [i for i, op in enumerate(h.ops) if op.name == "hlo.all_reduce"]
    kib16 = 64 * 64 * 4
    plan = plan_buffers(h, combined_collectives=frozenset({"all_reduce"}), explain=True)
    assert [plan.group[i] for i in reduces] == [reduces[0]] * 2
    assert (kib16, first) in plan.at_peak and plan.temp_bytes == 2 * kib16
    alone = plan_buffers(h, explain=True)
    assert (kib16, first) not in alone.at_peak and alone.temp_bytes < 2 * kib16
    assert simulate(h, TOY, links={"a": "slow"}).combined_collectives == 1


def test_a_scan_holds_its_bodys_buffers_while_it_runs():
    """A scan runs its body inside it: the body's temporaries (c @ w, its tanh in place,
    read by the next matmul) take 16 KiB while the scan runs, the new carry taking the
    old one's buffer; a per-iteration value it stacks that a matmul writes (and tanh
    reads) exists before XLA's dynamic-update-slice copies it into the stacked result.
    16 KiB in both, as XLA's `memory_analysis()` reports (besides 68 bytes of scalars)."""
    def carried(x, w):
        return jax.lax.scan(lambda c, _: (jnp.tanh(c @ w) @ w, None), x, None, length=3)[0]

    def stacked(x, w):
        def body(c, _):
            y = c @ w
            return jnp.tanh(y), y
        return jax.lax.scan(body, x, None, length=3)
    kib16 = 64 * 64 * 4
    for f in (carried, stacked):
        h = hlo(f, S((64, 64), F32), S((64, 64), F32))
        assert [op.name for op in h.ops] == ["scan"]
        assert plan_buffers(h).temp_bytes == kib16


def test_a_constant_broadcast_only_a_loop_reads_has_no_buffer_outside_it():
    """XLA sinks a broadcast constant that only loops read into their bodies, where it
    fuses into its readers (the mask of a scanned attention): the scan's body's matmul
    result alone, 16 KiB, as XLA's `memory_analysis()` reports (besides the scalars),
    not 16 KiB more for the broadcast held while the scan runs."""
    def f(x, w):
        m = jnp.full((64, 64), 2.0)
        return jax.lax.scan(lambda c, _: (jnp.tanh(c @ w) * m, None), x, None, length=3)[0]

    h = hlo(f, S((64, 64), F32), S((64, 64), F32))
    assert [op.name for op in h.ops][-2:] == ["broadcast_in_dim", "scan"]
    assert plan_buffers(h).temp_bytes == 64 * 64 * 4


# --- registry --------------------------------------------------------------------------------


def test_registry_names_aliases_and_user_specs():
    assert get_device("H100").name == "H100-80GB" and get_device("tpu-v3").name == "TPUv3"
    assert get_device("a100").memory_bytes == 40 * 1024 ** 3
    assert get_device("TPUv4").matmul_flops["bfloat16"] == 275e12
    mine = register_device(DeviceSpec(
        name="test-accelerator", aliases=("ta1",), matmul_flops={"float32": 2e12},
        vector_flops={"float32": 1e12}, memory_bytes=1 << 30, memory_bandwidth=1e11,
        links={"wire": LinkSpec(1e9, 1e-6)}, default_link="wire"), overwrite=True)
    assert get_device("TA1") is mine
    with pytest.raises(ValueError, match="already registered"):
        register_device(DeviceSpec(
            name="other", aliases=("ta1",), matmul_flops={"float32": 1.0},
            vector_flops={"float32": 1.0}, memory_bytes=1, memory_bandwidth=1.0,
            links={"wire": LinkSpec(1.0, 0.0)}, default_link="wire"))
    with pytest.raises(UnknownDeviceError, match="unknown device 'b200'"):
        get_device("b200")
    with pytest.raises(ValueError, match="default link"):
        DeviceSpec(name="x", matmul_flops={}, vector_flops={}, memory_bytes=1,
                   memory_bandwidth=1.0, links={}, default_link="nvlink")


def test_links_must_name_mesh_axes_and_spec_links():
    h = hlo(lambda x: x * 2, S((8,), F32))
    with pytest.raises(UnknownDeviceError, match="not in the mesh"):
        simulate(h, "h100", links={"c": "nvlink"})
    with pytest.raises(UnknownDeviceError, match="no link 'ici'"):
        simulate(h, "h100", links={"a": "ici"})
    cost = simulate(h, "h100", links={"a": "infiniband"})
    assert cost.links == {"a": "infiniband", "b": "nvlink"}


def test_cost_is_plain_json():
    import json
    cost = simulate(hlo(lambda x, w: x @ w, S((16, 8), F32), S((8, 4), F32)), "tpuv4")
    assert isinstance(cost, Cost) and cost.device == "TPUv4" and cost.fits
    data = json.loads(json.dumps(cost.to_json()))
    assert data["flops"] == 1024 and data["fits"] is True
    assert set(data["bytes_moved"]) == {"all_gather", "all_reduce", "reduce_scatter",
                                        "all_to_all", "collective_permute"}
