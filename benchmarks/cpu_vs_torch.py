"""txjax's train step against a PyTorch GPT of nanoGPT's shapes, fresh processes interleaved.

    python benchmarks/cpu_vs_torch.py --rounds 3                       # the bench config (issue 22)
    python benchmarks/cpu_vs_torch.py --rounds 3 --reference-attention # + txjax without the fused attention
    python benchmarks/cpu_vs_torch.py --rounds 3 --vocab 65 --seq 256 --d-model 384 --heads 6 \
        --layers 6 --d-ff 1536 --batch 8 --compile                      # the larger config, + torch.compile

Each round runs every variant once, in a rotated order, each in its own process
(`python -m txjax.bench`, `benchmarks/torch_gpt.py`), so that all of them see the same
drift of the machine; the table gives the median ms/step over rounds, each variant's speed
relative to PyTorch eager float32, and each txjax variant's relative to PyTorch eager in its own
dtype (float32, or bfloat16 under autocast: issue 22's targets), as the ratio of the medians and
the range of the rounds' ratios. Run it on an otherwise idle machine.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import sys

from _run import run_json  # benchmarks/_run.py

HERE = pathlib.Path(__file__).resolve().parent
SHAPE = (("vocab", 17), ("seq", 197), ("d-model", 128), ("heads", 4), ("layers", 4), ("d-ff", 512), ("batch", 32))


def variants(args) -> dict[str, list[str]]:
    """{name: command}: txjax and torch in float32 and bfloat16 (and torch.compile if asked)."""
    shape = [f"--{name}={getattr(args, name.replace('-', '_'))}" for name, _ in SHAPE]
    steps = [f"--steps={args.steps}", f"--warmup={args.warmup}"]
    txjax = [sys.executable, "-m", "txjax.bench", "--arch=gpt", *shape, *steps]
    torch = [sys.executable, str(HERE / "torch_gpt.py"), *shape, *steps]
    runs = {"txjax float32": txjax + ["--dtype=float32"], "txjax bfloat16": txjax + ["--dtype=bfloat16"],
            "torch float32": torch + ["--dtype=float32"], "torch bfloat16 autocast": torch + ["--dtype=bfloat16"]}
    if args.reference_attention:  # the attention txjax ran before the fused CPU kernel (attention_impl="auto")
        runs["txjax float32 ref-attn"] = txjax + ["--dtype=float32", "--attention=reference"]
        runs["txjax bfloat16 ref-attn"] = txjax + ["--dtype=bfloat16", "--attention=reference"]
    if args.compile:
        runs["torch.compile float32"] = torch + ["--dtype=float32", "--compile"]
        runs["torch.compile bfloat16"] = torch + ["--dtype=bfloat16", "--compile"]
    return runs


def same_dtype_reference(name: str) -> str | None:
    """The PyTorch eager variant a txjax variant is measured against: float32 against eager float32,
    bfloat16 against eager under autocast (the targets of issue 22); None for PyTorch's own."""
    if not name.startswith("txjax "):
        return None
    return {"float32": "torch float32", "bfloat16": "torch bfloat16 autocast"}[name.split()[1]]


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for name, default in SHAPE:
        p.add_argument(f"--{name}", type=int, default=default)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--compile", action="store_true", help="also time torch.compile")
    p.add_argument("--reference-attention", action="store_true",
                   help="also time txjax with attention_impl='reference' (no fused CPU kernel)")
    p.add_argument("--only", default="", help="comma-separated variant names to run (default: all)")
    args = p.parse_args(argv)
    runs = variants(args)
    if args.only:
        unknown = set(args.only.split(",")) - set(runs)
        if unknown:
            p.error(f"--only: no variant named {', '.join(sorted(unknown))}; the variants: {', '.join(runs)}")
        runs = {k: v for k, v in runs.items() if k in args.only.split(",")}
    names = list(runs)
    times: dict[str, list[float]] = {name: [] for name in names}
    for r in range(args.rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            ms = run_json(runs[name])["ms_per_step"]
            times[name].append(ms)
            print(f"round {r + 1}: {name:<26} {ms:7.1f} ms/step", flush=True)
    base = statistics.median(times["torch float32"]) if "torch float32" in times else None
    print(f"\n{'variant':<26} {'median ms/step':>14}  {'x torch float32':>15}  {'x eager, same dtype':>19}  rounds")
    summary = {}
    for name in names:
        med = statistics.median(times[name])
        speed = base / med if base else float("nan")
        summary[name] = {"median_ms": med, "speed_vs_torch_float32": speed, "ms": times[name]}
        ref = same_dtype_reference(name)
        same = ""
        if ref in times:
            rounds = [a / b for a, b in zip(times[ref], times[name])]  # round r ran both
            summary[name].update(speed_vs_same_dtype=statistics.median(times[ref]) / med, round_speeds=rounds)
            same = f"{summary[name]['speed_vs_same_dtype']:.2f} ({min(rounds):.2f}-{max(rounds):.2f})"
        print(f"{name:<26} {med:14.1f}  {speed:15.2f}  {same:>19}  " + ", ".join(f"{t:.0f}" for t in times[name]))
    print(json.dumps({"shape": {n: getattr(args, n.replace('-', '_')) for n, _ in SHAPE}, "variants": summary}))
    return summary


if __name__ == "__main__":
    main()
