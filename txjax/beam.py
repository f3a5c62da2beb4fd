"""Beam search for GPT and T5: one compiled `lax.while_loop` over the KV cache, scored as Hugging Face does.

The loop transcribes transformers 5.x `GenerationMixin._beam_search` (generation/utils.py)
with fixed shapes: each step takes the top 2K of the K x V extensions by summed log-prob
(`_get_top_k_continuations`); the best K that did not just end keep running
(`_get_running_beams_for_next_iteration`); those among the top K that ended (EOS, or the
last step) join the finished pool with score sum / (new length ** length_penalty), the
length counting generated tokens up to and including EOS, not the prompt or T5's start
token (`_update_finished_beams`). The loop stops once no row can improve on its finished
pool, by the `early_stopping=False` heuristic that is transformers' default
(`_check_early_stop_heuristic`), or after `max_new_tokens`. The KV cache is reordered
along the batch axis each step to follow the running beams.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from txjax.decoding import generate, new_cache
from txjax.models import GPT, T5

NEG = -1.0e9  # transformers' "never pick this" score, added (not set) as it does


def _gather(x_BK, index_BJ):
    """x_BK...[b, index_BJ[b, j]] per row: beams picked by index."""
    index = index_BJ.reshape(index_BJ.shape + (1,) * (x_BK.ndim - 2))
    return jnp.take_along_axis(x_BK, index, axis=1)


@functools.partial(jax.jit, static_argnames=("graphdef", "max_new_tokens", "num_beams", "length_penalty",
                                             "eos_id", "pad_id"))
def _beam_loop(graphdef, state, source_BS, prefix_BT, *, max_new_tokens, num_beams, length_penalty,
               eos_id, pad_id):
    """prefix_BT -> (best sequence [B, T + max_new_tokens], its score [B]); T5: source_BS is the encoder input."""
    model = nnx.merge(graphdef, state)
    b, t = prefix_BT.shape
    k, c, length = num_beams, 2 * num_beams, t + max_new_tokens
    flat_prefix_XT = jnp.repeat(prefix_BT, k, axis=0)  # X = B * K rows, row b * K + j is beam j of row b
    source_XS = None if source_BS is None else jnp.repeat(source_BS, k, axis=0)
    cache = new_cache(model, source_XS, b * k, length - 1)
    if t > 1:  # prefill all but the last prefix token; the loop feeds that one
        _, cache = model.decode_step(flat_prefix_XT[:, :-1], cache)
    running_BKL = jnp.full((b, k, length), pad_id, jnp.int32).at[:, :, :t].set(prefix_BT[:, None])
    running_logp_BK = jnp.zeros((b, k), jnp.float32).at[:, 1:].set(NEG)  # beams start equal: keep one
    top_k_1C = (jnp.arange(c) < k)[None]

    def cond(carry):
        i, _, _, _, _, _, _, unsatisfied_B1, ended_BC = carry
        return (i < max_new_tokens) & jnp.any(unsatisfied_B1) & ~jnp.all(ended_BC)

    def body(carry):
        i, cache, running_BKL, running_logp_BK, done_BKL, done_score_BK, done_BK, unsatisfied_B1, _ = carry
        token_X1 = jax.lax.dynamic_slice_in_dim(running_BKL.reshape(b * k, length), t + i - 1, 1, axis=1)
        logits_X1V, cache = model.decode_step(token_X1, cache)
        logp_BKV = jax.nn.log_softmax(logits_X1V[:, 0].astype(jnp.float32), axis=-1).reshape(b, k, -1)
        v = logp_BKV.shape[-1]
        total_BKV = logp_BKV + running_logp_BK[:, :, None]
        logp_BC, flat_BC = jax.lax.top_k(total_BKV.reshape(b, k * v), c)
        beam_BC, token_BC = flat_BC // v, (flat_BC % v).astype(jnp.int32)
        seq_BCL = jax.lax.dynamic_update_slice(_gather(running_BKL, beam_BC), token_BC[:, :, None], (0, 0, t + i))
        ended_BC = jnp.broadcast_to(i + 1 >= max_new_tokens, (b, c))
        if eos_id is not None:
            ended_BC = ended_BC | (token_BC == eos_id)

        # The best K candidates that did not end keep running; the cache follows their parents.
        alive_BC = logp_BC + ended_BC * NEG
        keep_BK = jax.lax.top_k(alive_BC, k)[1]
        running_BKL, running_logp_BK = _gather(seq_BCL, keep_BK), _gather(alive_BC, keep_BK)
        parent_X = (_gather(beam_BC, keep_BK) + jnp.arange(b)[:, None] * k).reshape(-1)
        cache = jax.tree.map(lambda x: x[parent_X] if x.ndim else x, cache)

        # Candidates among the top K that ended join the finished pool, which keeps its best K.
        new_len = (i + 1).astype(jnp.float32)
        just_done_BC = ended_BC & top_k_1C
        score_BC = (logp_BC / new_len**length_penalty + ~unsatisfied_B1 * NEG + ~just_done_BC * NEG)
        pool_score_BM = jnp.concatenate([done_score_BK, score_BC], axis=1)
        best_BK = jax.lax.top_k(pool_score_BM, k)[1]
        done_BKL = _gather(jnp.concatenate([done_BKL, seq_BCL], axis=1), best_BK)
        done_score_BK = _gather(pool_score_BM, best_BK)
        done_BK = _gather(jnp.concatenate([done_BK, just_done_BC], axis=1), best_BK)

        # early_stopping=False: stop a row once its best running beam, scored at the current
        # length, cannot beat the worst finished one.
        best_running_B1 = running_logp_BK[:, :1] / new_len**length_penalty
        worst_done_BK = jnp.where(done_BK, jnp.min(done_score_BK, axis=1, keepdims=True), NEG)
        unsatisfied_B1 = unsatisfied_B1 & jnp.any(best_running_B1 > worst_done_BK, axis=-1, keepdims=True)
        return (i + 1, cache, running_BKL, running_logp_BK, done_BKL, done_score_BK, done_BK,
                unsatisfied_B1, ended_BC)

    carry = (jnp.zeros((), jnp.int32), cache, running_BKL, running_logp_BK, running_BKL,
             jnp.full((b, k), NEG, jnp.float32), jnp.zeros((b, k), bool), jnp.ones((b, 1), bool),
             jnp.zeros((b, c), bool))
    carry = jax.lax.while_loop(cond, body, carry)
    return carry[4][:, 0], carry[5][:, 0]


def beam_search(
    model: GPT | T5,
    prompt_BT: jax.Array,
    max_new_tokens: int,
    num_beams: int,
    length_penalty: float = 1.0,
    eos_id: int | None = None,
) -> tuple[jax.Array, jax.Array]:
    """(tokens, score): the best beam per row and its length-penalized log-probability.

    GPT: tokens are the prompt and its continuation, int32 [B, T + max_new_tokens]. T5:
    `prompt_BT` is the encoder input and tokens are `config.decoder_start_id` followed by
    the continuation, [B, 1 + max_new_tokens]. After EOS a row holds the pad id `generate`
    uses (`config.pad_id`, else `eos_id`, else 0). eos_id None: no stop for GPT,
    `config.eos_id` for T5. score (float32 [B]) is the sum of the new tokens' log-probs
    divided by (number of new tokens, EOS included) ** length_penalty, as transformers'
    `sequences_scores`; 0 when max_new_tokens is 0. num_beams=1 gives greedy decoding.
    Dropout is off; a second call with the same shapes and settings reuses the compiled loop.
    """
    if not isinstance(num_beams, int) or num_beams < 1:
        raise ValueError(f"num_beams must be an int >= 1, got {num_beams!r}")
    if not isinstance(max_new_tokens, int) or max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be an int >= 0, got {max_new_tokens!r}")
    # generate validates the model, prompt, ids and lengths the same way, and builds the prefix.
    prefix_BT = generate(model, prompt_BT, 0, jax.random.key(0), eos_id=eos_id)
    config = model.config
    if config.position == "learned" and prefix_BT.shape[1] + max_new_tokens > config.max_len:
        raise ValueError(f"{prefix_BT.shape[1]} prefix tokens + max_new_tokens={max_new_tokens} run past "
                         f"max_len={config.max_len} of the learned position table")
    if isinstance(model, T5):
        eos_id = config.eos_id if eos_id is None else eos_id
        source_BS = jnp.asarray(prompt_BT, jnp.int32)
    else:
        source_BS = None
    pad_id = config.pad_id if config.pad_id is not None else eos_id
    if max_new_tokens == 0:
        return prefix_BT, jnp.zeros(prefix_BT.shape[:1], jnp.float32)
    graphdef, state = nnx.split(nnx.view(model, deterministic=True, raise_if_not_found=False))
    tokens, score = _beam_loop(
        graphdef, state, source_BS, prefix_BT, max_new_tokens=max_new_tokens, num_beams=num_beams,
        length_penalty=float(length_penalty), eos_id=eos_id, pad_id=0 if pad_id is None else pad_id,
    )
    if not np.all(np.isfinite(np.asarray(score))):
        rows = np.flatnonzero(~np.isfinite(np.asarray(score))).tolist()
        raise FloatingPointError(f"beam_search: rows {rows} got no finite beam: the best beam's score is not "
                                 "finite (NaN logits); the model's parameters or activations are not finite")
    return tokens, score
