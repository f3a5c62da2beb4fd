"""The experiment scripts: flags from dataclasses, bad input, and tiny end-to-end runs."""

import json
import math
from pathlib import Path

import numpy as np
import pytest

from experiment_scripts import load_script
from txjax.train.cli import field_docs
from txjax.tasks.mnist import MnistRunConfig, nats_to_bits_per_pixel, unigram_baseline

ROOT = Path(__file__).resolve().parent.parent


def parse(script, argv):
    from txjax.train.cli import parse_configs

    return parse_configs(script.make_parser, script.PRESETS, argv, "default")


def test_flags_are_generated_with_docs_and_defaults(capsys):
    gpt = load_script("train_gpt")
    with pytest.raises(SystemExit) as exit_:
        parse(gpt, ["--preset", "cpu", "--help"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    assert "--learning_rate FLOAT" in out and "peak learning rate" in out
    assert "--d_model INT" in out and "D: residual stream width (default: 128)" in out
    assert "--temperature FLOAT" in out and "--runs_dir STR" in out


@pytest.mark.parametrize("name", sorted(p.stem for p in (ROOT / "experiments").glob("*.py")
                                         if not p.stem.startswith("_")))
def test_every_script_prints_its_help(name, capsys):
    """`--help` exits 0 and lists the flags: argparse %-formats help text, so a field comment
    with a literal % ("the fixed 15% task") once made mask_rate.py's --help raise."""
    with pytest.raises(SystemExit) as exit_:
        load_script(name).main(["--help"])
    assert exit_.value.code == 0
    assert "--" in capsys.readouterr().out


def test_every_training_and_run_field_is_documented():
    from txjax.train.config import TrainConfig
    from txjax.tasks.sample import SampleConfig
    from txjax.tasks.text import TextRunConfig

    for cls in (TrainConfig, MnistRunConfig, TextRunConfig, SampleConfig):
        docs = field_docs(cls)
        missing = [f for f in cls.__dataclass_fields__ if f not in docs]
        assert not missing, f"{cls.__name__}: no comment for {missing}"


def test_field_docs_include_inherited_fields():
    docs = field_docs(MnistRunConfig)
    assert docs["runs_dir"] == "parent folder of all runs"
    assert docs["name"].startswith("run folder name")
    from txjax.config import BertConfig

    assert field_docs(BertConfig)["norm_position"].startswith('"pre"')  # a new default keeps the base's text


def test_presets_and_overrides():
    gpt = load_script("train_gpt")
    preset, cfg = parse(gpt, ["--preset", "cpu", "--steps", "7", "--dropout", "0.2", "--top_k", "none",
                              "--progress", "false", "--data", "/x.npz"])
    assert preset == "cpu"
    assert cfg["train"].steps == 7 and cfg["train"].batch_size == gpt.PRESETS["cpu"]["train"].batch_size
    assert cfg["model"].dropout == 0.2 and cfg["model"].d_model == 128
    assert cfg["run"].top_k is None and cfg["run"].data == "/x.npz" and cfg["train"].progress is False
    preset, cfg = parse(gpt, [])
    assert preset == "default" and cfg == gpt.PRESETS["default"]


@pytest.mark.parametrize("name", sorted(p.stem for p in (ROOT / "experiments").glob("*.py")
                                         if "PRESETS = {" in p.read_text()))
def test_preset_accelerator_is_another_name_for_default(name):
    """Every script with a `default` preset (the one sized for one accelerator) also takes
    `--preset accelerator`, as issue 23 names it; a script without one refuses it."""
    from txjax.train.cli import parse_configs

    script = load_script(name)
    presets = script.PRESETS
    if "default" not in presets:
        with pytest.raises(SystemExit):
            parse_configs(script.make_parser, presets, ["--preset", "accelerator"], "cpu")
        return
    alias = parse_configs(script.make_parser, presets, ["--preset", "accelerator", "--steps", "3"], "cpu")
    named = parse_configs(script.make_parser, presets, ["--preset", "default", "--steps", "3"], "cpu")
    assert alias == named and alias[0] == "default"


@pytest.mark.parametrize("script", ["train_gpt", "train_bert", "train_t5"])
def test_without_preset_the_backend_picks_it_and_the_first_line_says_why(script, monkeypatch):
    from txjax.train import experiment

    module, lines, seen = load_script(script), [], []

    def run(model, train, run, execution):
        seen.append(train)
        return {}

    experiment.train_script(run, module.PRESETS, module.make_parser, ["--steps", "3"], log=lines.append)
    assert seen[-1] == module.PRESETS["cpu"]["train"].replace(steps=3)  # flags still apply on top
    assert lines[0] == "preset cpu: JAX found no accelerator (backend cpu); --preset default forces the other"
    experiment.train_script(run, module.PRESETS, module.make_parser, ["--preset", "default"], log=lines.append)
    assert seen[-1] == module.PRESETS["default"]["train"] and "JAX found none, so it will be slow" in lines[-1]
    monkeypatch.setattr(experiment, "on_accelerator", lambda: True)
    experiment.train_script(run, module.PRESETS, module.make_parser, [], log=lines.append)
    assert seen[-1] == module.PRESETS["default"]["train"] and lines[-1].startswith("preset default: JAX found an")


def test_cpu_preset_computes_in_bfloat16_only_on_a_cpu_with_bfloat16_dots(tmp_path):
    from txjax.train.experiment import cpu_compute_dtype, train_script

    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nflags\t\t: fpu sse avx2 avx512f avx512_bf16 fma\n")
    assert cpu_compute_dtype(info) == ("bfloat16", "this CPU has bfloat16 dot instructions (avx512_bf16)")
    info.write_text("processor\t: 0\nflags\t\t: fpu sse avx2 avx512f fma\n")
    assert cpu_compute_dtype(info)[0] == "float32"
    assert cpu_compute_dtype(tmp_path / "absent")[0] == "float32"
    gpt = load_script("train_gpt")
    assert gpt.PRESETS["cpu"]["model"].dtype == cpu_compute_dtype()[0]
    lines = []
    train_script(lambda *a, **k: {}, gpt.PRESETS, gpt.make_parser, [], log=lines.append, notes={"cpu": "why"})
    assert lines[0].startswith("preset cpu: JAX found no accelerator") and lines[0].endswith("; why")


@pytest.mark.parametrize("argv, message", [
    (["--no_such_flag", "1"], "unrecognized arguments: --no_such_flag"),
    (["--learning_rate", "-0.1"], "learning_rate must be > 0"),
    (["--batch_size", "0"], "batch_size must be > 0"),
    (["--steps", "ten"], "expected int, got 'ten'"),
    (["--progress", "maybe"], "expected true or false"),
    (["--preset", "tpu"], "invalid choice: 'tpu'"),
    (["--num_heads", "3"], "not divisible by num_heads=3"),
    (["--temperature", "-1"], "temperature must be >= 0"),
    (["--name", "a/b"], "plain folder name"),
])
def test_bad_flags_are_clear_errors(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_:
        parse(load_script("train_gpt"), argv)
    assert exit_.value.code == 2
    assert message in capsys.readouterr().err


def test_unigram_baseline_by_hand():
    # Two patch positions, 2 ids (plus BOS 2 in column 0); add-one smoothing.
    train = np.array([[2, 0, 1], [2, 0, 1], [2, 0, 0]])
    test = np.array([[2, 0, 1]])
    p0 = (3 + 1) / (3 + 2)  # id 0 at position 0
    p1 = (2 + 1) / (3 + 2)  # id 1 at position 1
    assert unigram_baseline(train, test, num_ids=2) == pytest.approx(-math.log(p0) - math.log(p1))
    assert nats_to_bits_per_pixel(784 * math.log(2)) == pytest.approx(1.0)


TINY_MODEL = ["--d_model", "16", "--num_heads", "2", "--num_layers", "1", "--d_ff", "32"]
TINY_TRAIN = ["--steps", "2", "--batch_size", "8", "--warmup_steps", "1", "--checkpoint_every", "1",
              "--log_every", "1", "--eval_batches", "1", "--progress", "false"]


@pytest.mark.slow
def test_train_gpt_tiny_end_to_end_and_sample(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))  # the digit classifier's cache
    argv = ["--preset", "cpu", "--runs_dir", str(tmp_path), "--name", "g", *TINY_MODEL, *TINY_TRAIN,
            "--train_images", "64", "--test_images", "20", "--eval_batch_size", "10", "--num_samples", "4",
            "--quality_samples", "6"]
    summary = load_script("train_gpt").main(argv)
    run = tmp_path / "g"
    for name in ("config.json", "metrics.jsonl", "summary.json", "samples.png", "samples.npz", "loss.png"):
        assert (run / name).is_file(), name
    with np.load(run / "samples.npz") as f:
        assert f["images"].shape == (6, 28, 28) and f["images"].dtype == np.uint8
        assert set(np.unique(f["images"])) <= {0, 255} and f["tokens"].shape == (6, 197)
        assert (f["tokens"][:, 0] == 16).all() and f["tokens"][:, 1:].max() < 16
    assert summary["quality_samples"] == 6 and 1 <= summary["samples_classes"] <= 10
    assert 0 <= summary["samples_confident_share"] <= 1 and 0 <= summary["real_confident_share"] <= 1
    assert list((tmp_path / "cache" / "txjax").glob("digit_mlp-*.npz"))
    assert sorted(p.name for p in (run / "checkpoints").iterdir() if p.name.isdigit()) == ["1", "2"]
    assert json.loads((run / "summary.json").read_text()) == pytest.approx(summary)
    assert summary["test_images"] == 20 and summary["steps"] == 2
    assert 0 < summary["test_nll_nats_per_image"] < 196 * 2 * math.log(17)
    assert summary["test_bits_per_pixel"] == pytest.approx(nats_to_bits_per_pixel(summary["test_nll_nats_per_image"]))
    assert 100 < summary["unigram_baseline_nats_per_image"] < 200
    assert "bits/pixel" in capsys.readouterr().out
    out = load_script("sample").main(["--run", str(run), "--num_samples", "4", "--out", str(tmp_path / "new/s.png")])
    assert out["step"] == 2 and (tmp_path / "new/s.png").is_file()
    with np.load(tmp_path / "new/s.npz") as f:
        assert f["images"].shape == (4, 28, 28) and f["tokens"].shape == (4, 197)
    # The same name with another model is refused before any training (resume is in test_train).
    with pytest.raises(SystemExit) as exit_:
        load_script("train_gpt").main(argv + ["--d_model", "32"])
    assert exit_.value.code == 1
    assert "d_model: 16 -> 32" in capsys.readouterr().err


TEXT = ["--preset", "cpu", "--corpus", "default", "--seq_len", "32", "--heldout_examples", "16",
        "--eval_batch_size", "8", *TINY_MODEL, *TINY_TRAIN]


@pytest.mark.slow
def test_train_bert_tiny_end_to_end_and_fill(tmp_path):
    bert = load_script("train_bert").main(TEXT + ["--runs_dir", str(tmp_path), "--name", "b"])
    assert 0 < bert["heldout_mlm_loss"] < 10 and 0 <= bert["heldout_mlm_accuracy"] <= 1
    assert bert["heldout_predicted_tokens"] > 0
    assert (tmp_path / "b" / "summary.json").is_file() and (tmp_path / "b" / "loss.png").is_file()
    filled = load_script("sample").main(["--run", str(tmp_path / "b"), "--prompt", "to b_"])
    assert filled["filled"].startswith("to b[") and len(filled["filled"]) == len("to b[x]")


@pytest.mark.slow
def test_train_t5_tiny_end_to_end_and_fill(tmp_path, capsys):
    t5 = load_script("train_t5").main(TEXT + ["--runs_dir", str(tmp_path), "--name", "t", "--show", "2"])
    assert 0 < t5["heldout_loss"] < 10 and len(t5["examples"]) == 2
    assert set(t5["examples"][0]) == {"input", "truth", "predicted"}
    assert "<0>" in t5["examples"][0]["truth"]
    out = capsys.readouterr().out
    assert "truth:" in out and "predicted:" in out
    assert (tmp_path / "t" / "summary.json").is_file() and (tmp_path / "t" / "loss.png").is_file()
    filled = load_script("sample").main(["--run", str(tmp_path / "t"), "--prompt", "to b_ or n__"])
    assert filled["filled"].startswith("to b[") and "] or n[" in filled["filled"]


@pytest.mark.slow
@pytest.mark.parametrize("script", ["train_bert", "train_t5"])
def test_text_scripts_train_on_packed_documents(script, tmp_path, capsys):
    """--packing packed: the corpus's documents packed into rows with document ids, which the
    losses hand to the model; the log says how much padding is left."""
    out = load_script(script).main(TEXT + ["--runs_dir", str(tmp_path), "--name", "p", "--packing", "packed",
                                           "--show", "1"])
    loss = out["heldout_mlm_loss" if script == "train_bert" else "heldout_loss"]
    assert 0 < loss < 10
    log = capsys.readouterr().out
    assert "(packed):" in log and "% padding) train" in log


def test_unwritable_runs_dir_and_missing_run_are_clear_errors(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(SystemExit) as exit_:
        load_script("train_gpt").main(["--preset", "cpu", "--runs_dir", str(blocker)])
    assert exit_.value.code == 1
    assert f"cannot write to the run folder {blocker}/gpt_mnist_cpu" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_:
        load_script("train_gpt").main(["--preset", "cpu", "--runs_dir", str(tmp_path), "--data", "/nonexistent.npz"])
    assert exit_.value.code == 1
    assert "MNIST file /nonexistent.npz does not exist" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_:
        load_script("sample").main(["--run", str(tmp_path / "nope")])
    assert exit_.value.code == 1
    assert "no checkpoint folder" in capsys.readouterr().err
