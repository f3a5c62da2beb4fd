"""GPT: decoder-only, causal self-attention, pre-norm, final norm, tied head."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from txjax import ops
from txjax.config import GPTConfig
from txjax.nn import Embed, TransformerStack, check_tokens
from txjax.nn.blocks import KVCache
from txjax.nn.layers import INIT, Dense


class GPT(nnx.Module):
    def __init__(self, config: GPTConfig, *, rngs: nnx.Rngs | None = None):
        rngs = nnx.Rngs(0) if rngs is None else rngs
        self.config = config
        self.embed = Embed(config.vocab_size, config.d_model, rngs=rngs, dtype=config.dtype)
        self.dropout = nnx.Dropout(config.dropout, rngs=rngs)
        self.decoder = TransformerStack(config, config.num_layers, causal=True, cross=False, rngs=rngs)
        self.head = (
            None if config.tie_embeddings
            else Dense(config.d_model, config.vocab_size, use_bias=False, kernel_init=INIT,
                            dtype=config.dtype, rngs=rngs)
        )

    def mask(self, tokens_BT: jax.Array) -> jax.Array:
        """Causal, and padding where the config names a pad id."""
        mask = ops.causal_mask(tokens_BT.shape[1])
        if self.config.pad_id is not None:
            mask = mask & ops.padding_mask(tokens_BT, self.config.pad_id)
        return mask

    def logits(self, h_BTD: jax.Array) -> jax.Array:
        """float32 logits (the head may compute in bfloat16)."""
        return self.embed.attend(h_BTD) if self.head is None else self.head(h_BTD).astype(jnp.float32)

    def __call__(self, tokens_BT: jax.Array) -> jax.Array:
        """tokens_BT -> logits_BTV; position t sees tokens 0..t only."""
        check_tokens(tokens_BT, self.config.vocab_size)
        positions_T = jnp.arange(tokens_BT.shape[1])
        x_BTD = self.decoder.embed_positions(self.embed(tokens_BT), positions_T)
        h_BTD = self.decoder(self.dropout(x_BTD), self.mask(tokens_BT), positions_T)
        return self.logits(h_BTD)

    def init_cache(self, batch: int, max_len: int, dtype=None) -> KVCache:
        """An empty KV cache of `max_len` slots per layer for `decode_step`."""
        c = self.config
        dtype = self.embed.embedding.dtype if dtype is None else dtype
        return KVCache.zeros(c.num_layers, batch, max_len, c.num_heads, c.head_size, dtype)

    def decode_step(self, tokens_BT: jax.Array, cache: KVCache) -> tuple[jax.Array, KVCache]:
        """(tokens_BT, cache) -> (logits_BTV, cache): the T tokens at positions index .. index + T - 1.

        The logits equal those of `__call__` on the whole sequence so far at these
        positions; only the new tokens go through the stack. Feed a prompt at once
        (prefill), then one token per step.
        """
        check_tokens(tokens_BT, self.config.vocab_size)
        positions_T = cache.index + jnp.arange(tokens_BT.shape[1], dtype=jnp.int32)
        x_BTD = self.decoder.embed_positions(self.embed(tokens_BT), positions_T)
        valid_BT = None if self.config.pad_id is None else tokens_BT != self.config.pad_id
        h_BTD, cache = self.decoder.decode_step(self.dropout(x_BTD), cache, valid_BT)
        return self.logits(h_BTD), cache
