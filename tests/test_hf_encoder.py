"""Encoder-only BERT checkpoints (BertModel, with and without the pooler): txjax.hf against transformers.

The torch-free tests check what is loaded and written; the parity tests build tiny random
transformers models, as test_hf_parity.py does, and compare hidden states and the pooler
output with padding (pad tokens in the input, the same positions masked by attention_mask).
"""

import json
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

pytest.importorskip("safetensors")
from safetensors.numpy import load_file  # noqa: E402

from txjax import Bert, BertConfig, cost, hf  # noqa: E402

jax.config.update("jax_numpy_rank_promotion", "raise")

ATOL = 1e-4
V, D, N, L, F = 97, 64, 4, 2, 128
B, T = 3, 11
TINY = dict(vocab_size=V, max_len=32, d_model=D, num_heads=N, num_layers=L, d_ff=F)


def perturbed_bert(head: str) -> Bert:
    from test_hf import perturbed

    return perturbed(Bert(BertConfig(**TINY, head=head)))


def padded_inputs(seed: int = 0):
    """Ids in [1, V) right-padded with [PAD] = 0 to lengths T, T - 4, T - 7; segment ids; real mask."""
    rng = np.random.default_rng(seed)
    real = np.arange(T)[None, :] < np.array([T, T - 4, T - 7])[:, None]
    return np.where(real, rng.integers(1, V, (B, T)), 0), rng.integers(0, 2, (B, T)), real


# ----------------------------------------------------------------------------- without torch


@pytest.mark.parametrize("head", ["pooler", "none"])
def test_encoder_bert_returns_hidden_states_and_saves_as_bertmodel(head, tmp_path):
    model = perturbed_bert(head)
    ids, segments, _ = padded_inputs()
    h = model(jnp.asarray(ids), jnp.asarray(segments))
    assert h.shape == (B, T, D)
    np.testing.assert_array_equal(h, model.encode(jnp.asarray(ids), jnp.asarray(segments)))
    hf.save_pretrained(model, str(tmp_path))
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["architectures"] == ["BertModel"]
    keys = set(load_file(str(tmp_path / "model.safetensors")))
    assert "embeddings.word_embeddings.weight" in keys and not any(k.startswith(("bert.", "cls.")) for k in keys)
    assert ("pooler.dense.weight" in keys) == (head == "pooler")
    loaded = hf.from_pretrained(str(tmp_path))
    assert loaded.config == model.config and loaded.config.head == head
    np.testing.assert_array_equal(loaded(jnp.asarray(ids), jnp.asarray(segments)), h)
    if head == "pooler":
        pooled = model.pooled(h)
        assert pooled.shape == (B, D)
        np.testing.assert_allclose(pooled, jnp.tanh(h[:, 0] @ model.pooler.dense.kernel[...]
                                                    + model.pooler.dense.bias[...][None]), atol=1e-6)
        np.testing.assert_array_equal(loaded.pooled(h), pooled)
    else:
        with pytest.raises(ValueError, match="head='pooler'"):
            model.pooled(h)


def test_mlm_checkpoint_read_as_an_encoder_on_request(tmp_path):
    mlm = perturbed_bert("mlm")
    hf.save_pretrained(mlm, str(tmp_path))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the MLM head left unread is not an "unused tensor"
        encoder = hf.from_pretrained(str(tmp_path), head="none")
    assert encoder.config == mlm.config.replace(head="none") and encoder.mlm is None
    tokens = jnp.asarray(padded_inputs()[0])
    np.testing.assert_array_equal(encoder(tokens), mlm.encode(tokens))
    assert hf.from_pretrained(str(tmp_path)).config.head == "mlm"
    with pytest.raises(hf.CheckpointError, match=r"bert\.pooler\.dense\.weight.*no pooler head.*head='none'"):
        hf.from_pretrained(str(tmp_path), head="pooler")
    from txjax import GPT, GPTConfig

    hf.save_pretrained(GPT(GPTConfig(**TINY)), str(tmp_path / "gpt"))
    with pytest.raises(ValueError, match="BERT checkpoints only"):
        hf.from_pretrained(str(tmp_path / "gpt"), head="none")


def test_head_is_a_validated_config_field_the_cost_model_and_cli_know():
    from txjax.train.cli import field_docs

    with pytest.raises(ValueError, match="head='cls'"):
        BertConfig(head="cls")
    assert "pooler" in field_docs(BertConfig)["head"]
    counts = {h: cost.param_count(BertConfig.bert_base(head=h)) for h in ("mlm", "pooler", "none")}
    # bert-base-uncased as transformers counts BertModel: 109,482,240 with the pooler.
    assert counts == {"mlm": 109_514_298, "pooler": 109_482_240, "none": 109_482_240 - 768 * 769}


def test_a_bert_run_saved_before_head_existed_resumes_as_mlm():
    from txjax.train.checkpoint import CheckpointMismatch, check_compatible

    current = BertConfig(**TINY).to_dict()
    old = {k: v for k, v in current.items() if k != "head"}
    check_compatible({"model": old}, {"model": (current, ())}, "runs/r")
    with pytest.raises(CheckpointMismatch, match="model.head: 'none' -> 'mlm'"):
        check_compatible({"model": {**old, "head": "none"}}, {"model": (current, ())}, "runs/r")


