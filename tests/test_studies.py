"""Studies: evaluation functions on hand cases, task generators, attention recomputation, tiny end-to-end runs."""

import dataclasses
import json
import math
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from txjax import GPT, Bert, GPTConfig, ops
from txjax.config import BertConfig
from txjax.data import IGNORE_INDEX
from txjax.studies import common, length, randomized, synthetic, synthetic_data, windows
from txjax.studies.attention_maps import layer_attention
from txjax.studies.common import fmt_mean_std, mean_std
from txjax.studies.mask_rate import EVAL_RATE, MaskRateConfig, family_data, loss_tokens
from txjax.train.config import TrainConfig

ROOT = Path(__file__).resolve().parent.parent


def jit_logits(model):
    """model(tokens) as one jitted function of NumPy tokens."""
    graphdef, state = nnx.split(model)
    fn = jax.jit(lambda s, x: nnx.merge(graphdef, s)(x))
    return lambda x: fn(state, jnp.asarray(x, jnp.int32))


# --------------------------------------------------------------------------- length: windows and bits/char


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


# --------------------------------------------------------------------------- synthetic tasks


def test_copy_and_reverse_generators():
    x = np.array([5, 6, 7], np.int32)
    np.testing.assert_array_equal(synthetic_data.task_output("copy", x), x)
    np.testing.assert_array_equal(synthetic_data.task_output("reverse", x), [7, 6, 5])
    with pytest.raises(ValueError):
        synthetic_data.task_output("sort", x)
    rng = np.random.default_rng(0)
    xs = synthetic_data.sample_inputs(rng, 200, 4, 20, 20)
    lengths = [len(v) for v in xs]
    assert min(lengths) >= 4 and max(lengths) <= 20 and len(set(lengths)) > 10
    allv = np.concatenate(xs)
    assert allv.min() >= synthetic_data.NUM_SPECIAL and allv.max() < synthetic_data.NUM_SPECIAL + 20


def test_decoder_only_batch_layout():
    b = synthetic_data.decoder_only_batch("reverse", [np.array([5, 6, 7], np.int32)], max_len=4)
    B, S, E, P = synthetic_data.BOS, synthetic_data.SEP, synthetic_data.EOS, synthetic_data.PAD
    #          rows: BOS 5 6 7 SEP 7 6 5 EOS PAD PAD  (width 2*4+3 = 11)
    np.testing.assert_array_equal(b["inputs"][0], [B, 5, 6, 7, S, 7, 6, 5, E, P])
    I = IGNORE_INDEX
    np.testing.assert_array_equal(b["targets"][0], [I, I, I, I, 7, 6, 5, E, I, I])  # SEP predicts y[0]
    with pytest.raises(ValueError):
        synthetic_data.decoder_only_batch("copy", [np.arange(5, 10)], max_len=4)


def test_a_prefix_is_attended_but_not_scored():
    """The same row after a 2-token prefix, in a batch 3 wider: the targets move with it, unchanged."""
    x = np.array([5, 6, 7], np.int32)
    plain = synthetic_data.decoder_only_batch("reverse", [x], max_len=4)
    b = synthetic_data.decoder_only_batch("reverse", [x], max_len=4, prefixes=[np.array([9, 8], np.int32)],
                                          prefix_max=3)
    B, S, E, P, I = synthetic_data.BOS, synthetic_data.SEP, synthetic_data.EOS, synthetic_data.PAD, IGNORE_INDEX
    np.testing.assert_array_equal(b["inputs"][0], [9, 8, B, 5, 6, 7, S, 7, 6, 5, E, P, P])
    np.testing.assert_array_equal(b["targets"][0], [I, I, *plain["targets"][0], I])
    with pytest.raises(ValueError):
        synthetic_data.decoder_only_batch("copy", [x], max_len=4, prefixes=[np.arange(4, 8)], prefix_max=3)
    with pytest.raises(ValueError, match="decoder-only"):  # T5 rows have no prefix: refused, not ignored
        synthetic.SyntheticConfig(families="gpt,t5", prefix_max=3)


