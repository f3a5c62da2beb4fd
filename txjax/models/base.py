"""What every family's top-level model holds first: its configs, the token embedding, embedding dropout."""

from __future__ import annotations

from flax import nnx

from txjax.config import ExecutionConfig, TransformerConfig
from txjax.nn import Embed
from txjax.nn.layers import Dense, dense_kwargs


class Model(nnx.Module):
    """`config` (what is computed), `execution` (how), `embed` [V, D] and `dropout` on embeddings."""

    def __init__(self, config: TransformerConfig, rngs: nnx.Rngs, execution: ExecutionConfig | None):
        self.config = config
        self.execution = ExecutionConfig() if execution is None else execution
        self.embed = Embed(config.vocab_size, config.d_model, rngs=rngs, dtype=config.dtype)
        self.dropout = nnx.Dropout(config.dropout, rngs=rngs)

    def untied_head(self, rngs: nnx.Rngs) -> Dense | None:
        """The output projection D -> V, or None when the head is the embedding (tied)."""
        if self.config.tie_embeddings:
            return None
        return Dense(self.config.d_model, self.config.vocab_size,
                     **dense_kwargs(self.config, self.execution, rngs, use_bias=False))
