"""Benchmark the real train step of a config and report its MFU on this machine.

`python -m txjax.bench --arch gpt --vocab 17 --seq 197 --d-model 128 --heads 4 --layers 4 --d-ff 512 --batch 32`

The step timed is `txjax.train.steps.Stepper.step_leaves` — the jitted, donated
AdamW + warmup/cosine + clipping step users train with, called as `fit` calls it. We
compile it, run warm-up steps, then time N steps one by one (each waits for its result)
and take the median.
Model FLOPs per step come from `txjax.cost.train_flops` (3× the forward matmuls of
the notes); the peak is measured in the same run by timing the model's own dense
matmul shapes, forward and backward, on the same backend: after every timed step a
short burst of each shape, so both see the same machine load, and only the warm calls
of a burst count, because the step's own matmuls run back to back, warm (a lone call
after a step can find the thread pool asleep). MFU = achieved / peak (medians).
`--decode N` also times cached sampling of N tokens (txjax.decoding.generate).
The last line printed is JSON with ms_per_step, tokens_per_s, model_flops_per_step,
peak_flops and mfu.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from txjax.argtypes import at_least
from txjax import cost
from txjax.config import ACTIVATION_IMPLS, ATTENTION_IMPLS, CONFIGS, ExecutionConfig, TransformerConfig
from txjax.models import MODELS


@dataclasses.dataclass(frozen=True)
class BenchConfig:
    """What to benchmark and how long."""

    batch: int = 32  # sequences per step
    seq: int = 197  # tokens per sequence (T5: encoder and decoder each)
    steps: int = 20  # timed steps; the median is reported
    warmup: int = 3  # untimed steps after compilation
    burst: int = 3  # calls of each peak matmul after every step; the first (cold) one is not counted
    seed: int = 0


def time_calls(fn, *args, repeats: int, warmup: int = 2) -> list[float]:
    """Seconds per call of `fn(*args)`, each call waited for, after `warmup` calls."""
    for _ in range(warmup):
        jax.block_until_ready(fn(*args))
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - start)
    return times


def dense_matmul_shapes(config: TransformerConfig, batch: int, seq: int) -> list[tuple[int, int, int]]:
    """(m, k, n) of every distinct dense matmul a train step runs, forward and backward.

    Forward x[m, k] @ w[k, n] with m = B·T; backward dx = dy[m, n] @ wᵀ[n, k] and
    dw = xᵀ[k, m] @ dy[m, n]. Attention's batched [T, H] @ [H, T] products are left
    out: they are too small to show the machine's peak.
    """
    m = batch * seq
    d, f, v = config.d_model, config.d_ff, config.vocab_size
    inner, kv_inner = config.num_heads * config.head_size, config.kv_heads * config.head_size
    shapes = set()
    for k, n in ((d, inner), (d, kv_inner), (inner, d), (d, f), (f, d), (d, v)):
        shapes |= {(m, k, n), (m, n, k), (k, m, n)}
    return sorted(shapes, key=lambda s: -s[0] * s[1] * s[2])


def matmul_timers(shapes, dtype=jnp.float32, seed: int = 0) -> dict:
    """{"m x k x n": (jitted matmul, a, b)} for each (m, k, n), compiled and warmed up."""
    rng = np.random.default_rng(seed)
    matmul = jax.jit(jnp.matmul)
    timers = {}
    for m, k, n in shapes:
        a = jnp.asarray(rng.standard_normal((m, k)), dtype)
        b = jnp.asarray(rng.standard_normal((k, n)), dtype)
        time_calls(matmul, a, b, repeats=0)
        timers[f"{m}x{k}x{n}"] = (matmul, a, b, 2 * m * k * n)
    return timers


def peak_from_times(timers: dict, times: dict[str, list[float]]) -> dict:
    """Best median FLOP/s over the shapes: {"peak_flops", "by_shape"}."""
    by_shape = {name: timers[name][3] / statistics.median(ts) for name, ts in times.items()}
    return {"peak_flops": max(by_shape.values()), "by_shape": by_shape}


def measure_peak_flops(shapes, dtype=jnp.float32, repeats: int = 10, seed: int = 0) -> dict:
    """Best median FLOP/s over jitted matmuls of the given (m, k, n) shapes, alone."""
    timers = matmul_timers(shapes, dtype, seed)
    times = {name: time_calls(f, a, b, repeats=repeats, warmup=0) for name, (f, a, b, _) in timers.items()}
    return peak_from_times(timers, times)


def make_batch(config: TransformerConfig, batch: int, seq: int, seed: int = 0) -> dict:
    """Random token ids in the layout the family's loss expects (txjax.train.steps.LOSSES)."""
    rng = np.random.default_rng(seed)
    ids = lambda: jnp.asarray(rng.integers(0, config.vocab_size, (batch, seq)), jnp.int32)
    if config.family == "t5":
        return {"enc_inputs": ids(), "dec_inputs": ids(), "targets": ids()}
    return {"inputs": ids(), "targets": ids()}