def test_encoder_decoder_batch_layout():
    b = synthetic_data.encoder_decoder_batch("copy", [np.array([5, 6], np.int32)], max_len=3)
    E, P, I = synthetic_data.EOS, synthetic_data.PAD, IGNORE_INDEX
    np.testing.assert_array_equal(b["enc_inputs"][0], [5, 6, E, P])
    np.testing.assert_array_equal(b["dec_inputs"][0], [P, 5, 6, P])
    np.testing.assert_array_equal(b["targets"][0], [5, 6, E, I])


def test_exact_match_counts_only_scored_positions():
    targets = np.array([[IGNORE_INDEX, 1, 2], [0, 1, IGNORE_INDEX], [2, 2, 2]])
    pred = np.array([[0, 1, 2], [0, 0, 1], [2, 2, 1]])
    exact, tok = synthetic_data.exact_match(pred, targets)
    np.testing.assert_array_equal(exact, [True, False, False])
    np.testing.assert_allclose(tok, [1.0, 0.5, 2 / 3])


def test_match_by_distance_finds_where_a_decoder_reads_its_answer():
    """A correct copy of n distinct symbols reads from distance n; a fixed-offset reader from its
    offset, whatever the length."""
    xs = [np.arange(4, 9, dtype=np.int32), np.arange(4, 7, dtype=np.int32)]
    batch = synthetic_data.decoder_only_batch("copy", xs, 5)
    inputs, targets = batch["inputs"], batch["targets"]
    correct = np.where(targets != IGNORE_INDEX, targets, 0)
    assert synthetic_data.match_by_distance(correct, inputs, targets, [5, 3]) == [
        [3, [0.0] * 2 + [1.0] + [0.0] * 4], [5, [0.0] * 4 + [1.0] + [0.0] * 6]]
    fixed = np.concatenate([np.zeros((2, 2), int), inputs[:, :-2]], axis=1)  # always the token 2 back
    assert all(shares[1] == 1.0 for _, shares in synthetic_data.match_by_distance(fixed, inputs, targets, [5, 3]))


@pytest.mark.parametrize("family", ["gpt", "t5"])
def test_accuracy_by_index_locates_the_first_wrong_answer_token(family):
    """Predictions right up to answer token k and wrong after: per length n, accuracy 1 at indices
    1..k and 0 after, EOS included; each row has n + 1 scored positions in both layouts."""
    xs = [np.arange(4, 4 + n, dtype=np.int32) for n in (5, 3, 5)]
    targets = synthetic_data.BATCHERS[family]("reverse", xs, 5)["targets"]
    k = 2
    index_BT = np.cumsum(targets != IGNORE_INDEX, axis=1)  # 1-based index among scored positions
    pred = np.where(index_BT <= k, targets, -1)
    assert synthetic_data.accuracy_by_index(pred, targets, [5, 3, 5]) == [
        [3, [1.0, 1.0, 0.0, 0.0]], [5, [1.0, 1.0, 0.0, 0.0, 0.0, 0.0]]]
    pred[0] = np.where(targets[0] != IGNORE_INDEX, targets[0], -1)  # one of the two length-5 rows all right
    assert synthetic_data.accuracy_by_index(pred, targets, [5, 3, 5])[1] == [5, [1.0, 1.0, 0.5, 0.5, 0.5, 0.5]]


