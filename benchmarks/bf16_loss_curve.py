"""Does mixed bfloat16 train like float32? The MNIST cpu preset, both dtypes, same seed, same batches.

    python benchmarks/bf16_loss_curve.py --steps 200          # ~2 min on 2 cores
    python benchmarks/bf16_loss_curve.py --seed 1             # another seed (BUILD.md: seeds 0, 1, 2)

Runs `experiments/train_gpt.py --preset cpu` twice (float32, then bfloat16) for `--steps`
steps with a row of metrics per step, into a temporary folder, and compares the two
training-loss curves step by step (the batches are the same: they depend only on the seed),
then the test NLL of the first `--test-images` test images. The last line printed is JSON.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent


def train(runs: pathlib.Path, dtype: str, steps: int, test_images: int, seed: int = 0) -> dict:
    """{step: loss}, the summary and the wall time of one short run."""
    start = time.perf_counter()
    subprocess.run([sys.executable, str(ROOT / "experiments" / "train_gpt.py"), "--preset=cpu",
                    f"--dtype={dtype}", f"--steps={steps}", "--log_every=1", f"--eval_every={steps}",
                    f"--checkpoint_every={steps}", f"--test_images={test_images}", "--num_samples=16", f"--seed={seed}",
                    "--quality_samples=0", f"--runs_dir={runs}", f"--name={dtype}"],
                   check=True, capture_output=True, text=True, cwd=ROOT)
    wall = time.perf_counter() - start
    rows = [json.loads(line) for line in (runs / dtype / "metrics.jsonl").read_text().splitlines()]
    losses = {r["step"]: r["loss"] for r in rows if r.get("split") == "train" and "loss" in r}
    ms = [r["ms_per_step"] for r in rows if "ms_per_step" in r]
    summary = json.loads((runs / dtype / "summary.json").read_text())
    return {"losses": losses, "summary": summary, "wall_s": wall, "ms_per_step": statistics.median(ms)}


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--test-images", type=int, default=1000)
    p.add_argument("--seed", type=int, default=0, help="of the parameters and the batches (both runs)")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        runs = {dtype: train(pathlib.Path(tmp), dtype, args.steps, args.test_images, args.seed)
                for dtype in ("float32", "bfloat16")}
    f32, bf16 = runs["float32"]["losses"], runs["bfloat16"]["losses"]
    steps = sorted(set(f32) & set(bf16))
    gaps = [abs(bf16[s] - f32[s]) / f32[s] for s in steps]
    last = steps[-10:]
    windows = [steps[i:i + 10] for i in range(0, len(steps) - 9, 10)]
    window_gaps = [abs(statistics.mean(bf16[s] for s in w) - statistics.mean(f32[s] for s in w))
                   / statistics.mean(f32[s] for s in w) for w in windows]
    result = {
        "steps": len(steps),
        "max_relative_gap": max(gaps),
        "max_relative_gap_at_step": steps[gaps.index(max(gaps))],
        "median_relative_gap": statistics.median(gaps),
        "max_relative_gap_of_10_step_means": max(window_gaps),
        "last10_mean_loss": {d: statistics.mean(runs[d]["losses"][s] for s in last) for d in runs},
        "test_nll": {d: runs[d]["summary"].get("test_nll_nats_per_image") for d in runs},
        "ms_per_step": {d: runs[d]["ms_per_step"] for d in runs},
        "wall_s": {d: runs[d]["wall_s"] for d in runs},
    }
    for s in steps[:: max(1, len(steps) // 10)] + steps[-1:]:
        print(f"step {s:5d}  float32 {f32[s]:.4f}  bfloat16 {bf16[s]:.4f}  gap {abs(bf16[s] - f32[s]) / f32[s]:.2%}")
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
