"""txjax.hf without torch: config mapping, full-size counts, txjax round trips, bad input.

Parity with transformers itself is in test_hf_parity.py.
"""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

pytest.importorskip("safetensors")
from safetensors.numpy import load_file, save_file  # noqa: E402

from txjax import GPT, T5, Bert, BertConfig, GPTConfig, T5Config  # noqa: E402
from txjax import hf  # noqa: E402

jax.config.update("jax_numpy_rank_promotion", "raise")

# config.json of the published checkpoints (fields that matter), as on the Hub.
GPT2 = {
    "model_type": "gpt2", "activation_function": "gelu_new", "attn_pdrop": 0.1, "embd_pdrop": 0.1,
    "resid_pdrop": 0.1, "bos_token_id": 50256, "eos_token_id": 50256, "layer_norm_epsilon": 1e-05,
    "n_ctx": 1024, "n_embd": 768, "n_head": 12, "n_layer": 12, "n_positions": 1024, "vocab_size": 50257,
}
BERT_BASE_UNCASED = {
    "model_type": "bert", "attention_probs_dropout_prob": 0.1, "hidden_act": "gelu",
    "hidden_dropout_prob": 0.1, "hidden_size": 768, "intermediate_size": 3072, "layer_norm_eps": 1e-12,
    "max_position_embeddings": 512, "num_attention_heads": 12, "num_hidden_layers": 12, "pad_token_id": 0,
    "position_embedding_type": "absolute", "type_vocab_size": 2, "vocab_size": 30522,
}
T5_SMALL = {
    "model_type": "t5", "d_ff": 2048, "d_kv": 64, "d_model": 512, "decoder_start_token_id": 0,
    "dropout_rate": 0.1, "eos_token_id": 1, "layer_norm_epsilon": 1e-06, "n_positions": 512,
    "num_heads": 8, "num_layers": 6, "pad_token_id": 0, "relative_attention_num_buckets": 32,
    "vocab_size": 32128,
}
T5_V1_1_SMALL = {
    "model_type": "t5", "d_ff": 1024, "d_kv": 64, "d_model": 512, "decoder_start_token_id": 0,
    "dropout_rate": 0.1, "eos_token_id": 1, "feed_forward_proj": "gated-gelu", "layer_norm_epsilon": 1e-06,
    "num_decoder_layers": 8, "num_heads": 6, "num_layers": 8, "pad_token_id": 0,
    "relative_attention_num_buckets": 32, "tie_word_embeddings": False, "vocab_size": 32128,
}

TINY = dict(vocab_size=61, max_len=16, d_model=32, num_heads=4, num_layers=2, d_ff=64)
SMALL_MODELS = {
    "gpt": lambda: GPT(GPTConfig(**TINY, activation="gelu_tanh")),
    "gpt_untied": lambda: GPT(GPTConfig(**TINY, tie_embeddings=False, attention_scale=1.0)),
    "bert": lambda: Bert(BertConfig(**TINY)),
    "t5": lambda: T5(T5Config(**TINY, attention_scale=1.0)),
    "t5_v1_1": lambda: T5(T5Config(**TINY, attention_scale=1.0, activation="gelu_tanh", gated=True,
                                   tie_embeddings=False, num_decoder_layers=3, head_dim=12)),
}


def n_params(config) -> int:
    cls = {"gpt": GPT, "bert": Bert, "t5": T5}[config.family]
    abstract = nnx.eval_shape(lambda: cls(config, rngs=nnx.Rngs(0)))
    return sum(int(np.prod(x.shape)) for x in jax.tree.leaves(nnx.state(abstract, nnx.Param)))


def perturbed(model, seed=0, scale=0.1):
    """The model with noise on every parameter, so biases and norm scales are not 0 and 1."""
    rng = np.random.default_rng(seed)
    params = {p: v + scale * rng.standard_normal(v.shape).astype(np.float32)
              for p, v in hf.parameters(model).items()}
    return replace_params(model, params)


def replace_params(model, params):
    state = nnx.state(model, nnx.Param)
    nnx.replace_by_pure_dict(state, _unflatten(params))
    nnx.update(model, state)
    return model


def _unflatten(flat):
    from flax import traverse_util

    return traverse_util.unflatten_dict({p: jnp.asarray(v) for p, v in flat.items()})


