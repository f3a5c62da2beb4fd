"""The randomized-positions study (Ruoss et al. 2023): its tasks against their definitions, the
empty output tape, padding that changes nothing, and a small study end to end."""

import dataclasses
import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from hypothesis import given, settings
from hypothesis import strategies as st

from experiment_scripts import load_script
from txjax import Bert, ops
from txjax.data import IGNORE_INDEX
from txjax.studies.common import PROFILE_DISTANCES, bias_learned, init_params
from txjax.studies.randomized import (
    RandomizedConfig,
    band_markdown,
    eval_logits,
    eval_max_position,
    length_bands,
    markdown,
    model_config,
    randomization_gains,
    run_study,
    summarize,
    train_width,
)
from txjax.studies.randomized_tasks import BLANK, FIRST, MODULUS, OPERATORS, PAD, encode, evaluate_modular, sample_task, width
from txjax.train.config import TrainConfig
from txjax.train.steps import Stepper, bert_loss


def expression(text: str) -> tuple[np.ndarray, np.ndarray]:
    tokens = text.split()
    return np.array([int(t) for t in tokens[::2]]), np.array([OPERATORS.index(o) for o in tokens[1::2]])


@pytest.mark.parametrize("text, value", [
    ("1 + 2 * 3", 2), ("1 - 1 - 1", 4), ("0 * 1 + 4 * 3 - 2", 0),  # the examples of the paper's task
    ("4", 4), ("2 * 3 * 4", 4), ("3 - 2 * 4", 0), ("1 - 4 * 4 + 2", 2),
])
def test_modular_arithmetic_reduces_products_first(text, value):
    assert evaluate_modular(*expression(text)) == value


@settings(max_examples=30, deadline=None)
@given(st.sampled_from(["reverse_string", "duplicate_string", "parity_check", "modular_arithmetic"]),
       st.integers(1, 30), st.integers(0, 2**31 - 1))
def test_tasks_follow_their_definitions(task, length, seed):
    x, y = sample_task(task, np.random.default_rng(seed), 4, length)
    bits = x - FIRST
    if task == "reverse_string":
        np.testing.assert_array_equal(y - FIRST, bits[:, ::-1])
    elif task == "duplicate_string":
        np.testing.assert_array_equal(y - FIRST, np.concatenate([bits, bits], 1))
    elif task == "parity_check":
        np.testing.assert_array_equal(y[:, 0] - FIRST, bits.sum(1) % 2)
    else:
        assert x.shape[1] == length - (1 - length % 2)  # odd: an even length drops a token
        assert np.all((bits[:, ::2] >= 0) & (bits[:, ::2] < MODULUS))
        assert np.all(bits[:, 1::2] >= MODULUS)
        for row, out in zip(bits, y[:, 0] - FIRST):
            assert out == evaluate_modular(row[::2], row[1::2] - MODULUS)
    if task != "modular_arithmetic":
        assert set(np.unique(bits)) <= {0, 1}
    assert x.min() >= FIRST and y.min() >= FIRST
    assert x.shape[1] + y.shape[1] == width(task, x.shape[1])


def test_rows_are_the_input_then_a_blank_tape_scored_only_there():
    x, y = np.array([[2, 3, 3]]), np.array([[3, 3, 2]])
    b = encode(x, y, 8)
    np.testing.assert_array_equal(b["inputs"], [[2, 3, 3, BLANK, BLANK, BLANK, PAD, PAD]])
    np.testing.assert_array_equal(b["targets"], [[IGNORE_INDEX] * 3 + [3, 3, 2] + [IGNORE_INDEX] * 2])
    with pytest.raises(ValueError, match="does not fit"):
        encode(x, y, 5)


