"""Training memory against sequence length: XLA's compiled plan of the real train step beside txjax.cost.

For a GPT of fixed size `measure` compiles the real train step (`txjax.bench.train_step_memory`,
nothing is run) at growing T, for each way of running attention in `ATTENTION`, and sets
XLA's memory plan beside `txjax.cost`'s prediction. The T² term — the [B, N, T, T] score
matrices every layer keeps for the backward pass — takes over from the T-linear
activations once T ≳ (7D + 2F) / (2N); `fitted_score_copies` measures it in units of one
such float32 tensor. `run_study` does both and `write`s a table (markdown and CSV) and a
plot. experiments/memory_vs_length.py is the command line, with the measured answer.
"""

from __future__ import annotations

import csv
import os

from txjax import bench, cost
from txjax.config import ExecutionConfig, GPTConfig

MiB = 2**20


# How attention is run: the two implementations over whole score matrices, and the
# default, query blocks of 64 that skip the causal mask's upper triangle.
ATTENTION = {
    "reference": ExecutionConfig(attention_impl="reference", causal_block_size=None),
    "xla": ExecutionConfig(attention_impl="xla", causal_block_size=None),
    "blocked": ExecutionConfig(attention_impl="reference", causal_block_size=64),
}


def measure(config: GPTConfig, batch: int, seqs: list[int], impls: list[str]) -> list[dict]:
    rows = []
    for impl in impls:
        for t in seqs:
            c = config.replace(max_len=t)
            plan = bench.train_step_memory(c, batch, t, execution=ATTENTION[impl])
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


def run_study(config: GPTConfig, batch: int, seqs: list[int], impls: list[str], out: str) -> dict:
    """Measure, fit and write: {"rows": the table's rows, "copies": the fitted T² term per implementation}."""
    rows = measure(config, batch, seqs, impls)
    copies = fitted_score_copies(rows, config, batch)
    write(rows, copies, config, batch, out)
    return {"rows": rows, "copies": copies}
