"""txjax.studies.compare: Welch's test per table cell, written from its formula."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from experiment_scripts import load_script
from txjax.studies.compare import STUDIES, cells, compare, summary, welch

values = st.lists(st.floats(-10, 10, allow_nan=False).map(lambda x: round(x, 4)), min_size=2, max_size=6)


@settings(max_examples=50, deadline=None)
@given(values, values)
def test_welch_t_is_the_mean_difference_over_its_standard_error(old, new):
    t, p = welch(old, new)
    a, b = np.asarray(old), np.asarray(new)
    se = math.sqrt(a.var(ddof=1) / len(a) + b.var(ddof=1) / len(b))
    if se < 1e-9:
        return  # constant sides: the special cases below
    assert t == pytest.approx((b.mean() - a.mean()) / se, rel=1e-6, abs=1e-9)
    assert 0.0 <= p <= 1.0


def test_welch_p_from_the_t_distribution_with_welch_satterthwaite_degrees_of_freedom():
    from scipy.special import betainc

    old, new = [1.0, 1.2, 0.9], [1.5, 1.9, 1.6, 1.7]
    a, b = np.asarray(old), np.asarray(new)
    va, vb = a.var(ddof=1) / len(a), b.var(ddof=1) / len(b)
    t = (b.mean() - a.mean()) / math.sqrt(va + vb)
    df = (va + vb) ** 2 / (va ** 2 / (len(a) - 1) + vb ** 2 / (len(b) - 1))
    p = betainc(df / 2, 0.5, df / (df + t * t))  # two-sided tail of Student's t
    assert welch(old, new) == pytest.approx((t, p), rel=1e-9)


def test_welch_constant_sides_and_single_seeds():
    assert welch([1.0, 1.0], [2.0, 2.0]) == (math.inf, 0.0)
    t, p = welch([3.0, 3.0], [3.0, 3.0])
    assert t == 0.0 and math.isnan(p)
    assert all(math.isnan(x) for x in welch([1.0], [1.0, 2.0]))


def rows(shift=0.0):
    return [dict(family="gpt", task="copy", position=pos, seed=s, in_exact=0.9 + 0.01 * s + (shift if pos == "rope" else 0),
                 out_exact=None, in_token_acc=0.99, out_token_acc=None, steps=2000)
            for pos in ("rope", "none") for s in range(3)]


def test_compare_finds_the_one_moved_cell_and_skips_missing_and_constant_ones():
    same = compare(rows(), rows(), "synthetic_tasks")
    assert {(d["cell"], d["metric"]) for d in same} == {
        (("gpt", "copy", p), m) for p in ("rope", "none") for m in ("in_exact", "in_token_acc", "steps")}
    assert summary(same)["tested"] == 2 and summary(same)["p_below_0.05"] == 0  # in_exact; the rest constant
    moved = compare(rows(), rows(shift=0.05) + rows()[:1], "synthetic_tasks")  # a repeated run counts once
    hit = [d for d in moved if d["p"] < 0.05]
    assert [(d["cell"][2], d["metric"]) for d in hit] == [("rope", "in_exact")]
    assert hit[0]["new_n"] == 3 and hit[0]["shift"] == pytest.approx(5.0)
    assert summary(moved)["max_abs_t_at"] == (["gpt", "copy", "rope"], "in_exact")


def test_every_study_has_a_run_key_with_the_seed_and_cells_drop_it():
    for study, (key, metrics) in STUDIES.items():
        assert "seed" in key and metrics, study
    got = cells(rows(), "synthetic_tasks")
    assert got[("gpt", "copy", "rope")]["in_exact"] == pytest.approx([0.9, 0.91, 0.92])


def test_the_script_prints_the_summary(tmp_path, capsys):
    import json

    for name, shift in (("old", 0.0), ("new", 0.05)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "runs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows(shift)))
    result = load_script("compare_runs").main(["synthetic_tasks", str(tmp_path / "old"), str(tmp_path / "new")])
    assert result["p_below_0.05"] == 1 and "rope" in capsys.readouterr().out
