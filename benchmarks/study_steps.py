"""Milliseconds per train step of the studies' cpu presets, and the same against another revision.

    taskset -c 0 python benchmarks/study_steps.py mr:t5:0.5 syn:gpt:rope len:fire
    python benchmarks/study_steps.py --against HEAD~1 --rounds 3      # every SPEC, A/B

A SPEC names one study model: `mr:FAMILY:RATE` (the masking rate, bert or t5), `syn:FAMILY:POSITION`
(copy/reverse, gpt or t5), `len:POSITION` (the length study's GPT), `rnd:TASK:VARIANT` (randomized
positions' encoder). Each is built from its study script's cpu preset and timed on its own batches
(`Stepper.step_leaves`, 10 steps after 2 of warm-up, median of 5 repeats) in one process.

With --against REV the revision is checked out in a temporary git worktree, and each round runs
both trees at once, one process pinned to each core, swapping cores between rounds, so that the
machine's drift reaches both alike (BUILD.md, "Measuring"). Prints medians and their ratio.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SPECS = ("mr:t5:0.5", "mr:t5:0.15", "mr:bert:0.15", "mr:bert:0.5", "syn:gpt:rope", "syn:gpt:fire", "syn:t5:t5",
         "syn:t5:none", "len:fire", "len:rope", "rnd:reverse_string:rope", "rnd:reverse_string:rope+random")


def setup(spec: str, root: Path = ROOT):
    """(Stepper, its state's leaves, 12 batches) for a SPEC, from the cpu preset of its study script in
    root/experiments."""
    import numpy as np

    from txjax.train.steps import Stepper
    sys.path.insert(0, str(root / "experiments"))
    kind, *args = spec.split(":")
    if kind == "mr":
        from mask_rate import PRESETS
        from txjax.studies import mask_rate
        train, study = PRESETS["cpu"]["train"], PRESETS["cpu"]["study"]
        model_cls, loss, cfg, _, make_batches = mask_rate.family_data(args[0], study)
        it = make_batches(float(args[1]), 0, train.batch_size)
        batches = [next(it) for _ in range(12)]
    elif kind == "syn":
        from synthetic_tasks import PRESETS
        from txjax import GPT, T5
        from txjax.studies import synthetic
        from txjax.train.steps import gpt_loss, t5_loss
        train, study = PRESETS["cpu"]["train"], PRESETS["cpu"]["study"]
        cfg = synthetic.model_config(args[0], args[1], study)
        model_cls, loss = (GPT, gpt_loss) if args[0] == "gpt" else (T5, t5_loss)
        batches = [synthetic.BATCHERS[args[0]]("copy", synthetic.sample_inputs(
            np.random.default_rng(s), train.batch_size, study.train_min, study.train_max, study.num_symbols),
            study.train_max) for s in range(12)]
    elif kind == "len":
        from length_extrapolation import PRESETS
        from txjax import GPT
        from txjax.studies import length
        from txjax.train.steps import gpt_loss
        train, study = PRESETS["cpu"]["train"], PRESETS["cpu"]["study"]
        cfg = dataclasses.replace(PRESETS["cpu"]["model"], position=args[0], vocab_size=65, max_len=study.train_len)
        model_cls, loss = GPT, gpt_loss
        ids = np.random.default_rng(0).integers(0, 65, 100_000).astype(np.int32)  # a char corpus's shape
        batch_fn = length.lm_batches(ids, study.train_len, train.batch_size, 0)
        batches = [batch_fn(s) for s in range(12)]
    elif kind == "rnd":
        from randomized_positions import PRESETS
        from txjax import Bert
        from txjax.studies import randomized
        from txjax.studies.randomized_tasks import encode, sample_task
        from txjax.train.steps import bert_loss
        train, study = PRESETS["cpu"]["train"], PRESETS["cpu"]["study"]
        cfg = randomized.model_config(args[1], args[0], study)
        model_cls, loss = Bert, bert_loss
        n, width = study.train_max, randomized.train_width(args[0], study.train_max, study)  # the widest rows
        batches = [encode(*sample_task(args[0], np.random.default_rng(s), train.batch_size, n), width)
                   for s in range(12)]
    else:
        raise SystemExit(f"unknown spec {spec!r}: mr:FAMILY:RATE, syn:FAMILY:POSITION, len:POSITION or rnd:TASK:VARIANT")
    stepper = Stepper(model_cls(cfg), loss, train)
    return stepper, stepper.leaves(stepper.init_state()), batches


def time_spec(spec: str, root: Path = ROOT, repeats: int = 5) -> float:
    """Median ms per step of SPEC in this process."""
    import jax
    stepper, leaves, batches = setup(spec, root)
    key = jax.random.key(0)
    for batch in batches[:2]:
        leaves, _ = stepper.step_leaves(leaves, batch, key)
    jax.block_until_ready(leaves)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        for batch in batches[2:]:
            leaves, _ = stepper.step_leaves(leaves, batch, key)
        jax.block_until_ready(leaves)
        times.append(1000 * (time.perf_counter() - start) / len(batches[2:]))
    return statistics.median(times)


def ab(specs: list[str], against: str, rounds: int) -> dict:
    """Both trees' medians per spec, `rounds` rounds of both at once, cores swapped each round."""
    cores = sorted(os.sched_getaffinity(0))[:2]
    if len(cores) < 2:
        raise SystemExit("--against needs two cores: it runs both trees at once")
    times = {(s, t): [] for s in specs for t in ("old", "new")}
    with tempfile.TemporaryDirectory() as tmp:
        old = Path(tmp) / "old"
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", "-q", str(old), against], check=True)
        try:
            for r in range(rounds):
                procs = {}
                for tree, path in (("old", old), ("new", ROOT)):
                    core = cores[(r + (tree == "new")) % 2]
                    env = dict(os.environ, PYTHONPATH=str(path))  # that tree's txjax, this harness
                    procs[tree] = subprocess.Popen(
                        ["taskset", "-c", str(core), sys.executable, __file__, "--json", "--root", str(path), *specs],
                        cwd=path, env=env, stdout=subprocess.PIPE, text=True)
                for tree, proc in procs.items():
                    out, _ = proc.communicate()
                    if proc.returncode:
                        raise SystemExit(f"the {tree} tree's run failed ({proc.returncode})")
                    for s, ms in json.loads(out.splitlines()[-1]).items():
                        times[(s, tree)].append(ms)
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(old)], check=False)
    return times


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("specs", nargs="*", default=list(SPECS), help=f"default: {' '.join(SPECS)}")
    parser.add_argument("--against", help="a git revision to compare with (A/B, both trees at once)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", action="store_true", help="print {spec: ms} as one JSON line")
    parser.add_argument("--root", type=Path, default=ROOT, help="the checkout whose experiments/ presets to build")
    args = parser.parse_args(argv)
    if args.against is None:
        result = {}
        for spec in args.specs:
            result[spec] = round(time_spec(spec, args.root), 2)
            if not args.json:
                print(f"{spec:28s} {result[spec]:8.2f} ms/step", flush=True)
        if args.json:
            print(json.dumps(result))
        return
    times = ab(args.specs, args.against, args.rounds)
    print(f"{'spec':28s} {args.against + ' (ms)':>14s} {'this tree (ms)':>15s} {'speed-up':>9s}")
    for spec in args.specs:
        old, new = statistics.median(times[(spec, "old")]), statistics.median(times[(spec, "new")])
        print(f"{spec:28s} {old:14.2f} {new:15.2f} {old / new:8.3f}x")


if __name__ == "__main__":
    from txjax.hostmem import reuse_host_memory

    reuse_host_memory()  # before JAX runs anything, as the study scripts do
    main(sys.argv[1:])
