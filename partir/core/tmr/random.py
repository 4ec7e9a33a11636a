"""PRNG primitives: keys made, split, folded, wrapped and turned into random bits.

JAX computes these primitives by mapping the PRNG implementation over every element of
a key array, so each dimension of the keys is an independent instance and tiles like an
elementwise dimension (a batch of keys sharded like data). Dimensions a primitive adds
from a single key (the `shape` of `random_bits` and `random_split`, the draws of
`random_gamma` beyond the keys' rank) are computed from a counter over the whole added
shape: a tile of them is not the same primitive on a smaller shape, so they are not
offered and such a result stays whole. The key data's trailing dims (`random_wrap`'s
operand, `random_unwrap`'s result) hold one key together and are never sliced.
"""

from __future__ import annotations

from partir.core.tmr.elementwise import elementwise_mappings, leading_dims_mappings
from partir.core.tmr.registry import Entry, register

# The keys (or key data) are the first operand and lead every other operand and result.
register(("random_bits", "random_split", "random_wrap", "random_unwrap", "random_gamma"),
         Entry(leading_dims_mappings, doc="t_d -> t_d for every dim d of the key array; "
                                          "dims added from one key (bits, splits, key "
                                          "data) whole"))
register(("random_seed", "random_fold_in", "random_clone", "threefry2x32"),
         Entry(elementwise_mappings, doc="t_d, ..., t_d -> t_d for every dimension d: "
                                         "one key (or counter) per element"))