@pytest.mark.parametrize("variant", ["rope", "alibi", "t5", "sinusoidal", "learned"])
@pytest.mark.parametrize("jit", [False, True])
def test_padding_to_the_task_width_changes_no_logit(variant, jit):
    """One width per task is exact: pads are masked keys, and real tokens keep positions 0..k-1."""
    study = RandomizedConfig(num_layers=2, train_max=8, test_max=12)
    cfg = model_config(variant, "reverse_string", study)
    model = nnx.view(Bert(cfg, rngs=nnx.Rngs(0)), deterministic=True, raise_if_not_found=False)
    call = jax.jit(lambda t: model(t)) if jit else model
    b = encode(*sample_task("reverse_string", np.random.default_rng(0), 3, 5), width("reverse_string", 8))
    alone = call(jnp.asarray(b["inputs"][:, :10]))
    padded = call(jnp.asarray(b["inputs"]))
    np.testing.assert_allclose(padded[:, :10], alone, atol=1e-5, rtol=1e-5)


@settings(max_examples=40, deadline=None)
@given(st.sampled_from(["reverse_string", "duplicate_string", "parity_check", "modular_arithmetic"]),
       st.integers(1, 40), st.integers(0, 24))
def test_training_rows_pad_to_the_next_multiple_up_to_the_widest(task, length, k):
    study = RandomizedConfig(train_width_multiple=k)
    widest, needed = width(task, 40), width(task, length)
    w = train_width(task, length, study)
    assert needed <= w <= widest
    assert w == widest if k == 0 else (w == widest or (w % k == 0 and w - needed < k))
    x, y = sample_task(task, np.random.default_rng(0), 2, length)
    assert encode(x, y, w)["inputs"].shape == (2, w)


@pytest.mark.parametrize("variant", ["rope+random", "sinusoidal"])
def test_a_narrower_padding_trains_the_same_step(variant):
    """Without dropout, a batch padded to 16 or to the task's 80 tokens gives the same loss and
    the same updated parameters: the random positions, the masked pads and the mean over output
    tokens do not depend on the width."""
    study = RandomizedConfig(num_layers=2, d_model=16, num_heads=2, d_ff=32, dropout=0.0, train_width_multiple=16)
    cfg = model_config(variant, "reverse_string", study)
    stepper = Stepper(Bert(cfg, rngs=nnx.Rngs(0)), bert_loss, TrainConfig(batch_size=8, steps=2, warmup_steps=0))
    x, y = sample_task("reverse_string", np.random.default_rng(1), 8, 7)
    assert train_width("reverse_string", 7, study) == 16
    fresh = lambda: stepper.init_state(jax.tree.map(jnp.copy, stepper.init_params))  # noqa: E731  the step donates it
    out = [stepper.train_step(fresh(), encode(x, y, w), jax.random.key(3)) for w in (16, 80)]
    (narrow, m_narrow), (wide, m_wide) = out
    np.testing.assert_allclose(m_narrow["loss"], m_wide["loss"], rtol=1e-5)
    for a, b in zip(jax.tree.leaves(narrow.params), jax.tree.leaves(wide.params)):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("variant", ["rope", "learned", "t5+random"])
def test_the_study_dtype_is_the_models_compute_dtype(variant):
    for dtype in ("float32", "bfloat16"):
        assert model_config(variant, "reverse_string", RandomizedConfig(dtype=dtype)).dtype == dtype
    with pytest.raises(ValueError, match="dtype"):
        RandomizedConfig(dtype="float16")


def test_plain_learned_tables_hold_the_training_rows_and_random_ones_all_positions():
    study = RandomizedConfig(max_position=512)
    assert model_config("learned", "duplicate_string", study).max_len == 120
    assert model_config("learned", "parity_check", study).max_len == 41
    randomized = model_config("learned+random", "parity_check", study)
    assert (randomized.max_len, randomized.random_positions, randomized.random_positions_eval) == (512, 512, True)
    assert model_config("rope", "parity_check", study).random_positions is None
    assert study.test_lengths == (41, 46, 51, 56, 61, 66, 71, 76, 81, 86, 91, 96, 100)
    assert RandomizedConfig(positions="rope,none").variants == ("rope", "rope+random", "none")
    with pytest.raises(ValueError, match="max_position"):
        RandomizedConfig(max_position=200)  # duplicate_string at 100: 300 tokens
    with pytest.raises(ValueError, match="positions"):
        RandomizedConfig(positions="xpos")  # causal only; this is an encoder


@settings(max_examples=40, deadline=None)
@given(st.sampled_from(["reverse_string", "duplicate_string", "parity_check", "modular_arithmetic"]),
       st.integers(1, 100), st.booleans())