def forward(model, seed=0):
    rng = np.random.default_rng(seed)
    tokens = jnp.asarray(rng.integers(1, model.config.vocab_size, (2, 7)), jnp.int32)
    tokens = tokens.at[1, 5:].set(0)
    if isinstance(model, T5):
        return model(tokens, tokens.at[:, 0].set(model.config.decoder_start_id))
    return model(tokens)


# ----------------------------------------------------------------------------- configs


def test_published_configs_map_to_the_presets():
    assert hf.config_from_hf(GPT2) == GPTConfig.gpt2_small(dropout=0.1)
    assert hf.config_from_hf(BERT_BASE_UNCASED) == BertConfig.bert_base(dropout=0.1)
    assert hf.config_from_hf(T5_SMALL) == T5Config.t5_small(dropout=0.1)
    v11 = hf.config_from_hf(T5_V1_1_SMALL)
    assert (v11.gated, v11.activation, v11.tie_embeddings, v11.num_heads, v11.head_size) == (
        True, "gelu_tanh", False, 6, 64)


@pytest.mark.slow
def test_full_size_parameter_counts_by_eval_shape():
    assert n_params(hf.config_from_hf(GPT2)) == 124_439_808
    # BertForMaskedLM as transformers counts it: no pooler, decoder tied to the embedding.
    assert n_params(hf.config_from_hf(BERT_BASE_UNCASED)) == 109_514_298
    assert n_params(hf.config_from_hf(T5_SMALL)) == 60_506_624


def test_t5_v1_1_count_matches_the_formula_from_its_config():
    c = T5_V1_1_SMALL
    d, inner, f, v = c["d_model"], c["num_heads"] * c["d_kv"], c["d_ff"], c["vocab_size"]
    attn, ffn = 4 * d * inner, 3 * d * f  # q k v o; wi_0 wi_1 wo
    encoder = c["num_layers"] * (attn + ffn + 2 * d) + d
    decoder = c["num_decoder_layers"] * (2 * attn + ffn + 3 * d) + d
    relative = 2 * c["relative_attention_num_buckets"] * c["num_heads"]
    expected = 2 * v * d + encoder + decoder + relative  # shared + untied lm_head
    assert expected == 76_961_152
    assert n_params(hf.config_from_hf(T5_V1_1_SMALL)) == expected


def test_mt5_reads_as_t5_v1_1():
    assert hf.config_from_hf({**T5_V1_1_SMALL, "model_type": "mt5"}) == hf.config_from_hf(T5_V1_1_SMALL)


@pytest.mark.parametrize("name", SMALL_MODELS)
def test_config_survives_to_hf_and_back(name):
    config = SMALL_MODELS[name]().config
    again = hf.config_from_hf(json.loads(json.dumps(hf.config_to_hf(config))))
    assert again == config


# ----------------------------------------------------------------------------- round trips


@pytest.mark.parametrize("name", SMALL_MODELS)
def test_save_then_load_gives_the_same_parameters_and_logits(name, tmp_path):
    model = perturbed(SMALL_MODELS[name]())
    hf.save_pretrained(model, str(tmp_path))
    assert sorted(os.listdir(tmp_path)) == ["config.json", "model.safetensors"]
    loaded = hf.from_pretrained(str(tmp_path))
    assert type(loaded) is type(model) and loaded.config == model.config
    want, got = hf.parameters(model), hf.parameters(loaded)
    assert want.keys() == got.keys()
    for path in want:
        np.testing.assert_array_equal(got[path], want[path], err_msg=str(path))
    np.testing.assert_array_equal(forward(loaded), forward(model))


def test_gpt2_file_layout_is_conv1d_with_fused_qkv(tmp_path):
    model = perturbed(SMALL_MODELS["gpt"]())
    hf.save_pretrained(model, str(tmp_path))
    tensors = load_file(str(tmp_path / "model.safetensors"))
    attn = model.decoder.blocks[1].self_attn
    fused = np.concatenate([np.asarray(attn.q.kernel[...]), np.asarray(attn.k.kernel[...]),
                            np.asarray(attn.v.kernel[...])], axis=1)
    np.testing.assert_array_equal(tensors["transformer.h.1.attn.c_attn.weight"], fused)
    assert "lm_head.weight" not in tensors  # tied
    ffn = model.decoder.blocks[0].ffn
    np.testing.assert_array_equal(tensors["transformer.h.0.mlp.c_fc.weight"], np.asarray(ffn.wi.kernel[...]))


