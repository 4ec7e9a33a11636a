"""The compiler core in process (`partir.session`, issue 15.5): per-tactic states reused
from the longest unchanged prefix, dropped when a model file changes, typed results, and
cancellation inside a tactic's propagation and inside lowering that leaves every cache
valid. Timings are measured with generous margins (the target, 50 ms, is the
benchmark's to report)."""

from __future__ import annotations

import shutil
import threading
import time
from collections import Counter
from pathlib import Path

import pytest

import partir.session.core as session_core
from partir import CancellationToken, Cancelled, pipeline
from partir.core.padding import padding_report
from partir.metadata import TacticMetadata
from partir.session import (
    Analysis,
    ExplainedValue,
    Session,
    State,
    TacticResult,
)

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "transformer"

SCHEDULE = '''\
import dataclasses

import model
from schedules import megatron

import partir
from partir import FIRST_DIVISIBLE_DIM, REPLICATED

config = dataclasses.replace(model.T32, layers={layers})
program = partir.Program(model.train_step, *model.abstract_inputs(config))
mesh = {{"batch": 4, "model": 2}}
schedule = [
    partir.ManualPartition({{"batch": 0}}, axis="batch", name="BP"),
    {second},
    {third},
]
'''
MP = ('partir.ManualPartition({"params": megatron, "opt_state": megatron}, axis="model", '
      'name="MP")')
Z3 = ('partir.ManualPartition({"params": FIRST_DIVISIBLE_DIM, "opt_state": '
      'FIRST_DIVISIBLE_DIM}, axis="batch", name="Z3")')
Z2 = ('partir.ManualPartition({"params": REPLICATED, "opt_state": FIRST_DIVISIBLE_DIM}, '
      'axis="batch", name="Z2")')
MP_OPT = 'partir.ManualPartition({"opt_state": megatron}, axis="model", name="MP-opt")'
MP_PARAMS = 'partir.ManualPartition({"params": megatron}, axis="model", name="MP-params")'


def text(second: str = MP, third: str = Z3, layers: int = 2) -> str:
    return SCHEDULE.format(second=second, third=third, layers=layers)


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    for name in ("model.py", "schedules.py"):
        shutil.copy(EXAMPLES / name, tmp_path / name)
    (tmp_path / "t.partir.py").write_text(text())
    return tmp_path


def analyse(session: Session, ws: Path, source: str | None = None, **kw) -> Analysis:
    analysis = session.analyse(str(ws / "t.partir.py"), source, **kw)
    assert analysis.ok, analysis.diagnostics
    return analysis


def test_an_edit_reapplies_from_the_edited_tactic(ws: Path) -> None:
    session = Session(str(ws))
    first = analyse(session, ws)
    assert first.applied_indexes == [1, 2, 3] and session.tactics_applied == 3
    assert not first.trace_cached

    third = analyse(session, ws, text(third=Z2))
    assert third.trace_cached
    assert third.reused_indexes == [1, 2] and third.applied_indexes == [3]
    assert session.tactics_applied == 4
    # the states before the edit are the very cached ones
    assert third.states[:2] == first.states[:2]
    assert third.states[2] is not first.states[2]

    second = analyse(session, ws, text(second=MP_OPT))
    assert second.reused_indexes == [1] and second.applied_indexes == [2, 3]
    assert session.tactics_applied == 6

    again = analyse(session, ws)  # the original schedule: every state cached
    assert again.reused_indexes == [1, 2, 3] and session.tactics_applied == 6
    assert again.states == first.states


def test_a_renamed_tactic_is_neither_applied_nor_lowered_again(ws: Path) -> None:
    """A name labels a tactic and changes no program: renaming the first tactic of a
    lowered schedule reuses every state and lowering, under the new name."""
    session = Session(str(ws))
    session.lower(analyse(session, ws))
    applied, lowerings = session.tactics_applied, session.lowerings
    renamed = analyse(session, ws, text().replace('name="BP"', 'name="batch-parallel"'))
    assert renamed.reused_indexes == [1, 2, 3]
    session.lower(renamed)
    assert (session.tactics_applied, session.lowerings) == (applied, lowerings)
    tactics = renamed.tactics()
    assert [t.name for t in tactics] == ["batch-parallel", "MP", "Z3"]
    assert tactics[0].lowered and tactics[0].metadata.name == "batch-parallel"
    tokens = next(v for v in session.values(renamed) if v.name == "batch/tokens")
    assert tokens.history[0].tactic_name == "batch-parallel"
    back = analyse(session, ws)
    assert back.tactics()[0].name == "BP" and session.tactics_applied == applied


