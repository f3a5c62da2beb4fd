"""Tensor names and layouts: Hugging Face checkpoint <-> txjax parameters.

Each family is one list of `Entry`s, read in both directions, so loading and
saving cannot drift apart. What differs between the two layouts:

- torch `nn.Linear` keeps weight [out, in]; nnx.Linear keeps kernel [in, out]
  (layout "linear": transposed). GPT-2's `Conv1D` already keeps [in, out] ("copy").
- GPT-2 fuses q, k, v into one `c_attn` of width 3D: `part=(i, 3)` is the i-th
  third of its last axis.
- T5 holds each stack's relative bias [buckets, N] in its first layer's
  self-attention; txjax holds it once per stack and shares it across layers, as
  T5 does.
- Tied tensors (BERT's MLM decoder, T5's per-stack embed_tokens, a tied lm_head)
  are checked equal to the embedding and then dropped.
"""

from __future__ import annotations

import dataclasses
import re
import warnings

import numpy as np

from txjax.config import BertConfig, GPTConfig, T5Config, TransformerConfig
from txjax.hf._config import t5_scales_tied_head
from txjax.hf._files import CheckpointError

Path = tuple  # a txjax parameter path, e.g. ("decoder", "blocks", 0, "self_attn", "q", "kernel")



@dataclasses.dataclass(frozen=True)
class Entry:
    path: Path  # txjax parameter
    key: str  # Hugging Face tensor name
    layout: str = "copy"  # "copy", or "linear": torch [out, in] <-> kernel [in, out]
    part: tuple[int, int] | None = None  # (i, n): i-th of n equal slices of a fused last axis

    def hf_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        """The HF tensor's shape, given the txjax parameter's."""
        if self.layout == "linear":
            return tuple(reversed(shape))
        if self.part is not None:
            return (*shape[:-1], shape[-1] * self.part[1])
        return tuple(shape)

    def to_txjax(self, t: np.ndarray) -> np.ndarray:
        if self.layout == "linear":
            return t.T
        if self.part is not None:
            i, n = self.part
            return np.split(t, n, axis=-1)[i]
        return t


# ----------------------------------------------------------------------------- entries


def _linear(path: Path, key: str, bias: bool) -> list[Entry]:
    out = [Entry((*path, "kernel"), f"{key}.weight", "linear")]
    if bias:
        out.append(Entry((*path, "bias"), f"{key}.bias"))
    return out


def _norm(path: Path, key: str, bias: bool = True) -> list[Entry]:
    out = [Entry((*path, "scale"), f"{key}.weight")]
    if bias:
        out.append(Entry((*path, "bias"), f"{key}.bias"))
    return out


def _gpt_entries(c: GPTConfig) -> list[Entry]:
    e = [
        Entry(("embed", "embedding"), "transformer.wte.weight"),
        Entry(("decoder", "positions", "table"), "transformer.wpe.weight"),
    ]
    for i in range(c.num_layers):
        p, h = ("decoder", "blocks", i), f"transformer.h.{i}"
        e += _norm((*p, "self_norm"), f"{h}.ln_1")
        for j, name in enumerate("qkv"):
            e.append(Entry((*p, "self_attn", name, "kernel"), f"{h}.attn.c_attn.weight", part=(j, 3)))
            e.append(Entry((*p, "self_attn", name, "bias"), f"{h}.attn.c_attn.bias", part=(j, 3)))
        e += [
            Entry((*p, "self_attn", "o", "kernel"), f"{h}.attn.c_proj.weight"),
            Entry((*p, "self_attn", "o", "bias"), f"{h}.attn.c_proj.bias"),
            Entry((*p, "ffn", "wi", "kernel"), f"{h}.mlp.c_fc.weight"),
            Entry((*p, "ffn", "wi", "bias"), f"{h}.mlp.c_fc.bias"),
            Entry((*p, "ffn", "wo", "kernel"), f"{h}.mlp.c_proj.weight"),
            Entry((*p, "ffn", "wo", "bias"), f"{h}.mlp.c_proj.bias"),
        ]
        e += _norm((*p, "ffn_norm"), f"{h}.ln_2")
    e += _norm(("decoder", "final_norm"), "transformer.ln_f")
    if not c.tie_embeddings:
        e.append(Entry(("head", "kernel"), "lm_head.weight", "linear"))
    return e


