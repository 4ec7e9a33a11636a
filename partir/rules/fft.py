"""Fast Fourier transforms: `fft` (FFT, IFFT, RFFT, IRFFT) over the trailing
`len(fft_lengths)` dimensions.

The leading dimensions index independent transforms: pass-through factors of the operand
and the result. The transformed dimensions need replication: every output frequency
reads every input sample (a sliced transform would need the all-to-all exchanges of a
distributed FFT, which no `#tile`/`#sum` action expresses), and RFFT/IRFFT change the
last one's size.
"""

from __future__ import annotations

import math

from partir.rules.catalogue import Kind, OpView, Primitive, declare
from partir.rules.factors import RuleBuilder, ShardingRule


def fft_rule(view: OpView) -> ShardingRule:
    x, out = view.in_types[0], view.out_types[0]
    lead = x.rank - len(view.params["fft_lengths"])
    b = RuleBuilder([x.rank], [out.rank])
    for d in range(lead):
        b.factor(x.shape[d], {0: d}, {0: d})
    for d in range(lead, x.rank):
        if x.shape[d] == out.shape[d]:
            b.replicated(x.shape[d], {0: d}, {0: d})
        else:
            b.replicated(x.shape[d], operands={0: d})
            b.replicated(out.shape[d], results={0: d})
    return b.build()


def fft_flops(view: OpView, rule: ShardingRule | None) -> float:
    """5 N log2 N per transform of N = prod(fft_lengths) points (the radix-2 count),
    times the number of transforms (the product of the leading dims)."""
    lengths = view.params["fft_lengths"]
    x = view.in_types[0]
    n = math.prod(lengths)
    transforms = math.prod(x.shape[:x.rank - len(lengths)])
    return 5.0 * transforms * n * math.log2(n) if n > 1 else 0.0


declare("fft", Primitive(Kind.KERNEL, fft_flops, fft_rule,
                         doc="t_d -> t_d for every leading (not transformed) dimension"))