def test_t5_file_layout_is_torch_linear_with_relative_bias_in_layer_0(tmp_path):
    model = perturbed(SMALL_MODELS["t5_v1_1"]())
    hf.save_pretrained(model, str(tmp_path))
    tensors = load_file(str(tmp_path / "model.safetensors"))
    block = model.decoder.blocks[2]
    np.testing.assert_array_equal(tensors["decoder.block.2.layer.1.EncDecAttention.k.weight"],
                                  np.asarray(block.cross_attn.k.kernel[...]).T)
    np.testing.assert_array_equal(tensors["decoder.block.2.layer.2.DenseReluDense.wi_1.weight"],
                                  np.asarray(block.ffn.wg.kernel[...]).T)
    np.testing.assert_array_equal(tensors["encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight"],
                                  np.asarray(model.encoder.positions.relative.table[...]))
    assert not any("relative_attention_bias" in k for k in tensors if ".block.0." not in k)
    config = json.loads((tmp_path / "config.json").read_text())
    assert (config["feed_forward_proj"], config["tie_word_embeddings"], config["scale_decoder_outputs"]) == (
        "gated-gelu", False, False)


def test_loaded_model_is_in_eval_mode_and_can_train(tmp_path):
    hf.save_pretrained(GPT(GPTConfig(**TINY, dropout=0.5)), str(tmp_path))
    model = hf.from_pretrained(str(tmp_path))
    tokens = jnp.ones((1, 6), jnp.int32)
    np.testing.assert_array_equal(model(tokens), model(tokens))
    model.train()
    assert not np.allclose(model(tokens), model(tokens))


def test_bare_model_keys_legacy_names_and_buffers_are_accepted(tmp_path):
    """The Hub's gpt2 has no `transformer.` prefix and keeps attn.bias mask buffers."""
    model = perturbed(SMALL_MODELS["gpt"]())
    hf.save_pretrained(model, str(tmp_path))
    tensors = load_file(str(tmp_path / "model.safetensors"))
    bare = {k.removeprefix("transformer."): v for k, v in tensors.items()}
    bare["h.0.attn.bias"] = np.tril(np.ones((1, 1, 16, 16), np.float32))
    save_file(bare, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    np.testing.assert_array_equal(forward(hf.from_pretrained(str(tmp_path))), forward(model))


def test_bert_gamma_beta_names_and_tied_decoder_are_accepted(tmp_path):
    model = perturbed(SMALL_MODELS["bert"]())
    hf.save_pretrained(model, str(tmp_path))
    tensors = load_file(str(tmp_path / "model.safetensors"))
    legacy = {k.replace("LayerNorm.weight", "LayerNorm.gamma").replace("LayerNorm.bias", "LayerNorm.beta"): v
              for k, v in tensors.items()}
    legacy["cls.predictions.decoder.weight"] = tensors["bert.embeddings.word_embeddings.weight"]
    legacy["bert.pooler.dense.weight"] = np.zeros((32, 32), np.float32)
    save_file(legacy, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    np.testing.assert_array_equal(forward(hf.from_pretrained(str(tmp_path))), forward(model))


def test_bfloat16_checkpoint_loads_as_float32(tmp_path):
    import ml_dtypes

    model = perturbed(SMALL_MODELS["bert"]())
    hf.save_pretrained(model, str(tmp_path))
    edit_tensors(tmp_path, lambda t: t.update({k: v.astype(ml_dtypes.bfloat16) for k, v in t.items()}))
    loaded = hf.parameters(hf.from_pretrained(str(tmp_path)))
    for path, value in hf.parameters(model).items():
        assert loaded[path].dtype == np.float32
        np.testing.assert_array_equal(loaded[path], value.astype(ml_dtypes.bfloat16).astype(np.float32))


def test_sharded_safetensors_are_read(tmp_path):
    model = perturbed(SMALL_MODELS["t5"]())
    hf.save_pretrained(model, str(tmp_path))
    tensors = load_file(str(tmp_path / "model.safetensors"))
    os.remove(tmp_path / "model.safetensors")
    keys = sorted(tensors)
    shards = {"model-00001-of-00002.safetensors": keys[::2], "model-00002-of-00002.safetensors": keys[1::2]}
    for name, names in shards.items():
        save_file({k: tensors[k] for k in names}, str(tmp_path / name), metadata={"format": "pt"})
    index = {"weight_map": {k: name for name, names in shards.items() for k in names}}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    np.testing.assert_array_equal(forward(hf.from_pretrained(str(tmp_path))), forward(model))


# ----------------------------------------------------------------------------- bad input


@pytest.fixture
def gpt_folder(tmp_path):
    hf.save_pretrained(GPT(GPTConfig(**TINY)), str(tmp_path))
    return tmp_path


def edit_config(folder, **changes):
    config = json.loads((folder / "config.json").read_text())
    config.update(changes)
    (folder / "config.json").write_text(json.dumps(config))


def edit_tensors(folder, fn):
    tensors = load_file(str(folder / "model.safetensors"))
    fn(tensors)
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})