def test_stretched_test_rows_are_no_denser_than_the_widest_training_row(task, n, stretch):
    """Drawn from [0, M), a row of w tokens has mean gap ~M / w. The paper's test rows keep M, so
    a longer row is denser than any training row; stretched, M grows with w beyond training."""
    study = RandomizedConfig(tasks=task, positions="alibi,t5", stretch_test_positions=stretch)
    m = eval_max_position(task, n, study)
    if not stretch or n <= study.train_max:
        assert m == study.max_position
    else:
        assert m / width(task, n) >= study.max_position / width(task, study.train_max)
        assert (m - 1) / width(task, n) < study.max_position / width(task, study.train_max)  # the least such M


def test_stretching_is_refused_for_encodings_added_to_the_input():
    with pytest.raises(ValueError, match="stretch_test_positions"):
        RandomizedConfig(positions="rope,sinusoidal", stretch_test_positions=True)
    RandomizedConfig(positions="rope,t5,alibi,fire,kerple,none", stretch_test_positions=True)


def test_the_random_form_reaches_the_randomized_models_it_applies_to():
    study = RandomizedConfig(positions="alibi", random_positions_form="distances")
    assert model_config("alibi+random", "reverse_string", study).random_positions_form == "distances"
    assert model_config("alibi", "reverse_string", study).random_positions is None
    with pytest.raises(ValueError, match="random_positions_form"):
        RandomizedConfig(positions="alibi,rope", random_positions_form="distances")
    layers = RandomizedConfig(positions="rope,t5,alibi", random_positions_form="layers")
    assert model_config("rope+random", "reverse_string", layers).random_positions_form == "layers"
    with pytest.raises(ValueError, match="random_positions_form"):
        RandomizedConfig(positions="rope,sinusoidal", random_positions_form="layers")
    theirs = RandomizedConfig(random_positions_form="theirs")
    assert {v: model_config(v, "reverse_string", theirs).random_positions_form for v in theirs.variants
            if v.endswith("+random")} == {"sinusoidal+random": "positions", "learned+random": "positions",
                                          "rope+random": "layers", "t5+random": "positions",
                                          "alibi+random": "layer_distances"}
    per_batch = RandomizedConfig(positions="rope", random_positions_per_batch=True)
    assert model_config("rope+random", "reverse_string", per_batch).random_positions_per_batch
    assert not model_config("rope+random", "reverse_string", RandomizedConfig()).random_positions_per_batch


def test_directional_bias_reaches_the_model_and_only_the_distance_biases_take_it():
    study = RandomizedConfig(positions="alibi,fire,kerple", directional_bias=True)
    assert all(model_config(v, "reverse_string", study).directional_bias for v in study.variants)
    assert not model_config("fire+random", "reverse_string", RandomizedConfig()).directional_bias
    with pytest.raises(ValueError, match="directional_bias"):
        RandomizedConfig(positions="fire,t5", directional_bias=True)


def test_fires_threshold_reaches_the_model_and_its_learned_values_are_read():
    """FIRE's L and c options reach the model, and bias_learned reads L = |m| * fire_threshold and |c|
    from the encoder's FIRE bias, learned or fixed."""
    study = RandomizedConfig(positions="fire", fire_threshold=4096.0, fire_learn_threshold=False,
                             fire_c=0.25, fire_learn_c=False)
    cfg = model_config("fire+random", "reverse_string", study)
    assert (cfg.fire_threshold, cfg.fire_learn_threshold, cfg.fire_c, cfg.fire_learn_c) == (4096.0, False, 0.25, False)
    assert cfg.fire_mlp_width == 32 and model_config(
        "fire+random", "reverse_string", RandomizedConfig(positions="fire", fire_mlp_width=0)).fire_mlp_width == 0
    fixed = Bert(cfg, rngs=nnx.Rngs(0))
    assert {k: v for k, v in bias_learned(fixed).items() if k != "fire_bias"} == {"fire_threshold": 4096.0,
                                                                                  "fire_c": 0.25}
    learned = Bert(model_config("fire", "reverse_string", RandomizedConfig(positions="fire")), rngs=nnx.Rngs(0))
    fire = learned.encoder.positions.relative
    fire.threshold_multiplier[...] = jnp.asarray(-0.25)
    fire.c[...] = jnp.asarray(-0.5)
    read = bias_learned(learned)
    assert (read["fire_threshold"], read["fire_c"]) == (128.0, 0.5)
    # The bias profile: a query d from a key at 0, per head, as the op computes it at that L and c.
    d = np.asarray(PROFILE_DISTANCES, np.float64)
    w1, b1, w2, b2 = (np.asarray(p[...], np.float64) for p in (fire.w1, fire.b1, fire.w2, fire.b2))
    x = np.log1p(0.5 * d) / (np.log1p(0.5 * np.maximum(d, 128.0)) + 1e-6)
    expected = np.maximum(x[:, None] * w1 + b1, 0.0) @ w2 + b2
    assert np.shape(read["fire_bias"]) == (len(PROFILE_DISTANCES), study.num_heads)
    np.testing.assert_allclose(read["fire_bias"], expected, atol=2e-4)


