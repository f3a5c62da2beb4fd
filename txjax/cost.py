"""Analytic cost model: parameters, FLOPs, arithmetic intensity, memory.

Everything here is arithmetic on a config; nothing is built or run. The formulas
are the course notes' ("RAM Systems", "The Forward Pass of Attention Models",
"A Mental Model for GPU memory"):

- a matmul [m, k] @ [k, n] costs 2·m·k·n FLOPs;
- one attention layer over n tokens costs 8·n·D² (Q, K, V, O projections)
  + 4·n²·D (Q Kᵀ and weights·V); softmax, scaling, norms, activations, biases and
  the loss are lower order and left out (XLA counts them: tests/test_cost_xla.py);
- a training step costs 3× the forward pass (backward = 2× forward);
- arithmetic intensity AI = FLOPs / bytes moved, compared with the ridge point
  peak FLOP/s / bandwidth of the hardware (roofline);
- the KV cache holds L·B·2·D·T·s bytes; mixed-precision AdamW training holds
  2 + 2 + 4 + 4 bytes per parameter (+ 4 for an fp32 master copy).

Where the notes write D for the attention width, the code uses the inner width
N·H, which is D unless `head_dim` is set.

`python -m txjax.cost NAME` prints the table for a named config.
"""

from __future__ import annotations

import dataclasses
import math

from txjax.config import BertConfig, GPTConfig, T5Config, TransformerConfig

GiB = 2**30


@dataclasses.dataclass(frozen=True)
class Hardware:
    """Peak dense matmul throughput, memory bandwidth and memory of one accelerator."""

    name: str
    peak_flops: float  # FLOP/s, dense bf16 tensor-core (no sparsity)
    bandwidth: float  # bytes/s of main (HBM) memory
    memory_bytes: float  # capacity of main memory

    @property
    def ridge_point(self) -> float:
        """I* = peak / bandwidth, in FLOPs per byte: above it a kernel is compute-bound."""
        return self.peak_flops / self.bandwidth

    @classmethod
    def a100(cls) -> "Hardware":
        """A100 80GB SXM: 312 TFLOP/s bf16, HBM2e 2.0 TB/s (the notes' figures)."""
        return cls("A100 80GB", 312e12, 2.0e12, 80 * GiB)

    @classmethod
    def h100(cls) -> "Hardware":
        """H100 SXM: 989 TFLOP/s bf16, HBM3 3.35 TB/s, 80 GB."""
        return cls("H100 SXM", 989e12, 3.35e12, 80 * GiB)

    @classmethod
    def h200(cls) -> "Hardware":
        """H200: the H100's 989 TFLOP/s bf16 with HBM3e 4.8 TB/s, 141 GB."""
        return cls("H200", 989e12, 4.8e12, 141e9)


def hardware(name: str) -> Hardware:
    """Hardware preset by name: "a100", "h100", "h200"."""
    presets = {"a100": Hardware.a100, "h100": Hardware.h100, "h200": Hardware.h200}
    key = name.lower().replace("-", "").replace(" ", "").replace("sxm", "")
    if key not in presets:
        raise ValueError(f"unknown hardware {name!r}; expected one of {sorted(presets)}")
    return presets[key]()


# ----------------------------------------------------------------------------- parameters


def _norm_params(config: TransformerConfig) -> int:
    return 2 * config.d_model if config.norm == "layer" else config.d_model


def _attention_params(config: TransformerConfig) -> int:
    """Q, K, V: D -> N·H; O: N·H -> D; biases when `use_bias`. The notes' 4·D² when N·H = D."""
    d, inner = config.d_model, config.num_heads * config.head_size
    bias = (3 * inner + d) if config.use_bias else 0
    return 4 * d * inner + bias


def _ffn_params(config: TransformerConfig) -> int:
    d, f = config.d_model, config.d_ff
    matrices = 3 if config.gated else 2
    bias = ((2 if config.gated else 1) * f + d) if config.use_bias else 0
    return matrices * d * f + bias


def _position_params(config: TransformerConfig) -> int:
    """Per stack: a learned [max_len, D] table, or T5's [buckets, N] relative table."""
    if config.position == "learned":
        return config.max_len * config.d_model
    if config.position == "t5":
        return config.num_buckets * config.num_heads
    return 0