@pytest.mark.parametrize("task", ["copy", "reverse"])
def test_match_by_source_offset_finds_a_read_shifted_along_x(task):
    """Distinct symbols: a correct answer reads every token at delta 0; a reverse that believes the
    input is 3 long when it is 5 reads its first three tokens at delta 3 - 5 = -2."""
    xs = [np.arange(4, 9, dtype=np.int32)]
    batch = synthetic_data.decoder_only_batch(task, xs, 5)
    inputs, targets = batch["inputs"], batch["targets"]
    correct = np.where(targets != IGNORE_INDEX, targets, 0)
    assert synthetic_data.match_by_source_offset(task, correct, inputs, [5]) == [[5, [0.0] * 4 + [1.0] + [0.0] * 4]]
    if task == "reverse":
        believes_3 = np.zeros_like(correct)
        believes_3[0, 5 + np.arange(1, 4)] = inputs[0, 3 + 1 - np.arange(1, 4)]  # y_i := x_(3 + 1 - i)
        shares = synthetic_data.match_by_source_offset(task, believes_3, inputs, [5])[0][1]
        assert shares[-2 + 4] == pytest.approx(3 / 5) and sum(shares) == pytest.approx(3 / 5)


def prefix_hash_model(tokens_BT):
    """A causal hand model: the prediction at t is a fixed hash of tokens[: t + 1] onto {symbol 4, symbol 5, EOS}."""
    choices = np.array([4, 5, synthetic_data.EOS])
    weights = np.arange(1, tokens_BT.shape[1] + 1) * 7 + 3
    h_BT = np.cumsum(np.asarray(tokens_BT) * weights[None, :], axis=1) % 3
    return np.eye(6)[choices[h_BT]]


def test_teacher_forced_exact_match_equals_greedy_decoding():
    """The module's claim: all argmaxes right under teacher forcing <=> greedy decoding reproduces y EOS."""
    xs = synthetic_data.sample_inputs(np.random.default_rng(0), 200, 1, 3, 2)
    batch = synthetic_data.decoder_only_batch("copy", xs, 3)
    exact, _ = synthetic_data.exact_match(np.argmax(prefix_hash_model(batch["inputs"]), -1), batch["targets"])
    width = batch["inputs"].shape[1]
    for i, x in enumerate(xs):  # greedy decoding, one full (right-padded, causal) forward per token
        seq = [synthetic_data.BOS, *x.tolist(), synthetic_data.SEP]
        want = [*x.tolist(), synthetic_data.EOS]
        for _ in want:
            row = np.full((1, width), synthetic_data.PAD, np.int32)
            row[0, : len(seq)] = seq
            seq.append(int(np.argmax(prefix_hash_model(row)[0, len(seq) - 1])))
        assert (seq[len(x) + 2:] == want) == bool(exact[i])
    assert 0 < exact.sum() < len(xs)  # both outcomes occur, so the check is not vacuous


TINY_STUDY = dict(d_model=16, num_heads=2, num_layers=1, d_ff=32, eval_examples=8, check_examples=8)


def tiny_train(steps):
    return TrainConfig(steps=steps, batch_size=4, warmup_steps=1, learning_rate=1e-3, progress=False)


def test_a_run_stops_at_the_first_check_that_reaches_the_target(monkeypatch):
    """Checks every 2 steps; a stand-in scorer reports 0% exact, then 100%: training stops at step 4
    of 10, with the curve of both checks, and the test splits are scored once, after it."""
    calls = []

    def fake_score(logits_fn, params, batch, chunk=128):
        calls.append(len(batch["targets"]))
        n = len(batch["targets"])
        return np.full(n, len(calls) >= 2), np.ones(n), np.zeros(batch["targets"].shape, int)

    monkeypatch.setattr(synthetic, "score", fake_score)
    study = synthetic.SyntheticConfig(seeds=1, check_every=2, **TINY_STUDY)
    r = synthetic.run_one("gpt", "copy", "none", 0, study, tiny_train(10), {})
    assert (r["steps"], r["steps_to_target"]) == (4, 4)
    assert r["check_curve"] == [[2, 0.0], [4, 1.0]] and len(calls) == 4  # two checks, then in and out


