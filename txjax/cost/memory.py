"""Memory: KV cache, AdamW training state, activations, the largest batch that fits."""

from __future__ import annotations

import math

from txjax.config import TransformerConfig
from txjax.cost.counts import param_count

# ----------------------------------------------------------------------------- memory


def kv_cache_bytes(num_layers: int, batch: int, d_model: int, seq_len: int,
                   bytes_per_element: float = 2) -> float:
    """L·B·(2·D·T)·s: K and V of every layer for `batch` sequences of `seq_len` tokens."""
    return num_layers * batch * 2 * d_model * seq_len * bytes_per_element


def config_kv_cache_bytes(config: TransformerConfig, batch: int, seq_len: int,
                          bytes_per_element: float = 2) -> float:
    """KV cache of a config's decoder self-attention (width K·H per layer: K = kv_heads,
    so grouped-query attention's L·B·2·(D·K/N)·T·s when N·H = D)."""
    layers = config.decoder_layers if config.family == "t5" else config.num_layers
    inner = config.kv_heads * config.head_size
    return kv_cache_bytes(layers, batch, inner, seq_len, bytes_per_element)


def training_bytes_per_param(master_copy: bool = False) -> int:
    """Mixed-precision AdamW: 2 (bf16 weight) + 2 (grad) + 4 (m) + 4 (v) = 12, +4 master copy."""
    return 2 + 2 + 4 + 4 + (4 if master_copy else 0)


def training_state_bytes(num_params: int, master_copy: bool = False) -> int:
    """Weights, gradients and AdamW moments, without activations."""
    return num_params * training_bytes_per_param(master_copy)


def max_batch(memory_bytes: float, bytes_per_sequence: float, fixed_bytes: float = 0) -> int:
    """Largest B with fixed + B·per_sequence <= memory (0 if not even one fits)."""
    if bytes_per_sequence <= 0:
        raise ValueError(f"bytes_per_sequence must be positive, got {bytes_per_sequence}")
    return max(0, math.floor((memory_bytes - fixed_bytes) / bytes_per_sequence))


def activation_bytes(config: TransformerConfig, batch: int, seq_len: int,
                     bytes_per_element: float = 4, score_copies: int = 2) -> dict[str, float]:
    """Activations a training step keeps for the backward pass (one stack: GPT, BERT).

    Per layer and token, the tensors autodiff saves: the block input and both norm
    outputs, Q, K, V, the attention output and the FFN hidden before and after the
    activation: (7·D + 2·F)·s bytes (3·F gated). Per layer and sequence,
    `score_copies` [N, T, T] tensors (the reference attention keeps its exponentials
    and the softmax weights), plus two more [N, T, T] for the backward of the layer
    being differentiated (dP and dS). Then the logits and their softmax [T, V].
    The T² terms are what make memory grow quadratically with sequence length.
    """
    d, f, v, n = config.d_model, config.d_ff, config.vocab_size, config.num_heads
    s, layers = bytes_per_element, config.num_layers
    per_token = (7 * d + (3 if config.gated else 2) * f) * s
    linear = layers * batch * seq_len * per_token
    score = batch * n * seq_len**2 * s  # one [B, N, T, T] tensor
    quadratic = (layers * score_copies + 2) * score
    logits = 2 * batch * seq_len * v * s
    return {"linear": linear, "quadratic": quadratic, "logits": logits,
            "total": linear + quadratic + logits}


def train_step_bytes(config: TransformerConfig, batch: int, seq_len: int, bytes_per_element: float = 4,
                     score_copies: int = 2) -> dict[str, float]:
    """Predicted peak memory of an AdamW train step: state + gradients + activations.

    Weights and gradients in `bytes_per_element`, AdamW's m and v in float32, and
    `activation_bytes`. Compare with XLA's plan: experiments/memory_vs_length.py.
    """
    p = param_count(config)
    out = {
        "weights": p * bytes_per_element,
        "gradients": p * bytes_per_element,
        "optimizer": 2 * p * 4,
        "activations": activation_bytes(config, batch, seq_len, bytes_per_element, score_copies)["total"],
    }
    out["total"] = sum(out.values())
    return out