def param_counts(config: TransformerConfig) -> dict[str, int]:
    """Parameters per component, and "total"; equal to the model's real nnx.Param tree.

    Components: token_embedding, segment_embedding (BERT), positions (per stack),
    attention (self-attention, every layer of every stack), cross_attention (T5
    decoder), feed_forward, norms (block, final and embedding norms), head (an
    untied output projection, or BERT's MLM transform and output bias).
    """
    d, v = config.d_model, config.vocab_size
    family = config.family
    stacks = [(config.num_layers, False)]  # (layers, cross-attends)
    if family == "t5":
        stacks.append((config.decoder_layers, True))
    layers = sum(n for n, _ in stacks)
    cross_layers = sum(n for n, cross in stacks if cross)
    block_norms = sum(n * (3 if cross else 2) for n, cross in stacks)
    final_norms = len(stacks) if config.norm_position == "pre" else 0

    counts = {
        "token_embedding": v * d,
        "segment_embedding": 0,
        "positions": len(stacks) * _position_params(config),
        "attention": layers * _attention_params(config),
        "cross_attention": cross_layers * _attention_params(config),
        "feed_forward": layers * _ffn_params(config),
        "norms": (block_norms + final_norms) * _norm_params(config),
        "head": 0,
    }
    if family == "bert":
        assert isinstance(config, BertConfig)
        counts["segment_embedding"] = config.type_vocab_size * d
        if config.embedding_norm:
            counts["norms"] += _norm_params(config)
        # MLM transform: dense D -> D with bias, a norm, then the tied decoder's bias [V].
        counts["head"] = d * d + d + _norm_params(config) + v
    elif not config.tie_embeddings:
        counts["head"] = d * v
    counts["total"] = sum(counts.values())
    return counts


def param_count(config: TransformerConfig) -> int:
    """Total parameters of the model the config builds."""
    return param_counts(config)["total"]


# ----------------------------------------------------------------------------- FLOPs


def matmul_flops(m: int, k: int, n: int) -> int:
    """[m, k] @ [k, n]: m·n dot products of length k, 2·m·k·n FLOPs."""
    return 2 * m * k * n


def attention_flops(n_q: int, n_kv: int, d_model: int, inner: int | None = None) -> dict[str, int]:
    """One attention layer over one sequence: n_q queries, n_kv keys.

    Self-attention (n_q = n_kv = n, inner = D): projections 8·n·D², scores and
    weighted sum 4·n²·D — the notes' 8·n·D² + 4·n²·D. The O(n²·N) softmax is left out.
    """
    inner = d_model if inner is None else inner
    return {
        "attention_projections": matmul_flops(n_q, d_model, inner) * 2  # Q and O
        + matmul_flops(n_kv, d_model, inner) * 2,  # K and V
        "attention_scores": matmul_flops(n_q, inner, n_kv) * 2,  # Q Kᵀ and weights · V
    }


def forward_flops(
    config: TransformerConfig, batch: int, seq_len: int, dec_len: int | None = None
) -> dict[str, int]:
    """Matmul FLOPs of one forward pass over `batch` sequences, by component, and "total".

    GPT and BERT: `seq_len` tokens each. T5: `seq_len` encoder tokens and `dec_len`
    decoder tokens (default `seq_len`). Attention counts the full n² score matrix
    (the causal mask saves nothing in a dense kernel). The embedding lookup is a
    gather and does no multiply-adds, so "embeddings" is 0; the tied or untied head
    is the [n, D] @ [D, V] matmul.
    """
    d, f, v = config.d_model, config.d_ff, config.vocab_size
    inner = config.num_heads * config.head_size
    t5 = config.family == "t5"
    dec_len = seq_len if dec_len is None else dec_len
    # (layers, query length) per stack; T5's decoder also cross-attends to seq_len keys.
    stacks = [(config.num_layers, seq_len)]
    if t5:
        stacks.append((config.decoder_layers, dec_len))
    out_len = dec_len if t5 else seq_len
    ffn_matrices = 3 if config.gated else 2

    totals = dict(attention_projections=0, attention_scores=0, cross_attention=0,
                  feed_forward=0, embeddings=0, head=0)
    for layers, n in stacks:
        self_attn = attention_flops(n, n, d, inner)
        totals["attention_projections"] += layers * batch * self_attn["attention_projections"]
        totals["attention_scores"] += layers * batch * self_attn["attention_scores"]
        totals["feed_forward"] += layers * batch * ffn_matrices * matmul_flops(n, d, f)
    if t5:
        cross = attention_flops(dec_len, seq_len, d, inner)
        totals["cross_attention"] = config.decoder_layers * batch * sum(cross.values())
    totals["head"] = batch * matmul_flops(out_len, d, v)
    if config.family == "bert":
        totals["head"] += batch * matmul_flops(out_len, d, d)  # MLM transform
    totals["total"] = sum(totals.values())
    return totals