def build_model(config: TransformerConfig, seed: int = 0, execution: ExecutionConfig | None = None):
    return MODELS[config.family](config, rngs=nnx.Rngs(seed), execution=execution)


def bench_train(config: TransformerConfig, bench: BenchConfig, execution: ExecutionConfig | None = None) -> dict:
    """Time the train step; measure the peak; return the report's fields."""
    from txjax.train.config import TrainConfig
    from txjax.train.steps import LOSSES, Stepper

    dtype = jnp.dtype(config.dtype)  # of the model's matmuls, so of the peak ones too
    model = build_model(config, bench.seed, execution)
    train_cfg = TrainConfig(batch_size=bench.batch, steps=max(bench.steps + bench.warmup, 1),
                            warmup_steps=1, progress=False)
    stepper = Stepper(model, LOSSES[config.family], train_cfg)
    leaves = stepper.leaves(stepper.init_state())
    batch = make_batch(config, bench.batch, bench.seq, bench.seed)
    key = jax.random.key(bench.seed)

    start = time.perf_counter()
    leaves, metrics = stepper.step_leaves(leaves, batch, key)
    jax.block_until_ready(metrics)
    compile_s = time.perf_counter() - start
    for _ in range(bench.warmup):
        leaves, metrics = stepper.step_leaves(leaves, batch, key)
    jax.block_until_ready(metrics)
    timers = matmul_timers(dense_matmul_shapes(config, bench.batch, bench.seq), dtype, bench.seed)
    # Steps and peak matmuls alternate, so both see the same machine load (others share
    # the cores); MFU is the ratio of the two medians.
    times, matmul_times, cold_times = [], {name: [] for name in timers}, {name: [] for name in timers}
    for _ in range(bench.steps):
        start = time.perf_counter()
        leaves, metrics = stepper.step_leaves(leaves, batch, key)
        jax.block_until_ready(metrics)
        times.append(time.perf_counter() - start)
        for name, (f, a, b, _) in timers.items():
            burst = time_calls(f, a, b, repeats=max(bench.burst, 2), warmup=0)
            cold_times[name].append(burst[0])
            matmul_times[name].extend(burst[1:])
    loss = float(metrics["loss"])
    peak = peak_from_times(timers, matmul_times)
    cold_peak = peak_from_times(timers, cold_times)["peak_flops"]
    # Best-of-N view: the least disturbed step against the least disturbed matmul.
    best_peak = max(timers[name][3] / min(ts) for name, ts in matmul_times.items())
    step_s = statistics.median(times)
    flops = cost.train_flops(config, bench.batch, bench.seq)
    tokens = cost.tokens_per_step(config, bench.batch, bench.seq)
    achieved = flops / step_s
    return {
        "arch": config.family,
        "backend": jax.default_backend(),
        "devices": str(jax.devices()[0].device_kind),
        "dtype": config.dtype,
        "attention": (execution or ExecutionConfig()).attention(jax.default_backend()),
        "batch": bench.batch,
        "seq": bench.seq,
        "params": cost.param_count(config),
        "compile_s": compile_s,
        "steps": bench.steps,
        "ms_per_step": 1e3 * step_s,
        "ms_per_step_min": 1e3 * min(times),
        "ms_per_step_max": 1e3 * max(times),
        "tokens_per_s": tokens / step_s,
        "model_flops_per_step": flops,
        "achieved_flops": achieved,
        "peak_flops": peak["peak_flops"],
        "peak_by_shape": peak["by_shape"],
        "mfu": achieved / peak["peak_flops"],
        "peak_flops_cold": cold_peak,
        "mfu_cold": achieved / cold_peak,
        "peak_flops_best": best_peak,
        "mfu_best": flops / min(times) / best_peak,
        "final_loss": loss,
    }


