"""One top-level model per family."""

from txjax.models.bert import Bert
from txjax.models.gpt import GPT
from txjax.models.t5 import T5

__all__ = ["Bert", "GPT", "T5"]
