"""Parity with transformers (PyTorch, CPU) as the oracle: logits, round trips, greedy decoding.

Small random Hugging Face models (2 layers, D 64) of each family are saved to a
temporary folder and loaded with txjax. Every parameter is perturbed first, so
biases and norm scales are not 0 and 1 and a mis-mapped tensor cannot hide.

Padding: BERT and T5 get an attention_mask equal to `ids != pad`, which is what
txjax's config.pad_id masking computes. GPT-2 has no padding mask in either
library; with right padding the causal mask already keeps real positions from
seeing the pad tokens after them, so GPT-2 logits are compared at real positions
only (left padding would also need shifted position ids, which neither model
takes here).
"""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("safetensors")
from safetensors.numpy import load_file  # noqa: E402

import txjax  # noqa: E402
from txjax import GPT, T5, Bert, BertConfig, GPTConfig, T5Config, hf  # noqa: E402

jax.config.update("jax_numpy_rank_promotion", "raise")

ATOL = 1e-4
V, D, N, L, F = 97, 64, 4, 2, 128
B, T = 3, 11


def hf_config(family: str, **changes):
    if family == "gpt2":
        return transformers.GPT2Config(
            vocab_size=V, n_positions=32, n_embd=D, n_head=N, n_layer=L, n_inner=F,
            bos_token_id=None, eos_token_id=None, **changes)
    if family == "bert":
        return transformers.BertConfig(
            vocab_size=V, hidden_size=D, num_attention_heads=N, num_hidden_layers=L,
            intermediate_size=F, max_position_embeddings=32, **changes)
    return transformers.T5Config(
        vocab_size=V, d_model=D, num_heads=N, d_kv=D // N, num_layers=L, d_ff=F, **changes)


HF_CLASSES = {
    "gpt2": "GPT2LMHeadModel", "bert": "BertForMaskedLM", "t5": "T5ForConditionalGeneration",
}

# name: (family, config changes, std of an independent lm_head or None, std of the embedding or None).
# The stds keep every case's logits of order 1..5, so ATOL tests the mapping, not float32 rounding.
CASES = {
    "gpt2": ("gpt2", {}, None, None),
    "gpt2_exact_gelu_untied": ("gpt2", {"activation_function": "gelu", "tie_word_embeddings": False}, 0.1, None),
    "bert": ("bert", {}, None, None),
    "bert_gelu_tanh": ("bert", {"hidden_act": "gelu_new", "layer_norm_eps": 1e-5}, None, None),
    "t5_v1_0": ("t5", {}, None, None),
    # Few buckets and a short max_distance, so T = 11 reaches the log buckets and the clamp.
    "t5_far_buckets": ("t5", {"relative_attention_num_buckets": 8, "relative_attention_max_distance": 6}, None, None),
    "t5_v1_1": ("t5", {"feed_forward_proj": "gated-gelu", "tie_word_embeddings": False}, 0.1, None),
    # transformers >= 5 builds tie_word_embeddings=False as a tied but unscaled head.
    "t5_tied_unscaled": ("t5", {"feed_forward_proj": "gated-gelu", "tie_word_embeddings": False}, None, 0.15),
    # A scaled (v1.0-style) head with its own weights: txjax folds d^-0.5 into it.
    "t5_scaled_untied": ("t5", {}, 1.0, None),
}


def build_hf(name: str, seed: int = 0):
    family, changes, head_std, embed_std = CASES[name]
    torch.manual_seed(seed)
    model = getattr(transformers, HF_CLASSES[family])(hf_config(family, **changes))
    with torch.no_grad():
        if head_std is not None:
            model.lm_head.weight = torch.nn.Parameter(head_std * torch.randn(V, D))
        if embed_std is not None:
            model.get_input_embeddings().weight.normal_(0.0, embed_std)
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return model.eval()


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """name -> (HF model, folder it was saved to), built on first use."""
    cache = {}

    def get(name):
        if name not in cache:
            model = build_hf(name)
            folder = tmp_path_factory.mktemp(name)
            model.save_pretrained(str(folder))
            cache[name] = (model, folder)
        return cache[name]

    return get


def inputs(seed: int = 0):
    """Token ids in [1, V) with rows right-padded by 0 to lengths T, T - 4, T - 7."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(1, V, (B, T))
    lengths = np.array([T, T - 4, T - 7])
    real = np.arange(T)[None, :] < lengths[:, None]
    return np.where(real, ids, 0), real


def hf_logits(model, ids, real, segments=None, dec=None):
    with torch.no_grad():
        if isinstance(model, transformers.T5ForConditionalGeneration):
            out = model(input_ids=torch.tensor(ids), attention_mask=torch.tensor(real.astype(np.int64)),
                        decoder_input_ids=torch.tensor(dec))
        elif isinstance(model, transformers.BertForMaskedLM):
            out = model(input_ids=torch.tensor(ids), attention_mask=torch.tensor(real.astype(np.int64)),
                        token_type_ids=torch.tensor(segments))
        else:
            out = model(input_ids=torch.tensor(ids))
    return out.logits.numpy()


def tx_logits(model, ids, segments=None, dec=None):
    if isinstance(model, T5):
        return np.asarray(model(jnp.asarray(ids), jnp.asarray(dec)))
    if isinstance(model, Bert):
        return np.asarray(model(jnp.asarray(ids), jnp.asarray(segments)))
    return np.asarray(model(jnp.asarray(ids)))


def compare(hf_model, tx_model, seed=0):
    """max |HF - txjax| over the positions that must agree."""
    ids, real = inputs(seed)
    rng = np.random.default_rng(seed + 1)
    segments = rng.integers(0, 2, ids.shape)
    dec = rng.integers(1, V, (B, 6))
    dec[:, 0] = 0  # decoder_start_token_id = pad, as T5 does
    want = hf_logits(hf_model, ids, real, segments, dec)
    got = tx_logits(tx_model, ids, segments, dec)
    assert want.shape == got.shape
    if isinstance(tx_model, GPT):
        return float(np.abs(want - got)[real].max())
    return float(np.abs(want - got).max())


# ----------------------------------------------------------------------------- logits


@pytest.mark.parametrize("name", CASES)
def test_logits_match_transformers(name, saved):
    hf_model, folder = saved(name)
    model = hf.from_pretrained(str(folder))
    diff = compare(hf_model, model)
    print(f"{name}: max |logits diff| = {diff:.2e}")
    assert diff <= ATOL


def test_structure_of_loaded_models(saved):
    assert hf.from_pretrained(str(saved("t5_v1_1")[1])).config.tie_embeddings is False
    assert hf.from_pretrained(str(saved("t5_v1_0")[1])).config.tie_embeddings is True
    gpt = hf.from_pretrained(str(saved("gpt2_exact_gelu_untied")[1]))
    assert (gpt.config.activation, gpt.config.tie_embeddings) == ("gelu", False)


def test_pytorch_model_bin_is_accepted(saved, tmp_path):
    hf_model, folder = saved("bert")
    torch.save(hf_model.state_dict(), tmp_path / "pytorch_model.bin")  # holds the tied copies too
    (tmp_path / "config.json").write_text((folder / "config.json").read_text())
    assert compare(hf_model, hf.from_pretrained(str(tmp_path))) <= ATOL


# ----------------------------------------------------------------------------- round trips


@pytest.mark.parametrize("name", ["gpt2", "bert", "t5_v1_0", "t5_v1_1"])
def test_hf_to_txjax_to_hf_keeps_every_tensor(name, saved, tmp_path):
    hf_model, folder = saved(name)
    hf.save_pretrained(hf.from_pretrained(str(folder)), str(tmp_path))
    original, written = load_file(str(folder / "model.safetensors")), load_file(str(tmp_path / "model.safetensors"))
    assert sorted(written) == sorted(original)
    for key in original:
        np.testing.assert_array_equal(written[key], original[key], err_msg=key)
    reloaded = getattr(transformers, HF_CLASSES[CASES[name][0]]).from_pretrained(str(tmp_path)).eval()
    assert compare(reloaded, hf.from_pretrained(str(folder))) <= ATOL


TXJAX_MODELS = {
    "gpt": lambda: GPT(GPTConfig(vocab_size=V, max_len=32, d_model=D, num_heads=N, num_layers=L, d_ff=F,
                                 activation="gelu_tanh", tie_embeddings=False)),
    "bert": lambda: Bert(BertConfig(vocab_size=V, max_len=32, d_model=D, num_heads=N, num_layers=L, d_ff=F)),
    "t5": lambda: T5(T5Config(vocab_size=V, max_len=32, d_model=D, num_heads=N, num_layers=L, d_ff=F,
                              attention_scale=1.0)),
    "t5_gated_untied": lambda: T5(T5Config(vocab_size=V, max_len=32, d_model=D, num_heads=N, num_layers=L,
                                           num_decoder_layers=3, d_ff=F, head_dim=8, attention_scale=1.0,
                                           activation="gelu_tanh", gated=True, tie_embeddings=False)),
}


@pytest.mark.parametrize("name", TXJAX_MODELS)
def test_txjax_model_saved_is_loaded_by_transformers_with_the_same_logits(name, tmp_path):
    from test_hf import perturbed

    model = perturbed(TXJAX_MODELS[name](), scale=0.1)
    hf.save_pretrained(model, str(tmp_path))
    family = json.loads((tmp_path / "config.json").read_text())["model_type"]
    hf_model = getattr(transformers, HF_CLASSES[family]).from_pretrained(str(tmp_path)).eval()
    diff = compare(hf_model, model)
    print(f"{name}: max |logits diff| = {diff:.2e}")
    assert diff <= ATOL


# ----------------------------------------------------------------------------- parameter counts


def hf_count(cls_name: str, config) -> int:
    with torch.device("meta"):
        return getattr(transformers, cls_name)(config).num_parameters()


@pytest.mark.slow
def test_full_size_counts_equal_transformers_on_the_meta_device():
    from test_hf import BERT_BASE_UNCASED, GPT2, T5_SMALL, n_params

    counts = {}
    for cls_name, config_name, published in (
        ("GPT2LMHeadModel", "GPT2Config", GPT2),
        ("BertForMaskedLM", "BertConfig", BERT_BASE_UNCASED),
        ("T5ForConditionalGeneration", "T5Config", T5_SMALL),
    ):
        want = hf_count(cls_name, getattr(transformers, config_name)(**published))
        assert n_params(hf.config_from_hf(published)) == want, cls_name
        counts[cls_name] = want
    assert counts == {"GPT2LMHeadModel": 124_439_808, "BertForMaskedLM": 109_514_298,
                      "T5ForConditionalGeneration": 60_506_624}


# ----------------------------------------------------------------------------- greedy decoding


def greedy_loop(model, prompt_BT, steps, enc_BS=None):
    """Token by token argmax over the full forward (no cache): the reference decoder.

    One jitted forward over a fixed [B, T + steps] buffer; position t's logits do
    not depend on the unwritten tail, because the (decoder) attention is causal.
    """
    from flax import nnx

    graphdef, state = nnx.split(model)

    @jax.jit
    def logits_fn(state, buffer_BL):
        m = nnx.merge(graphdef, state)
        return m(jnp.asarray(enc_BS), buffer_BL) if enc_BS is not None else m(buffer_BL)

    t = prompt_BT.shape[1]
    buffer_BL = jnp.zeros((prompt_BT.shape[0], t + steps), jnp.int32).at[:, :t].set(prompt_BT)
    for i in range(t, t + steps):
        nxt_B = jnp.argmax(logits_fn(state, buffer_BL)[:, i - 1], axis=-1)
        buffer_BL = buffer_BL.at[:, i].set(nxt_B.astype(jnp.int32))
    return np.asarray(buffer_BL)


def until_eos(row, eos):
    row = list(row)
    return row[: row.index(eos) + 1] if eos in row else row


@pytest.mark.slow
def test_gpt2_greedy_generation_matches_transformers(saved):
    hf_model, folder = saved("gpt2")
    model = hf.from_pretrained(str(folder))
    prompt = np.random.default_rng(2).integers(1, V, (2, 5))
    with torch.no_grad():
        want = hf_model.generate(torch.tensor(prompt), attention_mask=torch.ones(2, 5, dtype=torch.long),
                                 max_new_tokens=10, do_sample=False, num_beams=1, pad_token_id=0).numpy()
    assert want.shape == (2, 15)
    np.testing.assert_array_equal(greedy_loop(model, prompt, 10), want)
    got = txjax.generate(model, jnp.asarray(prompt), 10, jax.random.key(0), temperature=0.0)
    np.testing.assert_array_equal(np.asarray(got), want)


@pytest.mark.slow
def test_t5_greedy_generation_matches_transformers(saved):
    hf_model, folder = saved("t5_v1_1")
    model = hf.from_pretrained(str(folder))
    ids, real = inputs(4)
    with torch.no_grad():
        want = hf_model.generate(torch.tensor(ids), attention_mask=torch.tensor(real.astype(np.int64)),
                                 max_new_tokens=10, do_sample=False, num_beams=1,
                                 decoder_start_token_id=model.config.decoder_start_id).numpy()
    start = np.full((B, 1), model.config.decoder_start_id)
    eos = model.config.eos_id
    loop = greedy_loop(model, start, 10, enc_BS=ids)
    cached = np.asarray(txjax.generate(model, jnp.asarray(ids), 10, jax.random.key(0), temperature=0.0))
    # transformers stops once every row has emitted eos and pads after it; compare up to eos.
    for row_want, row_loop, row_cached in zip(want, loop, cached):
        assert until_eos(row_loop, eos) == until_eos(row_want, eos)
        assert until_eos(row_cached, eos) == until_eos(row_want, eos)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["t5_v1_1"])
def test_cli_compare_runs_transformers_on_the_same_input(name, saved, capsys):
    from txjax.hf.cli import main

    _, folder = saved(name)
    assert main([str(folder), "--prompt-ids", "4", "8", "9", "1", "--max-new-tokens", "3", "--compare"]) == 0
    line = [s for s in capsys.readouterr().out.splitlines() if s.startswith("max |logits")][0]
    assert float(line.split("=")[1]) <= ATOL