@pytest.mark.parametrize("family", ["gpt", "t5"])
def test_an_unreached_target_trains_the_whole_budget_and_says_so(family):
    study = synthetic.SyntheticConfig(seeds=1, check_every=2, target_exact=1.0, **TINY_STUDY)
    r = synthetic.run_one(family, "reverse", "rope", 0, study, tiny_train(5), {})
    assert r["steps"] == 5 and r["steps_to_target"] is None
    assert [s for s, _ in r["check_curve"]] == [2, 4, 5]
    assert all(0.0 <= e < 1.0 for _, e in r["check_curve"])
    unchecked = synthetic.run_one(family, "reverse", "rope", 0, dataclasses.replace(study, check_every=0),
                                  tiny_train(5), {})
    if family == "gpt":  # a learned table grows to hold the prefixed training rows; test rows have none
        prefixed_study = dataclasses.replace(study, families="gpt", prefix_max=4)
        prefixed = synthetic.run_one(family, "reverse", "learned", 0, prefixed_study, tiny_train(3), {})
        assert prefixed["steps"] == 3 and 0.0 <= prefixed["in_token_acc"] <= 1.0
    assert (unchecked["steps"], unchecked["check_curve"], unchecked["steps_to_target"]) == (5, [], None)
    for split, (lo, hi) in (("in", (study.train_min, study.train_max)), ("out", (study.test_min, study.test_max))):
        by_length = r[f"{split}_exact_by_length"]  # the per-length means weighted by counts give the total
        assert all(lo <= k <= hi for k, _, _ in by_length) and sum(n for _, _, n in by_length) == study.eval_examples
        assert sum(e * n for _, e, n in by_length) / study.eval_examples == pytest.approx(r[f"{split}_exact"])
        by_index = r[f"{split}_accuracy_by_index"]  # one accuracy per answer token and EOS, in [0, 1]
        assert [n for n, _ in by_index] == [k for k, _, _ in by_length]
        assert all(len(acc) == n + 1 and all(0.0 <= a <= 1.0 for a in acc) for n, acc in by_index)
    # checking does not change training: the same steps give the same model
    assert unchecked["in_token_acc"] == pytest.approx(r["in_token_acc"], abs=1e-6)


def test_exact_by_length_groups_examples_by_input_length():
    exact = np.array([True, False, True, True, False])
    assert synthetic_data.exact_by_length(exact, [3, 3, 5, 4, 5]) == [[3, 0.5, 2], [4, 1.0, 1], [5, 0.5, 2]]


def test_synthetic_table_counts_seeds_at_the_target():
    runs = [{"family": "gpt", "task": "copy", "position": "none", "seed": s, "steps_to_target": t,
             "in_exact": 0.96, "out_exact": 0.1 * s, "in_token_acc": 1.0, "out_token_acc": 0.5}
            for s, t in ((0, 500), (1, 1000), (2, None))]
    (row,) = synthetic.summarize(runs)
    assert (row["n_reached"], row["steps_to_target_mean"], row["n_seeds"]) == (2, 750.0, 3)
    md = synthetic.markdown([row], synthetic.SyntheticConfig())
    assert "| none | 96.0 ± 0.0 | 10.0 ± 10.0 | 2/3 · 750 |" in md and "seeds at 95% · steps" in md


@pytest.mark.parametrize("family", ["gpt", "t5"])
def test_synthetic_bucket_options_reach_the_model(family):
    """The bucket cause-test's setting: 96 causal buckets give every distance a copy reads from up
    to length 40 (d = n <= 40; checked to 41) a bucket of its own, where the default 32 share log
    buckets past 16."""
    study = synthetic.SyntheticConfig(num_buckets=96, max_distance=128)
    cfg = synthetic.model_config(family, "t5", study)
    assert (cfg.num_buckets, cfg.max_distance) == (96, 128)
    offsets = -jnp.arange(study.test_max + 2)  # key minus query, looking back
    wide = ops.t5_relative_position_bucket(offsets, bidirectional=False, num_buckets=96, max_distance=128)
    narrow = ops.t5_relative_position_bucket(offsets, bidirectional=False, num_buckets=32, max_distance=128)
    assert len(set(np.asarray(wide).tolist())) == study.test_max + 2
    assert len(set(np.asarray(narrow).tolist())) < study.test_max + 2