@pytest.mark.parametrize("directional", [False, True])
def test_kerples_options_reach_the_model_and_its_learned_values_are_read(directional):
    """bias_learned reads KERPLE's r1, r2 per head (per direction, then head); other encodings give {}."""
    study = RandomizedConfig(positions="kerple", kerple_r2_init_scale=0.125, directional_bias=directional,
                             kerple_positive="clamp")
    model = Bert(model_config("kerple+random", "reverse_string", study), rngs=nnx.Rngs(0))
    assert model.config.kerple_positive == "clamp"
    kerple = model.encoder.positions.relative
    kerple.raw_r1[...] = jnp.full_like(kerple.raw_r1[...], 0.75)
    learned = bias_learned(model)
    assert model.config.kerple_r2_init_scale == 0.125 and set(learned) == {"kerple_r1", "kerple_r2"}
    fixed = model_config("kerple", "reverse_string", RandomizedConfig(kerple_learn_r2=False))
    assert fixed.kerple_learn_r2 is False
    r2 = [np.asarray(init_params(Bert, fixed, seed)["encoder"]["positions"]["relative"]["raw_r2"][...]) for seed in (0, 1)]
    assert not np.array_equal(*r2)  # held fixed, but drawn per seed with the other parameters
    shape = (2, study.num_heads) if directional else (study.num_heads,)
    np.testing.assert_allclose(learned["kerple_r1"], np.full(shape, 0.75), atol=1e-4)
    np.testing.assert_allclose(learned["kerple_r2"], np.asarray(kerple.r2), atol=1e-4)
    assert 0 < np.max(learned["kerple_r2"]) < 0.125
    assert bias_learned(Bert(model_config("rope", "reverse_string", RandomizedConfig()), rngs=nnx.Rngs(0))) == {}


def test_t5s_buckets_reach_the_model():
    """t5_num_buckets 1024: every offset of the longest test row (under 256) has its own bucket."""
    study = RandomizedConfig(positions="t5", t5_num_buckets=1024, t5_max_distance=1024)
    model = Bert(model_config("t5+random", "reverse_string", study), rngs=nnx.Rngs(0))
    assert model.encoder.positions.relative.table[...].shape == (1024, study.num_heads)
    offsets = jnp.arange(-255, 256)
    buckets = np.asarray(ops.t5_relative_position_bucket(offsets, True, 1024, 1024))
    assert len(np.unique(buckets)) == len(offsets)
    assert model_config("t5", "reverse_string", RandomizedConfig()).num_buckets == 32


