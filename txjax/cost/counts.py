"""Parameter and matmul-FLOP counts of a config: per component, forward, training, per token."""

from __future__ import annotations

from txjax.config import BertConfig, TransformerConfig

# ----------------------------------------------------------------------------- parameters


def _norm_params(config: TransformerConfig) -> int:
    return 2 * config.d_model if config.norm == "layer" else config.d_model


def _attention_params(config: TransformerConfig) -> int:
    """Q: D -> N·H; K, V: D -> K·H (K = kv_heads); O: N·H -> D; biases when `use_bias`.
    The notes' 4·D² when N·H = D and K = N."""
    d, inner = config.d_model, config.num_heads * config.head_size
    kv_inner = config.kv_heads * config.head_size
    bias = (inner + 2 * kv_inner + d) if config.use_bias else 0
    return 2 * d * inner + 2 * d * kv_inner + bias


def _ffn_params(config: TransformerConfig) -> int:
    d, f = config.d_model, config.d_ff
    matrices = 3 if config.gated else 2
    bias = ((2 if config.gated else 1) * f + d) if config.use_bias else 0
    return matrices * d * f + bias


def _position_params(config: TransformerConfig, directional: bool) -> int:
    """Per stack: a learned [max_len, D] table, T5's [buckets, N] relative table,
    FIRE's MLP 1 -> W -> N (W = 0: the linear 1 -> N) with c and the threshold multiplier (each
    when learned), or KERPLE's r1, r2 per head (r2 too when held fixed; per direction in a directional stack)."""
    if config.position == "learned":
        return config.max_len * config.d_model
    if config.position == "t5":
        return config.num_buckets * config.num_heads
    if config.position == "fire":
        w, n = config.fire_mlp_width, config.num_heads
        return (w + w) + ((w or 1) * n + n) + int(config.fire_learn_c) + int(config.fire_learn_threshold)
    if config.position == "kerple":
        return 2 * config.num_heads * (2 if directional else 1)
    return 0


def param_counts(config: TransformerConfig) -> dict[str, int]:
    """Parameters per component, and "total"; equal to the model's real nnx.Param tree.

    Components: token_embedding, segment_embedding (BERT), positions (per stack),
    attention (self-attention, every layer of every stack), cross_attention (T5
    decoder), feed_forward, norms (block, final and embedding norms), head (an
    untied output projection, or BERT's MLM transform and output bias).
    """
    d, v = config.d_model, config.vocab_size
    family = config.family
    stacks = [(config.num_layers, False)]  # (layers, cross-attends)
    if family == "t5":
        stacks.append((config.decoder_layers, True))
    layers = sum(n for n, _ in stacks)
    cross_layers = sum(n for n, cross in stacks if cross)
    block_norms = sum(n * (3 if cross else 2) for n, cross in stacks)
    final_norms = len(stacks) if config.norm_position == "pre" else 0

    counts = {
        "token_embedding": v * d,
        "segment_embedding": 0,
        # directional_bias acts in the bidirectional stacks: BERT's, T5's encoder (not its decoder)
        "positions": sum(_position_params(config, config.directional_bias and not cross) for _, cross in stacks),
        "attention": layers * _attention_params(config),
        "cross_attention": cross_layers * _attention_params(config),
        "feed_forward": layers * _ffn_params(config),
        "norms": (block_norms + final_norms) * _norm_params(config),
        "head": 0,
    }
    if family == "bert":
        assert isinstance(config, BertConfig)
        counts["segment_embedding"] = config.type_vocab_size * d
        if config.embedding_norm:
            counts["norms"] += _norm_params(config)
        # MLM transform: dense D -> D with bias, a norm, then the tied decoder's bias [V];
        # the pooler: dense D -> D with bias; no head: nothing.
        counts["head"] = {"mlm": d * d + d + _norm_params(config) + v, "pooler": d * d + d, "none": 0}[config.head]
    elif not config.tie_embeddings:
        counts["head"] = d * v
    counts["total"] = sum(counts.values())
    return counts


def param_count(config: TransformerConfig) -> int:
    """Total parameters of the model the config builds."""
    return param_counts(config)["total"]


# ----------------------------------------------------------------------------- FLOPs


def matmul_flops(m: int, k: int, n: int) -> int:
    """[m, k] @ [k, n]: m·n dot products of length k, 2·m·k·n FLOPs."""
    return 2 * m * k * n


