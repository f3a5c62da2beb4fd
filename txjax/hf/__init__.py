"""Hugging Face checkpoints for txjax: GPT-2, BERT (BertForMaskedLM, BertModel) and T5 (v1.0 and v1.1).

    model = txjax.hf.from_pretrained("path/to/gpt2")      # config.json + model.safetensors
    txjax.hf.save_pretrained(model, "path/to/out")        # transformers can load it back

A BERT comes back with the head its weights hold (`BertConfig.head`): an MLM head
(`model(tokens)` is logits), a pooler or none (`model(tokens)` is the hidden states;
`model.pooled(h)` the pooler output); `head="none"` reads any BERT as a bare encoder.
`load_tokenizer(path)` reads the folder's tokenizer.json (or a T5 spiece.model) and
encodes and decodes as transformers does.

Reading needs `safetensors` (numpy API) but not torch; a `pytorch_model.bin` needs
torch. Models come back in eval mode (dropout off), as transformers returns them;
call `model.train()` to fine-tune. Every tensor and every option is mapped
explicitly in `_weights.py` and `_config.py`.
"""

from __future__ import annotations

import json
import os

import jax
import numpy as np
from flax import nnx, traverse_util

from txjax.config import ExecutionConfig, TransformerConfig
from txjax.hf._config import UnsupportedConfigError, config_from_hf, config_to_hf
from txjax.hf._files import CheckpointError, read_tensors, write_safetensors
from txjax.hf._tokenizer import Tokenizer, load_tokenizer
from txjax.hf._weights import hf_names, params_from_tensors, prepare, tensors_from_params
from txjax.models import GPT, MODELS, T5, Bert

__all__ = [
    "CheckpointError",
    "Tokenizer",
    "UnsupportedConfigError",
    "config_from_hf",
    "config_to_hf",
    "from_pretrained",
    "load_tokenizer",
    "parameters",
    "read_config",
    "save_pretrained",
]


def read_config(path: str) -> dict:
    """The config.json of a local Hugging Face folder, as a dict."""
    file = os.path.join(path, "config.json")
    if not os.path.isdir(path):
        raise FileNotFoundError(f"{path} is not a folder (txjax.hf reads local Hugging Face folders)")
    if not os.path.isfile(file):
        raise FileNotFoundError(f"{path} has no config.json")
    with open(file) as f:
        try:
            return json.load(f)
        except json.JSONDecodeError as err:
            raise ValueError(f"{file} is not valid JSON ({err})") from None


def from_pretrained(path: str, execution: ExecutionConfig | None = None, *,
                    head: str | None = None) -> GPT | Bert | T5:
    """A txjax model, config inferred, from a local HF folder of GPT-2, BERT or T5.

    Parameters are float32, whatever the checkpoint's dtype. `execution`: how it runs
    (e.g. ExecutionConfig(attention_impl="cudnn") on a GPU); the default otherwise.
    head (BERT only): "none" for hidden states from any BERT (an MLM head or pooler in
    the file is not read), "pooler" or "mlm" to require that head; None: the one the
    weights hold.
    """
    hf = read_config(path)
    config = config_from_hf(hf)
    config, tensors = prepare(config, hf, read_tensors(path), head=head)
    graphdef, abstract, rest = _split_abstract(config, execution)
    shapes = {p: tuple(v.shape) for p, v in traverse_util.flatten_dict(nnx.to_pure_dict(abstract)).items()}
    architectures = ", ".join(hf.get("architectures") or []) or "no architectures named"
    params = params_from_tensors(config, tensors, shapes, source=f"{path} ({architectures})")
    state = traverse_util.unflatten_dict({p: jax.numpy.asarray(v) for p, v in params.items()})
    nnx.replace_by_pure_dict(abstract, state)
    model = nnx.merge(graphdef, abstract, rest)
    model.eval()
    return model


def _split_abstract(config: TransformerConfig, execution: ExecutionConfig | None = None):
    """(graphdef, abstract params, concrete non-parameter state) without initialising weights.

    The non-parameter state is the dropout RNG streams: each gets its own key (the
    model returns in eval mode, so they matter only once it is trained) and count 0.
    """
    cls = MODELS[config.family]
    graphdef, params, rest = nnx.split(
        nnx.eval_shape(lambda: cls(config, rngs=nnx.Rngs(0), execution=execution)), nnx.Param, ...
    )
    leaves, treedef = jax.tree.flatten(rest)
    keys = jax.random.split(jax.random.key(0), max(len(leaves), 1))

    def concrete(i, leaf):
        if jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key):
            return keys[i]
        return jax.numpy.zeros(leaf.shape, leaf.dtype)

    rest = jax.tree.unflatten(treedef, [concrete(i, leaf) for i, leaf in enumerate(leaves)])
    return graphdef, params, rest


def parameters(model: nnx.Module) -> dict[tuple, np.ndarray]:
    """A model's parameters by path, as numpy arrays."""
    state = nnx.state(model, nnx.Param)
    return {p: np.asarray(v) for p, v in traverse_util.flatten_dict(nnx.to_pure_dict(state)).items()}


def save_pretrained(model: GPT | Bert | T5, path: str) -> None:
    """Write config.json and model.safetensors (float32) that transformers loads.

    GPT -> GPT2LMHeadModel, Bert -> BertForMaskedLM (head "mlm") or BertModel (tensors named
    as BertModel saves them), T5 -> T5ForConditionalGeneration; a config HF cannot express
    (RoPE, RMS norm in GPT-2, ...) raises UnsupportedConfigError.
    """
    config = model.config
    hf = config_to_hf(config)
    tensors = hf_names(config, tensors_from_params(config, parameters(model)))
    os.makedirs(path, exist_ok=True)
    write_safetensors(tensors, path)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(hf, f, indent=2, sort_keys=True)
