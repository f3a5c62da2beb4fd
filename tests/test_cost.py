"""txjax.cost: parameter counts against the real tree, FLOPs, intensity, memory."""

import itertools
import math

import pytest
from flax import nnx

from txjax import GPT, T5, Bert, BertConfig, GPTConfig, T5Config, cost
from txjax.config import POSITIONS, positions_for

FAMILIES = {"gpt": (GPTConfig, GPT), "bert": (BertConfig, Bert), "t5": (T5Config, T5)}
TINY = dict(vocab_size=11, max_len=8, d_model=16, num_heads=2, num_layers=2, d_ff=24)
# Each variant flips a field away from the family defaults; together they cover
# norm kind and position, tied / untied, gated, biases, explicit head width, decoder depth.
VARIANTS = [
    {},
    dict(norm="rms", tie_embeddings=False, gated=True),
    dict(norm="layer", norm_position="post", use_bias=False, activation="silu"),
    dict(norm_position="pre", use_bias=True, head_dim=6, gated=True, tie_embeddings=False),
]


def component_of(path) -> str:
    """Which cost.param_counts component a parameter path belongs to."""
    keys = [str(k) for k in path]
    if "mlm" in keys or "head" in keys or "pooler" in keys:
        return "head"
    if "self_attn" in keys:
        return "attention"
    if "cross_attn" in keys:
        return "cross_attention"
    if "ffn" in keys:
        return "feed_forward"
    if "positions" in keys:
        return "positions"
    if "segments" in keys:
        return "segment_embedding"
    if any(k.endswith("norm") for k in keys):
        return "norms"
    if keys[0] == "embed":
        return "token_embedding"
    raise AssertionError(f"unclassified parameter {path}")


def real_counts(family: str, config) -> dict[str, int]:
    """Parameters of the built model (abstractly, via nnx.eval_shape), by component."""
    model = nnx.eval_shape(lambda: FAMILIES[family][1](config, rngs=nnx.Rngs(0)))
    counts: dict[str, int] = {}
    for path, leaf in nnx.to_flat_state(nnx.state(model, nnx.Param)):
        name = component_of(path)
        counts[name] = counts.get(name, 0) + math.prod(leaf.get_value().shape)
    counts["total"] = sum(counts.values())
    return counts


# The whole cross product; each family x position runs one variant fast (every
# variant still runs for every family), the rest are marked slow (~0.3 s each).
CASES = [
    pytest.param(
        family, position, i, id=f"{family}-{position}-v{i}",
        marks=() if i == POSITIONS.index(position) % len(VARIANTS) else pytest.mark.slow,
    )
    for family, position, i in itertools.product(FAMILIES, POSITIONS, range(len(VARIANTS)))
    if position in positions_for(family)
]


@pytest.mark.parametrize("family,position,variant", CASES)
def test_param_counts_equal_the_real_tree(family, position, variant):
    extra = dict(num_decoder_layers=3) if family == "t5" and variant % 2 else {}
    config = FAMILIES[family][0](**TINY, position=position, **VARIANTS[variant], **extra)
    predicted = cost.param_counts(config)
    real = real_counts(family, config)
    assert {k: v for k, v in predicted.items() if v} == real
    assert cost.param_count(config) == real["total"]


@pytest.mark.parametrize("kv_heads,variant", [(1, 0), (1, 3), (2, 1), (2, 2)])
@pytest.mark.parametrize("family", FAMILIES)
def test_param_counts_with_grouped_kv_heads_equal_the_real_tree(family, kv_heads, variant):
    """num_kv_heads: K and V project to K·H (T5's cross-attention too), with and without biases."""
    config = FAMILIES[family][0](**{**TINY, "num_heads": 4}, num_kv_heads=kv_heads, **VARIANTS[variant])
    predicted = cost.param_counts(config)
    assert {k: v for k, v in predicted.items() if v} == real_counts(family, config)
    assert predicted["attention"] < cost.param_counts(config.replace(num_kv_heads=None))["attention"]


@pytest.mark.parametrize("family", ["bert", "t5"])
@pytest.mark.parametrize("options", [
    dict(position="fire", fire_learn_threshold=False),  # c only, no threshold multiplier
    dict(position="fire", fire_learn_c=False),  # the threshold multiplier, no c
    dict(position="fire", directional_bias=True),
    dict(position="fire", fire_mlp_width=0),  # f linear: one weight and bias per head
    dict(position="kerple", directional_bias=True),  # r1, r2 per head and direction (T5: in its encoder)
    dict(position="kerple", kerple_positive="clamp"),  # the same r1, r2 per head, kept positive by a clamp
    dict(position="kerple", kerple_learn_r2=False),  # r1, r2 per head; r2 held at its draw is a parameter still
])
def test_param_counts_of_the_relative_bias_options_equal_the_real_tree(family, options):
    config = FAMILIES[family][0](**TINY, **options)
    assert {k: v for k, v in cost.param_counts(config).items() if v} == real_counts(family, config)


