"""Hugging Face config.json <-> txjax config, for GPT-2, BERT and T5.

Every option that changes the computation is either mapped or refused with an
error that names it; options that only matter to PyTorch (dropout on attention
probabilities, upcasting order, cache use) are ignored.
"""

from __future__ import annotations

from txjax.config import BertConfig, GPTConfig, T5Config, TransformerConfig

MODEL_TYPES = ("gpt2", "bert", "t5", "mt5")

# Hugging Face activation names (transformers.activations.ACT2FN) -> txjax.
_ACT_FROM_HF = {
    "gelu": "gelu",
    "gelu_python": "gelu",
    "gelu_new": "gelu_tanh",
    "gelu_pytorch_tanh": "gelu_tanh",
    "gelu_python_tanh": "gelu_tanh",
    "gelu_fast": "gelu_tanh",
    "gelu_accurate": "gelu_tanh",
    "relu": "relu",
    "silu": "silu",
    "swish": "silu",
}
_ACT_TO_HF = {"gelu": "gelu", "gelu_tanh": "gelu_new", "relu": "relu", "silu": "silu"}


class UnsupportedConfigError(ValueError):
    """A config.json (or a txjax config) that the other side cannot represent."""


def _activation(name: str, field: str) -> str:
    if name not in _ACT_FROM_HF:
        raise UnsupportedConfigError(
            f"{field}={name!r} is not supported; txjax maps {sorted(_ACT_FROM_HF)}"
        )
    return _ACT_FROM_HF[name]


def _refuse(hf: dict, field: str, ok, why: str) -> None:
    if field in hf and hf[field] is not None and not ok(hf[field]):
        raise UnsupportedConfigError(f"{field}={hf[field]!r} is not supported: {why}")


def t5_feed_forward(feed_forward_proj: str) -> tuple[str, bool]:
    """HF T5 `feed_forward_proj` -> (txjax activation, gated), parsed as transformers does.

    "gated-gelu" means the tanh approximation (T5 v1.1, mT5), not exact GELU.
    """
    parts = feed_forward_proj.split("-")
    if len(parts) > 2 or (len(parts) == 2 and parts[0] != "gated"):
        raise UnsupportedConfigError(
            f"feed_forward_proj={feed_forward_proj!r} is not 'ACT' or 'gated-ACT'"
        )
    act = "gelu_new" if feed_forward_proj == "gated-gelu" else parts[-1]
    return _activation(act, "feed_forward_proj"), len(parts) == 2


def t5_scales_tied_head(hf: dict) -> bool:
    """Whether HF T5 multiplies the decoder output by d_model^-0.5 before the head.

    transformers >= 5 stores this as `scale_decoder_outputs`; older configs imply
    it by `tie_word_embeddings` (default true): v1.0 ties and scales, v1.1 does neither.
    """
    if "scale_decoder_outputs" in hf:
        return bool(hf["scale_decoder_outputs"])
    return hf.get("tie_word_embeddings", True) is not False


def config_from_hf(hf: dict) -> TransformerConfig:
    """A txjax config from a Hugging Face config.json dict.

    The head's tying is taken from the config here; `from_pretrained` corrects it
    from the checkpoint (an `lm_head.weight` equal to the embedding is tied).
    """
    model_type = hf.get("model_type")
    if model_type == "gpt2":
        return _gpt_from_hf(hf)
    if model_type == "bert":
        return _bert_from_hf(hf)
    if model_type in ("t5", "mt5"):
        return _t5_from_hf(hf)
    raise UnsupportedConfigError(
        f"model_type={model_type!r} is not supported; txjax.hf reads {list(MODEL_TYPES)}"
    )


def _gpt_from_hf(hf: dict) -> GPTConfig:
    _refuse(hf, "scale_attn_by_inverse_layer_idx", lambda v: not v,
            "txjax scales every layer's attention by 1/sqrt(H)")
    _refuse(hf, "add_cross_attention", lambda v: not v, "GPT-2 with cross-attention is an encoder-decoder")
    d = hf["n_embd"]
    return GPTConfig(
        vocab_size=hf["vocab_size"],
        max_len=hf["n_positions"],
        d_model=d,
        num_heads=hf["n_head"],
        num_layers=hf["n_layer"],
        d_ff=hf.get("n_inner") or 4 * d,
        position="learned",
        norm="layer",
        norm_position="pre",
        norm_eps=hf.get("layer_norm_epsilon", 1e-5),
        activation=_activation(hf.get("activation_function", "gelu_new"), "activation_function"),
        use_bias=True,
        tie_embeddings=hf.get("tie_word_embeddings", True) is not False,
        dropout=hf.get("resid_pdrop", 0.1),
        attention_scale=None if hf.get("scale_attn_weights", True) else 1.0,
        # GPT-2 has no padding mask: HF masks with attention_mask, never by token id.
        pad_id=None,
    )


