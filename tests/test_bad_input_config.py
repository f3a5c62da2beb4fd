"""Bad config values fail when the config is made (issue 15), in one line naming the field, the value and the rule."""

import pytest

from txjax.config import BertConfig, ExecutionConfig, GPTConfig, T5Config

TINY = dict(vocab_size=8, max_len=8, d_model=8, num_heads=2, num_layers=1, d_ff=16)
NAN = float("nan")


@pytest.mark.parametrize("cls", [GPTConfig, BertConfig, T5Config])
@pytest.mark.parametrize("changes, match", [
    (dict(head_dim=0), r"head_dim must be a positive int or None, got 0"),
    (dict(head_dim=-2), r"head_dim must be a positive int or None, got -2"),
    (dict(head_dim=2.5), r"head_dim must be a positive int or None, got 2.5"),
    (dict(norm_eps=0.0), r"norm_eps must be a finite number > 0, got 0.0"),
    (dict(norm_eps=-1e-5), r"norm_eps must be a finite number > 0, got -1e-05"),
    (dict(norm_eps=NAN), r"norm_eps must be a finite number > 0, got nan"),
    (dict(rope_base=0.0), r"rope_base must be a finite number > 1, got 0.0"),
    (dict(rope_base=1.0), r"rope_base must be a finite number > 1, got 1.0"),
    (dict(rope_base=float("inf")), r"rope_base must be a finite number > 1, got inf"),
    (dict(attention_scale=NAN), r"attention_scale must be a finite number > 0 or None, got nan"),
    (dict(attention_scale=0.0), r"attention_scale must be a finite number > 0 or None, got 0.0"),
    (dict(num_buckets=3), r"num_buckets=3 must be an int >= 4"),
    (dict(num_buckets=32.0), r"num_buckets=32.0 must be an int >= 4"),
    (dict(max_distance=16), r"max_distance=16 > num_buckets // 2 = 16"),
    (dict(pad_id=8), r"pad_id=8 is outside the vocabulary \[0, 8\)"),
    (dict(pad_id=-1), r"pad_id=-1 is outside the vocabulary \[0, 8\)"),
])
def test_bad_model_config_values_are_refused(cls, changes, match):
    with pytest.raises(ValueError, match=match):
        cls(**TINY, **changes)


@pytest.mark.parametrize("cls, changes, match", [
    (BertConfig, dict(type_vocab_size=0), r"BertConfig.type_vocab_size must be a positive int, got 0"),
    (BertConfig, dict(type_vocab_size=-1), r"type_vocab_size must be a positive int, got -1"),
    (T5Config, dict(eos_id=8), r"eos_id=8 is outside the vocabulary \[0, 8\)"),
    (T5Config, dict(eos_id=-1), r"eos_id=-1 is outside the vocabulary \[0, 8\)"),
    (T5Config, dict(decoder_start_id=99), r"decoder_start_id=99 is outside the vocabulary \[0, 8\)"),
    (T5Config, dict(decoder_start_id=-1), r"decoder_start_id=-1 is outside the vocabulary"),
    (T5Config, dict(num_decoder_layers=0), r"num_decoder_layers must be a positive int or None, got 0"),
])
def test_bad_family_config_values_are_refused(cls, changes, match):
    with pytest.raises(ValueError, match=match):
        cls(**TINY, **changes)


@pytest.mark.parametrize("size", [0, -1, True, 2.5])
def test_bad_causal_block_size_is_refused(size):
    """0 and -1 were already refused; True (an int to Python) and 2.5 now are too."""
    with pytest.raises(ValueError, match=f"causal_block_size must be a positive int or None, got {size!r}"):
        ExecutionConfig(causal_block_size=size)


def test_the_presets_and_defaults_still_pass():
    for config in (GPTConfig(), BertConfig(), T5Config(), GPTConfig.gpt2_small(), BertConfig.bert_base(),
                   T5Config.t5_small(), T5Config(**TINY, head_dim=4, attention_scale=1.0, rope_base=2.0)):
        assert config.replace() == config
