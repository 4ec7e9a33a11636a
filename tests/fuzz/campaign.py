"""A campaign: run seeds × modes on a pool, minimize every failure, summarize.

Shared by scripts/fuzz.py (long campaigns) and tests/fuzz/test_fuzz.py (fixed seeds)."""

from __future__ import annotations

import json
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from tests.fuzz.minimize import minimize, size
from tests.fuzz.program import MODES, Case, render
from tests.fuzz.runner import CORE_EVERY, FAILURES, Outcome, Pool, Result, Task

CLASSES = ("OK", "WRONG", "CRASH", "REFUSED", "TIMEOUT", "INVALID", "SKIPPED")


@dataclass
class Failure:
    seed: int
    mode: str
    core: bool
    outcome: Outcome
    case: Case | None
    minimized: Case | None = None
    min_outcome: Outcome | None = None
    evals: int = 0

    def repro(self) -> str:
        case = self.minimized or self.case
        return render(case, self.mode, self.core) if case is not None else "(no case)"


@dataclass
class Report:
    results: list[Result] = field(default_factory=list)
    failures: list[Failure] = field(default_factory=list)
    elapsed: float = 0.0

    def counts(self) -> Counter:
        return Counter(r.outcome.cls for r in self.results)

    def by_reason(self, cls: str) -> dict[str, list[Result]]:
        groups: dict[str, list[Result]] = defaultdict(list)
        for r in self.results:
            if r.outcome.cls == cls:
                groups[r.outcome.reason()].append(r)
        return dict(sorted(groups.items(), key=lambda kv: -len(kv[1])))

    def format(self, repros: bool = True) -> str:
        counts = self.counts()
        seeds = sorted({r.task.seed for r in self.results})
        span = f" (seeds {seeds[0]}..{seeds[-1]})" if seeds else ""
        lines = [f"fuzz: {len(self.results)} cases{span} in {self.elapsed:.0f} s",
                 "  " + "  ".join(f"{c} {counts.get(c, 0)}" for c in CLASSES)]
        ok = [r for r in self.results if r.outcome.cls == "OK"]
        if ok:
            lines.append(f"  OK cases whose partitioned program shards something: "
                         f"{sum(bool(r.outcome.sharded) for r in ok)} of {len(ok)}")
        fams: Counter = Counter()
        for r in self.results:
            if r.task.mode == "plain":
                fams.update(r.families)
        if fams:
            lines.append("  op families (programs containing them): " +
                         ", ".join(f"{k} {v}" for k, v in sorted(fams.items())))
        for cls in ("REFUSED", "INVALID", "SKIPPED"):
            groups = self.by_reason(cls)
            if groups:
                lines.append(f"{cls} by reason:")
                for reason, rs in groups.items():
                    seeds = sorted({r.task.seed for r in rs})
                    lines.append(f"  {len(rs):4d}  {reason}   seeds {_seeds(seeds)}")
        for cls in FAILURES:
            groups = self.by_reason(cls)
            if groups:
                lines.append(f"{cls} by reason:")
                for reason, rs in groups.items():
                    where = Counter(r.outcome.where for r in rs if r.outcome.where)
                    at = f"  [{where.most_common(1)[0][0]}]" if where else ""
                    cases = ", ".join(f"{r.task.seed}/{r.task.mode}{'+core' if r.task.core else ''}"
                                      for r in rs)
                    lines.append(f"  {len(rs):4d}  {reason}{at}\n        {cases}")
        if self.failures:
            lines.append(f"{len(self.failures)} failures (replay: scripts/fuzz.py --replay SEED "
                         "--modes MODE):")
        for f in self.failures:
            o = f.outcome
            shrunk = ""
            if f.minimized is not None:
                shrunk = (f"; minimized {size(f.case)[0]} -> {size(f.minimized)[0]} ops in "
                          f"{f.evals} evaluations")
            lines.append(f"--- seed {f.seed} mode {f.mode}{' (core interpreter)' if f.core else ''}"
                         f": {o.cls} {o.error}: {o.message[:300]}{shrunk}")
            if o.where:
                lines.append(f"    at partir/{o.where}")
            if repros:
                lines.append(f.repro())
        return "\n".join(lines)

    def to_json(self) -> dict:
        return {
            "elapsed_s": self.elapsed,
            "counts": dict(self.counts()),
            "cases": [{"seed": r.task.seed, "mode": r.task.mode, "core": r.task.core,
                       "class": r.outcome.cls, "error": r.outcome.error,
                       "message": r.outcome.message, "reason": r.outcome.reason(),
                       "where": r.outcome.where, "elapsed_s": r.outcome.elapsed,
                       "sharded": r.outcome.sharded}
                      for r in self.results],
            "failures": [{"seed": f.seed, "mode": f.mode, "core": f.core,
                          "class": f.outcome.cls, "error": f.outcome.error,
                          "message": f.outcome.message, "where": f.outcome.where,
                          "trace": f.outcome.trace, "repro": f.repro()}
                         for f in self.failures],
        }