def _bert_from_hf(hf: dict) -> BertConfig:
    _refuse(hf, "position_embedding_type", lambda v: v == "absolute",
            "only absolute (learned) positions are mapped")
    _refuse(hf, "is_decoder", lambda v: not v, "txjax BERT is a bidirectional encoder")
    _refuse(hf, "add_cross_attention", lambda v: not v, "txjax BERT has no cross-attention")
    _refuse(hf, "tie_word_embeddings", lambda v: v, "txjax BERT's MLM decoder is the word embedding")
    d, n = hf["hidden_size"], hf["num_attention_heads"]
    # BertModel (the bare encoder, pooler included by default) returns hidden states; every other
    # architecture is read as BertForMaskedLM. from_pretrained corrects this from the weights.
    head = "pooler" if "BertModel" in (hf.get("architectures") or ()) else "mlm"
    return BertConfig(
        vocab_size=hf["vocab_size"],
        max_len=hf.get("max_position_embeddings", 512),
        d_model=d,
        num_heads=n,
        num_layers=hf["num_hidden_layers"],
        d_ff=hf["intermediate_size"],
        position="learned",
        norm="layer",
        norm_position="post",
        norm_eps=hf.get("layer_norm_eps", 1e-12),
        activation=_activation(hf.get("hidden_act", "gelu"), "hidden_act"),
        use_bias=True,
        tie_embeddings=True,
        dropout=hf.get("hidden_dropout_prob", 0.1),
        pad_id=hf.get("pad_token_id", 0),
        type_vocab_size=hf.get("type_vocab_size", 2),
        embedding_norm=True,
        head=head,
    )


