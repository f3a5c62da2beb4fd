"""What every family's top-level model holds first: its configs, the token embedding, embedding dropout."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from txjax import ops
from txjax.config import ExecutionConfig, TransformerConfig
from txjax.nn import Embed, KVCache
from txjax.nn.layers import Dense, dense_kwargs, embedding_init
from txjax.nn.random_positions import RandomPositions


class Model(nnx.Module):
    """`config` (what is computed), `execution` (how), `embed` [V, D], `dropout` on embeddings,
    and (with `config.random_positions` in its "positions" form) the random positions drawn while
    training; each stack's `Positions` draws the other forms."""

    def __init__(self, config: TransformerConfig, rngs: nnx.Rngs, execution: ExecutionConfig | None):
        self.config = config
        self.execution = ExecutionConfig() if execution is None else execution
        self.embed = Embed(config.vocab_size, config.d_model, rngs=rngs, dtype=config.dtype,
                           init=embedding_init(config))
        self.dropout = nnx.Dropout(config.dropout, rngs=rngs)
        self.random_positions = (RandomPositions.of(config, rngs) if config.random_positions is not None
                                 and config.random_positions_form == "positions" else None)

    def token_embeddings(self, tokens_BT: jax.Array) -> jax.Array:
        """The token table's rows, times sqrt(D) under `config.scale_embeddings` (Vaswani et al.)."""
        x_BTD = self.embed(tokens_BT)
        return x_BTD * self.config.d_model**0.5 if self.config.scale_embeddings else x_BTD

    def positions(self, tokens_BT: jax.Array, cache: KVCache | None = None,
                  document_ids_BT: jax.Array | None = None, valid_BT: jax.Array | None = None) -> jax.Array:
        """Where the tokens sit: 0..T-1 ([T]); after a cache's `index` tokens (per row after its
        left padding); restarting at 0 at each document of a packed row ([B, T]); or, while
        training with `config.random_positions`, a sorted random subset per row ([B, T]), of
        which a packed document takes the first ones (with `valid_BT`, False at pads, a padded
        row's real tokens are drawn as if the row had no pads)."""
        b, t = tokens_BT.shape
        positions_T = jnp.arange(t, dtype=jnp.int32)
        if cache is not None:
            return cache.positions(cache.index + positions_T)
        drawn_BT = None if self.random_positions is None else self.random_positions(
            b, t, valid_BT if document_ids_BT is None else None)
        if document_ids_BT is None:
            return positions_T if drawn_BT is None else drawn_BT
        in_document_BT = ops.document_positions(document_ids_BT)
        return in_document_BT if drawn_BT is None else jnp.take_along_axis(drawn_BT, in_document_BT, axis=1)

    def untied_head(self, rngs: nnx.Rngs) -> Dense | None:
        """The output projection D -> V, or None when the head is the embedding (tied)."""
        if self.config.tie_embeddings:
            return None
        return Dense(self.config.d_model, self.config.vocab_size,
                     **dense_kwargs(self.config, self.execution, rngs, use_bias=False))
