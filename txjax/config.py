"""Frozen configurations: what a model computes (one per family, with presets), and how it runs.

Every family shares the fields of `TransformerConfig`; the subclasses only change
defaults and add what is theirs (segments for BERT, a decoder depth and special ids
for T5). `ExecutionConfig` holds how the same computation is carried out (attention
kernel, causal query blocks, remat, gradient forms): a checkpoint records the model
config, and a resumed run may change its execution. A config is validated when it is
made, so a bad value fails here and not deep inside XLA.
"""

from __future__ import annotations

import dataclasses
import math
from typing import ClassVar

import jax.numpy as jnp

from txjax.ops import cpu_kernels
from txjax.ops.activations import ACTIVATIONS
from txjax.ops.attention import IMPLEMENTATIONS
from txjax.ops.positions import KERPLE_VARIANTS, ROPE_SCALINGS

POSITIONS = ("learned", "sinusoidal", "rope", "t5", "alibi", "none", "fire", "kerple", "xpos")
ABSOLUTE_POSITIONS = ("learned", "sinusoidal")  # a vector per position added to the input; the rest act in attention
KERPLE_POSITIVE = ("softplus", "clamp")  # how KERPLE's r1, r2 stay positive
DIRECTIONAL_POSITIONS = ("alibi", "fire", "kerple")  # biases of |i - j| that directional_bias can split by the key's side
ROTARY_POSITIONS = ("rope", "xpos")  # rotate queries and keys; the rope_scaling fields apply
CAUSAL_ONLY_POSITIONS = ("xpos",)  # defined for causal attention only: refused where a stack is bidirectional
RANDOM_POSITION_FORMS = {  # TransformerConfig.random_positions_form: (the positions it applies to, what it draws)
    "positions": (POSITIONS, "a sorted random subset of positions per row"),
    "distances": (("alibi", "t5", "kerple"), "a random distance per offset, drawn once for the stack"),
    "layer_distances": (("alibi", "t5", "kerple"),
                        "a random distance per offset, drawn per attention layer, as Ruoss et al.'s code's ALiBi"),
    "layers": (tuple(p for p in POSITIONS if p not in (*ABSOLUTE_POSITIONS, "none")),
               "positions drawn inside attention, per layer, as Ruoss et al.'s code's RoPE"),
}
NORMS = ("layer", "rms")
NORM_POSITIONS = ("pre", "post")
DTYPES = ("float32", "bfloat16")
INITS = ("normal", "t5")  # TransformerConfig.init: see txjax.nn.layers.kernel_init
GRAD_FORMS = ("auto", "autodiff", "xla_cpu")
ATTENTION_IMPLS = ("auto", *IMPLEMENTATIONS)
NORM_IMPLS = ("auto", "reference", "cpu_fused")
ACTIVATION_IMPLS = NORM_IMPLS
BERT_HEADS = ("mlm", "pooler", "none")  # BertConfig.head: what sits on the encoder


def _is_int(value) -> bool:
    """An int that is not a bool (True would pass as 1)."""
    return isinstance(value, int) and not isinstance(value, bool)


def _finite_above(value, low: float) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > low


def check_vocab_id(config, name: str, value: int | None) -> None:
    """ValueError unless `value` (a special token id; None allowed) is in [0, vocab_size)."""
    if value is not None and not (_is_int(value) and 0 <= value < config.vocab_size):
        raise ValueError(f"{type(config).__name__}: {name}={value!r} is outside the vocabulary "
                         f"[0, {config.vocab_size})")