# --------------------------------------------------------------------------- mask rate


def test_mask_rate_heldout_task_is_fixed_at_15_percent():
    study = MaskRateConfig(corpus="default", seq_len=32, heldout_examples=64, families="bert,t5")
    _, _, _, held_at, make_bert = family_data("bert", study)
    held_bert = held_at(EVAL_RATE)
    scored = held_bert["targets"] != IGNORE_INDEX
    assert abs(scored[:, 1:-1].mean() - EVAL_RATE) < 0.03  # [CLS]/[SEP] are never chosen
    _, _, _, held_again, _ = family_data("bert", study)
    np.testing.assert_array_equal(held_bert["inputs"], held_again(EVAL_RATE)["inputs"])  # same task every time
    held_half = held_at(0.5)  # the same rows, masked at a model's own rate
    assert abs((held_half["targets"] != IGNORE_INDEX)[:, 1:-1].mean() - 0.5) < 0.05
    def text(b):  # the rows before masking: the target where one is scored, else the input
        return np.where(b["targets"] != IGNORE_INDEX, b["targets"], b["inputs"])

    np.testing.assert_array_equal(text(held_half), text(held_bert))
    lo = loss_tokens(next(make_bert(0.05, 0, 16)))
    hi = loss_tokens(next(make_bert(0.5, 0, 16)))
    assert hi > 5 * lo  # training batches follow their own rate
    _, _, _, held_t5_at, make_t5 = family_data("t5", study)
    held_t5 = held_t5_at(EVAL_RATE)
    assert held_t5["enc_inputs"].shape[1] == 32 and held_t5_at(0.5)["enc_inputs"].shape[1] == 32
    assert loss_tokens(held_t5_at(0.5)) > 2 * loss_tokens(held_t5)
    assert loss_tokens(next(make_t5(0.5, 0, 8))) > 2 * loss_tokens(next(make_t5(0.15, 0, 8)))


def load_script(name):
    import importlib.util

    sys.path.insert(0, str(ROOT / "experiments"))  # the scripts import experiments/_local_data.py
    try:
        spec = importlib.util.spec_from_file_location(name.removesuffix(".py"), ROOT / "experiments" / name)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.pop(0)
    return module


def test_mask_rate_cpu_preset_is_the_recipe_of_the_bert_and_t5_presets():
    mask, bert, t5 = (load_script(n).PRESETS["cpu"] for n in ("mask_rate.py", "train_bert.py", "train_t5.py"))
    study, train = mask["study"], mask["train"]
    for family in (bert, t5):
        model = family["model"]
        assert study.size() == dict(d_model=model.d_model, num_heads=model.num_heads,
                                    num_layers=model.num_layers, d_ff=model.d_ff)
        assert study.seq_len == family["run"].seq_len
        for field in ("learning_rate", "warmup_steps", "batch_size", "weight_decay"):
            assert getattr(train, field) == getattr(family["train"], field), field
    assert study.mean_span == t5["run"].mean_span and train.steps == t5["train"].steps
    assert train.relative_bias_lr_multiplier == t5["train"].relative_bias_lr_multiplier
    assert train.b2 == bert["train"].b2 and study.seeds == 3


def test_mask_rate_config_validation():
    with pytest.raises(ValueError):
        MaskRateConfig(rates="0.15,1.0")
    with pytest.raises(ValueError):
        MaskRateConfig(families="gpt")


# --------------------------------------------------------------------------- attention maps