def _t5_from_hf(hf: dict) -> T5Config:
    d, n = hf["d_model"], hf["num_heads"]
    d_kv = hf.get("d_kv", d // n)
    activation, gated = t5_feed_forward(hf.get("feed_forward_proj", "relu"))
    num_layers = hf["num_layers"]
    num_decoder_layers = hf.get("num_decoder_layers")
    pad = hf.get("pad_token_id", 0)
    eos = hf.get("eos_token_id", 1)
    if isinstance(eos, list):
        eos = eos[0]
    start = hf.get("decoder_start_token_id")
    return T5Config(
        vocab_size=hf["vocab_size"],
        max_len=hf.get("n_positions") or 512,
        d_model=d,
        num_heads=n,
        num_layers=num_layers,
        num_decoder_layers=None if num_decoder_layers in (None, num_layers) else num_decoder_layers,
        d_ff=hf["d_ff"],
        head_dim=None if d_kv * n == d else d_kv,
        position="t5",
        norm="rms",
        norm_position="pre",
        norm_eps=hf.get("layer_norm_epsilon", 1e-6),
        activation=activation,
        gated=gated,
        use_bias=False,
        tie_embeddings=t5_scales_tied_head(hf),
        dropout=hf.get("dropout_rate", 0.1),
        attention_scale=1.0,  # T5 folds 1/sqrt(H) into its initialisation of q
        num_buckets=hf.get("relative_attention_num_buckets", 32),
        max_distance=hf.get("relative_attention_max_distance", 128),
        pad_id=pad,
        decoder_start_id=(pad if pad is not None else 0) if start is None else start,
        eos_id=1 if eos is None else eos,
    )


def _require(config: TransformerConfig, name: str, wanted, hf_name: str) -> None:
    value = getattr(config, name)
    allowed = wanted if isinstance(wanted, tuple) else (wanted,)
    if value not in allowed:
        raise UnsupportedConfigError(
            f"{type(config).__name__}.{name}={value!r} cannot be written as {hf_name}, "
            f"which needs {name} in {allowed}"
        )


def config_to_hf(config: TransformerConfig) -> dict:
    """The Hugging Face config.json dict of a txjax config; refuses what HF cannot express."""
    if isinstance(config, GPTConfig):
        return _gpt_to_hf(config)
    if isinstance(config, BertConfig):
        return _bert_to_hf(config)
    if isinstance(config, T5Config):
        return _t5_to_hf(config)
    raise UnsupportedConfigError(f"no Hugging Face layout for {type(config).__name__}")


def _common(config: TransformerConfig, hf_name: str) -> None:
    if config.head_size * config.num_heads != config.d_model and hf_name != "T5":
        raise UnsupportedConfigError(
            f"{hf_name} needs head_dim * num_heads == d_model, got {config.head_size} * "
            f"{config.num_heads} != {config.d_model}"
        )
    if config.kv_heads != config.num_heads:
        raise UnsupportedConfigError(
            f"{hf_name} has one key/value head per query head; num_kv_heads={config.num_kv_heads} "
            f"!= num_heads={config.num_heads} (grouped-query attention) cannot be exported"
        )
    if config.attention_window is not None:
        raise UnsupportedConfigError(f"{hf_name} attends over every key; attention_window="
                                     f"{config.attention_window} (sliding window) cannot be exported")
    if config.activation not in _ACT_TO_HF:
        raise UnsupportedConfigError(f"activation={config.activation!r} has no Hugging Face name")


def _gpt_to_hf(c: GPTConfig) -> dict:
    _common(c, "GPT-2")
    for name, wanted in (("position", "learned"), ("norm", "layer"), ("norm_position", "pre"),
                         ("gated", False), ("use_bias", True), ("attention_scale", (None, 1.0))):
        _require(c, name, wanted, "GPT-2")
    return {
        "model_type": "gpt2",
        "architectures": ["GPT2LMHeadModel"],
        "vocab_size": c.vocab_size,
        "n_positions": c.max_len,
        "n_ctx": c.max_len,
        "n_embd": c.d_model,
        "n_head": c.num_heads,
        "n_layer": c.num_layers,
        "n_inner": c.d_ff,
        "activation_function": _ACT_TO_HF[c.activation],
        "layer_norm_epsilon": c.norm_eps,
        "resid_pdrop": c.dropout,
        "embd_pdrop": c.dropout,
        "attn_pdrop": 0.0,  # txjax has no dropout on attention probabilities
        "scale_attn_weights": c.attention_scale is None,
        "scale_attn_by_inverse_layer_idx": False,
        "tie_word_embeddings": c.tie_embeddings,
        "pad_token_id": c.pad_id,
    }


def _bert_to_hf(c: BertConfig) -> dict:
    _common(c, "BERT")
    for name, wanted in (("position", "learned"), ("norm", "layer"), ("norm_position", "post"),
                         ("gated", False), ("use_bias", True), ("attention_scale", None),
                         ("embedding_norm", True), ("tie_embeddings", True)):
        _require(c, name, wanted, "BertForMaskedLM")
    return {
        "model_type": "bert",
        # head "pooler" or "none": the bare encoder (transformers builds a pooler unless told not to).
        "architectures": ["BertForMaskedLM" if c.head == "mlm" else "BertModel"],
        "vocab_size": c.vocab_size,
        "hidden_size": c.d_model,
        "num_hidden_layers": c.num_layers,
        "num_attention_heads": c.num_heads,
        "intermediate_size": c.d_ff,
        "hidden_act": _ACT_TO_HF[c.activation],
        "max_position_embeddings": c.max_len,
        "type_vocab_size": c.type_vocab_size,
        "layer_norm_eps": c.norm_eps,
        "hidden_dropout_prob": c.dropout,
        "attention_probs_dropout_prob": 0.0,  # txjax has no dropout on attention probabilities
        "pad_token_id": c.pad_id,
        "position_embedding_type": "absolute",
        "tie_word_embeddings": True,
    }


def _t5_to_hf(c: T5Config) -> dict:
    _common(c, "T5")
    for name, wanted in (("position", "t5"), ("norm", "rms"), ("norm_position", "pre"),
                         ("use_bias", False), ("attention_scale", 1.0)):
        _require(c, name, wanted, "T5")
    if c.gated:
        # HF reads "gated-gelu" as the tanh approximation; other names are taken literally.
        act = {"gelu_tanh": "gelu", "gelu": "gelu_python"}.get(c.activation, c.activation)
        feed_forward_proj = f"gated-{act}"
    else:
        feed_forward_proj = _ACT_TO_HF[c.activation]
    return {
        "model_type": "t5",
        "architectures": ["T5ForConditionalGeneration"],
        "is_encoder_decoder": True,
        "vocab_size": c.vocab_size,
        "n_positions": c.max_len,
        "d_model": c.d_model,
        "d_kv": c.head_size,
        "d_ff": c.d_ff,
        "num_layers": c.num_layers,
        "num_decoder_layers": c.decoder_layers,
        "num_heads": c.num_heads,
        "relative_attention_num_buckets": c.num_buckets,
        "relative_attention_max_distance": c.max_distance,
        "layer_norm_epsilon": c.norm_eps,
        "dropout_rate": c.dropout,
        "feed_forward_proj": feed_forward_proj,
        # v1.0 ties the head and rescales by d_model^-0.5; an untied head is used as is.
        "tie_word_embeddings": c.tie_embeddings,
        "scale_decoder_outputs": c.tie_embeddings,
        "pad_token_id": c.pad_id,
        "eos_token_id": c.eos_id,
        "decoder_start_token_id": c.decoder_start_id,
    }