def tokens_per_step(config: TransformerConfig, batch: int, seq_len: int, dec_len: int | None = None) -> int:
    """Tokens one step processes: B·T, or B·(S + T) for T5 (both stacks' inputs)."""
    if config.family == "t5":
        return batch * (seq_len + (seq_len if dec_len is None else dec_len))
    return batch * seq_len


def train_flops(config: TransformerConfig, batch: int, seq_len: int, dec_len: int | None = None) -> int:
    """One training step: forward + backward = 3 × forward (backward does two matmuls per one)."""
    return 3 * forward_flops(config, batch, seq_len, dec_len)["total"]


def flops_per_token(config: TransformerConfig, seq_len: int, dec_len: int | None = None) -> dict[str, float]:
    """Forward and training FLOPs per token at this sequence length."""
    fwd = forward_flops(config, 1, seq_len, dec_len)["total"]
    n = tokens_per_step(config, 1, seq_len, dec_len)
    return {"forward": fwd / n, "train": 3 * fwd / n}


# ----------------------------------------------------------------------------- intensity, roofline


def linear_intensity(batch: int, seq_len: int, d_in: int, d_out: int | None = None,
                     bytes_per_element: float = 2) -> float:
    """FLOPs per byte of X[b·t, d] @ W[d, d]: 2btd² / ((2btd + d²)·s), the notes' AI_lin.

    With d_out given, W is [d_in, d_out]: 2·bt·d_in·d_out / ((bt·d_in + d_in·d_out + bt·d_out)·s).
    It tends to d/s when bt ≫ d (training) and to 2b/s when t = 1 and b ≪ d (decoding).
    """
    d_out = d_in if d_out is None else d_out
    m = batch * seq_len
    flops = 2 * m * d_in * d_out
    moved = (m * d_in + d_in * d_out + m * d_out) * bytes_per_element
    return flops / moved


def attention_intensity(batch: int, seq_len: int, d_model: int, num_heads: int,
                        bytes_per_element: float = 2) -> float:
    """FLOPs per byte of softmax(QKᵀ)V with the score matrix in main memory.

    FLOPs 4·b·t²·d; bytes (4·b·t·d + 2·b·a·t²)·s (read Q, K, V, write O; write and
    read S), so AI = 2td / (s·(2d + a·t)) → 2d / (s·a) when t ≫ 2d/a: memory-bound.
    """
    b, t, d, a, s = batch, seq_len, d_model, num_heads, bytes_per_element
    return (4 * b * t * t * d) / ((4 * b * t * d + 2 * b * a * t * t) * s)


def roofline(intensity: float, hw: Hardware) -> dict[str, float | str]:
    """Attainable FLOP/s = min(peak, AI · bandwidth), and which roof limits it."""
    attainable = min(hw.peak_flops, intensity * hw.bandwidth)
    bound = "compute-bound" if intensity >= hw.ridge_point else "memory-bound"
    return {"intensity": intensity, "ridge_point": hw.ridge_point,
            "attainable_flops": attainable, "bound": bound}


# ----------------------------------------------------------------------------- memory


def kv_cache_bytes(num_layers: int, batch: int, d_model: int, seq_len: int,
                   bytes_per_element: float = 2) -> float:
    """L·B·(2·D·T)·s: K and V of every layer for `batch` sequences of `seq_len` tokens."""
    return num_layers * batch * 2 * d_model * seq_len * bytes_per_element