@pytest.mark.parametrize("head", ["pooler", "none"])
def test_bert_heads_count_and_cost_what_they_build(head):
    """An encoder-only BERT: the pooler is a D -> D dense at [CLS]; no head costs nothing."""
    config = BertConfig(**TINY, head=head)
    predicted = cost.param_counts(config)
    assert {k: v for k, v in predicted.items() if v} == real_counts("bert", config)
    d = TINY["d_model"]
    assert cost.forward_flops(config, 2, 8)["head"] == (2 * 2 * d * d if head == "pooler" else 0)


@pytest.mark.parametrize(
    "name,expected",
    [
        ("gpt2-small", 124_439_808),  # GPT-2 small, as Hugging Face counts it (tied head)
        ("bert-base", 109_514_298),  # bert-base-uncased with its MLM head (no pooler / NSP)
        ("t5-small", 60_506_624),  # t5-small (v1.0)
        ("7b", 6_738_415_616),  # Llama-7B's shape, the notes' L 32, D 4096 example
    ],
)
def test_presets_match_published_counts(name, expected):
    config = cost.named_config(name)
    assert cost.param_count(config) == expected


@pytest.mark.slow
def test_presets_equal_the_real_tree_via_eval_shape():
    for family, preset in (("gpt", GPTConfig.gpt2_small()), ("bert", BertConfig.bert_base()),
                           ("t5", T5Config.t5_small())):
        assert cost.param_counts(preset)["total"] == real_counts(family, preset)["total"]


def test_forward_flops_follow_the_notes():
    """Attention 8nD² + 4n²D per layer, FFN 4nDF, head 2nDV, training = 3× forward."""
    n, d, f, v, layers, b = 100, 64, 256, 50, 3, 2
    config = GPTConfig(vocab_size=v, max_len=n, d_model=d, num_heads=4, num_layers=layers, d_ff=f)
    fwd = cost.forward_flops(config, b, n)
    assert fwd["attention_projections"] == b * layers * 8 * n * d * d
    assert fwd["attention_scores"] == b * layers * 4 * n * n * d
    assert fwd["feed_forward"] == b * layers * 4 * n * d * f
    assert fwd["head"] == b * 2 * n * d * v
    assert fwd["embeddings"] == 0
    assert fwd["total"] == sum(x for k, x in fwd.items() if k != "total")
    assert cost.train_flops(config, b, n) == 3 * fwd["total"]
    per_token = cost.flops_per_token(config, n)
    assert per_token["forward"] == pytest.approx(fwd["total"] / (b * n))
    assert per_token["train"] == pytest.approx(3 * per_token["forward"])
    gated = cost.forward_flops(config.replace(gated=True), b, n)
    assert gated["feed_forward"] == b * layers * 6 * n * d * f


def test_forward_flops_t5_counts_cross_attention_and_both_lengths():
    s, t, d, inner, b = 40, 10, 32, 48, 3
    config = T5Config(vocab_size=20, d_model=d, num_heads=4, head_dim=12, num_layers=2,
                      num_decoder_layers=1, d_ff=64)
    fwd = cost.forward_flops(config, b, s, t)
    assert fwd["attention_projections"] == b * (2 * 8 * s * d * inner + 1 * 8 * t * d * inner)
    assert fwd["attention_scores"] == b * (2 * 4 * s * s * inner + 1 * 4 * t * t * inner)
    # Cross-attention: Q and O over the t decoder tokens, K and V over the s encoder tokens.
    assert fwd["cross_attention"] == b * (4 * t * d * inner + 4 * s * d * inner + 4 * t * s * inner)
    assert fwd["feed_forward"] == b * 4 * (2 * s + t) * d * 64
    assert fwd["head"] == b * 2 * t * d * 20
    assert cost.tokens_per_step(config, b, s, t) == b * (s + t)


def test_flops_per_token_approach_6n_for_short_sequences():
    """With n ≪ D the attention-score term vanishes and train FLOPs/token → 6 × non-embedding params + head."""
    config = GPTConfig.gpt2_small()
    per_token = cost.flops_per_token(config, 8)["train"]
    counts = cost.param_counts(config)
    matmul_params = counts["attention"] + counts["feed_forward"] + counts["token_embedding"]
    assert per_token == pytest.approx(6 * matmul_params, rel=1e-3)