@pytest.mark.parametrize("form", ["positions", "distances", "layers"])
@pytest.mark.parametrize("jit", [False, True])
def test_evaluation_draws_from_the_range_it_is_given(jit, form):
    """eval_logits at max_position M computes what a model built to draw from [0, M) computes, with
    the same parameters and key: the range is the one thing it changes."""
    study = RandomizedConfig(positions="alibi", num_layers=1, d_model=16, num_heads=2, d_ff=32,
                             random_positions_form=form)
    cfg = model_config("alibi+random", "reverse_string", study)
    stepper = Stepper(Bert(cfg, rngs=nnx.Rngs(0)), bert_loss, TrainConfig(batch_size=4, steps=1, warmup_steps=0))
    x = jnp.asarray(encode(*sample_task("reverse_string", np.random.default_rng(0), 4, 50), 100)["inputs"])
    call = jax.jit(eval_logits, static_argnums=(0, 4)) if jit else eval_logits
    key = jax.random.key(1)
    wide = Stepper(Bert(dataclasses.replace(cfg, random_positions=4096), rngs=nnx.Rngs(0)), bert_loss, stepper.cfg)
    at_4096, at_2048 = (call(stepper, stepper.init_params, x, key, m) for m in (4096, 2048))
    np.testing.assert_allclose(at_4096, eval_logits(wide, stepper.init_params, x, key, 4096), atol=1e-6, rtol=1e-6)
    assert np.abs(at_4096 - at_2048).max() > 1e-4  # ~1e-3 at init: the test can see the range


@pytest.mark.parametrize("std", [0.02, 1.0])
def test_learned_tables_start_at_the_configured_scale(std):
    """Their code's learned table is hk.Embed with its default init (std 1), 50x our model default
    of 0.02, against token rows of 0.02 * sqrt(D) = 0.16: the study's default follows their code."""
    assert RandomizedConfig().learned_init_std == 1.0
    cfg = model_config("learned+random", "parity_check", RandomizedConfig(learned_init_std=std))
    table = np.asarray(Bert(cfg, rngs=nnx.Rngs(0)).encoder.positions.table[...])
    assert table.shape == (2048, 64) and np.std(table) == pytest.approx(std, rel=0.05)


def test_gain_is_randomized_minus_plain_where_both_exist():
    runs = [{"task": "t", "variant": v, "seed": 0, "in_accuracy": 1.0, "out_accuracy": a}
            for v, a in [("rope", 0.5), ("rope+random", 0.8), ("learned", None), ("learned+random", 0.6),
                         ("alibi", 0.7), ("alibi+random", 0.6)]]
    gains = randomization_gains(summarize(runs))
    np.testing.assert_allclose(sorted(gains), [-0.1, 0.3])
    assert "+10.0 points" in markdown(summarize(runs), RandomizedConfig())


def test_length_bands_average_each_runs_lengths_then_the_seeds():
    assert length_bands(RandomizedConfig()) == [(1, 10), (11, 20), (21, 30), (31, 40), (41, 60), (61, 80), (81, 100)]
    study = RandomizedConfig(train_max=4, test_max=10)
    assert length_bands(study) == [(1, 1), (2, 2), (3, 3), (4, 4), (5, 6), (7, 8), (9, 10)]
    by_length = [{"1": 1.0, "2": 0.5, "3": 0.5, "4": 0.5, "5": 0.2, "6": 0.4, "7": 0.1, "9": 0.0, "10": None},
                 {"1": 0.0, "2": 0.5, "3": 0.5, "4": 0.5, "5": 0.4, "6": 0.4, "7": 0.3, "9": 0.0, "10": None}]
    runs = [{"task": "t", "variant": "rope", "seed": i, "accuracy_by_length": a} for i, a in enumerate(by_length)]
    row = band_markdown(runs, study).splitlines()[-1]
    assert row == "| t | rope | 50.0 | 50.0 | 50.0 | 50.0 | 35.0 | 20.0 | 0.0 |"  # 10: None, left out


def test_band_table_reproduces_a_committed_row():
    """The per-band rows in docs/results/README.md come from this table: ALiBi's plain row of the
    random-distances cause-test, as written there."""
    folder = Path(__file__).parents[1] / "docs/results/randomized_cause_tests/alibi_random_distances_symmetric"
    runs = [json.loads(line) for line in (folder / "runs.jsonl").read_text().splitlines()]
    table = band_markdown(runs, RandomizedConfig())
    assert "| reverse_string | alibi | 99.5 | 96.5 | 92.3 | 83.5 | 75.7 | 68.5 | 63.6 |" in table
    assert "| reverse_string | alibi+random | 99.7 | 99.1 | 96.2 | 92.0 | 85.2 | 77.8 | 73.0 |" in table


