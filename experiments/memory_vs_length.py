"""The notes' open question: why does training memory blow up as the sequence grows?

For a GPT of fixed size we compile the real train step (txjax.train) at growing T,
for the reference attention and for jax.nn.dot_product_attention ("xla"), read
XLA's memory plan (`compiled.memory_analysis()`), and set it beside txjax.cost's
prediction. The T² term — the [B, N, T, T] score matrices every layer keeps for the
backward pass — takes over from the T-linear activations once T ≳ (7D + 2F) / (2N).
Nothing is run, only compiled. Writes a table (markdown and CSV) and a plot.

Answer (GPT D 128, N 4, L 4, F 512, batch 8, float32, XLA CPU, jax 0.10.2, measured
2026-11-29 at cecd987): the plan grows 39 -> 77 -> 176 -> 488 -> 1519 MiB for T = 64 ->
1024 with the whole score matrix (reference) and to 2037 MiB with
jax.nn.dot_product_attention; from T = 512 on, each doubling of T costs ~3x, i.e. the T²
scores dominate. txjax.cost predicts 32 -> 1535 MiB (XLA / predicted 1.20 at T 64, 0.99
at T 1024 for the reference). The fitted T² term is 8.7 [B, N, T, T] float32 tensors
(reference) and 12.8 (xla) against the model's 10. The default causal query blocks of 64
("blocked") keep only the blocks on and below the diagonal: 1239 MiB at T 1024, a T²
term of 6.0. On CPU the "xla" implementation materialises the same score matrix (no flash
kernel), so it does not change the asymptotics; a fused kernel (cuDNN / Pallas flash
attention) would remove the T² activations, not the T² FLOPs.

    python experiments/memory_vs_length.py [--out runs/memory_vs_length] [--seqs 64 128 256 512 1024]
"""

from __future__ import annotations

import argparse
import csv
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from txjax import bench, cost  # noqa: E402
from txjax.config import GPTConfig  # noqa: E402

MiB = 2**20


# How attention is run: the two implementations over whole score matrices, and the
# default, query blocks of 64 that skip the causal mask's upper triangle.
ATTENTION = {
    "reference": dict(attention_impl="reference", causal_block_size=None),
    "xla": dict(attention_impl="xla", causal_block_size=None),
    "blocked": dict(attention_impl="reference", causal_block_size=64),
}


def measure(config: GPTConfig, batch: int, seqs: list[int], impls: list[str]) -> list[dict]:
    rows = []
    for impl in impls:
        for t in seqs:
            c = config.replace(max_len=t, **ATTENTION[impl])
            plan = bench.train_step_memory(c, batch, t)
            pred = cost.train_step_bytes(c, batch, t)
            act = cost.activation_bytes(c, batch, t)
            rows.append({
                "attention": impl, "T": t,
                "xla_peak_MiB": plan["peak"] / MiB, "xla_temp_MiB": plan["temporaries"] / MiB,
                "pred_peak_MiB": pred["total"] / MiB, "pred_T2_MiB": act["quadratic"] / MiB,
                "pred_linear_MiB": act["linear"] / MiB, "ratio": plan["peak"] / pred["total"],
            })
            print(f"  {impl:9s} T {t:5d}: XLA {plan['peak'] / MiB:9.1f} MiB, "
                  f"predicted {pred['total'] / MiB:9.1f} MiB", flush=True)
    return rows


def fitted_score_copies(rows: list[dict], config: GPTConfig, batch: int) -> dict[str, float]:
    """Least-squares a + b·T + c·T² on XLA's peak; c in units of one [B, N, T, T] float32 tensor."""
    import numpy as np

    out = {}
    for impl in sorted({r["attention"] for r in rows}):
        sub = [r for r in rows if r["attention"] == impl]
        t = np.array([r["T"] for r in sub], float)
        y = np.array([r["xla_peak_MiB"] for r in sub]) * MiB
        coef = np.linalg.lstsq(np.stack([np.ones_like(t), t, t * t], 1), y, rcond=None)[0]
        out[impl] = coef[2] / (batch * config.num_heads * 4)
    return out


def write(rows: list[dict], copies: dict[str, float], config: GPTConfig, batch: int, out: str) -> None:
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "memory_vs_length.csv"), "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    lines = [
        f"GPT D {config.d_model}, N {config.num_heads}, L {config.num_layers}, F {config.d_ff}, "
        f"V {config.vocab_size}, batch {batch}, float32, AdamW; XLA CPU memory_analysis()",
        "",
        "| attention | T | XLA peak MiB | XLA temporaries MiB | predicted MiB | of which T² MiB | XLA / predicted |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(f"| {r['attention']} | {r['T']} | {r['xla_peak_MiB']:.1f} | {r['xla_temp_MiB']:.1f} | "
                     f"{r['pred_peak_MiB']:.1f} | {r['pred_T2_MiB']:.1f} | {r['ratio']:.2f} |")
    lines += ["", "Fitted T² coefficient of XLA's peak, in [B, N, T, T] float32 tensors "
              f"(the model predicts {2 * config.num_layers + 2}: 2 kept per layer + 2 in the backward):"]
    lines += [f"- {impl}: {c:.1f}" for impl, c in copies.items()]
    text = "\n".join(lines) + "\n"
    with open(os.path.join(out, "memory_vs_length.md"), "w") as f:
        f.write(text)
    print(text)

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for impl, marker in (("reference", "o"), ("xla", "s"), ("blocked", "^")):
        sub = [r for r in rows if r["attention"] == impl]
        if sub:
            ax.plot([r["T"] for r in sub], [r["xla_peak_MiB"] for r in sub], marker=marker,
                    label=f"XLA plan, {impl} attention")
    ref = [r for r in rows if r["attention"] == rows[0]["attention"]]
    ax.plot([r["T"] for r in ref], [r["pred_peak_MiB"] for r in ref], "k--", label="txjax.cost prediction")
    ax.plot([r["T"] for r in ref], [r["pred_linear_MiB"] for r in ref], "k:", label="prediction without T² terms")
    ax.set(xscale="log", yscale="log", xlabel="sequence length T", ylabel="train-step memory (MiB)",
           title="Training memory vs sequence length")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(os.path.join(out, "memory_vs_length.png"), dpi=120)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="runs/memory_vs_length")
    p.add_argument("--seqs", type=int, nargs="+", default=[64, 128, 256, 512, 1024])
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--attention", nargs="+", choices=sorted(ATTENTION), default=list(ATTENTION))
    args = p.parse_args(argv)
    config = GPTConfig(vocab_size=17, max_len=max(args.seqs), d_model=128, num_heads=4, num_layers=4, d_ff=512)
    rows = measure(config, args.batch, args.seqs, args.attention)
    write(rows, fitted_score_copies(rows, config, args.batch), config, args.batch, args.out)


if __name__ == "__main__":
    from txjax.hostmem import reuse_host_memory

    reuse_host_memory()  # before JAX runs anything: see txjax/hostmem.py
    main()