def config_kv_cache_bytes(config: TransformerConfig, batch: int, seq_len: int,
                          bytes_per_element: float = 2) -> float:
    """KV cache of a config's decoder self-attention (width N·H per layer)."""
    layers = config.decoder_layers if config.family == "t5" else config.num_layers
    inner = config.num_heads * config.head_size
    return kv_cache_bytes(layers, batch, inner, seq_len, bytes_per_element)


def training_bytes_per_param(master_copy: bool = False) -> int:
    """Mixed-precision AdamW: 2 (bf16 weight) + 2 (grad) + 4 (m) + 4 (v) = 12, +4 master copy."""
    return 2 + 2 + 4 + 4 + (4 if master_copy else 0)


def training_state_bytes(num_params: int, master_copy: bool = False) -> int:
    """Weights, gradients and AdamW moments, without activations."""
    return num_params * training_bytes_per_param(master_copy)


def max_batch(memory_bytes: float, bytes_per_sequence: float, fixed_bytes: float = 0) -> int:
    """Largest B with fixed + B·per_sequence <= memory (0 if not even one fits)."""
    if bytes_per_sequence <= 0:
        raise ValueError(f"bytes_per_sequence must be positive, got {bytes_per_sequence}")
    return max(0, math.floor((memory_bytes - fixed_bytes) / bytes_per_sequence))


def activation_bytes(config: TransformerConfig, batch: int, seq_len: int,
                     bytes_per_element: float = 4, score_copies: int = 2) -> dict[str, float]:
    """Activations a training step keeps for the backward pass (one stack: GPT, BERT).

    Per layer and token, the tensors autodiff saves: the block input and both norm
    outputs, Q, K, V, the attention output and the FFN hidden before and after the
    activation: (7·D + 2·F)·s bytes (3·F gated). Per layer and sequence,
    `score_copies` [N, T, T] tensors (the reference attention keeps its exponentials
    and the softmax weights), plus two more [N, T, T] for the backward of the layer
    being differentiated (dP and dS). Then the logits and their softmax [T, V].
    The T² terms are what make memory grow quadratically with sequence length.
    """
    d, f, v, n = config.d_model, config.d_ff, config.vocab_size, config.num_heads
    s, layers = bytes_per_element, config.num_layers
    per_token = (7 * d + (3 if config.gated else 2) * f) * s
    linear = layers * batch * seq_len * per_token
    score = batch * n * seq_len**2 * s  # one [B, N, T, T] tensor
    quadratic = (layers * score_copies + 2) * score
    logits = 2 * batch * seq_len * v * s
    return {"linear": linear, "quadratic": quadratic, "logits": logits,
            "total": linear + quadratic + logits}


def train_step_bytes(config: TransformerConfig, batch: int, seq_len: int, bytes_per_element: float = 4,
                     score_copies: int = 2) -> dict[str, float]:
    """Predicted peak memory of an AdamW train step: state + gradients + activations.

    Weights and gradients in `bytes_per_element`, AdamW's m and v in float32, and
    `activation_bytes`. Compare with XLA's plan: experiments/memory_vs_length.py.
    """
    p = param_count(config)
    out = {
        "weights": p * bytes_per_element,
        "gradients": p * bytes_per_element,
        "optimizer": 2 * p * 4,
        "activations": activation_bytes(config, batch, seq_len, bytes_per_element, score_copies)["total"],
    }
    out["total"] = sum(out.values())
    return out


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
              f"  KV cache L*B*2*D*T*s per sequence (T {t})  {_fmt_bytes(kv)}",
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

    parser = argparse.ArgumentParser(prog="python -m txjax.cost", description=__doc__.splitlines()[0])
    parser.add_argument("config", nargs="?", default="gpt2-small",
                        help="gpt2-small | bert-base | t5-small | 7b (the notes' L 32, D 4096 example)")
    parser.add_argument("--seq", type=int, default=None, help="sequence length (default: max_len)")
    parser.add_argument("--batch", type=int, default=8, help="batch for the intensity rows")
    parser.add_argument("--hardware", default="a100", help="a100 | h100 | h200")
    parser.add_argument("--bytes", type=float, default=2, help="bytes per element (2: bf16)")
    args = parser.parse_args(argv)
    print(report(named_config(args.config), args.config, args.seq, args.batch,
                 hardware(args.hardware), args.bytes))


if __name__ == "__main__":
    main()