@pytest.mark.parametrize("position", ["rope", "t5", "learned"])
def test_layer_attention_reproduces_the_model_gpt(position):
    cfg = GPTConfig(vocab_size=11, max_len=12, d_model=16, num_heads=2, num_layers=2, d_ff=16, position=position)
    model = GPT(cfg, rngs=nnx.Rngs(1))
    tokens = jnp.asarray(np.random.default_rng(0).integers(0, 11, (2, 9)), jnp.int32)
    w = layer_attention(model, tokens, 1)
    assert w.shape == (2, 2, 9, 9)
    np.testing.assert_allclose(np.asarray(w).sum(-1), 1.0, rtol=1e-5)
    assert float(jnp.abs(jnp.triu(w, 1)).max()) == 0.0  # causal: nothing above the diagonal
    # the weights times the layer's values give exactly the layer's attention output
    stack = model.decoder
    positions = jnp.arange(9)
    x = stack.embed_positions(model.embed(tokens), positions)
    bias = stack.self_bias(positions, positions, model.valid(tokens))
    rotary = dict(rotary=stack.positions.rotary, positions=positions)
    x, _ = stack.blocks[0](x, bias, **rotary)
    blk = stack.blocks[1]
    h = blk.self_norm(x)
    want, _ = blk.self_attn(h, bias, **rotary)
    _, v = blk.self_attn.project_kv(h)
    got = blk.self_attn.o(ops.merge_heads(jnp.einsum("BNTS,BSNH->BTNH", w, v)))
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=1e-5)


def test_layer_attention_bert_masks_padding_and_checks_layer():
    cfg = BertConfig(vocab_size=9, max_len=8, d_model=16, num_heads=2, num_layers=1, d_ff=16)
    model = Bert(cfg, rngs=nnx.Rngs(0))
    tokens = jnp.asarray([[2, 5, 6, 3, 0, 0]], jnp.int32)  # two [PAD] keys
    w = np.asarray(layer_attention(model, tokens, 0))
    assert w.shape == (1, 2, 6, 6)
    assert np.abs(w[..., 4:]).max() == 0.0 and (w[..., :4] > 0).all()
    with pytest.raises(ValueError, match="layer"):
        layer_attention(model, tokens, 1)


# --------------------------------------------------------------------------- tiny end-to-end runs

TINY = ["--d_model", "16", "--num_heads", "2", "--num_layers", "1", "--d_ff", "32", "--steps", "2",
        "--warmup_steps", "1", "--batch_size", "4"]


def run_script(name, *args):
    return subprocess.run([sys.executable, str(ROOT / "experiments" / name), *args], capture_output=True,
                          text=True, cwd=ROOT, timeout=600)


@pytest.mark.slow
def test_length_extrapolation_script_end_to_end(tmp_path):
    out = tmp_path / "le"
    args = [*TINY, "--positions", "learned,alibi", "--seeds", "2", "--multiples", "1,2", "--train_len", "16",
            "--eval_tokens", "64", "--corpus", "default", "--out_dir", str(out)]
    proc = run_script("length_extrapolation.py", *args)
    assert proc.returncode == 0, proc.stderr
    for f in ("table.md", "table.csv", "runs.csv", "results.json", "length_extrapolation.png"):
        assert (out / f).stat().st_size > 0
    md = (out / "table.md").read_text()
    assert "| learned |" in md and "n/a" in md
    res = json.loads((out / "results.json").read_text())
    learned_2x = [r["bits_per_char"] for r in res["runs"] if r["position"] == "learned" and r["multiple"] == 2]
    alibi_2x = [r["bits_per_char"] for r in res["runs"] if r["position"] == "alibi" and r["multiple"] == 2]
    assert learned_2x == [None] * 4 and all(math.isfinite(v) for v in alibi_2x) and len(alibi_2x) == 4
    assert res["git_revision"] and res["parts"][0]["command"].startswith("length_extrapolation.py")
    # a second start finds every run done and only rewrites the tables
    proc = run_script("length_extrapolation.py", *args)
    assert proc.returncode == 0 and "seed" not in proc.stdout.split("\n", 1)[1]
    assert len((out / "runs.jsonl").read_text().splitlines()) == 2 * 2 * (2 * 2 + 1)


