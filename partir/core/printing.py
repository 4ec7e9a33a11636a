"""Text of a Core program in the paper's syntax."""

from __future__ import annotations

import partir.core.dialect  # noqa: F401  (registers the loop/slice/tag syntax)
from partir.core.materialize import materialize
from partir.core.program import CoreProgram
from partir.ir import print_function


def print_core(prog: CoreProgram, fuse: bool = True, elide_identities: bool = True) -> str:
    return print_function(materialize(prog, fuse=fuse, elide_identities=elide_identities))
