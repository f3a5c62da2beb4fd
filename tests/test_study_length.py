"""Length study: windows and bits/char on hand cases, its batches, configs, variants and tables."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from txjax import GPT, GPTConfig
from txjax.studies import length, windows
from txjax.studies.common import fmt_mean_std, mean_std
from txjax.train.config import TrainConfig


def jit_logits(model):
    """model(tokens) as one jitted function of NumPy tokens."""
    graphdef, state = nnx.split(model)
    fn = jax.jit(lambda s, x: nnx.merge(graphdef, s)(x))
    return lambda x: fn(state, jnp.asarray(x, jnp.int32))


def alternating_model(tokens_BW):
    """Hand model over V=2: position 0 of a window is uniform (1 bit); later positions put
    probability 3/4 on 'the other symbol' (log2(4/3) bits when the text alternates)."""
    b, w = tokens_BW.shape
    logits = np.zeros((b, w, 2))
    other = 1 - np.asarray(tokens_BW)
    logits[:, 1:, :] = 0.0
    np.put_along_axis(logits[:, 1:], other[:, 1:, None], math.log(3.0), axis=-1)
    return logits


def test_bits_per_char_hand_case_nonoverlapping_and_sliding():
    ids = np.array([0, 1] * 10, np.int32)  # alternating text: the hand model is right with p = 3/4
    cfg = GPTConfig(vocab_size=2, max_len=4, d_model=8, num_heads=2, num_layers=1, d_ff=8, position="rope")
    good = -math.log2(0.75)
    # Non-overlapping windows of 4 over 8 targets: two windows, each 1 bit + 3 good ones.
    got = windows.bits_per_char(alternating_model, cfg, ids, window=4, n_tokens=8)
    assert got == pytest.approx((2 * (1 + 3 * good)) / 8)
    # Sliding, stride 2: the first window scores 4 targets (1 + 3 good), windows at 2 and 4
    # score only their last 2, which all have context: 1 + 7 good over 8.
    got = windows.bits_per_char(alternating_model, cfg, ids, window=4, n_tokens=8, stride=2)
    assert got == pytest.approx((1 + 7 * good) / 8)
    # Batching (padding the last batch) does not change the answer.
    got = windows.bits_per_char(alternating_model, cfg, ids, window=4, n_tokens=8, stride=2, batch_tokens=4)
    assert got == pytest.approx((1 + 7 * good) / 8)


@pytest.mark.parametrize("window,stride", [(8, 8), (8, 4), (8, 1), (16, 4), (32, 32)])
def test_sliding_windows_score_every_target_once(window, stride):
    ids = np.arange(100, dtype=np.int32)
    inputs, targets, scored = windows.sliding_windows(ids, window, stride, 32)
    np.testing.assert_array_equal(targets, inputs + 1)  # next-character targets
    np.testing.assert_array_equal(np.sort(targets[scored]), np.arange(1, 33))
    # every scored target after the first window sees at least window - stride characters
    context = np.broadcast_to(np.arange(window), scored.shape)
    assert (context[1:][scored[1:]] >= window - stride).all()
    inputs, targets, scored = windows.nonoverlapping_windows(ids, window, 32)
    np.testing.assert_array_equal(np.sort(targets[scored]), np.arange(1, 33))


def test_windows_reject_lengths_that_do_not_tile():
    ids = np.arange(50, dtype=np.int32)
    with pytest.raises(ValueError):
        windows.nonoverlapping_windows(ids, 7, 32)
    with pytest.raises(ValueError):
        windows.sliding_windows(ids, 8, 5, 32)


def test_learned_positions_past_their_table_are_na_not_clamped():
    cfg = GPTConfig(vocab_size=5, max_len=8, d_model=8, num_heads=2, num_layers=1, d_ff=8, position="learned")
    model = GPT(cfg, rngs=nnx.Rngs(0))
    ids = np.random.default_rng(0).integers(0, 5, 40).astype(np.int32)
    calls = []
    model_fn = jit_logits(model)

    def logits_fn(x):
        calls.append(x.shape)
        return model_fn(x)

    assert windows.bits_per_char(logits_fn, cfg, ids, window=16, n_tokens=32) is None
    assert windows.bits_per_char(logits_fn, cfg, ids, window=16, n_tokens=32, stride=4) is None
    assert calls == []  # never run at all, so nothing could be clamped
    with pytest.raises(ValueError, match="max_len"):  # and the model itself refuses such input
        model(jnp.asarray(ids[None, :16]))
    in_table = windows.bits_per_char(logits_fn, cfg, ids, window=8, n_tokens=32, stride=4)
    assert math.isfinite(in_table) and in_table > 0
    # the same window with sinusoidal positions is scored beyond max_len
    sin = cfg.replace(position="sinusoidal")
    sin_model = GPT(sin, rngs=nnx.Rngs(0))
    got = windows.bits_per_char(jit_logits(sin_model), sin, ids, window=16, n_tokens=32)
    assert math.isfinite(got)


def test_lm_batches_are_shifted_windows_of_the_training_text():
    ids = np.arange(1000, dtype=np.int32)
    b = length.lm_batches(ids, 16, 4, seed=3)(7)
    assert b["inputs"].shape == b["targets"].shape == (4, 16)
    np.testing.assert_array_equal(b["targets"], b["inputs"] + 1)
    np.testing.assert_array_equal(length.lm_batches(ids, 16, 4, seed=3)(7)["inputs"], b["inputs"])


def test_length_config_validation():
    with pytest.raises(ValueError):
        length.LengthStudyConfig(positions="learned,bogus")
    with pytest.raises(ValueError):
        length.LengthStudyConfig(stride=5)  # does not divide 64
    with pytest.raises(ValueError):
        length.LengthStudyConfig(eval_tokens=100)  # shorter than 16 x 64
    assert length.LengthStudyConfig(eval_tokens=5000).scored_tokens == 4096
    with pytest.raises(ValueError, match="randomized"):
        length.LengthStudyConfig(positions="rope", randomized="bogus")
    with pytest.raises(ValueError, match="rope_scalings"):
        length.LengthStudyConfig(rope_scalings="linear,dynamic")
    with pytest.raises(ValueError, match="random_max"):
        length.LengthStudyConfig(positions="rope", randomized="rope", random_max=512)  # below 16 x 64
    assert length.LengthStudyConfig(positions="rope,alibi", randomized="rope,t5").trained == (
        "rope", "alibi", "rope+random")  # t5 is not trained in this part, so neither is t5+random


@pytest.mark.slow
def test_length_study_variants_random_positions_and_rope_scalings(tmp_path):
    """rope+random is trained with random positions (drawn in evaluation too); rope/yarn scores the
    rope model's own parameters with YaRN at factor = multiple, so at 1x (factor 1) it equals plain
    rope to the last bit, and at 2x it differs from it."""
    study = length.LengthStudyConfig(
        corpus="default", positions="rope,alibi", randomized="rope", rope_scalings="yarn", seeds=1,
        train_len=16, multiples="1,2", eval_tokens=64, random_max=64, out_dir=str(tmp_path))
    model = GPTConfig(vocab_size=2, max_len=16, d_model=16, num_heads=2, num_layers=1, d_ff=32)
    train = TrainConfig(steps=3, batch_size=4, warmup_steps=1, learning_rate=3e-3, progress=False)
    result = length.run_study(model, train, study, log=lambda s: None)
    bpc = {(r["position"], r["method"], r["multiple"]): r["bits_per_char"] for r in result["runs"]}
    assert {p for p, _, _ in bpc} == {"rope", "alibi", "rope+random", "rope/yarn"}
    for method in length.METHODS:
        assert bpc[("rope/yarn", method, 1)] == bpc[("rope", method, 1)]
        assert bpc[("rope/yarn", method, 2)] != bpc[("rope", method, 2)]
    assert all(math.isfinite(bpc[("rope+random", m, k)]) for m in length.METHODS for k in (1, 2))
    assert bpc[("rope+random", "sliding", 1)] != bpc[("rope", "sliding", 1)]
    md = (tmp_path / "table.md").read_text()
    assert md.index("| rope |") < md.index("| rope+random |") < md.index("| rope/yarn |") < md.index("| alibi |")


def test_length_study_records_fire_threshold(tmp_path):
    """A FIRE run's train row carries its trained threshold L = |m| * fire_threshold and |c|; the
    threshold moved from its start (it is learned) and is read from the trained model."""
    study = length.LengthStudyConfig(corpus="default", positions="fire,alibi", seeds=1, train_len=16,
                                     multiples="1", eval_tokens=64, out_dir=str(tmp_path))
    model = GPTConfig(vocab_size=2, max_len=16, d_model=16, num_heads=2, num_layers=1, d_ff=32, fire_threshold=8.0)
    train = TrainConfig(steps=3, batch_size=4, warmup_steps=1, learning_rate=3e-2, progress=False)
    rows = [r for r in length.run_study(model, train, study, log=lambda s: None)["runs"]
            if r["method"] == "train_loss_nats"]
    fire = next(r for r in rows if r["position"] == "fire")
    assert 0 < fire["fire_threshold"] != 8.0 and fire["fire_c"] > 0
    assert "fire_threshold" not in next(r for r in rows if r["position"] == "alibi")


def test_mean_std_and_na():
    assert mean_std([1.0, 3.0]) == (2.0, pytest.approx(math.sqrt(2.0)), 2)
    assert mean_std([None, None]) == (None, None, 0)
    assert fmt_mean_std(None, None) == "n/a"
    assert fmt_mean_std(1.0, 0.25, 2) == "1.00 ± 0.25"


def test_summary_and_markdown_show_na_for_learned():
    runs = [{"position": p, "seed": s, "method": m, "multiple": k, "length": 4 * k,
             "bits_per_char": (None if p == "learned" and k > 1 else 2.0 + s)}
            for p in ("learned", "alibi") for s in (0, 1) for m in length.METHODS for k in (1, 2)]
    summary = length.summarize(runs, ["learned", "alibi"], [1, 2])
    row = next(r for r in summary if r["position"] == "learned" and r["multiple"] == 2)
    assert row["mean_bits_per_char"] is None and row["n_seeds"] == 0
    md = length.markdown(summary, ["learned", "alibi"], [1, 2], 4)
    assert "| learned | 2 | 2.500 ± 0.707 | n/a |" in md
    assert "| alibi | 2 | 2.500 ± 0.707 | 2.500 ± 0.707 |" in md
