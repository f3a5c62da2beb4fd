"""Every study's cpu preset, split into parts shared by one process per core; records the wall time.

    python experiments/run_studies.py                          # the four studies into runs/studies_cpu
    python experiments/run_studies.py --out_root /tmp/s --workers 1 --studies length_extrapolation

Each part is a study script with a subset of its preset (`--positions`, `--families`, ...);
a study's parts append to one runs.jsonl, so its tables cover all of them once the last part
ends. Writes <out_root>/run_studies.json (per-part and total wall time, load, revision) and
one log per part in <out_root>/logs.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from txjax.studies.common import git_revision, run_metadata
from txjax.studies.schedule import run_parts

HERE = Path(__file__).resolve().parent

# (study, extra arguments), longest first: parts start in this order, so the workers end close
# together. In brackets the core-seconds of the whole run of 2026-12-07 at 646bf3c (bfloat16 and
# the CPU kernels, idle 2-core AMX Xeon): 208 core-minutes, 104.6 min of wall time
# (docs/results/README.md, "All four presets in one run"; in the order before, which put BERT's
# part second); two cores need at least 104.1 min for them, this order 104.4.
PARTS = [
    ("mask_rate", "--families t5"),  # 2,292
    ("synthetic_tasks", "--families gpt"),  # 1,561
    ("mask_rate", "--families bert"),  # 1,484
    ("synthetic_tasks", "--families t5"),  # 1,468
    ("length_extrapolation", "--positions none,fire,kerple"),  # 1,000
    ("length_extrapolation", "--positions rope"),  # 716: with rope+random and the three scalings
    ("randomized_positions", "--tasks parity_check,modular_arithmetic --positions rope"),  # 670
    ("randomized_positions", "--tasks reverse_string --positions rope"),  # 634
    ("randomized_positions", "--tasks parity_check,modular_arithmetic --positions sinusoidal"),  # 603
    ("randomized_positions", "--tasks reverse_string --positions sinusoidal"),  # 597
    ("length_extrapolation", "--positions t5,alibi"),  # 563
    ("length_extrapolation", "--positions learned,sinusoidal"),  # 558
    ("length_extrapolation", "--positions xpos"),  # 346
]
STUDIES = tuple(dict.fromkeys(s for s, _ in PARTS))


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out_root", default="runs/studies_cpu", help="one folder per study below it")
    parser.add_argument("--workers", type=int, default=min(2, os.cpu_count() or 1), help="processes at once")
    parser.add_argument("--studies", default=",".join(STUDIES),
                        help="comma list of the studies to run")
    parser.add_argument("--no_pin", action="store_true", help="do not pin each worker to its own core")
    args = parser.parse_args(argv)
    studies, root = args.studies.split(","), Path(args.out_root)
    unknown = set(studies) - set(STUDIES)
    if unknown:
        parser.error(f"--studies: unknown {sorted(unknown)}; choose from {list(STUDIES)}")
    parts = [(f"{study}__{i}", [sys.executable, str(HERE / f"{study}.py"), "--preset", "cpu", *extra.split(),
                                "--out_dir", str(root / study)])
             for i, (study, extra) in enumerate(PARTS) if study in studies]
    started, revision = time.time(), git_revision()
    record = run_parts(parts, args.workers, root / "logs", pin=not args.no_pin)
    record.update(run_metadata({}, started, revision), workers=args.workers,
                  started_at=time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(started)))
    (root / "run_studies.json").write_text(json.dumps(record, indent=1))
    print(f"{len(parts)} parts in {record['wall_s'] / 60:.1f} min on {args.workers} workers; "
          f"failed: {[p['name'] for p in record['parts'] if p['returncode']] or 'none'}")
    return record


if __name__ == "__main__":
    main(sys.argv[1:])
