"""AutomaticPartition on the UNet and GNS examples, and the strategies it finds on the
full-size models (abstract inputs) carried to their small configurations by name pattern
(`pattern_tactics`) and executed on 8 CPU devices: equal to the unpartitioned step."""

from __future__ import annotations

import dataclasses

import pytest

import partir
from examples.gns import model as gns
from examples.gns import schedules as gns_schedules
from examples.transformer import model as transformer
from examples.transformer import schedules as transformer_schedules
from examples.unet import model as unet
from examples.unet import schedules as unet_schedules
from partir.tactics.auto import pattern_tactics
from partir.tactics.search import name_pattern
from tests.oracles import assert_tree_close

SMALL_MESH = {"batch": 4, "model": 2}
FULL_MESH = {"batch": 16, "model": 2}


def auto(axis: str | None = "model", **kw) -> partir.AutomaticPartition:
    args = {"name": "Auto", "device": "h100", "budget_s": 120.0} | kw
    if "axes" not in args:
        args["axis"] = axis
    return partir.AutomaticPartition(**args)


def run_equal(step, mesh, schedule, inputs) -> partir.Metadata:
    import jax

    fn, meta = partir.jit(step, mesh, schedule)
    assert_tree_close(fn(*inputs), jax.jit(step)(*inputs))
    return meta


def decisions(meta: partir.Metadata) -> list[dict]:
    return [d for t in meta.tactics if t.search is not None for d in t.search["decisions"]]


# -- searched on the small configurations, executed --------------------------------------


@pytest.mark.slow
def test_unet_bp_then_auto_mp_runs_equal():
    # Objective "memory": on the tiny model every sharding saves memory, so the search
    # takes decisions whatever the step times.
    schedule = [unet_schedules.BP, auto(objective="memory", max_evaluations=12)]
    meta = run_equal(unet.train_step, SMALL_MESH, schedule, unet.make_inputs(unet.TINY))
    assert decisions(meta) and all(d["axis"] == "model" for d in decisions(meta))
    assert meta.tactics[-1].shardings["batch/images"][0][:1] == ["batch"]


@pytest.mark.slow
def test_gns_es_then_auto_bp_runs_equal():
    schedule = [gns_schedules.ES, auto("batch", objective="memory", max_evaluations=12)]
    meta = run_equal(gns.train_step, gns_schedules.MESH, schedule, gns.make_inputs(gns.TINY))
    assert decisions(meta)
    # ES's edges stay split; the search tiled other values on the same axis.
    assert meta.tactics[-1].shardings["graph/edges"][0] == ["batch"]
    assert all(not d["inputs"].startswith(("graph/edges", "graph/senders",
                                            "graph/receivers")) for d in decisions(meta))


@pytest.mark.slow
def test_gns_search_is_deterministic_for_a_seed():
    args = gns.abstract_inputs(gns.TINY)

    def run(seed: int):
        meta = partir.partition(gns.train_step, gns_schedules.MESH,
                                [gns_schedules.ES, auto("batch", objective="memory",
                                                        seed=seed, max_evaluations=15)],
                                *args)
        s = meta.tactics[-1].search
        return s["decisions"], s["evaluations"], s["history"][-1][1:], \
            meta.tactics[-1].actions

    first = run(7)
    assert first == run(7)
    assert first[0]


# -- found on the full-size models, carried to the small ones ----------------------------


def test_pattern_tactics_match_by_name_pattern():
    search = {"decisions": [{"inputs": "params/layers/*/w_up", "dim": 1, "axis": "model",
                             "names": ["params/layers/0/w_up"]},
                            {"inputs": "batch/tokens", "dim": 0, "axis": "batch",
                             "names": ["batch/tokens"]}]}
    mp, bp = pattern_tactics(search, {"batch": 4, "model": 2}, "Found")
    assert (mp.name, mp.axis, bp.name, bp.axis) == ("Found.1", "model", "Found.2", "batch")
    rule = mp.inputs["params"]
    assert rule("params/layers/7/w_up", (32, 128)) == 1
    assert rule("params/layers/7/w_down", (128, 32)) is partir.UNKNOWN
    assert rule("params/layers/7/w_up", (32, 3)) is partir.UNKNOWN  # 3 % 2: left alone
    assert name_pattern("params/layers/7/w_up") == "params/layers/*/w_up"


def _carried(step, full_inputs, schedule, small_inputs, n_manual: int) -> tuple:
    """Search on the full-size model, then run the found strategy (the manual tactics
    before the search, and the search's decisions by pattern) on the small one."""
    found = partir.partition(step, FULL_MESH, schedule, *full_inputs, device="h100")
    search = next(t.search for t in found.tactics if t.search is not None)
    assert search["decisions"], "the search found nothing to carry"
    carried = [*schedule[:n_manual], *pattern_tactics(search, SMALL_MESH, "Found")]
    meta = run_equal(step, SMALL_MESH, carried, small_inputs)
    return found, meta


@pytest.mark.slow
def test_t32_all_auto_found_on_two_full_width_layers_runs_equal_on_a_small_t32():
    full = dataclasses.replace(transformer.T32, layers=2)
    small = dataclasses.replace(transformer.TINY, layers=2)
    found, meta = _carried(transformer.train_step, transformer.abstract_inputs(full),
                           [auto(axes=["batch", "model"], max_evaluations=60)],
                           transformer.make_inputs(small), 0)
    manual = partir.partition(transformer.train_step, FULL_MESH,
                              [transformer_schedules.BP, transformer_schedules.MP,
                               transformer_schedules.Z3],
                              *transformer.abstract_inputs(full), device="h100")
    # Two layers of T32 width: the search reaches the manual BP+MP+Z3 within 10%.
    assert found.cost.step_time_s <= 1.1 * manual.cost.step_time_s
    assert found.cost.fits
    axes = {d["axis"] for d in decisions(found)}
    assert axes == {"batch", "model"}
    assert meta.tactics[0].name == "Found.1"


@pytest.mark.slow
def test_unet_bp_auto_mp_found_at_full_size_runs_equal_on_the_tiny_unet():
    base = partir.partition(unet.train_step, FULL_MESH, [unet_schedules.BP],
                            *unet.abstract_inputs(unet.FULL), device="h100")
    found, _ = _carried(unet.train_step, unet.abstract_inputs(unet.FULL),
                        [unet_schedules.BP, auto(max_evaluations=8)],
                        unet.make_inputs(unet.TINY), 1)
    assert found.cost.step_time_s < base.cost.step_time_s  # BP+AutoMP beats BP


@pytest.mark.slow
def test_gns_es_auto_bp_found_at_full_size_runs_equal_on_the_tiny_gns():
    base = partir.partition(gns.train_step, FULL_MESH, [gns_schedules.ES],
                            *gns.abstract_inputs(gns.GNS), device="h100")
    found, _ = _carried(gns.train_step, gns.abstract_inputs(gns.GNS),
                        [gns_schedules.ES, auto("batch", max_evaluations=8)],
                        gns.make_inputs(gns.TINY), 1)
    assert found.cost.step_time_s < base.cost.step_time_s  # ES+AutoBP beats ES