def test_a_tactic_that_changes_nothing_is_not_lowered_again(ws: Path) -> None:
    """MP-opt names what propagation from MP-params sharded already: its program is
    MP-params's, lowered once, and its metadata has MP-params's collectives and cost under
    its own name and actions."""
    session = Session(str(ws))
    analysis = analyse(session, ws, text(second=MP_PARAMS, third=MP_OPT))
    session.lower(analysis)
    assert session.lowerings == 2
    mp, mp_opt = analysis.tactics()[1:]
    assert mp_opt.lowered and (mp.name, mp_opt.name) == ("MP-params", "MP-opt")
    assert mp_opt.metadata.collectives == mp.metadata.collectives
    assert mp_opt.metadata.cost == mp.metadata.cost
    assert mp_opt.metadata.actions != mp.metadata.actions


def test_a_state_differing_in_one_tactic_lowers_only_what_it_changed(ws: Path) -> None:
    """Of the program after a one-leaf tactic, only the ops whose loops the tactic changed
    (and the values they make) are lowered (and reported for padding) again: the rest are
    the preceding state's fragments (`partir.ir.fragments`), and the result is what
    lowering afresh gives."""
    session = Session(str(ws))
    one_leaf = ('partir.ManualPartition({"opt_state/0/mu/layers/1/w_up": 0}, axis="batch", '
                'name="mu")')
    analysis = analyse(session, ws, text(second=MP_PARAMS, third=one_leaf))
    fragments = analysis.trace.fragments
    # The padding (diagnostics need it) of a state's program is the previous one's, with
    # the records of the ops its tactic changed only looked at (in their loops) again
    looked_at = []
    for st in analysis.states:
        before = fragments.made["padding"] + fragments.reused["padding"]
        st.applied_metadata(fragments)
        looked_at.append(fragments.made["padding"] + fragments.reused["padding"] - before)
    paddings = [t.metadata.padding for t in analysis.tactics()]
    assert paddings == [padding_report(st.program) for st in analysis.states]
    assert 0 < looked_at[2] * 4 < looked_at[0], looked_at
    counts = []  # after each state lowered: fragments made and reused, per pass
    session.lower(analysis, lowered=lambda i: counts.append(
        (Counter(fragments.made), Counter(fragments.reused))))
    assert session.lowerings == 3
    afresh, again = counts[2][0] - counts[1][0], counts[2][1] - counts[1][1]
    for lowering in ("materialize", "spmd"):
        assert 0 < afresh[lowering] * 4 < again[lowering], (afresh, again)
    for after, state in enumerate(analysis.states, 1):
        fresh = pipeline.lower(state.program)
        for level in ("spmd", "hlo"):
            assert session.ir(analysis, level, after=after) == fresh.text(level)


def test_an_equal_program_made_again_is_not_lowered_again(ws: Path) -> None:
    """States evicted (a bound of one op: only the newest stays) and applied again have
    new values and ops, and the programs of the first time: their lowerings are found by
    content."""
    session = Session(str(ws), max_ops=1)
    first = analyse(session, ws)
    session.lower(first)
    lowerings, applied = session.lowerings, session.tactics_applied
    again = analyse(session, ws)
    assert session.tactics_applied == applied + 3  # evicted: applied again
    session.lower(again)
    assert session.lowerings == lowerings
    assert [t.metadata.collectives for t in again.tactics()] == \
        [t.metadata.collectives for t in first.tactics()]
    # A program that differs is not taken for another.
    session.lower(analyse(session, ws, text(third=Z2)))
    assert session.lowerings == lowerings + 1