@pytest.mark.slow
def test_synthetic_script_end_to_end(tmp_path):
    out = tmp_path / "syn"
    args = [*TINY, "--tasks", "reverse", "--positions", "none,learned", "--seeds", "2", "--check_every", "1",
            "--eval_examples", "16", "--check_examples", "16", "--out_dir", str(out)]
    proc = run_script("synthetic_tasks.py", *args)
    assert proc.returncode == 0, proc.stderr
    res = json.loads((out / "results.json").read_text())
    assert len(res["runs"]) == 2 * 2 * 2  # families x encodings x seeds
    for r in res["runs"]:
        assert 0.0 <= r["in_exact"] <= 1.0 and r["steps"] == 2 and len(r["check_curve"]) == 2
        assert (r["out_exact"] is None) == (r["position"] == "learned")
    assert "n/a" in (out / "table.md").read_text() and (out / "synthetic.png").stat().st_size > 0
    assert res["git_revision"] and res["parts"][0]["command"].startswith("synthetic_tasks.py")
    # a second start finds every run done and only rewrites the tables
    proc = run_script("synthetic_tasks.py", *args)
    assert proc.returncode == 0 and " seed " not in proc.stdout
    assert len((out / "runs.jsonl").read_text().splitlines()) == 8 and len(json.loads(
        (out / "results.json").read_text())["parts"]) == 2


@pytest.mark.slow
def test_mask_rate_script_end_to_end(tmp_path):
    out = tmp_path / "mr"
    # seq_len 64 as in the cpu preset: at 16, T5's length helper cannot fit one span at p = 0.05
    args = [*TINY, "--rates", "0.05,0.5", "--seeds", "1", "--seq_len", "64", "--heldout_examples", "64",
            "--corpus", "default", "--out_dir", str(out)]
    proc = run_script("mask_rate.py", *args)
    assert proc.returncode == 0, proc.stderr
    res = json.loads((out / "results.json").read_text())
    by = {(r["family"], r["rate"]): r for r in res["runs"]}
    assert set(by) == {("bert", 0.05), ("bert", 0.5), ("t5", 0.05), ("t5", 0.5)}
    for fam in ("bert", "t5"):  # the held-out task is the same size whatever the training rate
        assert by[(fam, 0.05)]["heldout_tokens"] == by[(fam, 0.5)]["heldout_tokens"]
        assert by[(fam, 0.5)]["predicted_tokens_per_step"] > by[(fam, 0.05)]["predicted_tokens_per_step"]
        assert all(math.isfinite(by[(fam, r)][k]) for r in (0.05, 0.5) for k in ("heldout_loss", "own_rate_loss"))
    assert (out / "mask_rate.png").stat().st_size > 0 and "| bert | 0.05 |" in (out / "table.md").read_text()
    proc = run_script("mask_rate.py", *args)  # resumes: nothing left to train
    assert proc.returncode == 0 and " seed " not in proc.stdout
    assert len((out / "runs.jsonl").read_text().splitlines()) == 4


@pytest.mark.slow
def test_attention_maps_script_end_to_end(tmp_path):
    png = tmp_path / "maps" / "a.png"
    proc = run_script("attention_maps.py", "--d_model", "16", "--num_heads", "2", "--num_layers", "2",
                      "--d_ff", "32", "--train_steps", "2", "--batch_size", "4", "--corpus", "default",
                      "--layer", "1", "--text", "To be", "--out", str(png))
    assert proc.returncode == 0, proc.stderr
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_unique_runs_keeps_the_first_of_repeated_runs():
    rows = [{"position": "rope", "seed": 0, "method": "sliding", "multiple": 1, "bits_per_char": 2.0},
            {"position": "rope", "seed": 0, "method": "sliding", "multiple": 1, "bits_per_char": 9.0},
            {"position": "rope", "seed": 1, "method": "sliding", "multiple": 1, "bits_per_char": 3.0}]
    assert [r["bits_per_char"] for r in common.unique_runs(rows, length.RUN_KEY)] == [2.0, 3.0]


