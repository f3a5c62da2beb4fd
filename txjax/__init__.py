"""txjax: BERT, GPT and T5 from pure JAX functions, composed into Flax NNX modules."""

from txjax.config import BertConfig, GPTConfig, T5Config, TransformerConfig
from txjax.models import GPT, T5, Bert
from txjax.decoding import generate
from txjax.beam import beam_search
from txjax.scoring import score

__all__ = ["Bert", "BertConfig", "GPT", "GPTConfig", "T5", "T5Config", "TransformerConfig", "beam_search",
           "generate", "score"]
__version__ = "0.1.0"
