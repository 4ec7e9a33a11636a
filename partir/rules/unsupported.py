"""JAX primitives partir has no rule for, each with the reason, shown to users where
propagation stops at one (the `unsupported` conflict's detail, in the metadata, the
tactic's report and the editor's diagnostics).

`UNSUPPORTED` holds the primitives `jax.numpy`, `jax.nn`, `jax.lax` and `jax.random` can
emit; `NOT_EMITTED` those they never emit (JAX's internals, and what other modules emit:
callbacks, state, shard_map, shape polymorphism). Together with the catalogue, the calls
the frontend inlines and the sharding annotations it reads (`elementwise.ANNOTATIONS`)
they account for every primitive JAX registers, which tests/rules/test_primitive_coverage.py
checks: a new JAX primitive fails it until it is given a rule or a place here. A primitive
is in one place only.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping


def _reasons(*groups: tuple[str, Iterable[str]]) -> dict[str, str]:
    out: dict[str, str] = {}
    for reason, names in groups:
        for name in names:
            if name in out:
                raise ValueError(f"{name!r} is listed twice")
            out[name] = reason
    return out


_NAMED_AXES = ("a collective over a named axis of shard_map, pmap or vmap; partir partitions "
               "single-device programs and places its own collectives")

UNSUPPORTED: Mapping[str, str] = _reasons(
    (_NAMED_AXES, ("psum", "pmax", "pmin", "all_gather", "all_to_all", "reduce_scatter",
                   "ppermute", "axis_index", "pbroadcast", "pvary", "psend", "precv",
                   "ragged_all_to_all")),
    ("linear algebra on whole matrices (the trailing two dims); no rule for its batch dims "
     "yet", ("cholesky", "cholesky_update", "eig", "eigh", "hessenberg", "householder_product",
             "lu", "lu_pivots_to_permutation", "ormqr", "qr", "schur", "svd",
             "symmetric_product", "triangular_solve", "tridiagonal", "tridiagonal_solve")),
    ("a linear solve given as jaxprs (jnp.linalg.solve, inv, lax.custom_linear_solve), which "
     "partir does not look into", ("custom_linear_solve",)),
    ("a reduction with a user-defined computation (lax.reduce): no monoid to combine the "
     "partial results of a tile with", ("reduce",)),
    ("a grouped matmul whose group sizes are data (lax.ragged_dot): which rows form a group "
     "is known only at run time", ("ragged_dot_general",)),
    ("a block-scaled matmul (lax.scaled_dot, jax.nn.scaled_matmul); no rule for its scales "
     "yet", ("scaled_dot", "scaled_matmul_wrapper")),
    ("a cuDNN fused attention kernel (jax.nn.dot_product_attention(implementation='cudnn')); "
     "the default XLA implementation partitions",
     ("dot_product_attention_fwd_wrapper", "dot_product_attention_bwd_wrapper",
      "dot_product_attention_fp8_fwd_wrapper", "dot_product_attention_fp8_bwd_wrapper")),
    ("a random bit generator on an explicit state (lax.rng_bit_generator, the 'rbg' PRNG "
     "implementations): its bits depend on the whole shape, so a tile cannot make its own",
     ("rng_bit_generator", "rng_uniform")),
    ("a lax.composite: an opaque call with a decomposition, not inlined yet", ("composite",)),
    ("lax.platform_dependent's choice of a branch by platform", ("platform_index",)),
    ("an uninitialized array (lax.empty)", ("empty",)),
    ("side-effect ordering (tokens, lax.dce_sink): no tensor to partition",
     ("create_token", "after_all", "dce_sink")),
)

_STATE = "mutable state (refs, boxes, logs), which partir's programs do not have"
_HOST = "a host callback or foreign function call: opaque to partir"
_ASYNC = ("an asynchronous or typed-replication form of a collective, made inside JAX's "
          "own partitioner")
_INTERNAL = "internal to JAX's transformations and lowering"

NOT_EMITTED: Mapping[str, str] = _reasons(
    (_STATE, ("accum_grad_in_ref", "addupdate", "box_get", "box_set", "empty_ref", "free_ref",
              "freeze", "get", "log_extend", "log_read", "new_box", "new_log", "new_ref",
              "run_state", "swap")),
    (_HOST, ("pure_callback", "io_callback", "debug_callback", "debug_print", "ffi_call",
             "cudnn_fusion")),
    (_ASYNC, ("all_gather_done", "all_gather_invariant", "all_gather_reduced",
              "all_gather_reduced_start", "all_gather_start", "all_to_all_done",
              "all_to_all_start", "pbroadcast_done", "pbroadcast_start", "ppermute_done",
              "ppermute_start", "preduced", "psum_done", "psum_invariant",
              "psum_invariant_start", "psum_start", "reduce_scatter_done",
              "reduce_scatter_start", "reduced_vary_cast_p", "unreduced_psum",
              "unreduced_psum_start", "unreduced_reduce_scatter",
              "unreduced_reduce_scatter_start", "vary_unreduced_cast_p")),
    ("a nested SPMD program or explicit placement (shard_map, device_put, reshard, layouts, "
     "memory spaces, custom_partitioning)",
     ("shard_map", "device_put", "layout_constraint",
      "with_memory_space_constraint", "custom_partitioning", "inspect_sharding", "pin",
      "unpin")),
    ("shape polymorphism (jax.export): symbolic dimensions", ("dim_as_value",
                                                              "dimension_size",
                                                              "shape_assertion")),
    ("a call partir does not inline (jax.export, checkify, custom transposes and vmaps)",
     ("call", "call_exported", "call_hi_primitive", "call_hi_primitive_linearized", "check",
      "core_map", "custom_jvp_call_jaxpr", "custom_vmap_call", "eval_jaxpr", "linear_call",
      "remat_opt")),
    ("a kernel behind a wrapper primitive (the wrapper is what jax.nn emits)",
     ("dot_product_attention_fwd", "dot_product_attention_bwd", "dot_product_attention_fp8_fwd",
      "dot_product_attention_fp8_bwd", "scaled_matmul", "geqrf", "geqp3")),
    ("a PRNG implementation inside random_bits and random_split, which have rules",
     ("iota_2x32_shape", "philox2x32", "philox4x32", "threefry4x32")),
    (_INTERNAL, ("broadcast_to", "create_linear", "custom_lin", "empty2", "from_edtype",
                 "select_and_scatter", "stage", "tie", "to_edtype", "unreachable",
                 "zeros_like")),
)


def why_unsupported(name: str) -> str:
    """Why the primitive has no rule: its listed reason, or that it has none yet."""
    return (UNSUPPORTED.get(name) or NOT_EMITTED.get(name)
            or "partir has no rule for it yet")
