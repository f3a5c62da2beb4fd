"""T5: encoder-decoder; every decoder block cross-attends to the final encoder output."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from txjax.config import ExecutionConfig, T5Config
from txjax.models.base import Model
from txjax.nn import KVCache, TransformerStack, check_document_ids, check_tokens


class T5(Model):
    def __init__(self, config: T5Config, *, rngs: nnx.Rngs | None = None,
                 execution: ExecutionConfig | None = None):
        rngs = nnx.Rngs(0) if rngs is None else rngs
        super().__init__(config, rngs, execution)
        stack = dict(rngs=rngs, execution=self.execution)
        self.encoder = TransformerStack(config, config.num_layers, causal=False, cross=False, **stack)
        self.decoder = TransformerStack(config, config.decoder_layers, causal=True, cross=True, **stack)
        self.head = self.untied_head(rngs)

    def encoder_valid(self, enc_tokens_BS: jax.Array, lengths_B: jax.Array | None = None) -> jax.Array | None:
        """False at <pad> encoder tokens and (with `lengths_B`) after each row's first L_b tokens:
        keys no query sees. None when every key is real."""
        valid_BS = None if self.config.pad_id is None else enc_tokens_BS != self.config.pad_id
        if lengths_B is None:
            return valid_BS
        within_BS = jnp.arange(enc_tokens_BS.shape[1])[None, :] < jnp.asarray(lengths_B)[:, None]
        return within_BS if valid_BS is None else valid_BS & within_BS

    def encode(self, enc_tokens_BS: jax.Array, document_ids_BS: jax.Array | None = None,
               lengths_B: jax.Array | None = None) -> jax.Array:
        """enc_tokens_BS -> enc_BSD, the final (normed) encoder output; document_ids_BS as in
        `__call__`, lengths_B (int [B]): only each row's first L_b tokens are read."""
        enc_tokens_BS = check_tokens(enc_tokens_BS, self.config.vocab_size, "encoder tokens")
        if document_ids_BS is not None:
            document_ids_BS = check_document_ids(document_ids_BS, enc_tokens_BS.shape, "enc_document_ids")
        valid_BS = self.encoder_valid(enc_tokens_BS, lengths_B)
        positions_S = self.positions(enc_tokens_BS, document_ids_BT=document_ids_BS, valid_BT=valid_BS)
        x_BSD = self.encoder.embed_positions(self.token_embeddings(enc_tokens_BS), positions_S)
        h_BSD, _ = self.encoder(self.dropout(x_BSD), positions_S, documents_BT=document_ids_BS,
                                valid_BT=valid_BS)
        return self.dropout(h_BSD)

    def logits(self, h_BTD: jax.Array) -> jax.Array:
        if self.head is not None:
            return self.head(h_BTD).astype(jnp.float32)
        # T5 rescales before a tied head so logits keep the scale of an untied one.
        return self.embed.attend(h_BTD * self.config.d_model**-0.5)

    def forward_decoder(self, dec_tokens_BT: jax.Array, *, enc_BSD: jax.Array | None = None,
                        enc_valid_BS: jax.Array | None = None, cache: KVCache | None = None,
                        document_ids_BT: jax.Array | None = None,
                        enc_document_ids_BS: jax.Array | None = None) -> tuple[jax.Array, KVCache | None]:
        """(logits_BTV, cache): the decoder over the whole sequence and enc_BSD, or (with a cache
        from `init_cache`) the T tokens after what it holds."""
        dec_tokens_BT = check_tokens(dec_tokens_BT, self.config.vocab_size, "decoder tokens")
        if (document_ids_BT is None) != (enc_document_ids_BS is None):
            raise ValueError("packed T5 inputs need document ids for both the encoder and the decoder")
        if document_ids_BT is not None:
            document_ids_BT = check_document_ids(document_ids_BT, dec_tokens_BT.shape, "dec_document_ids")
        positions_T = self.positions(dec_tokens_BT, cache, document_ids_BT)
        x_BTD = self.decoder.embed_positions(self.token_embeddings(dec_tokens_BT), positions_T)
        h_BTD, cache = self.decoder(self.dropout(x_BTD), positions_T, documents_BT=document_ids_BT,
                                    enc_BSD=enc_BSD, enc_valid_BS=enc_valid_BS,
                                    enc_documents_BS=enc_document_ids_BS, cache=cache)
        return self.logits(self.dropout(h_BTD)), cache

    def decode(self, dec_tokens_BT: jax.Array, enc_BSD: jax.Array, enc_tokens_BS: jax.Array,
               dec_document_ids_BT: jax.Array | None = None,
               enc_document_ids_BS: jax.Array | None = None) -> jax.Array:
        """Decoder logits given the encoder output; enc_tokens_BS gives the cross padding mask."""
        dec_tokens_BT, enc_tokens_BS = jnp.asarray(dec_tokens_BT), jnp.asarray(enc_tokens_BS)
        if enc_BSD.ndim != 3 or enc_BSD.shape[0] != dec_tokens_BT.shape[0]:
            raise ValueError(
                f"encoder output {enc_BSD.shape} does not match decoder tokens {dec_tokens_BT.shape}"
            )
        return self.forward_decoder(dec_tokens_BT, enc_BSD=enc_BSD, enc_valid_BS=self.encoder_valid(enc_tokens_BS),
                                    document_ids_BT=dec_document_ids_BT,
                                    enc_document_ids_BS=enc_document_ids_BS)[0]

    def init_cache(self, enc_tokens_BS: jax.Array, max_len: int, dtype=None,
                   lengths_B: jax.Array | None = None) -> KVCache:
        """Encode once and cache what the decoder needs from it, for `decode_step`.

        Every decoder layer's cross-attention keys and values are projected from the
        encoder output here, once; the self-attention cache gets `max_len` empty slots.
        lengths_B: only each row's first L_b encoder tokens are read (inputs of different lengths).
        """
        c = self.config
        enc_tokens_BS = jnp.asarray(enc_tokens_BS)
        enc_BSD = self.encode(enc_tokens_BS, lengths_B=lengths_B)
        cross = [block.cross_attn.project_kv(enc_BSD) for block in self.decoder.blocks]
        valid_BS = self.encoder_valid(enc_tokens_BS, lengths_B)
        dtype = self.embed.embedding.dtype if dtype is None else dtype
        return KVCache.zeros(
            c.decoder_layers, enc_tokens_BS.shape[0], max_len, c.kv_heads, c.head_size, dtype,
            cross_k=tuple(k for k, _ in cross),
            cross_v=tuple(v for _, v in cross),
            cross_mask=None if valid_BS is None else valid_BS[:, None, None, :],
        )

    def decode_step(self, dec_tokens_BT: jax.Array, cache: KVCache) -> tuple[jax.Array, KVCache]:
        """(dec_tokens_BT, cache) -> (logits_BTV, cache), as `decode` at positions index .. index + T - 1."""
        if cache.cross_k is None:
            raise ValueError("T5.decode_step needs a cache from T5.init_cache(enc_tokens_BS, max_len)")
        return self.forward_decoder(dec_tokens_BT, cache=cache)

    def __call__(self, enc_tokens_BS: jax.Array, dec_tokens_BT: jax.Array,
                 enc_document_ids_BS: jax.Array | None = None,
                 dec_document_ids_BT: jax.Array | None = None) -> jax.Array:
        """(enc_tokens_BS, dec_tokens_BT) -> logits_BTV.

        Packed pairs: with document ids for both (non-decreasing along each row), encoder and
        decoder attention stay inside each document, decoder tokens read only their own
        document's encoder tokens, and positions restart at 0 at each document.
        """
        enc_tokens_BS = jnp.asarray(enc_tokens_BS)
        enc_BSD = self.encode(enc_tokens_BS, enc_document_ids_BS)
        return self.decode(dec_tokens_BT, enc_BSD, enc_tokens_BS, dec_document_ids_BT, enc_document_ids_BS)
