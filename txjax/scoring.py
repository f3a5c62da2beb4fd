"""Log-likelihood of given continuations: the building block of evaluation harnesses (lm-eval's loglikelihood).

One full forward per call, no sampling: GPT reads prompt + continuation and scores the
continuation's tokens; T5 reads the prompt as encoder input and the continuation as
decoder targets after `config.decoder_start_id`. Jitted once per shape, like `generate`.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from txjax.models import GPT, T5
from txjax.nn import check_tokens
from txjax.ops import token_nll


class Score(NamedTuple):
    """total_B: summed log-prob of the real continuation tokens; logp_BC: per token (0 at padding);
    greedy_B: whether every real token is the argmax of its position (lm-eval's is_greedy)."""

    total_B: jax.Array
    logp_BC: jax.Array
    greedy_B: jax.Array


@functools.partial(jax.jit, static_argnames=("graphdef",))
def _score(graphdef, state, prompt_BT, continuation_BC, mask_BC):
    model = nnx.merge(graphdef, state)
    c = continuation_BC.shape[1]
    if isinstance(model, T5):
        start_B1 = jnp.full((prompt_BT.shape[0], 1), model.config.decoder_start_id, jnp.int32)
        logits_BCV = model(prompt_BT, jnp.concatenate([start_B1, continuation_BC[:, :-1]], axis=1))
    else:
        # Position T - 1 + j predicts continuation token j; the last token predicts nothing.
        logits_BLV = model(jnp.concatenate([prompt_BT, continuation_BC[:, :-1]], axis=1))
        logits_BCV = logits_BLV[:, -c:]
    nll_BC, _ = token_nll(logits_BCV, jnp.where(mask_BC, continuation_BC, -100))  # 0 where masked
    logp_BC = -nll_BC
    hit_BC = jnp.argmax(logits_BCV, axis=-1) == continuation_BC
    return Score(logp_BC.sum(axis=1), logp_BC, jnp.all(hit_BC | ~mask_BC, axis=1))


def score(model: GPT | T5, prompt_BT: jax.Array, continuation_BC: jax.Array,
          mask_BC: jax.Array | None = None) -> Score:
    """Log-likelihood of `continuation_BC` after `prompt_BT` (T5: given the encoder input `prompt_BT`).

    mask_BC (bool [B, C], default all True) marks the real continuation tokens; pad them
    at the end of a row (a causal model never lets real tokens see them). Masked tokens
    add 0 to the total and count as greedy. Dropout and random positions are off (as in evaluation).
    """
    if not isinstance(model, (GPT, T5)):
        raise TypeError(f"score supports GPT and T5 models, got {type(model).__name__}")
    config = model.config
    prompt_BT, continuation_BC = jnp.asarray(prompt_BT), jnp.asarray(continuation_BC)
    check_tokens(prompt_BT, config.vocab_size, "encoder input" if isinstance(model, T5) else "prompt")
    check_tokens(continuation_BC, config.vocab_size, "continuation")
    prompt_BT, continuation_BC = prompt_BT.astype(jnp.int32), continuation_BC.astype(jnp.int32)
    if prompt_BT.shape[1] < 1 or continuation_BC.shape[1] < 1:
        raise ValueError(f"prompt and continuation need a token each, got {prompt_BT.shape}, {continuation_BC.shape}")
    if prompt_BT.shape[0] != continuation_BC.shape[0]:
        raise ValueError(f"prompt rows {prompt_BT.shape[0]} != continuation rows {continuation_BC.shape[0]}")
    mask_BC = jnp.ones(continuation_BC.shape, bool) if mask_BC is None else jnp.asarray(mask_BC, bool)
    if mask_BC.shape != continuation_BC.shape:
        raise ValueError(f"mask shape {mask_BC.shape} != continuation shape {continuation_BC.shape}")
    graphdef, state = nnx.split(nnx.view(model, deterministic=True, raise_if_not_found=False))
    return _score(graphdef, state, prompt_BT, continuation_BC, mask_BC)