def test_cli_prints_an_encoders_sentence_embedding(tmp_path, capsys):
    from txjax.hf.cli import main

    model = perturbed_bert("pooler")
    hf.save_pretrained(model, str(tmp_path))
    assert main([str(tmp_path), "--prompt-ids", "2", "7", "9", "3"]) == 0
    h = np.asarray(model(jnp.asarray([[2, 7, 9, 3]])))[0].mean(0)
    assert f"hidden states (4, {D}); mean-pooled, L2-normalized embedding [{h[0] / np.linalg.norm(h):.4f}, " in (
        capsys.readouterr().out)


# ----------------------------------------------------------------------------- parity with transformers


@pytest.fixture(scope="module")
def bert_model_folder(tmp_path_factory):
    """pooler: bool -> (transformers BertModel, the folder it saved), every parameter perturbed."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    cache = {}

    def get(pooler: bool):
        if pooler not in cache:
            torch.manual_seed(0)
            config = transformers.BertConfig(vocab_size=V, hidden_size=D, num_attention_heads=N, num_hidden_layers=L,
                                             intermediate_size=F, max_position_embeddings=32)
            model = transformers.BertModel(config, add_pooling_layer=pooler)
            with torch.no_grad():
                for p in model.parameters():
                    p.add_(0.1 * torch.randn_like(p))
            folder = tmp_path_factory.mktemp(f"bertmodel_pooler_{pooler}")
            model.eval().save_pretrained(str(folder))
            cache[pooler] = (model, folder)
        return cache[pooler]

    return get


def hf_outputs(model, ids, segments, real):
    import torch

    with torch.no_grad():
        out = model(input_ids=torch.tensor(ids), attention_mask=torch.tensor(real.astype(np.int64)),
                    token_type_ids=torch.tensor(segments))
    pooled = None if out.pooler_output is None else out.pooler_output.numpy()
    return out.last_hidden_state.numpy(), pooled


@pytest.mark.parametrize("pooler", [True, False])
def test_hidden_states_and_pooler_output_match_transformers_bertmodel(pooler, bert_model_folder):
    ref, folder = bert_model_folder(pooler)
    model = hf.from_pretrained(str(folder))
    assert model.config.head == ("pooler" if pooler else "none")
    ids, segments, real = padded_inputs()
    want_h, want_pooled = hf_outputs(ref, ids, segments, real)
    h = model(jnp.asarray(ids), jnp.asarray(segments))
    diff = float(np.abs(np.asarray(h) - want_h).max())
    print(f"pooler={pooler}: max |hidden diff| = {diff:.2e}")
    assert diff <= ATOL
    if pooler:
        assert float(np.abs(np.asarray(model.pooled(h)) - want_pooled).max()) <= ATOL


@pytest.mark.parametrize("pooler", [True, False])
def test_bertmodel_to_txjax_to_bertmodel_keeps_every_tensor(pooler, bert_model_folder, tmp_path):
    import transformers

    ref, folder = bert_model_folder(pooler)
    hf.save_pretrained(hf.from_pretrained(str(folder)), str(tmp_path))
    original, written = load_file(str(folder / "model.safetensors")), load_file(str(tmp_path / "model.safetensors"))
    assert sorted(written) == sorted(original)
    for key in original:
        np.testing.assert_array_equal(written[key], original[key], err_msg=key)
    again = transformers.BertModel.from_pretrained(str(tmp_path), add_pooling_layer=pooler).eval()
    ids, segments, real = padded_inputs(1)
    for a, b in zip(hf_outputs(again, ids, segments, real), hf_outputs(ref, ids, segments, real)):
        np.testing.assert_array_equal(a, b)


def test_bert_for_masked_lm_as_hidden_states_matches_its_encoder(tmp_path):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(1)
    ref = transformers.BertForMaskedLM(transformers.BertConfig(
        vocab_size=V, hidden_size=D, num_attention_heads=N, num_hidden_layers=L, intermediate_size=F,
        max_position_embeddings=32))
    with torch.no_grad():
        for p in ref.parameters():
            p.add_(0.1 * torch.randn_like(p))
    ref.eval().save_pretrained(str(tmp_path))
    model = hf.from_pretrained(str(tmp_path), head="none")
    ids, segments, real = padded_inputs(2)
    want, _ = hf_outputs(ref.bert, ids, segments, real)
    assert float(np.abs(np.asarray(model(jnp.asarray(ids), jnp.asarray(segments))) - want).max()) <= ATOL


def test_readme_sentence_embeddings_match_transformers(bert_model_folder):
    """Mean over real tokens, L2-normalized, then cosine similarities: the README's example."""
    ref, folder = bert_model_folder(True)
    model = hf.from_pretrained(str(folder))
    ids, segments, real = padded_inputs(3)
    h = model(jnp.asarray(ids))
    mask = jnp.asarray(ids != model.config.pad_id)[..., None]
    e = (h * mask).sum(1) / mask.sum(1)
    e = e / jnp.linalg.norm(e, axis=-1, keepdims=True)
    want_h, _ = hf_outputs(ref, ids, np.zeros_like(ids), real)
    want = (want_h * real[..., None]).sum(1) / real.sum(1, keepdims=True)
    want = want / np.linalg.norm(want, axis=-1, keepdims=True)
    np.testing.assert_allclose(np.asarray(e @ e.T), want @ want.T, atol=ATOL)
