"""Beam search and scoring: num_beams=1 is greedy, transformers' beam search is the oracle, score is a log_softmax gather.

The oracle models are tiny random GPT-2 and T5 built with transformers, saved and read
back with `txjax.hf`, every parameter perturbed so a mis-mapped tensor cannot hide. EOS
ids are taken from what the search emits without one, so the EOS path is really taken.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from txjax import GPT, T5, GPTConfig, T5Config, beam_search, generate, score

jax.config.update("jax_numpy_rank_promotion", "raise")

V, D, N, L, F = 97, 64, 4, 2, 128
STEPS = 8


def tiny_gpt(**changes):
    return GPT(GPTConfig(vocab_size=V, max_len=32, d_model=32, num_heads=2, num_layers=2, d_ff=64, **changes),
               rngs=nnx.Rngs(0))


def tiny_t5():
    return T5(T5Config(vocab_size=V, max_len=32, d_model=32, num_heads=2, num_layers=2, d_ff=64), rngs=nnx.Rngs(0))


def prompts(b=3, t=5, seed=0):
    return jnp.asarray(np.random.default_rng(seed).integers(1, V, (b, t)), jnp.int32)


@pytest.mark.parametrize("family", ["gpt", "t5"])
def test_one_beam_is_greedy(family):
    model, prompt = (tiny_gpt(), prompts()) if family == "gpt" else (tiny_t5(), prompts())
    want = generate(model, prompt, STEPS, jax.random.key(0), temperature=0.0)
    got, score_B = beam_search(model, prompt, STEPS, num_beams=1)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    assert score_B.shape == (3,) and bool(jnp.all(score_B < 0))


def test_one_beam_is_greedy_through_eos():
    model, prompt = tiny_gpt(), prompts()
    free = np.asarray(generate(model, prompt, STEPS, jax.random.key(0), temperature=0.0))
    eos = int(free[0, 5 + 2])
    want = generate(model, prompt, STEPS, jax.random.key(0), temperature=0.0, eos_id=eos)
    got, _ = beam_search(model, prompt, STEPS, num_beams=1, eos_id=eos)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


def test_bad_input_is_a_clear_error():
    model, prompt = tiny_gpt(), prompts()
    with pytest.raises(ValueError, match="num_beams"):
        beam_search(model, prompt, 4, num_beams=0)
    with pytest.raises(ValueError, match="max_new_tokens"):
        beam_search(model, prompt, -1, num_beams=2)
    with pytest.raises(ValueError, match="max_len"):
        beam_search(model, prompt, 40, num_beams=2)
    with pytest.raises(ValueError, match="mask shape"):
        score(model, prompt, prompt, mask_BC=jnp.ones((3, 2), bool))


def test_zero_new_tokens_returns_the_prompt():
    model, prompt = tiny_gpt(), prompts()
    tokens, score_B = beam_search(model, prompt, 0, num_beams=3)
    np.testing.assert_array_equal(np.asarray(tokens), np.asarray(prompt))
    np.testing.assert_array_equal(np.asarray(score_B), np.zeros(3))


def test_beam_search_compiles_once():
    from txjax import beam as beam_module

    model = tiny_gpt()
    beam_search(model, prompts(seed=1), STEPS, num_beams=3)
    size = beam_module._beam_loop._cache_size()
    beam_search(model, prompts(seed=2), STEPS, num_beams=3)
    assert beam_module._beam_loop._cache_size() == size


def test_score_is_the_log_prob_of_the_beam_and_beats_greedy():
    """With length_penalty 0 and no EOS every beam has the same length: the score is the log-prob
    of the returned sequence under `score`, and 4 beams find one at least as likely as greedy."""
    model, prompt = tiny_gpt(), prompts()
    s1 = beam_search(model, prompt, STEPS, num_beams=1, length_penalty=0.0)[1]
    tokens, s4 = beam_search(model, prompt, STEPS, num_beams=4, length_penalty=0.0)
    assert bool(jnp.all(s4 >= s1 - 1e-5))
    np.testing.assert_allclose(np.asarray(score(model, prompt, tokens[:, 5:]).total_B), np.asarray(s4), atol=1e-4)


# ----------------------------------------------------------------------------- scoring


def hand_score(logits_fn, targets_BC):
    logp_BCV = jax.nn.log_softmax(logits_fn().astype(jnp.float32), axis=-1)
    b, c = targets_BC.shape
    return np.array([[float(logp_BCV[i, j, targets_BC[i, j]]) for j in range(c)] for i in range(b)])


def test_score_matches_a_hand_loop_with_padding():
    model, prompt, cont = tiny_gpt(), prompts(t=4), prompts(t=5, seed=3)
    mask = jnp.arange(5)[None, :] < jnp.array([5, 3, 1])[:, None]
    out = score(model, prompt, cont, mask_BC=mask)
    full = jnp.concatenate([prompt, cont], axis=1)
    want = hand_score(lambda: model(full)[:, 3:8], cont) * np.asarray(mask)
    np.testing.assert_allclose(np.asarray(out.logp_BC), want, atol=1e-5)
    np.testing.assert_allclose(np.asarray(out.total_B), want.sum(1), atol=1e-5)
    # Padding tokens change nothing: row 1 alone, cut to its length, scores the same.
    alone = score(model, prompt[1:2], cont[1:2, :3])
    np.testing.assert_allclose(float(alone.total_B[0]), float(out.total_B[1]), atol=1e-5)


def test_score_t5_and_greedy_flag():
    model, enc = tiny_t5(), prompts(t=6)
    greedy = generate(model, enc, 4, jax.random.key(0), temperature=0.0, eos_id=V - 1)
    targets = greedy[:, 1:]
    out = score(model, enc, targets)
    dec = greedy[:, :-1]
    np.testing.assert_allclose(np.asarray(out.logp_BC), hand_score(lambda: model(enc, dec), targets), atol=1e-5)
    assert bool(jnp.all(out.greedy_B))
    other = targets.at[:, 0].set((targets[:, 0] + 1) % V)
    assert not bool(jnp.any(score(model, enc, other).greedy_B))


# ----------------------------------------------------------------------------- transformers as the oracle

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("safetensors")
from txjax import hf


def build_hf(family):
    torch.manual_seed(0)
    if family == "gpt2":
        config = transformers.GPT2Config(vocab_size=V, n_positions=32, n_embd=D, n_head=N, n_layer=L, n_inner=F,
                                         bos_token_id=None, eos_token_id=None)
        model = transformers.GPT2LMHeadModel(config)
    else:
        config = transformers.T5Config(vocab_size=V, d_model=D, num_heads=N, d_kv=D // N, num_layers=L, d_ff=F,
                                       feed_forward_proj="gated-gelu", tie_word_embeddings=False)
        model = transformers.T5ForConditionalGeneration(config)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return model.eval()


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    cache = {}

    def get(family):
        if family not in cache:
            hf_model = build_hf(family)
            folder = tmp_path_factory.mktemp(family)
            hf_model.save_pretrained(str(folder))
            cache[family] = (hf_model, hf.from_pretrained(str(folder)))
        return cache[family]

    return get


def hf_beam(hf_model, ids, mask, length_penalty, eos, pad, **extra):
    with torch.no_grad():
        out = hf_model.generate(torch.tensor(np.asarray(ids)), attention_mask=torch.tensor(np.asarray(mask)),
                                max_new_tokens=STEPS, num_beams=4, do_sample=False, length_penalty=length_penalty,
                                eos_token_id=eos, pad_token_id=pad, output_scores=True,
                                return_dict_in_generate=True, **extra)
    return out.sequences.numpy(), out.sequences_scores.numpy()


def until_eos(row, eos, start):
    """row up to and including its first EOS after the prefix (all of it without one)."""
    hits = [j for j in range(start, len(row)) if row[j] == eos]
    return row[: hits[0] + 1] if hits else row


def check_against_hf(model, hf_model, ids, mask, length_penalty, eos, **extra):
    pad = model.config.pad_id if model.config.pad_id is not None else eos
    want, want_score = hf_beam(hf_model, ids, mask, length_penalty, eos, pad, **extra)
    got, got_score = beam_search(model, jnp.asarray(ids), STEPS, 4, length_penalty=length_penalty, eos_id=eos)
    got, start = np.asarray(got), 1 if isinstance(model, T5) else ids.shape[1]
    # transformers crops to the longest returned beam and fills after EOS with `pad or eos`
    # (so with eos when the pad id is 0); ours keeps every row's width and fills with pad.
    for row_got, row_want in zip(got, want):
        real = until_eos(row_want, eos, start)
        np.testing.assert_array_equal(row_got[: len(real)], real)
        assert (row_got[len(real):] == pad).all()
    np.testing.assert_allclose(np.asarray(got_score), want_score, atol=1e-4, rtol=1e-5)
    return want


def check_with_reached_eos(model, hf_model, ids, mask, length_penalty, free, start, **extra):
    """Compare with EOS set to tokens the free search emits, until one ends a returned beam."""
    for eos in dict.fromkeys(free[:, start:].reshape(-1).tolist()):
        ended = check_against_hf(model, hf_model, ids, mask, length_penalty, eos, **extra)
        if (ended[:, start:] == eos).any():
            return eos
    pytest.fail("no emitted token, used as EOS, ends a returned beam")


@pytest.mark.parametrize("length_penalty", [1.0, 0.5])
def test_gpt2_beam_search_matches_transformers(pair, length_penalty):
    hf_model, model = pair("gpt2")
    ids = np.random.default_rng(5).integers(1, V, (3, 5))
    mask = np.ones_like(ids)
    free = check_against_hf(model, hf_model, ids, mask, length_penalty, None)
    assert free.shape == (3, 5 + STEPS)
    check_with_reached_eos(model, hf_model, ids, mask, length_penalty, free, 5)


@pytest.mark.parametrize("length_penalty", [1.0, 0.5])
def test_t5_beam_search_matches_transformers(pair, length_penalty):
    hf_model, model = pair("t5")
    ids = np.random.default_rng(6).integers(2, V, (3, 7))
    ids[1, 5:] = 0  # padded encoder input: the mask is ids != pad
    ids[2, 3:] = 0
    mask = (ids != 0).astype(np.int64)
    start = {"decoder_start_token_id": model.config.decoder_start_id}
    free = check_against_hf(model, hf_model, ids, mask, length_penalty, V - 1, **start)
    check_with_reached_eos(model, hf_model, ids, mask, length_penalty, free, 1, **start)
