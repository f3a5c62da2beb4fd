"""Copy and reverse: task generators, batch layouts, exact match on hand models, the stop-at-target loop."""

import dataclasses

import jax.numpy as jnp
import numpy as np
import pytest

from txjax import ops
from txjax.data import IGNORE_INDEX
from txjax.studies import synthetic, synthetic_data
from txjax.train.config import TrainConfig


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
def test_the_study_dtype_is_the_models_compute_dtype(family):
    for dtype in ("float32", "bfloat16"):
        assert synthetic.model_config(family, "rope", synthetic.SyntheticConfig(dtype=dtype)).dtype == dtype
    with pytest.raises(ValueError, match="dtype"):
        synthetic.SyntheticConfig(dtype="float16")


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
