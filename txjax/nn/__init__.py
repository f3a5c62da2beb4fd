"""Flax NNX modules: they own parameters and call `txjax.ops`."""

from txjax.nn.attention import LayerCache, MultiHeadAttention
from txjax.nn.blocks import KVCache, TransformerBlock, TransformerStack
from txjax.nn.layers import (Dense, Embed, FeedForward, LayerNorm, RMSNorm, check_document_ids, check_tokens,
                             make_norm)
from txjax.nn.positions import Positions, RelativePositionBias

__all__ = [
    "Dense",
    "Embed",
    "FeedForward",
    "KVCache",
    "LayerCache",
    "LayerNorm",
    "MultiHeadAttention",
    "Positions",
    "RMSNorm",
    "RelativePositionBias",
    "TransformerBlock",
    "TransformerStack",
    "check_document_ids",
    "check_tokens",
    "make_norm",
]
