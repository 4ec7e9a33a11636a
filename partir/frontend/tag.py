"""`partir.tag(x, name)`: names a model-internal value so tactics can refer to it.

It is an identity primitive that survives tracing and differentiation (the tangent is
passed through untagged), and lowers to nothing.
"""

from __future__ import annotations

import jax
from jax.extend.core import Primitive
from jax.interpreters import ad, batching, mlir

from partir.ir.opnames import TAG

tag_p = Primitive(TAG)
tag_p.def_impl(lambda x, *, name: x)
tag_p.def_abstract_eval(lambda x, *, name: x)
mlir.register_lowering(tag_p, lambda ctx, x, *, name: [x])


def _tag_jvp(primals, tangents, *, name):
    (x,), (t,) = primals, tangents
    return tag_p.bind(x, name=name), t


ad.primitive_jvps[tag_p] = _tag_jvp
batching.primitive_batchers[tag_p] = lambda args, dims, *, name: (tag_p.bind(args[0], name=name),
                                                                  dims[0])


def tag(x: jax.Array, name: str) -> jax.Array:
    """Name the value `x` as `name`; tactics can then tile it or keep it replicated."""
    if not isinstance(name, str) or not name:
        raise TypeError(f"partir.tag needs a non-empty string name, got {name!r}")
    return tag_p.bind(x, name=name)
