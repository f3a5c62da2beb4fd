"""txjax.studies.memory: XLA's compiled train-step plan against txjax.cost, at tiny sizes."""

import csv

import pytest

from txjax.config import ExecutionConfig, GPTConfig
from txjax.studies import memory


@pytest.mark.slow  # three train-step compilations (nothing is run)
def test_run_study_writes_the_table_csv_and_plot(tmp_path, capsys):
    config = GPTConfig(vocab_size=11, max_len=32, d_model=16, num_heads=2, num_layers=1, d_ff=32)
    result = memory.run_study(config, batch=2, seqs=[8, 16, 32], impls=["reference"], out=str(tmp_path))
    rows = result["rows"]
    assert [(r["attention"], r["T"]) for r in rows] == [("reference", 8), ("reference", 16), ("reference", 32)]
    for r in rows:
        assert r["xla_peak_MiB"] > 0 and r["pred_peak_MiB"] > 0
        assert r["ratio"] == pytest.approx(r["xla_peak_MiB"] / r["pred_peak_MiB"])
    peaks = [r["xla_peak_MiB"] for r in rows]
    assert peaks == sorted(peaks)  # longer sequences never plan less memory
    assert set(result["copies"]) == {"reference"}
    with open(tmp_path / "memory_vs_length.csv") as f:
        assert [row["T"] for row in csv.DictReader(f)] == ["8", "16", "32"]
    text = (tmp_path / "memory_vs_length.md").read_text()
    assert "| reference | 32 |" in text and "Fitted T² coefficient" in text
    assert (tmp_path / "memory_vs_length.png").stat().st_size > 0
    assert "| reference | 8 |" in capsys.readouterr().out


def test_attention_ways_differ_only_in_how_attention_runs():
    """Each way is an ExecutionConfig: the model config (what is computed) is the same for all."""
    assert set(memory.ATTENTION) == {"reference", "xla", "blocked"}
    for execution in memory.ATTENTION.values():
        assert isinstance(execution, ExecutionConfig)
        assert (execution.remat, execution.grad_forms) == (False, "auto")
