"""Decoding: turn logits into tokens, and generate autoregressively with or without a KV cache.

`filter_logits` and `sample_logits` are pure functions of a [B, V] logit matrix:
temperature, then top-k, then top-p (nucleus), the order Hugging Face uses.
`generate` runs a whole decode as one compiled `lax.while_loop` with fixed shapes:

- use_cache=True: all but the last prompt token go through `decode_step` at once
  (prefill); each iteration then feeds one token (the last one written) and samples
  the next, over a `KVCache` of T + max_new_tokens - 1 slots;
- use_cache=False (the baseline): every iteration runs the full forward over a
  [B, T + max_new_tokens] buffer whose unwritten tail the causal mask hides (the same
  `decode_step`, on an empty cache as long as the buffer).

The model is split once per call (`nnx.split`) and a function of (graphdef, state)
is jitted, so a second call with the same shapes and settings reuses the compiled
loop. `python -m txjax.decoding --bench` measures both paths on the MNIST GPT.
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from txjax.argtypes import at_least
from txjax.config import GPTConfig
from txjax.models import GPT, T5
from txjax.nn import check_tokens
from txjax.nn.layers import is_concrete

MIN_TEMPERATURE = 1e-6
"""The smallest temperature > 0: below it logits / temperature overflow float32 (use 0 for greedy)."""


def check_sampling(temperature: float, top_k: int | None, top_p: float | None) -> None:
    """ValueError for a negative temperature or one in (0, MIN_TEMPERATURE), top_k < 1 or top_p
    outside (0, 1]."""
    if not temperature >= 0.0:
        raise ValueError(f"temperature must be >= 0 (0 means greedy), got {temperature}")
    if 0.0 < temperature < MIN_TEMPERATURE:
        raise ValueError(f"temperature={temperature} is below the floor {MIN_TEMPERATURE} (logits / temperature "
                         "would overflow); use 0 for greedy")
    if top_k is not None and (int(top_k) != top_k or top_k < 1):
        raise ValueError(f"top_k must be an int >= 1 or None, got {top_k}")
    if top_p is not None and not 0.0 < top_p <= 1.0:
        raise ValueError(f"top_p must be in (0, 1] or None, got {top_p}")


def filter_logits(
    logits_BV: jax.Array,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
) -> jax.Array:
    """float32 logits / temperature, with tokens outside top-k and top-p set to -inf.

    top-k keeps exactly the k largest (ties broken toward the lower id, as argmax
    does, so top_k=1 is greedy). top-p keeps the smallest set of most likely tokens
    whose probability (after temperature and top-k) reaches p: a token stays if the
    mass of the tokens ranked above it is still below p. temperature must be > 0.
    """
    check_sampling(temperature, top_k, top_p)
    if temperature == 0.0:
        raise ValueError("filter_logits needs temperature > 0; temperature 0 is greedy (argmax)")
    if logits_BV.ndim != 2:
        raise ValueError(f"logits must be [B, V], got shape {logits_BV.shape}")
    b, v = logits_BV.shape
    logits_BV = logits_BV.astype(jnp.float32) / temperature
    rows_B1 = jnp.arange(b)[:, None]
    if top_k is not None and top_k < v:
        _, top_BK = jax.lax.top_k(logits_BV, int(top_k))
        keep_BV = jnp.zeros((b, v), bool).at[rows_B1, top_BK].set(True)
        logits_BV = jnp.where(keep_BV, logits_BV, -jnp.inf)
    if top_p is not None and top_p < 1.0:
        order_BV = jnp.argsort(-logits_BV, axis=-1, stable=True)
        probs_BV = jax.nn.softmax(jnp.take_along_axis(logits_BV, order_BV, axis=-1), axis=-1)
        mass_before_BV = jnp.concatenate(
            [jnp.zeros((b, 1), jnp.float32), jnp.cumsum(probs_BV, axis=-1)[:, :-1]], axis=-1
        )
        keep_BV = jnp.zeros((b, v), bool).at[rows_B1, order_BV].set(mass_before_BV < top_p)
        logits_BV = jnp.where(keep_BV, logits_BV, -jnp.inf)
    return logits_BV


def sample_logits(
    logits_BV: jax.Array,
    key: jax.Array,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
) -> jax.Array:
    """One token id per row, int32 [B]: argmax at temperature 0, else a draw from
    softmax(`filter_logits(...)`) with `key`.

    A row with no usable logit (any NaN, or every logit -inf) gets -1, never a real id:
    argmax and the draw would both make token 0 of it. `generate` raises when a row does.
    """
    check_sampling(temperature, top_k, top_p)
    logits_BV = jnp.asarray(logits_BV)
    if temperature == 0.0:
        token_B, usable_BV = jnp.argmax(logits_BV, axis=-1), logits_BV
    else:
        usable_BV = filter_logits(logits_BV, temperature, top_k, top_p)
        token_B = jax.random.categorical(key, usable_BV, axis=-1)
    bad_B = jnp.any(jnp.isnan(logits_BV), axis=-1) | jnp.all(usable_BV == -jnp.inf, axis=-1)
    return jnp.where(bad_B, -1, token_B).astype(jnp.int32)


def new_cache(model: GPT | T5, source_BS: jax.Array | None, batch: int, length: int, lengths_B=None):
    """An empty KV cache of `length` slots: a GPT's for `batch` rows, or (source_BS given) a T5's,
    which encodes its encoder input (each row's first lengths_B[b] tokens, if given) first. The one
    place decoding loops tell the two apart."""
    if source_BS is None:
        return model.init_cache(batch, length)
    return model.init_cache(source_BS, length, lengths_B=lengths_B)


def check_prompt_lengths(prompt_lengths, batch: int, width: int) -> jax.Array:
    """int32 [B]: each row's real prompt length, between 1 and the prompt's width."""
    lengths_B = jnp.asarray(prompt_lengths)
    if lengths_B.shape != (batch,) or not jnp.issubdtype(lengths_B.dtype, jnp.integer):
        raise ValueError(f"prompt_lengths must be {batch} integers (one per row), got "
                         f"{lengths_B.dtype} of shape {lengths_B.shape}")
    lo, hi = int(lengths_B.min()), int(lengths_B.max())
    if lo < 1 or hi > width:
        raise ValueError(f"prompt_lengths must lie in [1, {width}] (the prompt's width), got [{lo}, {hi}]")
    return lengths_B.astype(jnp.int32)


def check_no_pads(prompt_BT: jax.Array, pad_id: int | None, lengths_B: jax.Array | None) -> None:
    """A GPT hides keys equal to `config.pad_id`, so a pad inside a prompt is never text: refused
    (concrete prompts) with a pointer to prompt_lengths, the way to batch prompts of different lengths."""
    if pad_id is None or not is_concrete(prompt_BT):
        return
    ids_BT = np.asarray(prompt_BT)
    real_BT = np.ones(ids_BT.shape, bool) if lengths_B is None else (
        np.arange(ids_BT.shape[1])[None, :] < np.asarray(lengths_B)[:, None])
    hits = np.argwhere((ids_BT == pad_id) & real_BT)
    if not hits.size:
        return
    row, col = map(int, hits[0])
    if lengths_B is None:
        raise ValueError(f"prompt row {row} holds pad_id={pad_id} at position {col} (the model never attends to "
                         "pads, and generation would continue after them); for prompts of different lengths, "
                         "left-align them and pass prompt_lengths (each row's real length)")
    raise ValueError(f"prompt row {row} holds pad_id={pad_id} at position {col}, inside its first "
                     f"{int(np.asarray(lengths_B)[row])} tokens (prompt_lengths); the model never attends to pads")


def check_finite_tokens(out_BL: jax.Array, start: int) -> jax.Array:
    """out_BL, or FloatingPointError if `sample_logits` marked a new token -1 (no usable logit)."""
    bad_BL = np.asarray(out_BL[:, start:] < 0)
    if bad_BL.any():
        rows = np.flatnonzero(bad_BL.any(axis=1)).tolist()
        first = int(np.argmax(bad_BL[rows[0]]))
        raise FloatingPointError(
            f"generate: rows {rows} had no usable logit (NaN, or all -inf) for new token {first} of row {rows[0]} "
            "and later; the model's parameters or activations are not finite")
    return out_BL


def shift_rows(x_BL: jax.Array, shift_B: jax.Array, fill: int) -> jax.Array:
    """Row b moved shift_B[b] slots right (left if negative); vacated slots hold `fill`."""
    source_BL = jnp.arange(x_BL.shape[1])[None, :] - shift_B[:, None]
    inside_BL = (source_BL >= 0) & (source_BL < x_BL.shape[1])
    moved_BL = jnp.take_along_axis(x_BL, jnp.clip(source_BL, 0, x_BL.shape[1] - 1), axis=1)
    return jnp.where(inside_BL, moved_BL, fill)


@functools.partial(
    jax.jit,
    static_argnames=("graphdef", "max_new_tokens", "temperature", "top_k", "top_p", "use_cache",
                     "eos_id", "pad_id"),
)
def _generate_loop(graphdef, state, source_BS, prefix_BT, key, start_B, source_lengths_B, *, max_new_tokens,
                   temperature, top_k, top_p, use_cache, eos_id, pad_id):
    """The compiled decode: prefix_BT -> [B, T + max_new_tokens] (T5: source_BS is the encoder input,
    of which row b reads its first source_lengths_B[b] tokens if given).

    Both paths run the model's one forward through `decode_step`: with the cache, each
    iteration feeds one token over the cache; without, each feeds the whole buffer to an
    empty cache of the buffer's length (the full forward, recomputed every step).
    start_B (GPT prompts of different lengths): row b's prompt is right-aligned, starting
    at slot start_B[b]; the cache counts its positions from there and hides the slots before.
    """
    model = nnx.merge(graphdef, state)
    b, t = prefix_BT.shape
    fill = 0 if pad_id is None else pad_id
    buffer_BL = jnp.full((b, t + max_new_tokens), fill, jnp.int32).at[:, :t].set(prefix_BT)
    # With the cache, the last token ever fed sits at position t + max_new_tokens - 2.
    length = t + max_new_tokens - (1 if use_cache else 0)
    empty = new_cache(model, source_BS, b, length, source_lengths_B).replace(start_B=start_B)
    cache = empty
    if use_cache and t > 1:  # prefill all but the last prompt token; the loop feeds that one
        _, cache = model.decode_step(prefix_BT[:, :-1], cache)

    def logits_after(buffer_BL, cache, last):
        """Logits for position last + 1, given the tokens up to `last` (fed: `last` only)."""
        if use_cache:
            token_B1 = jax.lax.dynamic_slice_in_dim(buffer_BL, last, 1, axis=1)
            logits_B1V, cache = model.decode_step(token_B1, cache)
            return logits_B1V[:, 0], cache
        logits_BLV, _ = model.decode_step(buffer_BL, empty)
        return jax.lax.dynamic_index_in_dim(logits_BLV, last, axis=1, keepdims=False), cache

    def cond(carry):
        i, _, _, done_B = carry
        return (i < max_new_tokens) & ~jnp.all(done_B)

    def body(carry):
        i, buffer_BL, cache, done_B = carry
        logits_BV, cache = logits_after(buffer_BL, cache, t + i - 1)
        token_B = sample_logits(logits_BV, jax.random.fold_in(key, i), temperature, top_k, top_p)
        if eos_id is not None:
            token_B = jnp.where(done_B, pad_id, token_B)
            done_B = done_B | (token_B == eos_id)
        buffer_BL = jax.lax.dynamic_update_slice(buffer_BL, token_B[:, None], (0, t + i))
        return i + 1, buffer_BL, cache, done_B

    carry = (jnp.zeros((), jnp.int32), buffer_BL, cache, jnp.zeros((b,), bool))
    return jax.lax.while_loop(cond, body, carry)[1]


def generate(
    model: GPT | T5,
    prompt_BT: jax.Array,
    max_new_tokens: int,
    key: jax.Array,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    use_cache: bool = True,
    eos_id: int | None = None,
    pad_id: int | None = None,
    prompt_lengths: jax.Array | None = None,
) -> jax.Array:
    """Sample `max_new_tokens` tokens after each prompt row; int32 [B, T + max_new_tokens].

    GPT: returns the prompt followed by the new tokens. T5: `prompt_BT` is the encoder
    input; decoding starts from `config.decoder_start_id` and the result is that start
    token followed by the new tokens, [B, 1 + max_new_tokens].

    prompt_lengths (int [B], each in [1, T]): row b's prompt is its first L_b tokens, the
    rest ignored. GPT: row b of the result is those L_b tokens and its new ones, as if
    generated alone (the same positions and keys), then `pad_id` (or 0) to the width.
    T5: the encoder reads only the first L_b tokens of each row.

    temperature 0 is greedy; otherwise tokens are drawn from softmax(logits / temperature)
    restricted to top_k and top_p (see `filter_logits`), step i with
    `fold_in(key, i)`, so a key reproduces its sample. After a row emits `eos_id` it
    emits `pad_id` (default: `config.pad_id`, else `eos_id`); the loop ends early once
    every row has. eos_id None: no stop for GPT, `config.eos_id` for T5. Dropout is
    off. use_cache=False recomputes the full forward at every step (the baseline).

    Refused: temperatures in (0, 1e-6) (`MIN_TEMPERATURE`); a GPT prompt holding
    `config.pad_id` within its real tokens (pass `prompt_lengths` for prompts of different
    lengths). A row whose logits are ever all NaN / -inf (`sample_logits` gives -1) raises
    FloatingPointError after the loop, naming the rows: no made-up tokens.
    """
    if not isinstance(model, (GPT, T5)):
        raise TypeError(f"generate supports GPT and T5 models, got {type(model).__name__}")
    config = model.config
    is_t5 = isinstance(model, T5)
    if not isinstance(max_new_tokens, int) or max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be an int >= 0, got {max_new_tokens!r}")
    check_sampling(temperature, top_k, top_p)
    prompt_BT = jnp.asarray(prompt_BT)
    check_tokens(prompt_BT, config.vocab_size, "encoder input" if is_t5 else "prompt")
    b, t = prompt_BT.shape
    if t < 1:
        raise ValueError("the prompt must hold at least one token")
    if t > config.max_len:
        raise ValueError(f"prompt length {t} exceeds the model's max_len={config.max_len}")
    if is_t5:
        eos_id = config.eos_id if eos_id is None else eos_id
        prefix_BT = jnp.full((b, 1), config.decoder_start_id, jnp.int32)
        source_BS = prompt_BT.astype(jnp.int32)
    else:
        prefix_BT, source_BS = prompt_BT.astype(jnp.int32), None
    length = prefix_BT.shape[1] + max_new_tokens
    if config.position == "learned" and length > config.max_len:
        raise ValueError(
            f"{'decoder start token' if is_t5 else f'prompt length {t}'} + max_new_tokens="
            f"{max_new_tokens} = {length} runs past max_len={config.max_len} of the learned "
            "position table"
        )
    if pad_id is None:
        pad_id = config.pad_id if config.pad_id is not None else eos_id
    for name, value in (("eos_id", eos_id), ("pad_id", pad_id)):
        if value is not None and not 0 <= value < config.vocab_size:
            raise ValueError(f"{name}={value} is outside the vocabulary [0, {config.vocab_size})")
    lengths_B = None if prompt_lengths is None else check_prompt_lengths(prompt_lengths, b, t)
    if not is_t5:  # a T5 encoder masks its pads, so right-padded inputs are how it batches
        check_no_pads(prompt_BT, config.pad_id, lengths_B)
    start_B = None if lengths_B is None or is_t5 else t - lengths_B
    fill = 0 if pad_id is None else pad_id
    if start_B is not None:
        prefix_BT = shift_rows(prefix_BT, start_B, fill)
    if max_new_tokens == 0:
        return prefix_BT if start_B is None else shift_rows(prefix_BT, -start_B, fill)
    graphdef, state = nnx.split(nnx.view(model, deterministic=True, raise_if_not_found=False))
    out_BL = _generate_loop(
        graphdef, state, source_BS, prefix_BT, key, start_B, lengths_B if is_t5 else None,
        max_new_tokens=max_new_tokens, temperature=float(temperature),
        top_k=None if top_k is None else int(top_k),
        top_p=None if top_p is None else float(top_p),
        use_cache=bool(use_cache), eos_id=eos_id, pad_id=pad_id,
    )
    check_finite_tokens(out_BL, prefix_BT.shape[1])
    return out_BL if start_B is None else shift_rows(out_BL, -start_B, fill)


def mnist_gpt_config(**changes) -> GPTConfig:
    """The GPT of the MNIST benchmark: 16 grey levels + BOS (16), 1 + 196 positions."""
    return GPTConfig(**{**dict(
        vocab_size=17, max_len=197, d_model=128, num_heads=4, num_layers=4, d_ff=512,
    ), **changes})


def benchmark(
    config: GPTConfig | None = None,
    batch: int = 16,
    new_tokens: int = 196,
    bos_id: int = 16,
    repeats: int = 3,
    temperature: float = 1.0,
) -> dict:
    """Tokens per second of `generate` with and without the cache, compile time excluded.

    Each path is called once to compile, then timed `repeats` times (to
    `block_until_ready`); the median counts. Returns the numbers as a dict.
    """
    config = mnist_gpt_config() if config is None else config
    model = GPT(config, rngs=nnx.Rngs(0))
    prompt_BT = jnp.full((batch, 1), bos_id, jnp.int32)
    result = {"batch": batch, "new_tokens": new_tokens, "repeats": repeats,
              "backend": jax.default_backend()}
    for use_cache in (True, False):
        run = functools.partial(generate, model, prompt_BT, new_tokens,
                                temperature=temperature, use_cache=use_cache)
        start = time.perf_counter()
        run(jax.random.key(0)).block_until_ready()
        first = time.perf_counter() - start
        times = []
        for r in range(repeats):
            start = time.perf_counter()
            run(jax.random.key(r + 1)).block_until_ready()
            times.append(time.perf_counter() - start)
        median = statistics.median(times)
        name = "cache" if use_cache else "no_cache"
        result[name] = {
            "median_s": median,
            "times_s": times,
            "compile_s": first - median,
            "tokens_per_s": batch * new_tokens / median,
        }
    result["speedup"] = result["no_cache"]["median_s"] / result["cache"]["median_s"]
    return result


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bench", action="store_true", help="time generate on the MNIST GPT")
    parser.add_argument("--batch", type=at_least(1), default=16)
    parser.add_argument("--new-tokens", type=at_least(1), default=196)
    parser.add_argument("--repeats", type=at_least(1), default=3)
    args = parser.parse_args(argv)
    if not args.bench:
        parser.error("nothing to do; pass --bench")
    print(json.dumps(benchmark(batch=args.batch, new_tokens=args.new_tokens, repeats=args.repeats),
                     indent=2))


if __name__ == "__main__":
    from txjax.hostmem import reuse_host_memory

    reuse_host_memory()  # before JAX runs anything: see txjax/hostmem.py
    main()
