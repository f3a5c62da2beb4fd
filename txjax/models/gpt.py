"""GPT: decoder-only, causal self-attention, pre-norm, final norm, tied head."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from txjax.config import ExecutionConfig, GPTConfig
from txjax.models.base import Model
from txjax.nn import KVCache, TransformerStack, check_document_ids, check_tokens


class GPT(Model):
    def __init__(self, config: GPTConfig, *, rngs: nnx.Rngs | None = None,
                 execution: ExecutionConfig | None = None):
        rngs = nnx.Rngs(0) if rngs is None else rngs
        super().__init__(config, rngs, execution)
        self.decoder = TransformerStack(config, config.num_layers, causal=True, cross=False, rngs=rngs,
                                        execution=self.execution)
        self.head = self.untied_head(rngs)

    def valid(self, tokens_BT: jax.Array) -> jax.Array | None:
        """False at pad tokens, whose keys no query sees; None without a pad id."""
        return None if self.config.pad_id is None else tokens_BT != self.config.pad_id

    def logits(self, h_BTD: jax.Array) -> jax.Array:
        """float32 logits (the head may compute in bfloat16)."""
        return self.embed.attend(h_BTD) if self.head is None else self.head(h_BTD).astype(jnp.float32)

    def __call__(self, tokens_BT: jax.Array, document_ids_BT: jax.Array | None = None) -> jax.Array:
        """tokens_BT -> logits_BTV; position t sees tokens 0..t only (and no pad key).

        document_ids_BT (packed sequences, non-decreasing along each row): a token sees only
        earlier tokens of its own document, and positions restart at 0 at each document, so
        each document's logits are those it gets alone.
        """
        return self.forward(tokens_BT, document_ids_BT=document_ids_BT)[0]

    def forward(self, tokens_BT: jax.Array, cache: KVCache | None = None,
                document_ids_BT: jax.Array | None = None) -> tuple[jax.Array, KVCache | None]:
        """(logits_BTV, cache): the whole sequence, or (with a cache) the T tokens after it."""
        tokens_BT = check_tokens(tokens_BT, self.config.vocab_size)
        if document_ids_BT is not None:
            document_ids_BT = check_document_ids(document_ids_BT, tokens_BT.shape)
        positions_T = self.positions(tokens_BT, cache, document_ids_BT)
        x_BTD = self.decoder.embed_positions(self.token_embeddings(tokens_BT), positions_T)
        h_BTD, cache = self.decoder(self.dropout(x_BTD), positions_T, valid_BT=self.valid(tokens_BT),
                                    documents_BT=document_ids_BT, cache=cache)
        return self.logits(h_BTD), cache

    def init_cache(self, batch: int, max_len: int, dtype=None) -> KVCache:
        """An empty KV cache of `max_len` slots per layer for `decode_step`."""
        c = self.config
        dtype = self.embed.embedding.dtype if dtype is None else dtype
        return KVCache.zeros(c.num_layers, batch, max_len, c.kv_heads, c.head_size, dtype)

    def decode_step(self, tokens_BT: jax.Array, cache: KVCache) -> tuple[jax.Array, KVCache]:
        """(tokens_BT, cache) -> (logits_BTV, cache): the T tokens at positions index .. index + T - 1.

        The logits equal those of `__call__` on the whole sequence so far at these
        positions; only the new tokens go through the stack. Feed a prompt at once
        (prefill), then one token per step.
        """
        return self.forward(tokens_BT, cache)