@pytest.mark.slow
def test_lowering_in_forked_processes_gives_what_one_process_gives(ws: Path,
                                                                   monkeypatch) -> None:
    """`lowering_processes=2`: the states are lowered here and in a fork of this process
    (`partir.forked`), with the same collectives and cost, each state reported lowered
    once; what a fork lowered counts as lowered here (an edit back lowers nothing)."""
    monkeypatch.setattr(session_core, "PARALLEL_MIN_OPS", 0)  # the test's programs are small
    one, two = Session(str(ws)), Session(str(ws), lowering_processes=2)
    serial = analyse(one, ws)
    one.lower(serial)
    parallel = analyse(two, ws)
    reported = []
    two.lower(parallel, lowered=reported.append)
    assert sorted(reported) == [1, 2, 3] and two.lowerings == one.lowerings == 3
    assert len(two.lowered) < 3  # a fork lowered one at least (its programs stay there)

    def lowered(analysis: Analysis) -> list[tuple]:
        return [(t.metadata.collectives, t.metadata.executed_collectives, t.metadata.cost)
                for t in analysis.tactics()]

    assert all(t.lowered for t in parallel.tactics())
    assert lowered(parallel) == lowered(serial)
    assert two.ir(parallel, "hlo", after=2) == one.ir(serial, "hlo", after=2)
    two.lower(analyse(two, ws, text(third=Z2)))
    assert two.lowerings == 4
    back = analyse(two, ws, text(layers=2))
    two.lower(back)
    assert two.lowerings == 4 and lowered(back) == lowered(serial)


def test_results_are_typed(ws: Path) -> None:
    session = Session(str(ws))
    analysis = analyse(session, ws)
    tactics = analysis.tactics()
    assert [type(t) for t in tactics] == [TacticResult] * 3
    assert [t.name for t in tactics] == ["BP", "MP", "Z3"]
    assert all(isinstance(t.metadata, TacticMetadata) and not t.lowered for t in tactics)
    assert tactics[0].range is not None and tactics[0].range.line == 13
    assert all(isinstance(s, State) for s in analysis.states)
    assert session.collectives(analysis) is None  # not lowered yet

    session.lower(analysis)
    lowered = analysis.tactics()
    assert all(t.lowered and t.metadata.cost is not None for t in lowered)
    assert sum(lowered[-1].metadata.collectives.values()) > 0
    assert session.collectives(analysis)
    values = session.values(analysis)
    assert values and all(isinstance(v, ExplainedValue) for v in values)
    assert session.values(analysis) is values  # made once (sent with each partial result)
    # The steps that changed each value, and the last tactic's.
    assert all(v.history[-1].tactic == 3 and all(s.changed for s in v.history[:-1])
               for v in values)
    tokens = next(v for v in values if v.name == "batch/tokens")
    assert [(s.tactic, s.changed) for s in tokens.history] == [(1, True), (3, False)]
    assert "all_reduce" in session.ir(analysis, "hlo", after=1) or \
        "reduce_scatter" in session.ir(analysis, "hlo", after=1)
    lowerings = session.lowerings
    session.lower(analysis)  # nothing left to lower
    assert session.lowerings == lowerings


def test_a_changed_model_file_invalidates_its_trace_and_states(ws: Path) -> None:
    session = Session(str(ws))
    first = analyse(session, ws)
    model = ws / "model.py"
    assert session.invalidate([str(model)]).paths == []  # unchanged content
    model.write_text(model.read_text() + "\n# edited\n")
    found = session.invalidate([str(model)])
    assert found.paths == [str(model)] and found.traces == 1
    second = analyse(session, ws)
    assert not second.trace_cached and second.applied_indexes == [1, 2, 3]
    assert second.invalidated_by == [str(model)]
    assert second.trace.key != first.trace.key


def test_a_changed_model_file_is_seen_without_a_watcher(ws: Path) -> None:
    session = Session(str(ws))
    analyse(session, ws)
    model = ws / "model.py"
    model.write_text(model.read_text() + "\n# edited\n")
    second = analyse(session, ws)  # nobody called invalidate
    assert not second.trace_cached and second.applied_indexes == [1, 2, 3]


class Canceller:
    """Runs `work` on a thread, cancels its token once `progress` reports a message
    starting with `stage` (plus `delay`), and measures how long the work ran on."""

    def __init__(self, stage: str, delay: float) -> None:
        self.token = CancellationToken()
        self.stage, self.delay = stage, delay
        self.cancelled_at: float | None = None
        self.ended_at: float | None = None
        self.error: BaseException | None = None
        self.result = None

    def progress(self, message: str, step: int | None, total: int | None) -> None:
        if self.cancelled_at is None and message.startswith(self.stage):
            def cancel() -> None:
                time.sleep(self.delay)
                self.cancelled_at = time.perf_counter()
                self.token.cancel("a newer revision")
            if self.delay:  # from another thread, as an editor's newer revision does
                threading.Thread(target=cancel, daemon=True).start()
            else:  # at once: the stage cannot end before the cancellation lands
                cancel()

    def run(self, work) -> None:
        def target() -> None:
            try:
                self.result = work(self.progress, self.token)
            except BaseException as e:  # reported to the test
                self.error = e
            self.ended_at = time.perf_counter()
        thread = threading.Thread(target=target)
        thread.start()
        thread.join(300)

    @property
    def latency(self) -> float:
        assert self.cancelled_at is not None and self.ended_at is not None
        return self.ended_at - self.cancelled_at


