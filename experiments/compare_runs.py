"""Two runs of one study's preset, cell by cell (txjax.studies.compare): did a change move the table?

    python experiments/compare_runs.py synthetic_tasks docs/results/synthetic /tmp/s/synthetic_tasks
    python experiments/compare_runs.py mask_rate docs/results/mask_rate docs/results/mask_rate_bfloat16 --all

Reads each folder's runs.jsonl; prints the cells with p < 0.05 (every cell with --all) and a summary.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from txjax.studies.common import read_jsonl
from txjax.studies.compare import STUDIES, compare, summary


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("study", choices=list(STUDIES))
    parser.add_argument("old", help="folder with the reference runs.jsonl")
    parser.add_argument("new", help="folder with the runs.jsonl to compare")
    parser.add_argument("--all", action="store_true", help="print every cell, not only p < 0.05")
    args = parser.parse_args(argv)
    diffs = compare(*(read_jsonl(Path(d) / "runs.jsonl") for d in (args.old, args.new)), args.study)
    for d in diffs:
        if args.all or d["p"] < 0.05:
            print(f"{' '.join(map(str, d['cell'])):36s} {d['metric']:18s} "
                  f"{d['old_mean']:9.4f} ± {d['old_std']:.4f} ({d['old_n']}) -> "
                  f"{d['new_mean']:9.4f} ± {d['new_std']:.4f} ({d['new_n']})  t {d['t']:6.2f}  p {d['p']:.3f}")
    result = summary(diffs)
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