def test_done_runs_reads_the_keys_a_resumed_study_skips(tmp_path):
    path = tmp_path / "runs.jsonl"
    assert common.done_runs(path, randomized.RUN_KEY) == set()  # a fresh study skips nothing
    common.append_jsonl(path, [{"task": "parity_check", "variant": "rope", "seed": s, "in_accuracy": 0.5}
                               for s in (0, 1, 1)])
    assert common.done_runs(path, randomized.RUN_KEY) == {("parity_check", "rope", 0), ("parity_check", "rope", 1)}


def test_rebuild_tables_from_runs_jsonl(tmp_path):
    rows = [{"position": p, "seed": s, "method": m, "multiple": k, "length": 64 * k,
             "bits_per_char": None if p == "learned" and k > 1 else 3.0 + 0.1 * s}
            for p in ("alibi", "learned") for s in (0, 1) for m in length.METHODS for k in (1, 2)]
    length.append_jsonl(tmp_path / "runs.jsonl", rows + rows[:3])  # a repeated run is counted once
    res = length.rebuild_tables(tmp_path)
    assert len(res["runs"]) == len(rows)
    md = (tmp_path / "table.md").read_text()
    assert md.index("| learned |") < md.index("| alibi |")  # canonical encoding order
    assert "| learned | 2 | 3.050 ± 0.071 | n/a |" in md
    assert (tmp_path / "length_extrapolation.png").stat().st_size > 0


def test_run_parts_runs_each_part_once_and_records_failures(tmp_path):
    from txjax.studies.schedule import pinned, run_parts

    parts = [(f"p{i}", [sys.executable, "-c", f"print('part {i}'); raise SystemExit({int(i == 1)})"])
             for i in range(3)]
    record = run_parts(parts, workers=2, log_dir=tmp_path, pin=False, log=lambda *_: None)
    rows = {r["name"]: r for r in record["parts"]}
    assert sorted(rows) == ["p0", "p1", "p2"]
    assert [rows[f"p{i}"]["returncode"] for i in range(3)] == [0, 1, 0]
    for i in range(3):
        assert (tmp_path / f"p{i}.log").read_text().strip() == f"part {i}"
    assert record["wall_s"] >= max(r["started_s"] + r["wall_s"] for r in rows.values()) - 0.2
    assert pinned(["x"], None) == ["x"]
    assert pinned(["x"], 1)[-1] == "x"


def test_run_studies_parts_parse_and_cover_each_cpu_preset():
    """Every part of experiments/run_studies.py is a valid command line of its study script, and
    together a study's parts train its whole cpu preset, nothing twice."""
    import itertools

    from txjax.train.cli import parse_configs

    def grid(study, cfg):
        """The (what, ...) runs a study config trains, seeds aside."""
        if study == "length_extrapolation":
            return list(cfg.trained)
        first, second = ("tasks", "positions") if study == "randomized_positions" else ("families", "tasks")
        return list(itertools.product(common.parse_list(getattr(cfg, first)),
                                      common.parse_list(getattr(cfg, second, "-"))))

    runner = load_script("run_studies.py")
    for study in runner.STUDIES:
        script = load_script(f"{study}.py")
        union = []
        for s, extra in runner.PARTS:
            if s == study:
                _, cfg = parse_configs(script.make_parser, script.PRESETS, ["--preset", "cpu", *extra.split()], "cpu")
                union += grid(study, cfg["study"])
        assert sorted(union) == sorted(grid(study, script.PRESETS["cpu"]["study"])), study