def _bert_entries(c: BertConfig) -> list[Entry]:
    emb = "bert.embeddings"
    e = [
        Entry(("embed", "embedding"), f"{emb}.word_embeddings.weight"),
        Entry(("segments", "embedding"), f"{emb}.token_type_embeddings.weight"),
        Entry(("encoder", "positions", "table"), f"{emb}.position_embeddings.weight"),
        *_norm(("embed_norm",), f"{emb}.LayerNorm"),
    ]
    for i in range(c.num_layers):
        p, h = ("encoder", "blocks", i), f"bert.encoder.layer.{i}"
        for name, hf in (("q", "query"), ("k", "key"), ("v", "value")):
            e += _linear((*p, "self_attn", name), f"{h}.attention.self.{hf}", bias=True)
        e += _linear((*p, "self_attn", "o"), f"{h}.attention.output.dense", bias=True)
        e += _norm((*p, "self_norm"), f"{h}.attention.output.LayerNorm")
        e += _linear((*p, "ffn", "wi"), f"{h}.intermediate.dense", bias=True)
        e += _linear((*p, "ffn", "wo"), f"{h}.output.dense", bias=True)
        e += _norm((*p, "ffn_norm"), f"{h}.output.LayerNorm")
    if c.head == "mlm":
        e += _linear(("mlm", "dense"), "cls.predictions.transform.dense", bias=True)
        e += _norm(("mlm", "norm"), "cls.predictions.transform.LayerNorm")
        e.append(Entry(("mlm", "bias"), "cls.predictions.bias"))
    elif c.head == "pooler":
        e += _linear(("pooler", "dense"), "bert.pooler.dense", bias=True)
    return e


def _t5_stack(c: T5Config, stack: str, num_layers: int, cross: bool) -> list[Entry]:
    e = [
        Entry((stack, "positions", "relative", "table"),
              f"{stack}.block.0.layer.0.SelfAttention.relative_attention_bias.weight"),
    ]
    for i in range(num_layers):
        p, h = (stack, "blocks", i), f"{stack}.block.{i}.layer"
        e += _norm((*p, "self_norm"), f"{h}.0.layer_norm", bias=False)
        for name in "qkvo":
            e += _linear((*p, "self_attn", name), f"{h}.0.SelfAttention.{name}", bias=False)
        ff = 1
        if cross:
            e += _norm((*p, "cross_norm"), f"{h}.1.layer_norm", bias=False)
            for name in "qkvo":
                e += _linear((*p, "cross_attn", name), f"{h}.1.EncDecAttention.{name}", bias=False)
            ff = 2
        e += _norm((*p, "ffn_norm"), f"{h}.{ff}.layer_norm", bias=False)
        if c.gated:
            e += _linear((*p, "ffn", "wi"), f"{h}.{ff}.DenseReluDense.wi_0", bias=False)
            e += _linear((*p, "ffn", "wg"), f"{h}.{ff}.DenseReluDense.wi_1", bias=False)
        else:
            e += _linear((*p, "ffn", "wi"), f"{h}.{ff}.DenseReluDense.wi", bias=False)
        e += _linear((*p, "ffn", "wo"), f"{h}.{ff}.DenseReluDense.wo", bias=False)
    e += _norm((stack, "final_norm"), f"{stack}.final_layer_norm", bias=False)
    return e


def _t5_entries(c: T5Config) -> list[Entry]:
    e = [Entry(("embed", "embedding"), "shared.weight")]
    e += _t5_stack(c, "encoder", c.num_layers, cross=False)
    e += _t5_stack(c, "decoder", c.decoder_layers, cross=True)
    if not c.tie_embeddings:
        e.append(Entry(("head", "kernel"), "lm_head.weight", "linear"))
    return e


def entries(config: TransformerConfig) -> list[Entry]:
    """The full name map of one config's parameters."""
    if isinstance(config, GPTConfig):
        return _gpt_entries(config)
    if isinstance(config, BertConfig):
        return _bert_entries(config)
    if isinstance(config, T5Config):
        return _t5_entries(config)
    raise CheckpointError(f"no Hugging Face layout for {type(config).__name__}")


