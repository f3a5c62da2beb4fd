"""python -m txjax.bench: fields, consistency with txjax.cost, and the last-line JSON.

Nothing here asserts a speed: timings are reported by the command, never tested.
"""

import json
import math
import pathlib
import runpy

import pytest

from txjax import bench, cost
from txjax.config import ExecutionConfig

TINY = ["--vocab", "11", "--seq", "8", "--d-model", "16", "--heads", "2", "--layers", "1",
        "--d-ff", "32", "--batch", "2", "--steps", "2", "--warmup", "1"]
FIELDS = ("ms_per_step", "tokens_per_s", "model_flops_per_step", "peak_flops", "mfu")


def run(capsys, argv):
    result = bench.main(argv)
    out = capsys.readouterr().out.strip().splitlines()
    return result, out, json.loads(out[-1])


@pytest.mark.slow  # compiles a train step: ~6 s alone, ~25 s on a busy 2-core machine
def test_gpt_bench_prints_table_then_json(capsys):
    result, out, line = run(capsys, ["--arch", "gpt", *TINY])
    for field in FIELDS:
        assert field in line and line[field] > 0
    assert any("MFU" in row for row in out[:-1])
    config = bench.config_from_args(bench.parse_args(["--arch", "gpt", *TINY]))
    assert line["model_flops_per_step"] == cost.train_flops(config, 2, 8)
    assert line["tokens_per_s"] == pytest.approx(2 * 8 / (line["ms_per_step"] / 1e3))
    assert line["mfu"] == pytest.approx(line["model_flops_per_step"] / (line["ms_per_step"] / 1e3)
                                        / line["peak_flops"])
    assert line["peak_flops"] == max(result["peak_by_shape"].values())
    assert line["peak_flops_best"] >= line["peak_flops"] and 0 < line["mfu_best"]
    assert line["mfu_cold"] == pytest.approx(line["achieved_flops"] / line["peak_flops_cold"])
    assert line["backend"] == "cpu" and line["final_loss"] > 0


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["bert", "t5"])
def test_other_families_and_xla_attention(capsys, arch):
    _, _, line = run(capsys, ["--arch", arch, "--attention", "xla", *TINY])
    config = bench.config_from_args(bench.parse_args(["--arch", arch, *TINY]))
    assert line["model_flops_per_step"] == cost.train_flops(config, 2, 8)
    assert line["mfu"] > 0


@pytest.mark.slow
def test_decode_flag_adds_cached_decoding(capsys):
    _, out, line = run(capsys, ["--arch", "gpt", *TINY, "--decode", "4"])
    assert line["decode_tokens_per_s"] > 0 and line["decode_ms_per_token"] > 0
    assert any("cached decoding" in row for row in out)
    for field in FIELDS:
        assert field in line


def test_dense_matmul_shapes_cover_forward_and_backward():
    config = bench.config_from_args(bench.parse_args(TINY))
    shapes = bench.dense_matmul_shapes(config, batch=2, seq=8)
    m = 16
    for k, n in ((16, 16), (16, 32), (32, 16), (16, 11)):
        assert {(m, k, n), (m, n, k), (k, m, n)} <= set(shapes)
    flops = [2 * a * b * c for a, b, c in shapes]
    assert flops == sorted(flops, reverse=True)


def test_measure_peak_flops_reports_each_shape():
    peak = bench.measure_peak_flops([(64, 32, 16), (32, 32, 32)], repeats=2)
    assert set(peak["by_shape"]) == {"64x32x16", "32x32x32"}
    assert peak["peak_flops"] == max(peak["by_shape"].values()) > 0


def test_make_batch_layout():
    gpt = bench.config_from_args(bench.parse_args(TINY))
    t5 = bench.config_from_args(bench.parse_args(["--arch", "t5", *TINY]))
    assert set(bench.make_batch(gpt, 2, 8)) == {"inputs", "targets"}
    b = bench.make_batch(t5, 2, 8)
    assert set(b) == {"enc_inputs", "dec_inputs", "targets"}
    assert b["targets"].shape == (2, 8) and int(b["targets"].max()) < 11


