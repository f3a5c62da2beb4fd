"""Pure functions: no parameters, no state, no Flax.

Shape suffixes, used everywhere in txjax:

    B  batch
    T  query length
    S  key length
    D  model width
    N  heads
    H  head width (D = N * H)
    F  feed-forward width
    V  vocabulary

so `q_BTNH` is queries of shape [batch, query length, heads, head width] and
`bias_BNTS` an additive attention bias. Masks are booleans (True = may attend)
until `mask_to_bias`, the one place that makes `-inf`.
"""

from txjax.ops.attention import (
    attention_weights,
    causal_mask,
    dot_product_attention,
    mask_to_bias,
    merge_heads,
    padding_mask,
    split_heads,
)
from txjax.ops.losses import cross_entropy, token_nll
from txjax.ops.matmul import cpu_nn_grads, dense
from txjax.ops.norms import layer_norm, rms_norm
from txjax.ops.positions import (
    alibi_bias,
    alibi_slopes,
    apply_rope,
    sinusoidal_positions,
    t5_relative_position_bucket,
)

__all__ = [
    "alibi_bias",
    "alibi_slopes",
    "apply_rope",
    "attention_weights",
    "causal_mask",
    "cpu_nn_grads",
    "cross_entropy",
    "dense",
    "dot_product_attention",
    "layer_norm",
    "mask_to_bias",
    "merge_heads",
    "padding_mask",
    "rms_norm",
    "sinusoidal_positions",
    "split_heads",
    "t5_relative_position_bucket",
    "token_nll",
]