def test_linear_intensity_limits_from_the_notes():
    d, s = 4096, 2
    # Training (bt ≫ d): AI → d / s = 2048 for d = 4096 in bf16.
    assert cost.linear_intensity(64, 4096, d, bytes_per_element=s) == pytest.approx(d / s, rel=0.02)
    # Decoding (t = 1, b ≪ d): AI → 2b / s.
    assert cost.linear_intensity(8, 1, d, bytes_per_element=s) == pytest.approx(2 * 8 / s, rel=0.01)
    # The exact formula of the notes: 2btd² / ((2btd + d²) s).
    b, t, d = 3, 5, 7
    assert cost.linear_intensity(b, t, d, bytes_per_element=4) == 2 * b * t * d**2 / ((2 * b * t * d + d**2) * 4)


def test_attention_intensity_is_the_notes_formula_and_memory_bound():
    b, t, d, a, s = 2, 4096, 4096, 32, 2
    ai = cost.attention_intensity(b, t, d, a, s)
    assert ai == pytest.approx(2 * t * d / (s * (2 * d + a * t)))
    assert ai == pytest.approx(2 * d / (s * a), rel=0.07)  # t ≫ 2d/a
    for hw in (cost.Hardware.a100(), cost.Hardware.h100(), cost.Hardware.h200()):
        assert cost.roofline(ai, hw)["bound"] == "memory-bound"


def test_hardware_ridge_points_and_roofline():
    assert cost.Hardware.a100().ridge_point == pytest.approx(156)
    assert cost.Hardware.h100().ridge_point == pytest.approx(295.2, abs=0.1)
    assert cost.Hardware.h200().ridge_point == pytest.approx(206.0, abs=0.1)
    assert cost.hardware("H100-SXM") == cost.Hardware.h100()
    a100 = cost.Hardware.a100()
    assert cost.roofline(2048, a100) == {"intensity": 2048, "ridge_point": 156.0,
                                         "attainable_flops": 312e12, "bound": "compute-bound"}
    assert cost.roofline(8, a100)["attainable_flops"] == pytest.approx(8 * 2.0e12)
    with pytest.raises(ValueError, match="unknown hardware"):
        cost.hardware("tpu")


def test_kv_cache_and_the_notes_7b_batch_of_40():
    """L 32, D 4096, T 4096, bf16: 2 GiB a sequence, ≈ 40 on an 80 GB A100 (cache only)."""
    per_seq = cost.kv_cache_bytes(32, 1, 4096, 4096, 2)
    assert per_seq == 32 * 2 * 4096 * 4096 * 2 == 2 * 2**30
    assert cost.kv_cache_bytes(32, 5, 4096, 4096, 2) == 5 * per_seq
    a100 = cost.Hardware.a100()
    assert cost.max_batch(a100.memory_bytes, per_seq) == 40
    config = cost.named_config("7b")
    assert cost.config_kv_cache_bytes(config, 1, 4096) == per_seq
    # Beside bf16 weights (6.74B × 2 bytes = 12.6 GiB) 33 fit; the notes say 28-32 in practice.
    weights = cost.param_count(config) * 2
    assert cost.max_batch(a100.memory_bytes, per_seq, weights) == 33
    assert cost.max_batch(1.0, 2.0) == 0


def test_training_bytes_per_param():
    assert cost.training_bytes_per_param() == 12
    assert cost.training_bytes_per_param(master_copy=True) == 16
    assert cost.training_state_bytes(7_000_000_000) == 84_000_000_000  # the notes' 84 GB
    assert cost.training_state_bytes(7_000_000_000, master_copy=True) == 112_000_000_000


def test_activation_bytes_grow_quadratically_only_through_scores():
    config = GPTConfig(vocab_size=17, max_len=4096, d_model=128, num_heads=4, num_layers=4, d_ff=512)
    small, big = cost.activation_bytes(config, 2, 256), cost.activation_bytes(config, 2, 512)
    assert big["linear"] == 2 * small["linear"]
    assert big["quadratic"] == 4 * small["quadratic"]
    assert big["total"] == big["linear"] + big["quadratic"] + big["logits"]
    # (4 layers x 2 saved copies + 2 backward buffers) of [B, N, T, T] float32.
    assert small["quadratic"] == (4 * 2 + 2) * 2 * 4 * 256**2 * 4
    step = cost.train_step_bytes(config, 2, 256)
    p = cost.param_count(config)
    assert step["weights"] == step["gradients"] == 4 * p and step["optimizer"] == 8 * p
    assert step["total"] == 16 * p + small["total"]


def test_report_prints_the_table():
    text = cost.report(cost.named_config("7b"), "7b", 4096)
    assert "6,738,415,616" in text
    assert "40 with the cache alone" in text
    assert "memory-bound" in text and "compute-bound" in text


def test_cli_main(capsys):
    cost.main(["gpt2-small", "--seq", "1024", "--hardware", "h100"])
    out = capsys.readouterr().out
    assert "124,439,808" in out and "H100 SXM" in out
    with pytest.raises(ValueError, match="unknown config"):
        cost.named_config("gpt5")
