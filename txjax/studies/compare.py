"""Two runs of one study, cell by cell: does a change (the compute dtype, a revision) move its table?

A cell is one row of the study's table (its run key without the seed) and one metric. Each cell's
seeds in the two runs are compared with Welch's t-test. With 3 seeds a side, ~5% of the cells of
an unchanged study fall under p < 0.05 by chance: read that count against the number expected,
not any single cell.
"""

from __future__ import annotations

import math
import warnings
from collections import defaultdict
from collections.abc import Sequence

from scipy import stats

from txjax.studies import length, mask_rate, randomized, synthetic
from txjax.studies.common import mean_std, unique_runs

# study (its script's and run_studies.py's name) -> (run key, the metrics its table reports)
STUDIES = {
    "length_extrapolation": (length.RUN_KEY, ("bits_per_char",)),
    "synthetic_tasks": (synthetic.RUN_KEY, ("in_exact", "out_exact", "in_token_acc", "out_token_acc", "steps")),
    "mask_rate": (mask_rate.RUN_KEY, ("heldout_loss", "heldout_accuracy", "own_rate_loss", "own_rate_accuracy")),
    "randomized_positions": (randomized.RUN_KEY, ("in_accuracy", "out_accuracy")),
}


def cells(rows: Sequence[dict], study: str) -> dict[tuple, dict[str, list[float]]]:
    """{cell: {metric: one value per seed}}; a cell is the run key without the seed."""
    key, metrics = STUDIES[study]
    out: dict[tuple, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for row in unique_runs(list(rows), key):
        cell = tuple(row[k] for k in key if k != "seed")
        for m in metrics:
            if row.get(m) is not None:
                out[cell][m].append(float(row[m]))
    return out


def welch(old: Sequence[float], new: Sequence[float]) -> tuple[float, float]:
    """(t, two-sided p) of Welch's test, new minus old; (0, nan) where both sides are one constant
    value (nothing to test), (±inf, 0) where each side is constant and they differ."""
    (m1, s1, n1), (m2, s2, n2) = mean_std(old), mean_std(new)
    if n1 < 2 or n2 < 2:
        return math.nan, math.nan
    se = math.sqrt(s1 ** 2 / n1 + s2 ** 2 / n2)
    if len(set(old)) == len(set(new)) == 1 or se == 0:  # float sums may leave a 1e-17 std, or none
        return (0.0, math.nan) if m1 == m2 else (math.copysign(math.inf, m2 - m1), 0.0)
    with warnings.catch_warnings():  # scipy warns of precision loss on nearly equal seeds; t says as much
        warnings.simplefilter("ignore", RuntimeWarning)
        return (m2 - m1) / se, float(stats.ttest_ind(new, old, equal_var=False).pvalue)


def compare(old_rows: Sequence[dict], new_rows: Sequence[dict], study: str) -> list[dict]:
    """One dict per (cell, metric) in both runs: means, stds, seeds, Welch's t and p, and the
    shift |new - old| in units of the larger of the two stds."""
    old, new = cells(old_rows, study), cells(new_rows, study)
    diffs = []
    for cell in sorted(set(old) & set(new), key=str):
        for metric in STUDIES[study][1]:
            a, b = old[cell].get(metric), new[cell].get(metric)
            if not a or not b:
                continue
            (m1, s1, n1), (m2, s2, n2) = mean_std(a), mean_std(b)
            t, p = welch(a, b)
            sd = max(s1, s2)
            shift = abs(m2 - m1) / sd if sd > 0 else (0.0 if m1 == m2 else math.inf)
            diffs.append(dict(cell=cell, metric=metric, old_mean=m1, old_std=s1, old_n=n1,
                              new_mean=m2, new_std=s2, new_n=n2, t=t, p=p, shift=shift))
    return diffs


def summary(diffs: Sequence[dict]) -> dict:
    """How many cells moved: p < 0.05 against the number expected by chance, the largest |t|."""
    tested = [d for d in diffs if not math.isnan(d["p"])]
    worst = max(tested, key=lambda d: abs(d["t"]), default=None)
    return {
        "cells": len(diffs), "tested": len(tested),
        "p_below_0.05": sum(d["p"] < 0.05 for d in tested), "expected_by_chance": 0.05 * len(tested),
        "p_below_0.01": sum(d["p"] < 0.01 for d in tested),
        "max_abs_t": abs(worst["t"]) if worst else None,
        "max_abs_t_at": (list(worst["cell"]), worst["metric"]) if worst else None,
        "shift_above_1_std": sum(d["shift"] > 1 for d in diffs),
    }