def cancel_analysis(session: Session, ws: Path, source: str, stage: str) -> Canceller:
    """Analyse `source`, cancelling as progress reports `stage` (a fast machine may
    finish a small tactic within milliseconds): the analysis must end `Cancelled`."""
    c = Canceller(stage, 0)
    c.run(lambda progress, token: session.analyse(str(ws / "t.partir.py"), source,
                                                  progress, token))
    assert isinstance(c.error, Cancelled), c.error
    return c


def test_cancelling_mid_tactic_keeps_the_cached_prefix(ws: Path) -> None:
    session = Session(str(ws))
    analyse(session, ws, text(layers=8))
    edited = text(third=Z2, layers=8)
    c = cancel_analysis(session, ws, edited, "tactic 3/3")
    assert c.latency < 0.5  # the target is 50 ms: generous for a loaded machine
    assert session.cancelled == 1 and session.tactics_applied == 3  # Z2 never finished

    after = analyse(session, ws, edited)
    assert after.reused_indexes == [1, 2] and after.applied_indexes == [3]
    assert session.tactics_applied == 4


@pytest.mark.slow
def test_cancelling_mid_lowering_keeps_the_caches(ws: Path, monkeypatch) -> None:
    session = Session(str(ws))
    analysis = analyse(session, ws, text(layers=8))
    c = Canceller("no stage: cancelled by the lowering below", 0)
    # The newer revision lands while the first tactic's program is being lowered: after
    # its SPMD stage (a delay after the progress report would land after the whole
    # lowering on a fast machine).
    spmd = pipeline.lower_core_to_spmd

    def lower_then_cancel(*args):
        out = spmd(*args)
        if c.cancelled_at is None:
            c.cancelled_at = time.perf_counter()
            c.token.cancel("a newer revision")
        return out

    monkeypatch.setattr(pipeline, "lower_core_to_spmd", lower_then_cancel)
    c.run(lambda progress, token: session.lower(analysis, progress, token))
    assert isinstance(c.error, Cancelled), c.error
    assert c.latency < 0.5
    assert not analysis.states[0].lowered  # nothing half-made was kept
    assert session.lowerings == 0

    again = analyse(session, ws, text(layers=8))
    assert again.reused_indexes == [1, 2, 3]
    session.lower(again)
    assert all(t.lowered for t in again.tactics()) and session.lowerings == 3


def test_a_cancelled_token_stops_before_any_tactic(ws: Path) -> None:
    session = Session(str(ws))
    token = CancellationToken()
    token.cancel()
    with pytest.raises(Cancelled):
        session.analyse(str(ws / "t.partir.py"), token=token)
    assert session.tactics_applied == 0
    assert analyse(session, ws).applied_indexes == [1, 2, 3]


def test_an_automatic_tactic_reports_its_search_progress(ws: Path) -> None:
    auto = 'partir.AutomaticPartition(axis="model", max_evaluations=4, name="AutoMP")'
    session = Session(str(ws))
    messages: list[tuple[str, int | None, int | None]] = []
    analysis = analyse(session, ws, text(second=auto, third=Z3),
                       progress=lambda m, step, total: messages.append((m, step, total)))
    assert [t.name for t in analysis.tactics()] == ["BP", "AutoMP", "Z3"]
    searching = [m for m, _, _ in messages if m.startswith("tactic 2/3: AutoMP: ")]
    assert searching and searching[0].endswith("1 evaluations")
    assert any("best step" in m for m in searching)


def test_local_shapes_of_padded_values_are_their_tiles() -> None:
    from partir.mesh import Mesh
    from partir.session.core import _local_shape

    mesh = Mesh({"batch": 4, "model": 2})
    # 6 on 4 devices: tiles of 2 (the last device holds padding), not 6 // 4
    assert _local_shape((6, 8), [["batch"], ["model"]], mesh) == [2, 4]


