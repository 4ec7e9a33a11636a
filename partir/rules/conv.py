"""Convolutions: `conv_general_dilated`, including the transposes autodiff produces.

Its `dimension_numbers` name, for the lhs (images), the rhs (kernel) and the output, the
batch / feature dimensions and the spatial ones (`lhs_spec = (batch, feature, *spatial)`,
`rhs_spec = (out feature, in feature, *spatial)`, `out_spec = (batch, feature,
*spatial)`). With `feature_group_count` G and `batch_group_count` B (XLA's semantics,
groups major):

- *feature groups*: the lhs feature dim is (G, Cin/G), the rhs in-feature dim is Cin/G,
  the rhs out-feature and output feature dims are (G, Cout/G). G is a pass-through factor
  (group g of the output reads group g of the images and of the kernel: depthwise convs
  shard on it); Cin/G is a reduction (`#sum`, the contracted features); Cout/G passes
  through. Without groups (G = 1) these are the usual batch -> batch, out feature ->
  feature tiles and in feature -> `#sum`.
- *batch groups* (the kernel gradient of a grouped conv): the lhs batch dim is (B, N/B),
  the rhs out-feature and output feature dims (B, Cout/B), the output batch dim N/B;
  output feature group b reads batch group b. B and Cout/B, N/B pass through; the lhs
  feature / rhs in-feature dim is a reduction.
- *spatial dims* need replication: a tile of an output row needs a halo of its
  neighbours' rows (window size - stride of them, more with padding and dilation), and
  partir does no halo exchange, so a sliced image is gathered before a conv.

The local group counts are the local sizes of factors G and B, read off the local types
(`lhs feature / rhs in-feature`, `lhs batch / out batch`), which also lets the rule be
built on local types with the global parameters.
"""

from __future__ import annotations

from partir.rules.catalogue import Kind, OpView, Primitive, declare
from partir.rules.factors import REDUCTION, RuleBuilder, ShardingRule


def _specs(view: OpView):
    dn = view.params["dimension_numbers"]
    return dn.lhs_spec, dn.rhs_spec, dn.out_spec


def group_counts(view: OpView) -> tuple[int, int]:
    """(feature groups, batch groups) of the op whose (local) types the view gives."""
    lhs_spec, rhs_spec, out_spec = _specs(view)
    lhs, rhs = view.in_shapes
    out = view.out_shapes[0]
    return lhs[lhs_spec[1]] // rhs[rhs_spec[1]], lhs[lhs_spec[0]] // out[out_spec[0]]


def conv_rule(view: OpView) -> ShardingRule:
    lhs_spec, rhs_spec, out_spec = _specs(view)
    lhs, rhs = view.in_shapes
    out = view.out_shapes[0]
    g, bg = group_counts(view)
    b = RuleBuilder([len(lhs), len(rhs)], [len(out)])
    lb, lf = lhs_spec[:2]
    ro, ri = rhs_spec[:2]
    ob, of = out_spec[:2]
    if g > 1 and bg > 1:  # XLA rejects it; nothing to prove
        for t, shape in enumerate((lhs, rhs)):
            for d, n in enumerate(shape):
                b.replicated(n, operands={t: d})
        for d, n in enumerate(out):
            b.replicated(n, results={0: d})
        return b.build()
    if g > 1:
        b.factor(g, {0: lf, 1: ro}, {0: of})
    if bg > 1:
        b.factor(bg, {0: lb, 1: ro}, {0: of})
    b.factor(out[ob], {0: lb}, {0: ob})  # batch (per batch group)
    b.factor(rhs[ro] // (g * bg), {1: ro}, {0: of})  # output features (per group)
    b.factor(rhs[ri], {0: lf, 1: ri}, kind=REDUCTION, monoid="add")  # input features
    for t, spec, shape in ((0, lhs_spec, lhs), (1, rhs_spec, rhs)):
        for d in spec[2:]:
            b.replicated(shape[d], operands={t: d})
    for d in out_spec[2:]:
        b.replicated(out[d], results={0: d})
    return b.build()


def conv_localize(view: OpView) -> dict:
    g, bg = group_counts(view)
    return {**view.params, "feature_group_count": g, "batch_group_count": bg}


def conv_flops(view: OpView, rule: ShardingRule | None) -> float:
    """2 * |out| * (input features per group) * prod(window) = 2 * |out| * |rhs| / (output
    features), as XLA's HloCostAnalysis counts."""
    rhs = view.in_types[1]
    out_feature_dim = view.params["dimension_numbers"].rhs_spec[0]
    return 2.0 * view.out_types[0].size * rhs.size / rhs.shape[out_feature_dim]


declare("conv_general_dilated", Primitive(
    Kind.KERNEL, conv_flops, conv_rule, localize=conv_localize, matmul=True,
    doc="batch -> tile, output features -> tile, input features -> #sum; feature / "
        "batch groups -> tile (local group count); spatial dims whole (no halo exchange)"))
