"""Beam search against transformers' `generate(num_beams=4)`: the same sequences and `sequences_scores`.

The oracle models are tiny random GPT-2 and T5 built with transformers, saved and read
back with `txjax.hf`, every parameter perturbed so a mis-mapped tensor cannot hide. EOS
ids are taken from what the search emits without one, so the EOS path is really taken.
Needs the `.[parity]` extra (torch, transformers); a plain `.[test]` install skips this file.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from txjax import T5, beam_search

jax.config.update("jax_numpy_rank_promotion", "raise")

V, D, N, L, F = 97, 64, 4, 2, 128
STEPS = 8

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
