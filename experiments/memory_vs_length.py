"""The notes' open question: why does training memory blow up as the sequence grows?

For a GPT of fixed size we compile the real train step (txjax.train) at growing T,
for the reference attention and for jax.nn.dot_product_attention ("xla"), read
XLA's memory plan (`compiled.memory_analysis()`), and set it beside txjax.cost's
prediction. The T² term — the [B, N, T, T] score matrices every layer keeps for the
backward pass — takes over from the T-linear activations once T ≳ (7D + 2F) / (2N).
Nothing is run, only compiled. Writes a table (markdown and CSV) and a plot.
Intentionally kept short: the logic lives in txjax.studies.memory, where tests reach it.

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

from txjax.config import GPTConfig
from txjax.studies.memory import ATTENTION, run_study


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="runs/memory_vs_length")
    p.add_argument("--seqs", type=int, nargs="+", default=[64, 128, 256, 512, 1024])
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--attention", nargs="+", choices=sorted(ATTENTION), default=list(ATTENTION))
    args = p.parse_args(argv)
    config = GPTConfig(vocab_size=17, max_len=max(args.seqs), d_model=128, num_heads=4, num_layers=4, d_ff=512)
    return run_study(config, args.batch, args.seqs, args.attention, args.out)


if __name__ == "__main__":
    from txjax.hostmem import reuse_host_memory

    reuse_host_memory()  # before JAX runs anything: see txjax/hostmem.py
    main()
