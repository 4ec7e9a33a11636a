"""JAX frontend: jaxpr -> IR."""

from partir.frontend.jaxpr_to_ir import TracedProgram, trace
from partir.frontend.tag import tag, tag_p

__all__ = ["TracedProgram", "tag", "tag_p", "trace"]