def _seeds(seeds: list[int]) -> str:
    text = ", ".join(map(str, seeds[:12]))
    return text + (f" … ({len(seeds)})" if len(seeds) > 12 else "")


def tasks_for(seeds: Sequence[int], modes: Sequence[str] = MODES,
              core_every: int = CORE_EVERY) -> list[Task]:
    for m in modes:
        if m not in MODES:
            raise ValueError(f"unknown mode {m!r}; modes are {', '.join(MODES)}")
    return [Task(s, m, core=(m == "plain" and core_every > 0 and s % core_every == 0))
            for s in seeds for m in modes]


def run_campaign(seeds: Sequence[int], modes: Sequence[str] = MODES, workers: int = 1,
                 timeout: float = 120.0, minimize_s: float = 60.0, minimize_total_s: float = 1e9,
                 core_every: int = CORE_EVERY, budget_s: float | None = None,
                 log: Callable[[str], None] | None = None) -> Report:
    """Run every seed in every mode (until `budget_s` seconds have passed, if given:
    seeds not started by then are not run), then minimize the failures."""
    start = time.monotonic()
    report = Report()
    deadline = start + budget_s if budget_s else None
    with Pool(workers, timeout) as pool:
        for r in pool.run(tasks_for(seeds, modes, core_every), deadline):
            report.results.append(r)
            o = r.outcome
            if log and o.cls in (*FAILURES, "INVALID"):
                log(f"seed {r.task.seed} {r.task.mode}: {o.cls} {o.error}: {o.message[:160]}")
            if o.cls in FAILURES:
                report.failures.append(Failure(r.task.seed, r.task.mode, r.task.core, o, r.case))
        report.results.sort(key=lambda r: (r.task.seed, MODES.index(r.task.mode)))
        report.failures.sort(key=lambda f: (f.seed, MODES.index(f.mode)))
        # Failures whose case came back (a worker that died or timed out sent none) are
        # regenerated from the seed here.
        if minimize_s > 0 and report.failures:
            from tests.fuzz.generator import generate
            stop = time.monotonic() + minimize_total_s
            for f in report.failures:
                if time.monotonic() >= stop:
                    break
                f.case = f.case or generate(f.seed)
                budget = min(minimize_s, stop - time.monotonic())
                if f.outcome.cls == "TIMEOUT":
                    budget = min(budget, 3 * timeout)

                def evaluate(cases: list[Case], f: Failure = f) -> list[Outcome]:
                    tasks = [Task(f.seed, f.mode, f.core, c, tag=i) for i, c in enumerate(cases)]
                    got = {r.task.tag: r.outcome for r in pool.run(tasks)}
                    return [got[i] for i in range(len(cases))]

                if log:
                    log(f"minimizing seed {f.seed} {f.mode} ({f.outcome.cls})")
                f.minimized, f.evals = minimize(f.case, f.mode, f.core, f.outcome, evaluate,
                                                batch=workers, budget_s=budget, log=log)
    report.elapsed = time.monotonic() - start
    return report


def write_json(report: Report, path: str) -> None:
    with open(path, "w") as fh:
        json.dump(report.to_json(), fh, indent=1)
