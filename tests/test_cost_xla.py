"""The analytic forward FLOPs of txjax.cost against XLA's own count of the compiled model.

XLA's `cost_analysis()["flops"]` counts every HLO op: 2·m·k·n for each dot (as the
notes do), plus one or more FLOPs per element for everything else. What the formula
leaves out, and XLA counts:

- softmax in attention (scale, bias add, max, subtract, exp, sum, divide: ~8 per
  score, O(B·N·T·S)) and the log-softmax of the loss-free logits (none here: we
  time the forward to logits);
- layer / RMS norm (~8 per element of [B, T, D], twice per layer), residual adds,
  bias adds, the position add;
- the activation: exact GELU (erf) costs tens of FLOPs per element of [B, T, F] —
  the largest leftover in these configs; ReLU costs one.
- The embedding gather costs XLA nothing, as in the formula.

So we choose configs where the matmuls dominate: D ≥ 256 and T ≤ D/4, so the
per-token matmul work (24·D² + 4·T·D per layer) dwarfs the O(T·N + F + D)
elementwise work, and check agreement within 10% — and that XLA never counts less.
Measured (jax 0.10.2, CPU): XLA / formula = 1.045 GPT (exact GELU), 1.007 GPT
(RoPE, SwiGLU, untied), 1.054 BERT (GELU + MLM-head GELU and norm), 1.004 T5 (ReLU).
"""

import jax
import jax.numpy as jnp
import pytest
from flax import nnx

from txjax.config import ExecutionConfig
from txjax import GPT, T5, Bert, BertConfig, GPTConfig, T5Config, cost

BIG = dict(vocab_size=256, max_len=64, d_model=256, num_heads=4, num_layers=1, d_ff=1024)


REFERENCE = ExecutionConfig(attention_impl="reference")  # XLA counts no FLOPs inside the fused CPU kernel


def xla_forward_flops(model, *inputs) -> float:
    graphdef, state = nnx.split(model)

    def forward(state, *inputs):
        return nnx.merge(graphdef, state)(*inputs)

    analysis = jax.jit(forward).lower(state, *inputs).compile().cost_analysis()
    analysis = analysis[0] if isinstance(analysis, (list, tuple)) else analysis
    return float(analysis["flops"])


def tokens(b, t):
    return jnp.ones((b, t), jnp.int32)


CASES = [
    pytest.param(GPT, GPTConfig(**BIG), 2, 32, None, id="gpt-gelu"),
    pytest.param(GPT, GPTConfig(**BIG, position="rope", norm="rms", gated=True, activation="silu",
                                tie_embeddings=False), 2, 32, None, id="gpt-rope-swiglu-untied"),
    pytest.param(Bert, BertConfig(**BIG), 2, 32, None, id="bert"),
    pytest.param(T5, T5Config(**BIG), 2, 48, 16, id="t5"),
]


@pytest.mark.slow
@pytest.mark.parametrize("model_cls,config,batch,seq,dec", CASES)
def test_forward_flops_agree_with_xla_within_10_percent(model_cls, config, batch, seq, dec):
    model = model_cls(config, rngs=nnx.Rngs(0), execution=REFERENCE)
    inputs = (tokens(batch, seq), tokens(batch, dec)) if dec else (tokens(batch, seq),)
    xla = xla_forward_flops(model, *inputs)
    formula = cost.forward_flops(config, batch, seq, dec)["total"]
    assert formula <= xla <= 1.10 * formula, (xla, formula, xla / formula)


@pytest.mark.slow
def test_xla_excess_is_the_elementwise_work_the_formula_leaves_out():
    """When softmax dominates (tiny D, long T) XLA counts far more than the matmuls.

    The excess scales with the score count B·N·T², not with the matmul FLOPs: it is
    the O(n²·h) softmax term the notes drop. At D 16 with T = D/4 it vanishes again.
    """
    # Whole score matrices, as the formula assumes (no causal query blocks).
    small = GPTConfig(vocab_size=16, max_len=256, d_model=16, num_heads=4, num_layers=1, d_ff=64,
                      activation="relu")
    model = GPT(small, rngs=nnx.Rngs(0), execution=REFERENCE.replace(causal_block_size=None))
    excess = {}
    for t in (64, 128):
        xla = xla_forward_flops(model, tokens(1, t))
        excess[t] = xla - cost.forward_flops(small, 1, t)["total"]
        assert xla > 1.2 * cost.forward_flops(small, 1, t)["total"]
    # Doubling T multiplies the excess by ~4 (quadratic), not ~2 (linear) or ~2.x (matmuls).
    assert 3.2 < excess[128] / excess[64] < 4.2
    per_score = excess[128] / (small.num_heads * 128**2)
    assert 4 < per_score < 20  # a handful of FLOPs per attention score


@pytest.mark.slow
def test_causal_blocks_skip_the_upper_right_score_block():
    """T 128 in two query blocks of 64: the first block never scores keys 64..127.

    Skipped, per head: a 64 x 64 block of scores, i.e. 2·64·64·H FLOPs of q·kᵀ and as
    many of weights·v (H = 4 here), plus the softmax's few FLOPs per skipped score.
    """
    config = GPTConfig(vocab_size=16, max_len=128, d_model=16, num_heads=4, num_layers=1, d_ff=64,
                       activation="relu")
    whole = xla_forward_flops(GPT(config, rngs=nnx.Rngs(0), execution=REFERENCE.replace(causal_block_size=None)),
                              tokens(1, 128))
    blocked = xla_forward_flops(GPT(config, rngs=nnx.Rngs(0), execution=REFERENCE.replace(causal_block_size=64)),
                                tokens(1, 128))
    skipped_scores = config.num_heads * 64 * 64
    skipped_matmul = 2 * (2 * skipped_scores * config.head_size)
    assert skipped_matmul < whole - blocked < skipped_matmul + 20 * skipped_scores, (whole - blocked)