def test_other_model_type_is_refused(gpt_folder):
    edit_config(gpt_folder, model_type="llama")
    with pytest.raises(hf.UnsupportedConfigError, match="model_type='llama'.*gpt2.*bert.*t5"):
        hf.from_pretrained(str(gpt_folder))


def test_missing_tensor_is_named(gpt_folder):
    edit_tensors(gpt_folder, lambda t: t.pop("transformer.h.1.mlp.c_fc.bias"))
    with pytest.raises(hf.CheckpointError, match=r"1 tensor\(s\) missing.*transformer\.h\.1\.mlp\.c_fc\.bias"):
        hf.from_pretrained(str(gpt_folder))


def test_misshaped_tensor_is_named_with_both_shapes(gpt_folder):
    def cut(t):
        t["transformer.h.0.attn.c_attn.weight"] = t["transformer.h.0.attn.c_attn.weight"][:, :90]
    edit_tensors(gpt_folder, cut)
    with pytest.raises(hf.CheckpointError, match=r"transformer\.h\.0\.attn\.c_attn\.weight has shape \(32, 90\), "
                                                 r"expected \(32, 96\)"):
        hf.from_pretrained(str(gpt_folder))


def test_config_and_weights_that_disagree_name_the_tensors(gpt_folder):
    edit_config(gpt_folder, n_layer=3)
    with pytest.raises(hf.CheckpointError, match=r"transformer\.h\.2\.ln_1\.weight"):
        hf.from_pretrained(str(gpt_folder))


def test_unused_tensor_is_named_in_a_warning(gpt_folder):
    edit_tensors(gpt_folder, lambda t: t.update({"transformer.h.0.adapter.weight": np.zeros(3, np.float32)}))
    with pytest.warns(UserWarning, match=r"transformer\.h\.0\.adapter\.weight"):
        hf.from_pretrained(str(gpt_folder))


@pytest.mark.parametrize("changes,match", [
    ({"scale_attn_by_inverse_layer_idx": True}, "scale_attn_by_inverse_layer_idx=True"),
    ({"activation_function": "quick_gelu"}, "activation_function='quick_gelu'"),
    ({"model_type": "bert", "position_embedding_type": "relative_key"}, "position_embedding_type='relative_key'"),
    ({"model_type": "bert", "is_decoder": True}, "is_decoder=True"),
    ({"model_type": "t5", "feed_forward_proj": "gated-quick_gelu"}, "feed_forward_proj='quick_gelu'"),
    ({"model_type": "t5", "feed_forward_proj": "relu-gelu"}, "feed_forward_proj='relu-gelu'"),
])
def test_unsupported_options_are_named(changes, match):
    base = {"gpt2": GPT2, "bert": BERT_BASE_UNCASED, "t5": T5_SMALL}[changes.get("model_type", "gpt2")]
    with pytest.raises(hf.UnsupportedConfigError, match=match):
        hf.config_from_hf({**base, **changes})


