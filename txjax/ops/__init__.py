"""Pure functions: no parameters, no state, no Flax.

Shape suffixes, used everywhere in txjax:

    B  batch
    T  query length
    S  key length
    D  model width
    N  heads (query heads)
    K  key/value heads (grouped-query attention: K divides N; K = N otherwise)
    G  query heads per key/value head, N / K (M = G * T: a group's queries side by side)
    H  head width (D = N * H)
    F  feed-forward width
    V  vocabulary

so `q_BTNH` is queries of shape [batch, query length, heads, head width] and
`bias_BNTS` an additive attention bias. Masks are booleans (True = may attend)
until `mask_to_bias`, the one place that makes `-inf`.

These are the plain formulas. `txjax.ops.xla_cpu` has `dense` and `dot_product_attention`
with the same values and the backward pass in the form XLA:CPU runs fast; the execution
config, not these functions, chooses between them.
"""

from txjax.ops.attention import (
    attention_mask,
    attention_weights,
    causal_mask,
    dot_product_attention,
    mask_to_bias,
    merge_heads,
    padding_mask,
    split_heads,
)
from txjax.ops.losses import cross_entropy, token_nll
from txjax.ops.activations import ACTIVATIONS, gelu
from txjax.ops.linear import dense
from txjax.ops.norms import layer_norm, rms_norm
from txjax.ops.positions import (
    KERPLE_VARIANTS,
    alibi_bias,
    alibi_slopes,
    ROPE_SCALINGS,
    apply_rope,
    apply_xpos,
    document_positions,
    fire_bias,
    kerple_bias,
    random_distances,
    random_offsets,
    random_positions,
    relative_positions,
    rope_attention_factor,
    rope_inv_freq,
    rotate_half,
    sinusoidal_positions,
    t5_relative_position_bucket,
)

__all__ = [
    "ACTIVATIONS",
    "KERPLE_VARIANTS",
    "alibi_bias",
    "alibi_slopes",
    "apply_rope",
    "apply_xpos",
    "document_positions",
    "attention_mask",
    "attention_weights",
    "causal_mask",
    "cross_entropy",
    "dense",
    "dot_product_attention",
    "fire_bias",
    "gelu",
    "kerple_bias",
    "layer_norm",
    "mask_to_bias",
    "merge_heads",
    "padding_mask",
    "random_distances",
    "random_offsets",
    "random_positions",
    "relative_positions",
    "rms_norm",
    "rope_attention_factor",
    "rope_inv_freq",
    "ROPE_SCALINGS",
    "rotate_half",
    "sinusoidal_positions",
    "split_heads",
    "t5_relative_position_bucket",
    "token_nll",
]