def test_cancelling_a_search_stops_it_and_keeps_the_cached_prefix(ws: Path) -> None:
    auto = 'partir.AutomaticPartition(axis="model", max_evaluations=400, name="AutoMP")'
    session = Session(str(ws))
    analyse(session, ws, text(layers=4))
    c = cancel_analysis(session, ws, text(second=auto, layers=4), "tactic 2/3: AutoMP: ")
    assert c.latency < 1.0  # between two evaluations of a 4-layer model
    assert session.cancelled == 1
    after = analyse(session, ws, text(layers=4))
    assert after.reused_indexes == [1, 2, 3]  # the manual schedule's states were kept


SCAN_MODEL = '''\
import jax.numpy as jnp
import numpy as np
from jax import lax

import partir


def layers(x, ws):
    def layer(c, w):
        h = partir.tag(c @ w, "hidden")
        return jnp.tanh(h), None
    return jnp.sum(lax.scan(layer, x, ws)[0])


X = np.ones((8, 4), np.float32)
WS = np.ones((3, 4, 4), np.float32)
'''
SCAN_SCHEDULE = '''\
import scan_model

import partir

program = partir.Program(scan_model.layers, scan_model.X, scan_model.WS)
mesh = {"batch": 4}
schedule = [partir.ManualPartition({"x": 0}, axis="batch", name="BP")]
'''


def test_a_value_tagged_inside_a_loop_body_is_explained_with_its_sharding(
        tmp_path: Path) -> None:
    (tmp_path / "scan_model.py").write_text(SCAN_MODEL)
    (tmp_path / "s.partir.py").write_text(SCAN_SCHEDULE)
    session = Session(str(tmp_path))
    analysis = session.analyse(str(tmp_path / "s.partir.py"))
    assert analysis.ok, analysis.diagnostics
    (hidden,) = [v for v in session.values(analysis) if v.name == "hidden"]
    assert hidden.kind == "tag" and hidden.shape == [8, 4]
    # the scan runs on each device's rows: the body's value is sliced like them
    assert hidden.history[-1].sharding == [["batch"], []]
    assert hidden.history[-1].local_shape == [2, 4]
    line = SCAN_MODEL.splitlines().index('        h = partir.tag(c @ w, "hidden")') + 1
    assert [(d.file, d.line) for d in hidden.definitions] == [
        (str(tmp_path / "scan_model.py"), line)]


PIPELINE = '''\
import model

import partir

program = partir.Program(model.train_step_scanned, *model.make_scanned_inputs(model.TINY))
mesh = {{"stage": {stages}, "batch": 2}}
schedule = [
    partir.ManualPartition({{"batch": 0}}, axis="batch", name="BP"),
    partir.PipelinePartition({{"params/layers": 0}}, axis="stage", microbatches={m},
                             name="PP"),
]
'''


@pytest.mark.slow
def test_a_pipeline_rewrites_the_program_once_for_the_edits_after_it(ws: Path) -> None:
    session = Session(str(ws))
    first = analyse(session, ws, PIPELINE.format(stages=2, m=2))
    assert first.states[1].record.pipeline == {
        "stages": 2, "layers_per_stage": 2, "microbatches": 2, "steps": 3, "bubble": 1 / 3}
    assert first.program is not first.trace.traced  # the rewritten program
    # BP's tiling reaches the microbatches of the rewritten scans: the same initial state
    # serves an edit of the tactics, not one of the pipeline.
    again = analyse(session, ws, PIPELINE.format(stages=2, m=2).replace('name="BP"',
                                                                        'name="DP"'))
    assert again.initial is first.initial
    other = analyse(session, ws, PIPELINE.format(stages=2, m=4))
    assert other.initial is not first.initial
    assert other.states[1].record.pipeline["microbatches"] == 4


def test_a_scan_the_pipeline_cannot_split_is_a_diagnostic_at_the_tactic(ws: Path) -> None:
    session = Session(str(ws))
    source = PIPELINE.format(stages=8, m=2).replace('"batch": 2', '"batch": 1')
    analysis = session.analyse(str(ws / "t.partir.py"), source)
    (diagnostic,) = analysis.diagnostics
    assert diagnostic.kind == "tactic" and diagnostic.tactic == 2
    assert "tactic 2 (PP): 8 stages do not divide the 4 layers" in diagnostic.message
    assert diagnostic.line == source.splitlines().index(
        '    partir.PipelinePartition({"params/layers": 0}, axis="stage", microbatches=2,') + 1
