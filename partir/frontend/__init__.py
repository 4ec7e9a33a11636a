"""JAX frontend: jaxpr -> IR."""

from partir.frontend.annotation import Annotation, annotation_p
from partir.frontend.jaxpr_to_ir import TracedProgram, inline_jaxpr, trace
from partir.frontend.tag import tag, tag_p

__all__ = ["Annotation", "TracedProgram", "annotation_p", "inline_jaxpr", "tag",
           "tag_p", "trace"]
