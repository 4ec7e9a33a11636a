"""`partir lsp`: the language server's command in the `partir` command line, added through
the `partir.commands` entry point."""

from __future__ import annotations

import argparse
from typing import Any


def add_command(commands: Any) -> None:
    lsp = commands.add_parser(
        "lsp", help="run the language server over stdio (editors start it)",
        description="The PartIR language server over stdio: diagnostics, hovers, code lenses "
                    "and inlay hints for schedule files, computed by the workspace's daemon "
                    "(see lsp/README.md).")
    lsp.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    # Imported here: building the parser for another command needs no server.
    from partir_lsp.server import main

    return main()
