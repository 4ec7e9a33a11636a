"""The T32 schedule file the latency benchmarks edit (`daemon_latency.py`,
`lsp_latency.py`): BP, MP, then a last tactic that each edit replaces by one the daemon
has not seen. Tactics are written out, so that their input keys have source ranges."""

from __future__ import annotations

import argparse

SCHEDULE = '''\
import dataclasses

import model
from schedules import megatron

import partir
from partir import FIRST_DIVISIBLE_DIM, REPLICATED

config = dataclasses.replace(model.T32, layers={layers})
program = partir.Program(model.train_step, *model.abstract_inputs(config))
mesh = {{"batch": {batch}, "model": {model_axis}}}
schedule = [
    partir.ManualPartition({{"batch": 0}}, axis="batch", name="BP"),
    partir.ManualPartition({{"params": megatron, "opt_state": megatron}}, axis="model",
                           name="MP"),
    {last},
]
'''
Z3 = ('partir.ManualPartition({"params": FIRST_DIVISIBLE_DIM, "opt_state": '
      'FIRST_DIVISIBLE_DIM}, axis="batch", name="Z3")')
# Edited last tactics: ZeRO-2 and ZeRO-3 under new names, so that each is new to the daemon.
EDITS = [
    'partir.ManualPartition({{"params": REPLICATED, "opt_state": FIRST_DIVISIBLE_DIM}}, '
    'axis="batch", name="Z2-edit{k}")',
    'partir.ManualPartition({{"params": FIRST_DIVISIBLE_DIM, "opt_state": '
    'FIRST_DIVISIBLE_DIM}}, axis="batch", name="Z3-edit{k}")',
]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--batch-axis", type=int, default=16)
    parser.add_argument("--model-axis", type=int, default=2)
    parser.add_argument("--layers", type=int, default=32)


def schedule_text(args: argparse.Namespace, last: str) -> str:
    """The schedule file with `last` as its last tactic."""
    return SCHEDULE.format(layers=args.layers, batch=args.batch_axis,
                           model_axis=args.model_axis, last=last)


def edited_tactic(k: int) -> str:
    """The k-th edited last tactic."""
    return EDITS[k % len(EDITS)].format(k=k)
