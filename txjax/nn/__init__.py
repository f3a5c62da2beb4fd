"""Flax NNX modules: they own parameters and call `txjax.ops`."""

from txjax.nn.blocks import TransformerBlock, TransformerStack
from txjax.nn.layers import (
    Dense,
    Embed,
    FeedForward,
    LayerNorm,
    MultiHeadAttention,
    Positions,
    RelativePositionBias,
    RMSNorm,
    check_tokens,
    make_norm,
)

__all__ = [
    "Dense",
    "Embed",
    "FeedForward",
    "LayerNorm",
    "MultiHeadAttention",
    "Positions",
    "RMSNorm",
    "RelativePositionBias",
    "TransformerBlock",
    "TransformerStack",
    "check_tokens",
    "make_norm",
]