# Tensors a checkpoint may hold that no txjax parameter needs.
IGNORED = {
    "gpt": (r"^transformer\.h\.\d+\.attn\.(bias|masked_bias)$",),  # causal-mask buffers
    "bert": (
        r"^bert\.embeddings\.position_ids$",
        r"^bert\.pooler\.",  # BertForPreTraining's NSP path, where head is not "pooler"
        r"^cls\.seq_relationship\.",
    ),
    "t5": (r"^decoder\.block\.0\.layer\.1\.EncDecAttention\.relative_attention_bias\.weight$",),
}


# ----------------------------------------------------------------------------- family quirks


def _rename_legacy(tensors: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Old TF-converted checkpoints name LayerNorm parameters gamma / beta."""
    out = {}
    for k, v in tensors.items():
        k = re.sub(r"LayerNorm\.gamma$", "LayerNorm.weight", k)
        k = re.sub(r"LayerNorm\.beta$", "LayerNorm.bias", k)
        out[k] = v
    return out


def _add_prefix(tensors: dict, prefix: str, keep: tuple[str, ...]) -> dict:
    """Checkpoints of the bare model (GPT2Model, BertModel) lack the LM model's prefix."""
    if any(k.startswith(prefix) for k in tensors):
        return tensors
    return {k if k.startswith(keep) else prefix + k: v for k, v in tensors.items()}


def _same(a: np.ndarray | None, b: np.ndarray | None) -> bool:
    return a is not None and b is not None and a.shape == b.shape and np.array_equal(a, b)


def _drop_tied(tensors: dict, key: str, source: str, what: str) -> None:
    """Remove `key`, a tied copy of `source`; refuse a copy that differs."""
    if key not in tensors:
        return
    if source not in tensors:
        tensors[source] = tensors.pop(key)
        return
    if not _same(tensors[key], tensors[source]):
        raise CheckpointError(f"{key} differs from {source}: {what} is not supported")
    del tensors[key]


def bert_head(tensors: dict[str, np.ndarray]) -> str:
    """The head a BERT checkpoint holds: "mlm" (cls.predictions), else "pooler", else "none"."""
    if any(k.startswith("cls.predictions.") for k in tensors):
        return "mlm"
    return "pooler" if "bert.pooler.dense.weight" in tensors else "none"


def prepare(config: TransformerConfig, hf: dict, tensors: dict[str, np.ndarray], head: str | None = None
            ) -> tuple[TransformerConfig, dict[str, np.ndarray]]:
    """Canonical tensor names, tied copies removed, and the head's tying read from the weights.

    BERT: `head` (BertConfig.head) is the one asked for, else the one the weights hold (`bert_head`).
    """
    if head is not None and not isinstance(config, BertConfig):
        raise ValueError(f"head={head!r} applies to BERT checkpoints only, not {config.family}")
    tensors = _rename_legacy(tensors)
    if isinstance(config, GPTConfig):
        tensors = _add_prefix(tensors, "transformer.", ("lm_head.",))
        head = tensors.get("lm_head.weight")
        if head is not None and _same(head, tensors.get("transformer.wte.weight")):
            del tensors["lm_head.weight"]
            config = config.replace(tie_embeddings=True)
        elif head is not None:
            config = config.replace(tie_embeddings=False)
    elif isinstance(config, BertConfig):
        tensors = _add_prefix(tensors, "bert.", ("cls.",))
        if head is None:
            head = bert_head(tensors)
        config = config.replace(head=head)
        if head != "mlm":  # an MLM head the caller did not ask for is not read at all
            tensors = {k: v for k, v in tensors.items() if not k.startswith("cls.predictions.")}
        _drop_tied(tensors, "cls.predictions.decoder.weight", "bert.embeddings.word_embeddings.weight",
                   "an MLM decoder untied from the word embedding")
        _drop_tied(tensors, "cls.predictions.decoder.bias", "cls.predictions.bias",
                   "an MLM decoder bias other than cls.predictions.bias")
    elif isinstance(config, T5Config):
        for stack in ("encoder", "decoder"):
            _drop_tied(tensors, f"{stack}.embed_tokens.weight", "shared.weight",
                       f"a {stack} embedding untied from shared.weight")
        head = tensors.pop("lm_head.weight", None)
        if t5_scales_tied_head(hf):
            if head is None or _same(head, tensors.get("shared.weight")):
                config = config.replace(tie_embeddings=True)
            else:
                # HF scales the decoder output by d^-0.5 before this head; txjax scales only
                # a tied head, so the factor is folded into the untied kernel instead.
                config = config.replace(tie_embeddings=False)
                tensors["lm_head.weight"] = head * np.asarray(config.d_model**-0.5, head.dtype)
        else:
            # Unscaled head (v1.1): txjax's untied head, even when it equals the embedding.
            config = config.replace(tie_embeddings=False)
            shared = tensors.get("shared.weight")
            if head is not None or shared is not None:
                tensors["lm_head.weight"] = shared if head is None else head
    return config, tensors


# ----------------------------------------------------------------------------- conversion


def params_from_tensors(
    config: TransformerConfig,
    tensors: dict[str, np.ndarray],
    shapes: dict[Path, tuple[int, ...]],
    source: str = "checkpoint",
) -> dict[Path, np.ndarray]:
    """float32 txjax parameters by path; `shapes` are the model's, from `jax.eval_shape`.

    Missing and misshaped tensors are named, all of them, in one error; tensors no
    parameter needs are named in a warning.
    """
    table = entries(config)
    _check_coverage(table, shapes)
    missing = sorted({e.key for e in table if e.key not in tensors})
    if missing:
        hint = ""
        if isinstance(config, BertConfig) and all(k.startswith(("cls.", "bert.pooler.")) for k in missing):
            hint = (f" (it has no {config.head} head: from_pretrained(path) loads the head it has, "
                    "head='none' the bare encoder)")
        raise CheckpointError(
            f"{source}: {len(missing)} tensor(s) missing for this {config.family} config: "
            f"{_names(missing)}{hint}"
        )
    wrong = []
    for e in table:
        want = e.hf_shape(shapes[e.path])
        if tuple(tensors[e.key].shape) != want:
            wrong.append(f"{e.key} has shape {tuple(tensors[e.key].shape)}, expected {want}")
    if wrong:
        raise CheckpointError(f"{source}: {len(set(wrong))} misshaped tensor(s): " + "; ".join(sorted(set(wrong))))
    used = {e.key for e in table}
    ignored = IGNORED.get(config.family, ())
    extra = sorted(k for k in tensors if k not in used and not any(re.search(p, k) for p in ignored))
    if extra:
        warnings.warn(f"{source}: {len(extra)} tensor(s) not used by txjax: {_names(extra)}", stacklevel=3)
    return {e.path: np.asarray(e.to_txjax(tensors[e.key]), np.float32) for e in table}


def tensors_from_params(config: TransformerConfig, params: dict[Path, np.ndarray]) -> dict[str, np.ndarray]:
    """HF tensors (float32) from txjax parameters by path; fused tensors are concatenated."""
    table = entries(config)
    _check_coverage(table, {p: np.shape(v) for p, v in params.items()})
    parts: dict[str, dict[int, np.ndarray]] = {}
    out = {}
    for e in table:
        value = np.asarray(params[e.path], np.float32)
        if e.layout == "linear":
            out[e.key] = value.T
        elif e.part is not None:
            parts.setdefault(e.key, {})[e.part[0]] = value
        else:
            out[e.key] = value
    for key, pieces in parts.items():
        out[key] = np.concatenate([pieces[i] for i in sorted(pieces)], axis=-1)
    return out


def hf_names(config: TransformerConfig, tensors: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Tensors named as transformers' class for the config saves them: BertModel has no `bert.` prefix."""
    if isinstance(config, BertConfig) and config.head != "mlm":
        return {k.removeprefix("bert."): v for k, v in tensors.items()}
    return tensors


def _check_coverage(table: list[Entry], shapes: dict[Path, tuple]) -> None:
    """The map must name every txjax parameter exactly: a new parameter must not load silently."""
    mapped = {e.path for e in table}
    unmapped, stale = sorted(map(str, set(shapes) - mapped)), sorted(map(str, mapped - set(shapes)))
    if unmapped or stale:
        raise CheckpointError(
            f"txjax.hf's name map is out of date with the model: parameters without a Hugging Face "
            f"name {_names(unmapped)}; names without a parameter {_names(stale)}"
        )


def _names(names: list[str], limit: int = 12) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f", ... ({len(names) - limit} more)" if len(names) > limit else "")
