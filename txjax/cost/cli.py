"""`python -m txjax.cost`: named configs, the `report` table and its command line `main`."""

from __future__ import annotations

from txjax.argtypes import at_least, positive
from txjax.config import BertConfig, GPTConfig, T5Config, TransformerConfig
from txjax.cost.counts import flops_per_token, forward_flops, param_counts
from txjax.cost.intensity import (
    GiB,
    Hardware,
    attention_intensity,
    hardware,
    linear_intensity,
    roofline,
)
from txjax.cost.memory import (
    config_kv_cache_bytes,
    max_batch,
    training_bytes_per_param,
    training_state_bytes,
)

DESCRIPTION = "Analytic cost model: parameters, FLOPs, arithmetic intensity, memory."
"""First line of `txjax.cost`'s docstring: the `--help` description."""

# ----------------------------------------------------------------------------- named configs


def llama_7b() -> GPTConfig:
    """The notes' 7B example (L = 32, D = 4096): Llama-7B's shape, 6.74B parameters."""
    return GPTConfig(
        vocab_size=32000, max_len=4096, d_model=4096, num_heads=32, num_layers=32, d_ff=11008,
        position="rope", norm="rms", norm_eps=1e-6, activation="silu", gated=True,
        use_bias=False, tie_embeddings=False,
    )


def named_config(name: str) -> TransformerConfig:
    """gpt2-small, bert-base, t5-small, 7b (the notes' example)."""
    configs = {
        "gpt2-small": GPTConfig.gpt2_small,
        "bert-base": BertConfig.bert_base,
        "t5-small": T5Config.t5_small,
        "7b": llama_7b,
    }
    key = name.lower().replace("_", "-")
    if key not in configs:
        raise ValueError(f"unknown config {name!r}; expected one of {sorted(configs)}")
    return configs[key]()


# ----------------------------------------------------------------------------- report


def _fmt_bytes(x: float) -> str:
    if x < GiB:
        return f"{x / 2**20:,.1f} MiB"
    return f"{x / GiB:,.2f} GiB ({x / 1e9:,.1f} GB)"


def report(config: TransformerConfig, name: str = "", seq_len: int | None = None, batch: int = 8,
           hw: Hardware | None = None, bytes_per_element: float = 2) -> str:
    """The cost table of one config as text: parameters, FLOPs, intensity, memory."""
    hw = Hardware.a100() if hw is None else hw
    t = config.max_len if seq_len is None else seq_len
    s = bytes_per_element
    inner = config.num_heads * config.head_size
    lines = [f"{name or config.family}: V {config.vocab_size}, D {config.d_model}, N {config.num_heads}, "
             f"H {config.head_size}, L {config.num_layers}, F {config.d_ff}, position {config.position}, "
             f"norm {config.norm}, gated {config.gated}, tied {config.tie_embeddings}", "",
             "parameters"]
    counts = param_counts(config)
    for key, value in counts.items():
        if value or key == "total":
            lines.append(f"  {key:<24}{value:>16,}  {100 * value / counts['total']:6.2f}%")

    fwd = forward_flops(config, 1, t)
    lines += ["", f"forward FLOPs per sequence of T = {t} (2mnk per matmul; train = 3x)"]
    for key, value in fwd.items():
        if value or key in ("embeddings", "total"):
            lines.append(f"  {key:<24}{value:>16.4g}  {100 * value / fwd['total']:6.2f}%")
    per_tok = flops_per_token(config, t)
    lines += [f"  per token: forward {per_tok['forward']:.4g}, train {per_tok['train']:.4g} "
              f"(6N rule: {6 * counts['total']:.4g})"]

    lines += ["", f"arithmetic intensity (s = {s:g} bytes) on {hw.name}: peak {hw.peak_flops / 1e12:g} TFLOP/s, "
                  f"{hw.bandwidth / 1e12:g} TB/s, ridge point I* = {hw.ridge_point:.0f} FLOP/B"]
    cases = [
        (f"linear D->D, training B {batch} T {t}", linear_intensity(batch, t, config.d_model, None, s)),
        (f"linear D->D, decoding B {batch} T 1", linear_intensity(batch, 1, config.d_model, None, s)),
        (f"linear D->F, training B {batch} T {t}", linear_intensity(batch, t, config.d_model, config.d_ff, s)),
        (f"attention, B {batch} T {t}", attention_intensity(batch, t, inner, config.num_heads, s)),
    ]
    for label, ai in cases:
        r = roofline(ai, hw)
        lines.append(f"  {label:<36}AI {ai:8.1f}  {r['bound']:<14} "
                     f"attainable {r['attainable_flops'] / 1e12:6.1f} TFLOP/s")

    kv = config_kv_cache_bytes(config, 1, t, s)
    weights = counts["total"] * s
    lines += ["", "memory",
              f"  KV cache L*B*2*(K*H)*T*s per sequence (T {t}, K {config.kv_heads})  {_fmt_bytes(kv)}",
              f"  max batch on {hw.name} ({_fmt_bytes(hw.memory_bytes)}): "
              f"{max_batch(hw.memory_bytes, kv)} with the cache alone, "
              f"{max_batch(hw.memory_bytes, kv, weights)} beside the weights ({_fmt_bytes(weights)})",
              f"  training state, {training_bytes_per_param()} B/param (2+2+4+4)   "
              f"{_fmt_bytes(training_state_bytes(counts['total']))}",
              f"  with an fp32 master copy, {training_bytes_per_param(True)} B/param  "
              f"{_fmt_bytes(training_state_bytes(counts['total'], True))}"]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m txjax.cost", description=DESCRIPTION)
    parser.add_argument("config", nargs="?", default="gpt2-small",
                        help="gpt2-small | bert-base | t5-small | 7b (the notes' L 32, D 4096 example)")
    parser.add_argument("--seq", type=at_least(1), default=None, help="sequence length (default: max_len)")
    parser.add_argument("--batch", type=at_least(1), default=8, help="batch for the intensity rows")
    parser.add_argument("--hardware", default="a100", help="a100 | h100 | h200")
    parser.add_argument("--bytes", type=positive(float), default=2, help="bytes per element (2: bf16)")
    args = parser.parse_args(argv)
    print(report(named_config(args.config), args.config, args.seq, args.batch,
                 hardware(args.hardware), args.bytes))