def bench_decode(config: TransformerConfig, batch: int, new_tokens: int, repeats: int = 3,
                 seed: int = 0) -> dict:
    """Cached sampling with `txjax.decoding.generate` from a one-token prompt (GPT only).

    Compiled once, then timed `repeats` times; the median counts.
    """
    from txjax.decoding import generate

    if config.family != "gpt":
        raise ValueError(f"--decode benchmarks GPT decoding, not {config.family}")
    if new_tokens + 1 > config.max_len and config.position == "learned":
        config = config.replace(max_len=new_tokens + 1)
    model = build_model(config, seed)
    prompt_BT = jnp.zeros((batch, 1), jnp.int32)
    run = lambda key: generate(model, prompt_BT, new_tokens, key, use_cache=True)
    start = time.perf_counter()
    jax.block_until_ready(run(jax.random.key(seed)))
    first = time.perf_counter() - start
    times = []
    for r in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(run(jax.random.key(seed + r + 1)))
        times.append(time.perf_counter() - start)
    median = statistics.median(times)
    return {"decode_new_tokens": new_tokens, "decode_compile_s": first - median,
            "decode_ms_per_token": 1e3 * median / new_tokens,
            "decode_tokens_per_s": batch * new_tokens / median}


def format_table(config: TransformerConfig, result: dict) -> str:
    """Human-readable summary of `bench_train`'s result."""
    c = config
    rows = [
        f"train step: {c.family}  V {c.vocab_size}  T {result['seq']}  D {c.d_model}  N {c.num_heads}  "
        f"L {c.num_layers}  F {c.d_ff}  B {result['batch']}  {result['dtype']}  attention "
        f"{result['attention']}",
        f"backend {result['backend']} ({result['devices']}), params {result['params']:,}, "
        f"compile {result['compile_s']:.1f} s",
        "",
        f"  ms / step (median of {result['steps']})   {result['ms_per_step']:10.2f}"
        f"   (min {result['ms_per_step_min']:.2f}, max {result['ms_per_step_max']:.2f})",
        f"  tokens / s                   {result['tokens_per_s']:10.0f}",
        f"  model FLOPs / step (cost)    {result['model_flops_per_step']:10.4g}",
        f"  achieved FLOP/s              {result['achieved_flops']:10.4g}",
        f"  peak matmul FLOP/s (measured){result['peak_flops']:10.4g}",
        f"  MFU                          {result['mfu']:10.3f}",
        f"  MFU, best of N (min step vs fastest matmul) {result['mfu_best']:.3f}"
        f"  (peak {result['peak_flops_best']:.4g})",
        f"  MFU against lone cold matmuls (not a peak)  {result['mfu_cold']:.3f}"
        f"  (peak {result['peak_flops_cold']:.4g})",
        "",
        "  peak by matmul shape m x k x n: " + ", ".join(
            f"{k} {v / 1e9:.1f}G" for k, v in result["peak_by_shape"].items()),
    ]
    return "\n".join(rows)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m txjax.bench", description=__doc__.splitlines()[0])
    p.add_argument("--arch", choices=sorted(CONFIGS), default="gpt")
    p.add_argument("--vocab", type=at_least(1), default=17)
    p.add_argument("--seq", type=at_least(1), default=197)
    p.add_argument("--d-model", type=at_least(1), default=128)
    p.add_argument("--heads", type=at_least(1), default=4)
    p.add_argument("--layers", type=at_least(1), default=4)
    p.add_argument("--d-ff", type=at_least(1), default=512)
    p.add_argument("--batch", type=at_least(1), default=32)
    p.add_argument("--steps", type=at_least(1), default=20)
    p.add_argument("--warmup", type=at_least(0), default=3)
    p.add_argument("--burst", type=at_least(1), default=3,
                   help="peak matmul calls per shape after each step (the first, cold, is not counted)")
    p.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32",
                   help="compute dtype (config.dtype): bfloat16 is mixed precision, float32 "
                        "parameters and optimizer state as in training")
    p.add_argument("--attention", choices=ATTENTION_IMPLS, default="auto",
                   help="attention implementation (ExecutionConfig.attention_impl; cudnn: NVIDIA GPU, bfloat16; "
                        "cpu_fused: the CPU's fused kernel; auto: cpu_fused on the CPU where it builds)")
    p.add_argument("--causal-block-size", default="config",
                   help="ExecutionConfig.causal_block_size: query block length of causal attention, 'none' "
                        "for unblocked, 'config' (default) for the config's own")
    p.add_argument("--activation-impl", choices=ACTIVATION_IMPLS, default="auto",
                   help="ExecutionConfig.activation_impl: GELU's and SiLU's implementation (auto: the CPU's "
                        "kernel in bfloat16)")
    p.add_argument("--grad-forms", choices=("auto", "autodiff", "xla_cpu"), default="auto",
                   help="ExecutionConfig.grad_forms: the float32 matmul gradients' form (auto: xla_cpu on CPU)")
    p.add_argument("--decode", type=at_least(0), default=0, metavar="NEW_TOKENS",
                   help="also time cached decoding (txjax.decoding.generate) of this many new tokens")
    return p.parse_args(argv)