@dataclasses.dataclass(frozen=True)
class ExecutionConfig:
    """How a model runs: none of these change what it computes, only the order of float sums."""

    attention_impl: str = "auto"  # "reference" (txjax.ops), "xla" or "cudnn" (jax.nn.dot_product_attention; cudnn: NVIDIA GPU only), "cpu_fused" (txjax.ops.cpu_attention), or "auto": cpu_fused on the CPU where its kernel builds (txjax.ops.cpu_kernels), else reference
    causal_block_size: int | None = 64  # causal self-attention in query blocks of ~this size that skip the masked keys above the diagonal; None: one block (cudnn: never blocked, its kernel skips them itself)
    remat: bool = False  # recompute each block's activations in the backward pass (gradient checkpointing)
    grad_forms: str = "auto"  # float32 and bfloat16 matmuls: "xla_cpu" (txjax.ops.xla_cpu, the forms fast on XLA:CPU), "autodiff" (the plain ops), or "auto": xla_cpu when JAX's default backend is the CPU
    norm_impl: str = "auto"  # layer and RMS norms: "reference" (txjax.ops), "cpu_fused" (txjax.ops.cpu_norm), or "auto": cpu_fused on the CPU where its kernel builds, else reference
    activation_impl: str = "auto"  # GELU and SiLU: "reference" (txjax.ops.activations), "cpu_fused" (txjax.ops.cpu_activation), or "auto": cpu_fused for bfloat16 on the CPU where its kernel builds (in float32 XLA fuses the activation with the bias add, which is faster), else reference

    def __post_init__(self):
        for name, allowed in (("attention_impl", ATTENTION_IMPLS), ("grad_forms", GRAD_FORMS),
                              ("norm_impl", NORM_IMPLS), ("activation_impl", ACTIVATION_IMPLS)):
            if getattr(self, name) not in allowed:
                raise ValueError(f"ExecutionConfig.{name}={getattr(self, name)!r} is not one of {allowed}")
        if self.causal_block_size is not None and (not _is_int(self.causal_block_size) or self.causal_block_size < 1):
            raise ValueError(f"causal_block_size must be a positive int or None, got {self.causal_block_size!r}")

    @staticmethod
    def _resolve(impl: str, backend: str) -> str:
        """`impl` with "auto" resolved: the CPU kernel on the CPU where it builds, else reference."""
        if impl != "auto":
            return impl
        return "cpu_fused" if backend == "cpu" and cpu_kernels.available() else "reference"

    def attention(self, backend: str) -> str:
        """The attention implementation on `backend` (jax.default_backend()), "auto" resolved."""
        return self._resolve(self.attention_impl, backend)

    def norm(self, backend: str) -> str:
        """The norms' implementation on `backend` (jax.default_backend()), "auto" resolved."""
        return self._resolve(self.norm_impl, backend)

    def activation(self, backend: str, dtype) -> str:
        """The activations' implementation on `backend` (jax.default_backend()) for a model computing
        in `dtype`, "auto" resolved."""
        if self.activation_impl == "auto" and jnp.dtype(dtype) != jnp.bfloat16:
            return "reference"
        return self._resolve(self.activation_impl, backend)

    def xla_cpu_grads(self, backend: str) -> bool:
        """Whether to use txjax.ops.xla_cpu's forms on `backend` (jax.default_backend())."""
        return self.grad_forms == "xla_cpu" or (self.grad_forms == "auto" and backend == "cpu")

    def replace(self, **changes) -> "ExecutionConfig":
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class TransformerConfig:
    """Fields common to BERT, GPT and T5."""

    vocab_size: int = 256  # V: number of token ids
    max_len: int = 256  # longest sequence; the size of a learned position table
    d_model: int = 128  # D: residual stream width
    num_heads: int = 4  # N
    num_layers: int = 4  # blocks per stack (T5: encoder, and decoder unless num_decoder_layers)
    d_ff: int = 512  # F: feed-forward hidden width
    head_dim: int | None = None  # H; None means d_model // num_heads
    position: str = "learned"  # one of POSITIONS
    norm: str = "layer"  # "layer" (mean, variance, bias) or "rms"
    norm_position: str = "pre"  # "pre": read normalised; "post": write normalised
    norm_eps: float = 1e-5
    activation: str = "gelu"  # gelu (exact), gelu_tanh, relu, silu
    gated: bool = False  # gated feed-forward (GEGLU / SwiGLU): act(x W0) * (x W1)
    use_bias: bool = True  # biases in attention and feed-forward projections
    tie_embeddings: bool = True  # output head shares the token embedding
    dropout: float = 0.0  # on embeddings and on each residual branch
    attention_scale: float | None = None  # None: 1/sqrt(H); T5 checkpoints use 1.0
    rope_base: float = 10000.0
    num_buckets: int = 32  # T5 relative-position buckets
    max_distance: int = 128  # T5: offsets beyond this share the last bucket (must exceed num_buckets // 2)
    scale_embeddings: bool = False  # multiply token embeddings by sqrt(d_model) before positions are added, as Vaswani et al. do (with sinusoidal positions of unit scale)
    position_init_std: float = 0.02  # learned: std of the table's normal init (Ruoss et al.'s code: hk.Embed's default, 1.0)
    random_positions: int | None = None  # Ruoss et al. 2023: while training, each sequence's positions are a sorted random subset of [0, random_positions) instead of 0..T-1; None: off
    random_positions_eval: bool = False  # draw random positions in evaluation too (the paper's code does); False: 0..T-1 there
    random_positions_per_batch: bool = False  # one random draw shared by every row of a batch (Ruoss et al.'s code); False: each row draws its own
    random_positions_form: str = "positions"  # "positions": each token's position is drawn; "distances" (ALiBi, T5's bias and KERPLE, functions of the offset alone): positions stay 0..T-1 and each offset 1, 2, ... gets a sorted random distance from [1, random_positions), once per stack, the same for every query; "layer_distances": the same, drawn per attention layer (Ruoss et al.'s code's random ALiBi); "layers" (encodings that act in attention; Ruoss et al.'s code's RoPE): each attention layer draws its own positions, no packed documents
    pad_id: int | None = None  # keys equal to pad_id are masked; None: no padding mask
    dtype: str = "float32"  # compute dtype of matmuls and activations; parameters, softmax, norms and logits stay float32
    fire_mlp_width: int = 32  # FIRE: hidden width of the MLP 1 -> W -> N heads; 0: f is linear, 1 -> N (one weight and bias per head)
    fire_threshold: float = 512.0  # FIRE: initial threshold L of the normaliser psi(max(L, i)); learned as a multiple of this
    fire_learn_threshold: bool = True  # FIRE: learn L (the paper's code); False: L stays fire_threshold
    fire_c: float = 0.1  # FIRE: initial scale c of psi(x) = log(c x + 1) (the paper's code)
    fire_learn_c: bool = True  # FIRE: learn c (the paper's code); False: c stays fire_c
    kerple_variant: str = "log"  # KERPLE: "log" -r1 log(1 + r2 |i-j|) or "power" -r1 |i-j|^r2
    kerple_positive: str = "softplus"  # KERPLE keeps r1, r2 > 0 by "softplus" of a raw parameter, or "clamp": the parameter itself, kept >= 0.01 (the power variant's r2 also <= 2) as the reference code does: clamped where used and after each optimizer step
    kerple_learn_r2: bool = True  # KERPLE: learn r2 (the paper's); False: r2 stays its initial draw, a parameter with no gradient (a control: a bias of fixed shape whose scale r1 learns)
    kerple_r2_init_scale: float = 1.0  # KERPLE: r2's initial draw (the reference code's) multiplied by this; the power variant's must stay below 2, so at most 1
    directional_bias: bool = False  # ALiBi / FIRE / KERPLE in bidirectional stacks: False: one function of |i - j| both ways; True: keys before and after the query differ, as T5's buckets do (ALiBi: slope / 2 more before it, Ruoss et al.'s code; FIRE: the MLP reads the signed input; KERPLE: a second r1, r2 per head for keys after it); causal stacks are unchanged
    rope_scaling: str | None = None  # rope / xpos at inference on longer contexts: "linear" (positions / factor), "ntk" (base * factor^(H/(H-2))) or "yarn" (per-frequency ramp and attention temperature); None: plain
    rope_scaling_factor: float = 1.0  # s >= 1: how many times the context is stretched; 1 is plain rope
    rope_original_max_len: int | None = None  # YaRN: the context the model was trained on; None: max_len
    xpos_scale_base: float = 512.0  # xpos: gamma of the decay zeta^((n - m) / gamma)
    num_kv_heads: int | None = None  # K key/value heads, each shared by num_heads // K query heads (grouped-query attention; 1: multi-query); must divide num_heads; None: num_heads
    attention_window: int | None = None  # W: sliding-window self-attention; causal: query q sees keys q - W < k <= q (the last W, itself included); bidirectional: |q - k| <= W; None: full
    init: str = "normal"  # "normal": every weight N(0, 0.02^2) (GPT-2, BERT); "t5": token embeddings N(0, 1), dense kernels N(0, 1/fan_in) (Mesh TensorFlow / t5x)

    family: ClassVar[str] = "transformer"
    bidirectional_stack: ClassVar[bool] = False  # True where some stack attends both ways (BERT, T5's encoder)

    def __post_init__(self):
        for name in ("vocab_size", "max_len", "d_model", "num_heads", "num_layers", "d_ff"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{type(self).__name__}.{name} must be a positive int, got {value!r}")
        for name, allowed in (
            ("position", POSITIONS),
            ("norm", NORMS),
            ("norm_position", NORM_POSITIONS),
            ("activation", tuple(ACTIVATIONS)),
            ("dtype", DTYPES),
            ("init", INITS),
        ):
            if getattr(self, name) not in allowed:
                raise ValueError(
                    f"{type(self).__name__}.{name}={getattr(self, name)!r} is not one of {allowed}"
                )
        if self.head_dim is not None and (not _is_int(self.head_dim) or self.head_dim < 1):
            raise ValueError(f"{type(self).__name__}.head_dim must be a positive int or None, got {self.head_dim!r}")
        for name, low, rule in (("norm_eps", 0.0, "> 0"), ("rope_base", 1.0, "> 1")):
            if not _finite_above(getattr(self, name), low):
                raise ValueError(
                    f"{type(self).__name__}.{name} must be a finite number {rule}, got {getattr(self, name)!r}")
        if self.attention_scale is not None and not _finite_above(self.attention_scale, 0.0):
            raise ValueError(f"{type(self).__name__}.attention_scale must be a finite number > 0 or None, "
                             f"got {self.attention_scale!r}")
        if self.head_dim is None and self.d_model % self.num_heads:
            raise ValueError(
                f"d_model={self.d_model} is not divisible by num_heads={self.num_heads}; "
                "set head_dim explicitly"
            )
        if (not _is_int(self.num_buckets) or self.num_buckets < 4 or not _is_int(self.max_distance)
                or self.max_distance <= self.num_buckets // 2):
            # T5's buckets: half exact, half logarithmic up to max_distance, whose log(max_distance / max_exact)
            # must be positive (max_exact is num_buckets // 2, or // 4 per direction when bidirectional).
            raise ValueError(f"num_buckets={self.num_buckets!r} must be an int >= 4 and "
                             f"max_distance={self.max_distance!r} "
                             f"> num_buckets // 2 = {self.num_buckets // 2}")
        if self.random_positions_form not in RANDOM_POSITION_FORMS:
            raise ValueError(f"random_positions_form={self.random_positions_form!r} is not one of "
                             f"{tuple(RANDOM_POSITION_FORMS)}")
        if not isinstance(self.random_positions_per_batch, bool):
            raise ValueError(f"random_positions_per_batch must be a bool, got {self.random_positions_per_batch!r}")
        if self.random_positions is not None:
            if not isinstance(self.random_positions, int) or self.random_positions < 1:
                raise ValueError(f"random_positions must be a positive int or None, got {self.random_positions!r}")
            applies, draws = RANDOM_POSITION_FORMS[self.random_positions_form]
            if self.position not in applies:
                raise ValueError(f"random_positions_form={self.random_positions_form!r} ({draws}) is for "
                                 f"position in {applies}, got position={self.position!r}")
            if self.position == "learned" and self.random_positions > self.max_len:
                raise ValueError(f"random_positions={self.random_positions} needs a learned table of as many rows, "
                                 f"but max_len={self.max_len}")
        if self.position in ROTARY_POSITIONS and self.head_size % 2:
            raise ValueError(f"{self.position} needs an even head width, got {self.head_size}")
        if self.position == "sinusoidal" and self.d_model % 2:
            raise ValueError(f"sinusoidal positions need an even d_model, got {self.d_model}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout}")
        check_vocab_id(self, "pad_id", self.pad_id)
        if not isinstance(self.fire_mlp_width, int) or self.fire_mlp_width < 0:
            raise ValueError(f"fire_mlp_width must be an int >= 0 (0: f linear), got {self.fire_mlp_width!r}")
        if not self.fire_threshold > 0:
            raise ValueError(f"fire_threshold must be positive, got {self.fire_threshold!r}")
        if not self.fire_c > 0:
            raise ValueError(f"fire_c must be positive, got {self.fire_c!r}")
        if not self.position_init_std > 0:
            raise ValueError(f"position_init_std must be positive, got {self.position_init_std!r}")
        if self.kerple_variant not in KERPLE_VARIANTS:
            raise ValueError(f"kerple_variant={self.kerple_variant!r} is not one of {KERPLE_VARIANTS}")
        if self.kerple_positive not in KERPLE_POSITIVE:
            raise ValueError(f"kerple_positive={self.kerple_positive!r} is not one of {KERPLE_POSITIVE}")
        if not 0 < self.kerple_r2_init_scale <= (1.0 if self.kerple_variant == "power" else float("inf")):
            raise ValueError(f"kerple_r2_init_scale must be positive (at most 1 for the power variant), "
                             f"got {self.kerple_r2_init_scale!r}")
        if self.directional_bias and (self.position not in DIRECTIONAL_POSITIONS or not self.bidirectional_stack):
            raise ValueError(f"{type(self).__name__}: directional_bias is for {DIRECTIONAL_POSITIONS} in a "
                             f"bidirectional stack (BERT, T5's encoder), got position={self.position!r}")
        if self.bidirectional_stack and self.position in CAUSAL_ONLY_POSITIONS:
            raise ValueError(f"{type(self).__name__}: position={self.position!r} is defined for causal attention "
                             f"only, and {self.family} has a bidirectional stack; use one of {positions_for(self.family)}")
        if self.rope_scaling is not None and self.rope_scaling not in ROPE_SCALINGS:
            raise ValueError(f"rope_scaling={self.rope_scaling!r} is not one of {ROPE_SCALINGS} or None")
        if self.rope_scaling is not None and self.position not in ROTARY_POSITIONS:
            raise ValueError(f"rope_scaling needs a rotary position {ROTARY_POSITIONS}, got position={self.position!r}")
        if not self.rope_scaling_factor >= 1.0:
            raise ValueError(f"rope_scaling_factor must be >= 1, got {self.rope_scaling_factor}")
        if self.rope_original_max_len is not None and self.rope_original_max_len < 1:
            raise ValueError(f"rope_original_max_len must be a positive int or None, got {self.rope_original_max_len}")
        if self.xpos_scale_base <= 0:
            raise ValueError(f"xpos_scale_base must be positive, got {self.xpos_scale_base}")
        if self.num_kv_heads is not None and (
                not isinstance(self.num_kv_heads, int) or self.num_kv_heads < 1 or self.num_heads % self.num_kv_heads):
            raise ValueError(f"num_kv_heads={self.num_kv_heads!r} must be a positive int dividing "
                             f"num_heads={self.num_heads}, or None")
        if self.attention_window is not None and (
                not isinstance(self.attention_window, int) or self.attention_window < 1):
            raise ValueError(f"attention_window must be a positive int or None, got {self.attention_window!r}")

    @property
    def head_size(self) -> int:
        """H: the head width actually used."""
        return self.head_dim if self.head_dim is not None else self.d_model // self.num_heads

    @property
    def kv_heads(self) -> int:
        """K: the key/value heads actually used (num_heads unless grouped-query)."""
        return self.num_heads if self.num_kv_heads is None else self.num_kv_heads

    def replace(self, **changes) -> "TransformerConfig":
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict:
        return {"family": self.family, **dataclasses.asdict(self)}


@dataclasses.dataclass(frozen=True)
class GPTConfig(TransformerConfig):
    """Decoder-only: causal self-attention, pre-norm, a final norm, a tied head."""

    family: ClassVar[str] = "gpt"

    @classmethod
    def gpt2_small(cls, **changes) -> "GPTConfig":
        """GPT-2 small (124M): 12 layers, D 768, 12 heads, learned positions, tanh GELU."""
        return cls(**{**dict(
            vocab_size=50257, max_len=1024, d_model=768, num_heads=12, num_layers=12,
            d_ff=3072, position="learned", activation="gelu_tanh",
        ), **changes})


@dataclasses.dataclass(frozen=True)
class BertConfig(TransformerConfig):
    """Encoder-only: bidirectional attention with padding mask, post-norm, an MLM head (or none, or a pooler)."""

    norm_position: str = "post"
    norm_eps: float = 1e-12
    pad_id: int | None = 0  # [PAD]
    type_vocab_size: int = 2  # segment ids 0 .. type_vocab_size - 1
    embedding_norm: bool = True  # LayerNorm on the summed embeddings, as BERT does
    head: str = "mlm"  # on the encoder: "mlm" (the model returns MLM logits), "pooler" or "none" (it returns hidden states h_BTD; "pooler" adds Bert.pooled(h_BTD) = tanh(dense(h[:, 0])), as HF BertModel)

    family: ClassVar[str] = "bert"
    bidirectional_stack: ClassVar[bool] = True

    def __post_init__(self):
        super().__post_init__()
        if not _is_int(self.type_vocab_size) or self.type_vocab_size < 1:
            raise ValueError(f"BertConfig.type_vocab_size must be a positive int, got {self.type_vocab_size!r}")
        if self.head not in BERT_HEADS:
            raise ValueError(f"BertConfig.head={self.head!r} is not one of {BERT_HEADS}")

    @classmethod
    def bert_base(cls, **changes) -> "BertConfig":
        """bert-base-uncased: 12 layers, D 768, 12 heads, vocab 30522, 512 positions."""
        return cls(**{**dict(
            vocab_size=30522, max_len=512, d_model=768, num_heads=12, num_layers=12,
            d_ff=3072, position="learned",
        ), **changes})


@dataclasses.dataclass(frozen=True)
class T5Config(TransformerConfig):
    """Encoder-decoder: relative bias, RMS pre-norm, no biases; decoder cross-attends."""

    position: str = "t5"
    norm: str = "rms"
    norm_eps: float = 1e-6
    activation: str = "relu"
    use_bias: bool = False
    pad_id: int | None = 0  # <pad>; masks encoder keys only
    num_decoder_layers: int | None = None  # None: same as num_layers
    decoder_start_id: int = 0  # T5 starts decoding from <pad>
    eos_id: int = 1  # </s>
    init: str = "t5"  # T5's own: with 0.02 embeddings the decoder learns to read the encoder far later (BUILD.md, "CPU presets")

    family: ClassVar[str] = "t5"
    bidirectional_stack: ClassVar[bool] = True

    def __post_init__(self):
        super().__post_init__()
        check_vocab_id(self, "eos_id", self.eos_id)
        check_vocab_id(self, "decoder_start_id", self.decoder_start_id)
        layers = self.num_decoder_layers
        if layers is not None and (not _is_int(layers) or layers < 1):
            raise ValueError(f"T5Config.num_decoder_layers must be a positive int or None, got {layers!r}")

    @property
    def decoder_layers(self) -> int:
        return self.num_layers if self.num_decoder_layers is None else self.num_decoder_layers

    @classmethod
    def t5_small(cls, **changes) -> "T5Config":
        """t5-small (v1.0, 60.5M): 6 + 6 layers, D 512, 8 heads, F 2048, ReLU, tied head."""
        return cls(**{**dict(
            vocab_size=32128, max_len=512, d_model=512, num_heads=8, num_layers=6,
            d_ff=2048, attention_scale=1.0,
        ), **changes})


EXECUTION_FIELDS = tuple(f.name for f in dataclasses.fields(ExecutionConfig))


CONFIGS = {cls.family: cls for cls in (GPTConfig, BertConfig, T5Config)}
"""config.family -> config class, the one registry of configs (models: txjax.models.MODELS)."""


def positions_for(family: str) -> tuple[str, ...]:
    """The POSITIONS a family accepts: all of them, less the causal-only ones where a stack is bidirectional."""
    if CONFIGS[family].bidirectional_stack:
        return tuple(p for p in POSITIONS if p not in CAUSAL_ONLY_POSITIONS)
    return POSITIONS


def config_from_dict(d: dict) -> TransformerConfig:
    """Inverse of `to_dict`. Execution fields, which run folders written before they had their
    own config kept in the model's, are dropped: they never changed what a model computes."""
    d = {k: v for k, v in d.items() if k not in EXECUTION_FIELDS}
    family = d.pop("family")
    if family not in CONFIGS:
        raise ValueError(f"unknown model family {family!r}; expected one of {sorted(CONFIGS)}")
    return CONFIGS[family](**d)