def attention_flops(n_q: int, n_kv: int, d_model: int, inner: int | None = None,
                    kv_inner: int | None = None, keys_per_query: int | None = None) -> dict[str, int]:
    """One attention layer over one sequence: n_q queries, n_kv keys.

    Self-attention (n_q = n_kv = n, inner = D): projections 8·n·D², scores and
    weighted sum 4·n²·D — the notes' 8·n·D² + 4·n²·D. The O(n²·N) softmax is left out.
    `kv_inner` (K·H, grouped-query attention; default inner) is the width of the K and V
    projections; `keys_per_query` (a sliding window; default n_kv) the keys each query
    scores and mixes.
    """
    inner = d_model if inner is None else inner
    kv_inner = inner if kv_inner is None else kv_inner
    keys = n_kv if keys_per_query is None else min(keys_per_query, n_kv)
    return {
        "attention_projections": matmul_flops(n_q, d_model, inner) * 2  # Q and O
        + matmul_flops(n_kv, d_model, kv_inner) * 2,  # K and V
        "attention_scores": matmul_flops(n_q, inner, keys) * 2,  # Q Kᵀ and weights · V
    }


def window_keys(config: TransformerConfig, causal: bool) -> int | None:
    """Keys a query sees at most under `attention_window` W: W causal, 2·W + 1 both ways; None: all."""
    w = config.attention_window
    return None if w is None else (w if causal else 2 * w + 1)


def forward_flops(
    config: TransformerConfig, batch: int, seq_len: int, dec_len: int | None = None
) -> dict[str, int]:
    """Matmul FLOPs of one forward pass over `batch` sequences, by component, and "total".

    GPT and BERT: `seq_len` tokens each. T5: `seq_len` encoder tokens and `dec_len`
    decoder tokens (default `seq_len`). Attention counts the full n² score matrix
    (the causal mask saves nothing in a dense kernel), or with `attention_window` the
    n·min(W, n) (causal) or n·min(2W + 1, n) (encoder) scores a banded kernel computes. The embedding lookup is a
    gather and does no multiply-adds, so "embeddings" is 0; the tied or untied head
    is the [n, D] @ [D, V] matmul.
    """
    d, f, v = config.d_model, config.d_ff, config.vocab_size
    inner = config.num_heads * config.head_size
    kv_inner = config.kv_heads * config.head_size
    t5 = config.family == "t5"
    dec_len = seq_len if dec_len is None else dec_len
    # (layers, query length, causal) per stack; T5's decoder also cross-attends to seq_len keys.
    stacks = [(config.num_layers, seq_len, config.family == "gpt")]
    if t5:
        stacks.append((config.decoder_layers, dec_len, True))
    out_len = dec_len if t5 else seq_len
    ffn_matrices = 3 if config.gated else 2

    totals = dict(attention_projections=0, attention_scores=0, cross_attention=0,
                  feed_forward=0, embeddings=0, head=0)
    for layers, n, causal in stacks:
        self_attn = attention_flops(n, n, d, inner, kv_inner, window_keys(config, causal))
        totals["attention_projections"] += layers * batch * self_attn["attention_projections"]
        totals["attention_scores"] += layers * batch * self_attn["attention_scores"]
        totals["feed_forward"] += layers * batch * ffn_matrices * matmul_flops(n, d, f)
    if t5:
        cross = attention_flops(dec_len, seq_len, d, inner, kv_inner)
        totals["cross_attention"] = config.decoder_layers * batch * sum(cross.values())
    totals["head"] = batch * matmul_flops(out_len, d, v)
    if config.family == "bert":
        # MLM: the transform D -> D, then the decoder; pooler: D -> D at [CLS]; none: no head.
        totals["head"] = {"mlm": totals["head"] + batch * matmul_flops(out_len, d, d),
                          "pooler": batch * matmul_flops(1, d, d), "none": 0}[config.head]
    totals["total"] = sum(totals.values())
    return totals


def tokens_per_step(config: TransformerConfig, batch: int, seq_len: int, dec_len: int | None = None) -> int:
    """Tokens one step processes: B·T, or B·(S + T) for T5 (both stacks' inputs)."""
    if config.family == "t5":
        return batch * (seq_len + (seq_len if dec_len is None else dec_len))
    return batch * seq_len


def train_flops(config: TransformerConfig, batch: int, seq_len: int, dec_len: int | None = None) -> int:
    """One training step: forward + backward = 3 × forward (backward does two matmuls per one)."""
    return 3 * forward_flops(config, batch, seq_len, dec_len)["total"]


def flops_per_token(config: TransformerConfig, seq_len: int, dec_len: int | None = None) -> dict[str, float]:
    """Forward and training FLOPs per token at this sequence length."""
    fwd = forward_flops(config, 1, seq_len, dec_len)["total"]
    n = tokens_per_step(config, 1, seq_len, dec_len)
    return {"forward": fwd / n, "train": 3 * fwd / n}
