"""Studies: the mask rate, attention recomputation, tiny end-to-end runs of the scripts, resuming and the study runner."""

import json
import math
import subprocess
import sys
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from experiment_scripts import load_script
from txjax import GPT, Bert, GPTConfig, ops
from txjax.config import BertConfig
from txjax.data import IGNORE_INDEX
from txjax.studies import common, length, randomized
from txjax.studies.attention_maps import layer_attention
from txjax.studies.mask_rate import EVAL_RATE, MaskRateConfig, family_data, loss_tokens
from txjax.train.config import TrainConfig
from txjax.train.experiment import cpu_compute_dtype

ROOT = Path(__file__).resolve().parent.parent


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


def test_mask_rate_cpu_preset_is_the_recipe_of_the_bert_and_t5_presets():
    mask, bert, t5 = (load_script(n).PRESETS["cpu"] for n in ("mask_rate.py", "train_bert.py", "train_t5.py"))
    study, train = mask["study"], mask["train"]
    for family in (bert, t5):
        model = family["model"]
        assert study.model_kwargs() == dict(d_model=model.d_model, num_heads=model.num_heads,
                                            num_layers=model.num_layers, d_ff=model.d_ff, dtype=cpu_compute_dtype()[0])
        assert study.seq_len == family["run"].seq_len
        for field in ("learning_rate", "warmup_steps", "batch_size", "weight_decay"):
            assert getattr(train, field) == getattr(family["train"], field), field
    assert study.mean_span == t5["run"].mean_span and train.steps == t5["train"].steps
    assert train.relative_bias_lr_multiplier == t5["train"].relative_bias_lr_multiplier
    assert train.b2 == bert["train"].b2 and study.seeds == 3


@pytest.mark.parametrize("script,group", [("mask_rate.py", "study"), ("synthetic_tasks.py", "study"),
                                          ("randomized_positions.py", "study"), ("length_extrapolation.py", "model")])
def test_every_study_cpu_preset_computes_in_bfloat16_where_the_cpu_has_it(script, group):
    """docs/results/README.md, "The studies in bfloat16": the four cpu presets rerun in bfloat16.
    Elsewhere bfloat16 is slower, so they take float32 there, as train_gpt.py's does; one flag
    chooses either."""
    from txjax.train.cli import parse_configs

    module = load_script(script)
    _, cfg = parse_configs(module.make_parser, module.PRESETS, [], "cpu")
    assert cfg[group].dtype == cpu_compute_dtype()[0]
    _, cfg = parse_configs(module.make_parser, module.PRESETS, ["--dtype", "float32"], "cpu")
    assert cfg[group].dtype == "float32"


def test_mask_rate_config_validation():
    with pytest.raises(ValueError):
        MaskRateConfig(rates="0.15,1.0")
    with pytest.raises(ValueError):
        MaskRateConfig(families="gpt")
    with pytest.raises(ValueError, match="finetune"):
        MaskRateConfig(finetune_steps=-1)
    with pytest.raises(ValueError, match="dtype"):
        MaskRateConfig(dtype="float16")


@pytest.mark.parametrize("family", ["bert", "t5"])
def test_the_study_dtype_is_the_models_compute_dtype(family):
    for dtype in ("float32", "bfloat16"):
        _, _, cfg, _, _ = family_data(family, MaskRateConfig(corpus="default", seq_len=32, heldout_examples=8,
                                                              dtype=dtype))
        assert cfg.dtype == dtype


def test_the_fine_tune_runs_its_steps_at_a_constant_rate_with_trainings_optimizer():
    from txjax.studies.mask_rate import finetune_config
    from txjax.train.optim import make_schedule

    train = TrainConfig(learning_rate=3e-3, warmup_steps=100, steps=1200, weight_decay=0.01, b2=0.98)
    tune = finetune_config(train, MaskRateConfig(finetune_steps=200, finetune_learning_rate=1e-3))
    assert (tune.steps, tune.weight_decay, tune.b2) == (200, 0.01, 0.98)
    np.testing.assert_allclose([make_schedule(tune)(s) for s in (0, 100, 199)], 1e-3, rtol=1e-6)


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
            "--corpus", "default", "--finetune_steps", "2", "--out_dir", str(out)]
    proc = run_script("mask_rate.py", *args)
    assert proc.returncode == 0, proc.stderr
    res = json.loads((out / "results.json").read_text())
    by = {(r["family"], r["rate"]): r for r in res["runs"]}
    assert set(by) == {("bert", 0.05), ("bert", 0.5), ("t5", 0.05), ("t5", 0.5)}
    for fam in ("bert", "t5"):  # the held-out task is the same size whatever the training rate
        assert by[(fam, 0.05)]["heldout_tokens"] == by[(fam, 0.5)]["heldout_tokens"]
        assert by[(fam, 0.5)]["predicted_tokens_per_step"] > by[(fam, 0.05)]["predicted_tokens_per_step"]
        assert all(math.isfinite(by[(fam, r)][k]) for r in (0.05, 0.5)
                   for k in ("heldout_loss", "own_rate_loss", "finetuned_loss"))
        assert by[(fam, 0.05)]["finetuned_loss"] != by[(fam, 0.05)]["heldout_loss"]  # two more steps moved it
    table = (out / "table.md").read_text()
    assert (out / "mask_rate.png").stat().st_size > 0 and "| bert | 0.05 |" in table and "after fine-tuning" in table
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


def test_write_csv_takes_every_rows_keys(tmp_path):
    """A key only later rows have (FIRE's c after RoPE runs) gets its column; rows without it say n/a."""
    rows = [{"variant": "rope", "seed": 0, "acc": None}, {"variant": "fire", "seed": 0, "acc": 0.5, "fire_c": 0.1}]
    lines = common.write_csv(tmp_path / "runs.csv", rows).read_text().splitlines()
    assert lines == ["variant,seed,acc,fire_c", "rope,0,n/a,n/a", "fire,0,0.5,0.1"]


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
