"""One top-level model per family, and the one registry of families."""

from txjax.models.bert import Bert
from txjax.models.gpt import GPT
from txjax.models.t5 import T5

MODELS = {"gpt": GPT, "bert": Bert, "t5": T5}
"""config.family -> model class: every family-keyed lookup (hf, sampling, bench) uses this."""

__all__ = ["Bert", "GPT", "MODELS", "T5"]
