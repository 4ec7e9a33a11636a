"""`partir show FILE VALUE [--after N]`: the sharding of an input, output or tagged value
of a schedule file after a tactic (the last by default), in both notations, and its tiles
over the mesh drawn as the editor's hover draws them (`partir_lsp.pictures`). Runs the
analysis in this process (`partir.session`), without a daemon."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from partir_lsp import pictures, render

COLOR = ("auto", "always", "never")


def add_command(commands: Any) -> None:
    show = commands.add_parser(
        "show", help="draw a value's tiles over the mesh after a tactic",
        description="The sharding of an input, output or tagged value (or of every value "
                    "under a pytree prefix) of a schedule file after a tactic, as Shardy "
                    "axes and a PartitionSpec, and which devices hold each of its tiles "
                    "(like jax.debug.visualize_array_sharding).")
    show.add_argument("file", help="a schedule file (*.partir.py)")
    show.add_argument("value", help="an input, output or tag name, or a pytree prefix "
                                    "(`params/layers/0`)")
    show.add_argument("--after", type=int, default=None, metavar="N",
                      help="after the N-th tactic (default: the last; 0: unsharded)")
    show.add_argument("--color", choices=COLOR, default="auto",
                      help="colour the tiles with ANSI colours (auto: on a terminal)")
    show.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    # Imported here: building the parser for another command needs no JAX.
    from partir.session import Session

    session = Session(os.getcwd(), tool_dirs=[os.path.dirname(os.path.abspath(__file__))])
    analysis = session.analyse(os.path.abspath(args.file))
    if analysis.schedule_file is None or analysis.trace is None:
        first = analysis.diagnostics[0] if analysis.diagnostics else None
        where = f"{first.file}:{first.line}: " if first is not None and first.line else ""
        print(f"partir: error: {where}{first.message if first else 'nothing to show'}",
              file=sys.stderr)
        return 2
    for d in analysis.diagnostics:  # a failed tactic: the values as the ones before left
        print(f"partir: warning: {d.message}", file=sys.stderr)
    applied = len(analysis.states)
    after = applied if args.after is None else args.after
    if not 0 <= after <= applied:
        print(f"partir: error: --after {after}: the schedule has {applied} applied tactics",
              file=sys.stderr)
        return 2
    values = [v for v in session.values(analysis)
              if v.name == args.value or v.name.startswith(args.value + "/")]
    if not values:
        print(f"partir: error: no input, output or tag named {args.value!r}", file=sys.stderr)
        return 2
    color = args.color == "always" or (args.color == "auto" and sys.stdout.isatty())
    mesh = pictures.Mesh.of(dict(analysis.schedule_file.mesh))
    print("\n\n".join(describe(v, after, mesh, color) for v in values))
    return 0


def describe(v: Any, after: int, mesh: pictures.Mesh, color: bool) -> str:
    """One value (`partir.session.ExplainedValue`) after tactic `after`, as text."""
    step = render.step_after(v, after) if after > 0 else None
    sharding = step.sharding if step is not None else [[] for _ in v.shape]
    local = step.local_shape if step is not None else list(v.shape)
    when = f"after tactic {after} ({step.tactic_name})" if step is not None and \
        step.tactic_name else f"after tactic {after}"
    lines = [f"{v.name} · {v.kind} · {render.tensor_type(v.shape, v.dtype)} "
             f"({render.format_bytes(render.nbytes(v.shape, v.dtype))}) {when}",
             f"  {render.format_sharding(sharding)}  {pictures.partition_spec(sharding)}  "
             f"local {local} ({render.format_bytes(render.nbytes(local, v.dtype))}/device)"]
    tiles = pictures.tiling(v.shape, sharding, mesh)
    if tiles is not None:
        lines.append(pictures.terminal(tiles, color))
    return "\n".join(lines)
