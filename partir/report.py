"""Plain-text per-tactic report of a partitioning."""

from __future__ import annotations

from collections import Counter

from partir.api import CorePartition


def format_report(result: CorePartition, max_inputs: int = 12) -> str:
    lines = [f"mesh {result.mesh}   traced {len(result.initial.ops)} ops in "
             f"{result.frontend_s * 1e3:.1f} ms"]
    for i, t in enumerate(result.tactics, 1):
        kinds = Counter(c.kind for c in t.conflicts)
        conflicts = ", ".join(f"{n} {k}" for k, n in sorted(kinds.items())) or "none"
        lines.append(f"\n[{i}] {t.name}  axis {t.axis!r}  {t.elapsed_s * 1e3:.1f} ms "
                     f"(propagation {t.propagation_s * 1e3:.1f} ms)")
        lines.append("    actions:   " + "; ".join(t.actions))
        lines.append(f"    conflicts: {conflicts}")
        for c in t.conflicts[:5]:
            lines.append(f"      - {c}")
        for note in t.notes:
            lines.append(f"    note: {note}")
        shardings = t.program.input_shardings()
        shown = [(n, s) for n, s in shardings.items() if any(s.dims)]
        lines.append(f"    sharded inputs ({len(shown)} of {len(shardings)}):")
        for name, s in shown[:max_inputs]:
            lines.append(f"      {name:<28} {s}")
        if len(shown) > max_inputs:
            lines.append(f"      ... {len(shown) - max_inputs} more")
    return "\n".join(lines)