def config_from_args(args: argparse.Namespace) -> TransformerConfig:
    return CONFIGS[args.arch](vocab_size=args.vocab, max_len=args.seq, d_model=args.d_model,
                              num_heads=args.heads, num_layers=args.layers, d_ff=args.d_ff, dtype=args.dtype)


def execution_from_args(args: argparse.Namespace) -> ExecutionConfig:
    fields = dict(attention_impl=args.attention, grad_forms=args.grad_forms, activation_impl=args.activation_impl)
    if args.causal_block_size != "config":
        fields["causal_block_size"] = (None if args.causal_block_size.lower() == "none"
                                       else int(args.causal_block_size))
    return ExecutionConfig(**fields)


def main(argv=None, host_memory: bool | None = None) -> dict:
    """`host_memory`: what `txjax.hostmem.reuse_host_memory()` returned before JAX ran (None: not
    called), reported because it moves the CPU step time by ~20%."""
    args = parse_args(argv)
    config, execution = config_from_args(args), execution_from_args(args)
    bench = BenchConfig(batch=args.batch, seq=args.seq, steps=args.steps, warmup=args.warmup,
                        burst=args.burst)
    result = bench_train(config, bench, execution)
    result["host_memory_reused"] = host_memory
    print(format_table(config, result))
    print("  host memory: " + {True: "one malloc arena, reused from step to step (txjax.hostmem)",
                               False: "glibc's default malloc (TXJAX_MALLOC=default, an accelerator, or not glibc)",
                               None: "malloc as the caller left it (txjax.hostmem not called here)"}[host_memory])
    if args.decode:
        result.update(bench_decode(config, args.batch, args.decode))
        print(f"  cached decoding, {args.decode} new tokens x {args.batch} rows: "
              f"{result['decode_ms_per_token']:.2f} ms / step, {result['decode_tokens_per_s']:.0f} tokens / s")
    print(json.dumps({k: v for k, v in result.items() if k != "peak_by_shape"}))
    return result


def train_step_memory(config: TransformerConfig, batch: int, seq: int, dtype: str | None = None,
                      execution: ExecutionConfig | None = None) -> dict:
    """XLA's compiled memory plan of the real train step (nothing is run); `dtype`
    overrides the config's compute dtype.

    Returns bytes: arguments (parameters, optimizer state, batch), outputs, aliased
    (donated state reused for the output), temporaries (activations kept for the
    backward pass and scratch), and peak = arguments + outputs - aliased + temporaries.
    """
    from txjax.train.config import TrainConfig
    from txjax.train.steps import LOSSES, Stepper

    model = build_model(config if dtype is None else config.replace(dtype=dtype), 0, execution)
    stepper = Stepper(model, LOSSES[config.family], TrainConfig(batch_size=batch, progress=False))
    state = jax.eval_shape(stepper.init_state)
    data = jax.eval_shape(lambda: make_batch(config, batch, seq))
    key = jax.eval_shape(lambda: jax.random.key(0))
    stats = stepper.step_leaves.lower(stepper.leaves(state), data, key).compile().memory_analysis()
    out = {
        "arguments": stats.argument_size_in_bytes,
        "outputs": stats.output_size_in_bytes,
        "aliased": stats.alias_size_in_bytes,
        "temporaries": stats.temp_size_in_bytes,
    }
    out["peak"] = out["arguments"] + out["outputs"] - out["aliased"] + out["temporaries"]
    return out


if __name__ == "__main__":
    from txjax.hostmem import reuse_host_memory

    main(host_memory=reuse_host_memory())  # before JAX runs anything: see txjax/hostmem.py