def test_untied_bert_decoder_is_refused(tmp_path):
    hf.save_pretrained(Bert(BertConfig(**TINY)), str(tmp_path))
    edit_tensors(tmp_path, lambda t: t.update({"cls.predictions.decoder.weight": np.ones((61, 32), np.float32)}))
    with pytest.raises(hf.CheckpointError, match="cls.predictions.decoder.weight differs"):
        hf.from_pretrained(str(tmp_path))


def test_folder_without_weights_or_config(tmp_path):
    with pytest.raises(FileNotFoundError, match="no config.json"):
        hf.from_pretrained(str(tmp_path))
    (tmp_path / "config.json").write_text(json.dumps(GPT2))
    with pytest.raises(hf.CheckpointError, match="no weights found"):
        hf.from_pretrained(str(tmp_path))


@pytest.mark.parametrize("changes,match", [
    ({"position": "rope"}, "position='rope'"),
    ({"norm": "rms"}, "norm='rms'"),
    ({"use_bias": False}, "use_bias=False"),
    ({"attention_scale": 0.5}, "attention_scale=0.5"),
])
def test_saving_what_gpt2_cannot_express_is_refused(changes, match, tmp_path):
    with pytest.raises(hf.UnsupportedConfigError, match=match):
        hf.save_pretrained(GPT(GPTConfig(**{**TINY, **changes})), str(tmp_path))
    assert not os.listdir(tmp_path)


# ----------------------------------------------------------------------------- command line


def word_tokenizer(folder, vocab_size):
    """A tokenizer.json of words w0 .. w{V-1}, with [MASK] as id 5."""
    tokenizers = pytest.importorskip("tokenizers")
    vocab = {f"w{i}": i for i in range(vocab_size) if i != 5}
    vocab["[MASK]"] = 5
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="w3"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.WhitespaceSplit()
    tok.add_special_tokens(["[MASK]"])
    tok.save(str(folder / "tokenizer.json"))


def test_cli_continues_a_gpt_prompt_given_as_text(tmp_path, capsys):
    from txjax import generate
    from txjax.hf.cli import main

    model = perturbed(SMALL_MODELS["gpt"](), scale=0.3)
    hf.save_pretrained(model, str(tmp_path))
    word_tokenizer(tmp_path, TINY["vocab_size"])
    assert main([str(tmp_path), "--text", "w7 w8 w9", "--max-new-tokens", "4"]) == 0
    out = capsys.readouterr().out
    want = np.asarray(generate(model, jnp.asarray([[7, 8, 9]]), 4, jax.random.key(0), temperature=0.0))[0]
    assert "input  [7, 8, 9]" in out
    assert f"output {[int(t) for t in want[3:]]}" in out
    assert "text   'w7 w8 w9 " + " ".join(f"w{t}" for t in want[3:]) + "'" in out


def test_cli_fills_bert_masks_and_refuses_text_without_tokenizer(tmp_path, capsys):
    from txjax.hf.cli import main

    model = perturbed(SMALL_MODELS["bert"]())
    hf.save_pretrained(model, str(tmp_path))
    with pytest.raises(SystemExit, match="no tokenizer.json"):
        main([str(tmp_path), "--text", "w1 [MASK] w2"])
    word_tokenizer(tmp_path, TINY["vocab_size"])
    main([str(tmp_path), "--text", "w1 [MASK] w2", "--top", "3"])
    out = capsys.readouterr().out
    best = np.argsort(-np.asarray(model(jnp.asarray([[1, 5, 2]])))[0, 1])[:3]
    assert "position 1: " + "  ".join(f"w{b}" for b in best) in out
    assert "position 0" not in out


def test_from_pretrained_takes_an_execution_config(tmp_path):
    """How the loaded model runs is the caller's choice; what it computes is the checkpoint's."""
    from txjax.config import ExecutionConfig

    hf.save_pretrained(GPT(GPTConfig(**TINY, activation="gelu_tanh"), rngs=nnx.Rngs(0)), str(tmp_path))
    plain = hf.from_pretrained(str(tmp_path))
    other = hf.from_pretrained(str(tmp_path), execution=ExecutionConfig(attention_impl="xla", causal_block_size=None))
    assert other.execution.attention_impl == "xla" and plain.execution == ExecutionConfig()
    tokens = jnp.asarray([[1, 2, 3, 4]], jnp.int32)
    np.testing.assert_allclose(other(tokens), plain(tokens), atol=1e-5)
