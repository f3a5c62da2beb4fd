"""The table of docs/results/README.md's "Why does T5's bias not generalise at 4 layers?", from the
runs.jsonl files beside this script.

Per folder, over the seeds whose in-distribution check reached 95% (a model that has not learned
the task says nothing about how it generalises): mean ± std of exact match, of token accuracy
beyond the training lengths, of teacher-forced accuracy by answer token (`out_accuracy_by_index`:
the first token at input lengths 31-40, tokens 3-20 and 21-n at 21-40), and of the share of answer
tokens read from the right x at lengths 30-40 (`out_match_by_source_offset` at delta 0).

    python docs/results/synthetic_cause_tests/t5_depth/index_table.py
"""
import json
from pathlib import Path

import numpy as np

HERE = Path(__file__).parent
FOLDERS = ("2_layers_to_95", "2_layers_prefix_40", "2_layers_to_100",
           "4_layers_to_95", "4_layers_prefix_40", "4_layers_to_100")


def mean_std(values) -> str:
    if any(v is None for v in values):
        return "n/a"
    v = 100 * np.asarray(values)
    return f"{v.mean():.1f} ± {v.std(ddof=1):.1f}"


def band(r, first: int, last: int | None, min_len: int = 21) -> float:
    """Mean accuracy of answer tokens first..last (None: the last before EOS) over lengths >= min_len."""
    return float(np.mean([np.mean(acc[first - 1: n if last is None else min(last, n)])
                          for n, acc in r["out_accuracy_by_index"] if n >= max(min_len, first)]))


def read_right(r) -> float | None:
    """Share of answer tokens equal to the right x (delta 0) at input lengths >= 30."""
    if "out_match_by_source_offset" not in r:  # runs made before the record existed
        return None
    return float(np.mean([by_delta[n - 1] for n, by_delta in r["out_match_by_source_offset"] if n >= 30]))


print("| run | seeds that learned · steps to 95% | in exact | out exact | out token acc "
      "| token 1, n 31–40 | tokens 3–20 | tokens 21–n | read from the right x, n 30–40 |")
print("|---|---|---|---|---|---|---|---|---|")
for folder in FOLDERS:
    runs = [json.loads(line) for line in open(HERE / folder / "runs.jsonl")]
    learned = [r for r in runs if any(e >= 0.95 for _, e in r["check_curve"])]
    first95 = [next(s for s, e in r["check_curve"] if e >= 0.95) for r in learned]
    cells = [mean_std([r["in_exact"] for r in learned]), mean_std([r["out_exact"] for r in learned]),
             mean_std([r["out_token_acc"] for r in learned]),
             mean_std([band(r, 1, 1, min_len=31) for r in learned]),
             mean_std([band(r, 3, 20) for r in learned]), mean_std([band(r, 21, None) for r in learned]),
             mean_std([read_right(r) for r in learned])]
    print(f"| `{folder}/` | {len(learned)}/{len(runs)} · {np.mean(first95):,.0f} | " + " | ".join(cells) + " |")