@pytest.mark.slow
def test_small_study_learns_writes_and_resumes(tmp_path):
    study = RandomizedConfig(tasks="reverse_string", positions="learned,kerple", seeds=1, train_max=6,
                             test_max=10, test_step=2, eval_examples=32, num_layers=2, max_position=64,
                             out_dir=str(tmp_path))
    train = TrainConfig(steps=60, batch_size=32, learning_rate=3e-3, warmup_steps=0, min_lr_ratio=1.0,
                        weight_decay=0.0, progress=False)
    result = run_study(train, study, log=lambda s: None)
    runs = {r["variant"]: r for r in result["runs"]}
    assert set(runs) == {"learned", "learned+random", "kerple", "kerple+random"}
    assert len(runs["kerple"]["kerple_r2"]) == study.num_heads and "kerple_r2" not in runs["learned"]
    assert runs["learned"]["out_accuracy"] is None  # beyond a plain table: n/a, never clamped
    assert runs["learned+random"]["out_accuracy"] is not None
    assert sorted(runs["kerple"]["accuracy_by_length"], key=int) == [str(n) for n in range(1, 7)] + ["7", "9", "10"]
    assert runs["kerple"]["in_accuracy"] > 0.6  # above the 0.5 of guessing bits: the tape is read
    for name in ("table.md", "table.csv", "runs.csv", "results.json", "randomized_positions.png"):
        assert (tmp_path / name).exists()
    assert "| reverse_string | kerple | " in (tmp_path / "table.md").read_text().split("by input length")[1]
    assert json.loads((tmp_path / "results.json").read_text())["configs"]["study"]["train_max"] == 6
    header = (tmp_path / "runs.csv").read_text().splitlines()[0].split(",")
    assert "in_accuracy" in header and "kerple_r2" not in header  # per-head lists stay in runs.jsonl
    again = run_study(train, study, log=lambda s: None)  # everything is in runs.jsonl: nothing retrains
    assert len(again["runs"]) == 4 and len(again["parts"]) == 2


def test_the_script_parses_its_presets_and_flags():
    from txjax.train.cli import parse_configs

    script = load_script("randomized_positions")
    preset, cfg = parse_configs(script.make_parser, script.PRESETS,
                                ["--tasks", "parity_check", "--positions", "alibi", "--seeds", "1", "--steps", "5"], "cpu")
    assert preset == "cpu" and cfg["study"].variants == ("alibi", "alibi+random")
    assert cfg["train"].steps == 5 and cfg["train"].learning_rate == 1e-3 and cfg["train"].min_lr_ratio == 1.0
    _, default = parse_configs(script.make_parser, script.PRESETS, ["--preset", "default"], "cpu")
    assert (default["train"].batch_size, default["train"].steps, default["study"].test_max) == (128, 10_000, 500)
    # both pad training rows to multiples of 8 (docs/results: the same results as the widest padding)
    assert (cfg["study"].train_width_multiple, default["study"].train_width_multiple) == (8, 8)


def test_the_scripts_optimizer_is_the_papers_clipped_adam():
    """Ruoss et al.'s training.py: optax.chain(clip_by_global_norm(1), optax.adam(1e-3)), defaults
    otherwise (b2 0.999, not the 0.95 of TrainConfig); three updates agree to float rounding."""
    import optax

    from txjax.train.optim import make_optimizer

    script = load_script("randomized_positions")
    params = {"w": jnp.ones((3, 4)), "b": jnp.zeros(4)}
    ours = make_optimizer(script.PRESETS["cpu"]["train"], params)
    theirs = optax.chain(optax.clip_by_global_norm(1.0), optax.adam(1e-3))
    s_ours, s_theirs = ours.init(params), theirs.init(params)
    for i in range(3):
        grads = jax.tree.map(lambda p: (i + 1) * jax.random.normal(jax.random.key(i), p.shape), params)
        u_ours, s_ours = ours.update(grads, s_ours, params)
        u_theirs, s_theirs = theirs.update(grads, s_theirs, params)
        for a, b in zip(jax.tree.leaves(u_ours), jax.tree.leaves(u_theirs)):
            np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-9)
