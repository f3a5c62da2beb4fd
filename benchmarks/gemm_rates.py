"""Matmul rates of JAX (XLA:CPU) and PyTorch at the train steps' shapes, float32 and bfloat16.

    python benchmarks/gemm_rates.py                    # every core JAX and PyTorch see
    taskset -c 0 python benchmarks/gemm_rates.py       # one core

What is left between txjax and PyTorch on the CPU is mostly these products (BUILD.md, issue 22):
each library runs in its own fresh process, alternately, so that one's spinning threads do not
slow the other. bfloat16 is bf16 x bf16 with float32 accumulation in both (JAX:
`preferred_element_type=float32`; PyTorch returns bf16, which its kernels round from float32).
The table gives GFLOP/s (2·m·k·n / median time) for [m, k] @ [k, n].
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

from _run import run_json  # benchmarks/_run.py

# [m, k] @ [k, n]: the larger config's (tokens 2048, D 384, F 1536) and the bench config's (6304, 128, 512)
SHAPES = ((2048, 384, 1536), (2048, 1536, 384), (2048, 384, 384), (384, 2048, 1536), (6304, 128, 512),
          (6304, 512, 128))


def rates(lib: str, dtype: str, repeats: int) -> list[float]:
    """GFLOP/s of lib's matmul at each of SHAPES, in this process."""
    if lib == "jax":
        import jax
        import jax.numpy as jnp
        dt = jnp.bfloat16 if dtype == "bfloat16" else jnp.float32
        dot = jax.jit(lambda a, b: jnp.dot(a, b, preferred_element_type=jnp.float32))
        make = lambda m, k, i: jax.random.normal(jax.random.key(i), (m, k), dt)
        run = lambda a, b: dot(a, b).block_until_ready()
    else:
        import torch
        dt = torch.bfloat16 if dtype == "bfloat16" else torch.float32
        make = lambda m, k, i: torch.randn(m, k, generator=torch.Generator().manual_seed(i)).to(dt)
        run = torch.mm
    out = []
    for m, k, n in SHAPES:
        a, b = make(m, k, 0), make(k, n, 1)
        run(a, b)
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            run(a, b)
            times.append(time.perf_counter() - t0)
        out.append(2 * m * k * n / statistics.median(times) / 1e9)
    return out


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=30)
    p.add_argument("--rounds", type=int, default=2, help="each library this many times, alternating")
    p.add_argument("--worker", nargs=2, metavar=("LIB", "DTYPE"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        print(json.dumps({"gflops": rates(*args.worker, args.repeats)}))
        return {}
    results = {}
    for dtype in ("float32", "bfloat16"):
        for _ in range(args.rounds):
            for lib in ("jax", "torch"):
                cmd = [sys.executable, __file__, "--repeats", str(args.repeats), "--worker", lib, dtype]
                results.setdefault(f"{lib} {dtype}", []).append(run_json(cmd)["gflops"])
    table = {name: [statistics.median(r[i] for r in runs) for i in range(len(SHAPES))] for name, runs in results.items()}
    print(f"{'GFLOP/s':16s}" + "".join(f"{f'{m}x{k}x{n}':>16s}" for m, k, n in SHAPES))
    for name, row in table.items():
        print(f"{name:16s}" + "".join(f"{r:16.0f}" for r in row))
    summary = {"shapes": SHAPES, "gflops": table}
    print(json.dumps(summary))
    return summary


if __name__ == "__main__":
    main()