def test_dtype_flag_sets_the_compute_dtype_and_cudnn_is_a_choice():
    """--dtype bfloat16 is the model's mixed precision (config.dtype), not cast parameters."""
    args = bench.parse_args(["--dtype", "bfloat16", "--attention", "cudnn", *TINY])
    assert (bench.config_from_args(args).dtype, bench.execution_from_args(args).attention_impl) == (
        "bfloat16", "cudnn")


@pytest.mark.parametrize("flag, expected", [(None, "default"), ("none", None), ("NONE", None), ("66", 66)])
def test_causal_block_size_flag(flag, expected):
    """Absent: the config's own default; 'none': unblocked; a number: that block length."""
    if expected == "default":
        expected = ExecutionConfig().causal_block_size
    argv = [*TINY] if flag is None else ["--causal-block-size", flag, *TINY]
    assert bench.execution_from_args(bench.parse_args(argv)).causal_block_size == expected


def test_cpu_vs_torch_refuses_an_unknown_variant_before_running_anything(monkeypatch, capsys):
    """`--only` names variants as the table prints them ("txjax float32"); a name that matches
    none is a usage error naming the variants, not an empty run."""
    root = pathlib.Path(__file__).resolve().parents[1]
    monkeypatch.syspath_prepend(str(root / "benchmarks"))  # as `python benchmarks/...` puts its folder first
    script = runpy.run_path(str(root / "benchmarks" / "cpu_vs_torch.py"))
    with pytest.raises(SystemExit) as exit_info:
        script["main"](["--only", "txjax float32,txjax-bfloat16"])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and "txjax-bfloat16" in err and "torch bfloat16 autocast" in err


def test_cpu_vs_torch_rates_each_txjax_variant_against_pytorch_in_its_own_dtype(monkeypatch, capsys):
    """float32 against eager float32, bfloat16 against eager under autocast, as the ratio of the
    medians and per round (each round ran both); with `--only` leaving out eager float32 the
    same-dtype ratio is still there. Fake timings: no process is started."""
    root = pathlib.Path(__file__).resolve().parents[1]
    monkeypatch.syspath_prepend(str(root / "benchmarks"))
    script = runpy.run_path(str(root / "benchmarks" / "cpu_vs_torch.py"))
    ms = {("torch", "float32"): [300.0, 330.0, 280.0], ("torch", "bfloat16"): [240.0, 270.0, 250.0],
          ("txjax", "float32"): [250.0, 300.0, 280.0], ("txjax", "bfloat16"): [200.0, 180.0, 250.0]}
    calls = {k: 0 for k in ms}

    def fake_run_json(cmd):
        key = ("torch" if any("torch_gpt.py" in c for c in cmd) else "txjax",
               next(c.split("=")[1] for c in cmd if c.startswith("--dtype=")))
        calls[key] += 1
        return {"ms_per_step": ms[key][calls[key] - 1]}

    monkeypatch.setitem(script["main"].__globals__, "run_json", fake_run_json)
    summary = script["main"](["--rounds", "3"])
    assert summary["txjax float32"]["speed_vs_same_dtype"] == pytest.approx(300.0 / 280.0)
    assert summary["txjax float32"]["round_speeds"] == pytest.approx([300 / 250, 330 / 300, 280 / 280])
    assert summary["txjax bfloat16"]["speed_vs_same_dtype"] == pytest.approx(250.0 / 200.0)
    assert summary["txjax bfloat16"]["round_speeds"] == pytest.approx([240 / 200, 270 / 180, 250 / 250])
    assert "speed_vs_same_dtype" not in summary["torch float32"]
    assert summary["txjax bfloat16"]["speed_vs_torch_float32"] == pytest.approx(300.0 / 200.0)
    assert "1.25 (1.00-1.50)" in capsys.readouterr().out
    calls.update({k: 0 for k in calls})
    summary = script["main"](["--rounds", "3", "--only", "txjax bfloat16,torch bfloat16 autocast"])
    assert summary["txjax bfloat16"]["speed_vs_same_dtype"] == pytest.approx(1.25)
    assert math.isnan(summary["txjax bfloat16"]["speed_vs_torch_float32"])  # no eager float32 run
