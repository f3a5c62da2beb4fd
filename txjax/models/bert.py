"""BERT: encoder-only, bidirectional attention with a padding mask; an MLM head, a pooler, or no head.

`config.head` says what sits on the encoder: "mlm" (pre-training; `Bert(...)(tokens)` is the MLM
logits), or, for encoder checkpoints such as sentence-embedding models, "none" or "pooler":
`Bert(...)(tokens)` is then the hidden states h_BTD, and with "pooler" `pooled(h_BTD)` is BERT's
sentence vector tanh(dense(h of [CLS])).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from txjax import ops
from txjax.config import BertConfig, ExecutionConfig
from txjax.models.base import Model
from txjax.nn import Embed, TransformerStack, check_document_ids, check_tokens, make_norm
from txjax.nn.layers import Dense, dense_kwargs


class MLMHead(nnx.Module):
    """BERT's transform (dense, activation, norm) then the tied decoder plus a bias."""

    def __init__(self, config: BertConfig, *, rngs: nnx.Rngs, execution: ExecutionConfig):
        self.activation = config.activation
        self.dense = Dense(config.d_model, config.d_model, **dense_kwargs(config, execution, rngs, use_bias=True))
        self.norm = make_norm(config, execution)
        self.bias = nnx.Param(jnp.zeros((config.vocab_size,)))

    def __call__(self, h_BTD: jax.Array, embed: Embed) -> jax.Array:
        h_BTD = self.norm(ops.ACTIVATIONS[self.activation](self.dense(h_BTD)))
        return embed.attend(h_BTD) + self.bias[...][None, None, :]


class Pooler(nnx.Module):
    """BERT's pooler: tanh(dense(h at the first token, [CLS])), the input of NSP and classifiers."""

    def __init__(self, config: BertConfig, *, rngs: nnx.Rngs, execution: ExecutionConfig):
        self.dense = Dense(config.d_model, config.d_model, **dense_kwargs(config, execution, rngs, use_bias=True))

    def __call__(self, h_BTD: jax.Array) -> jax.Array:
        return jnp.tanh(self.dense(h_BTD[:, 0]))


class Bert(Model):
    def __init__(self, config: BertConfig, *, rngs: nnx.Rngs | None = None,
                 execution: ExecutionConfig | None = None):
        rngs = nnx.Rngs(0) if rngs is None else rngs
        super().__init__(config, rngs, execution)
        self.segments = Embed(config.type_vocab_size, config.d_model, rngs=rngs, dtype=config.dtype)
        self.embed_norm = make_norm(config, self.execution) if config.embedding_norm else None
        self.encoder = TransformerStack(config, config.num_layers, causal=False, cross=False, rngs=rngs,
                                        execution=self.execution)
        self.mlm = MLMHead(config, rngs=rngs, execution=self.execution) if config.head == "mlm" else None
        self.pooler = Pooler(config, rngs=rngs, execution=self.execution) if config.head == "pooler" else None

    def valid(self, tokens_BT: jax.Array) -> jax.Array | None:
        """False at [PAD] tokens, whose keys no query sees; None without a pad id."""
        return None if self.config.pad_id is None else tokens_BT != self.config.pad_id

    def embed_tokens(self, tokens_BT: jax.Array, segment_ids_BT: jax.Array | None = None,
                     positions_T: jax.Array | None = None) -> jax.Array:
        """Token + segment + absolute position embeddings, normed: what enters the first block."""
        tokens_BT = check_tokens(tokens_BT, self.config.vocab_size)
        if segment_ids_BT is None:
            segment_ids_BT = jnp.zeros_like(tokens_BT)
        elif (segment_ids_BT := jnp.asarray(segment_ids_BT)).shape != tokens_BT.shape:
            raise ValueError(
                f"segment_ids {segment_ids_BT.shape} must have the shape of tokens {tokens_BT.shape}"
            )
        else:
            check_tokens(segment_ids_BT, self.config.type_vocab_size, "segment_ids")
        positions_T = self.positions(tokens_BT) if positions_T is None else positions_T
        x_BTD = self.token_embeddings(tokens_BT) + self.segments(segment_ids_BT)
        x_BTD = self.encoder.embed_positions(x_BTD, positions_T)
        return x_BTD if self.embed_norm is None else self.embed_norm(x_BTD)

    def encode(self, tokens_BT: jax.Array, segment_ids_BT: jax.Array | None = None,
               document_ids_BT: jax.Array | None = None) -> jax.Array:
        """Contextual embeddings h_BTD (before any head)."""
        tokens_BT = check_tokens(tokens_BT, self.config.vocab_size)
        if document_ids_BT is not None:
            document_ids_BT = check_document_ids(document_ids_BT, tokens_BT.shape)
        valid_BT = self.valid(tokens_BT)
        positions_T = self.positions(tokens_BT, document_ids_BT=document_ids_BT, valid_BT=valid_BT)
        x_BTD = self.embed_tokens(tokens_BT, segment_ids_BT, positions_T)
        return self.encoder(self.dropout(x_BTD), positions_T, valid_BT=valid_BT,
                            documents_BT=document_ids_BT)[0]

    def __call__(self, tokens_BT: jax.Array, segment_ids_BT: jax.Array | None = None,
                 document_ids_BT: jax.Array | None = None) -> jax.Array:
        """tokens_BT -> mlm_logits_BTV (head "mlm"), else the hidden states h_BTD, as `encode`.
        segment_ids_BT: sentence A/B token types. document_ids_BT (packed sequences, non-decreasing
        along each row): attention stays inside each document and positions restart at 0 at each one."""
        h_BTD = self.encode(tokens_BT, segment_ids_BT, document_ids_BT)
        return h_BTD if self.mlm is None else self.mlm(h_BTD, self.embed)

    def pooled(self, h_BTD: jax.Array) -> jax.Array:
        """pooled_BD = tanh(dense(h_BTD[:, 0])), HF BertModel's pooler_output (head "pooler" only)."""
        if self.pooler is None:
            raise ValueError(f"this Bert has head={self.config.head!r}; pooled() needs head='pooler'")
        return self.pooler(h_BTD)
