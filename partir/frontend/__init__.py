"""JAX frontend: jaxpr -> IR."""

from partir.frontend.jaxpr_to_ir import BodyTag, TracedProgram, inline_jaxpr, trace
from partir.frontend.tag import tag, tag_p

__all__ = ["BodyTag", "TracedProgram", "inline_jaxpr", "tag", "tag_p", "trace"]
