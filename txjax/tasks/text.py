"""What the text tasks share: the run config, the corpus split, the tokenizer in run metadata, "_" prompts.

BERT masked-language modelling (`txjax.tasks.mlm`) and T5 span corruption
(`txjax.tasks.spans`) both read a corpus (a path or a `txjax.data` corpus name; by
default the packaged Shakespeare excerpt), build a character tokenizer with the
family's special tokens, hold out the last `heldout_fraction` of the text, and train
through `txjax.train.experiment.train_run`.
"""

from __future__ import annotations

import dataclasses
import re

import jax
import numpy as np
from flax import nnx

from txjax.data import BatchIterator, CharTokenizer, load_corpus, split_documents
from txjax.train.config import TrainConfig
from txjax.train.experiment import RunConfig, train_run
from txjax.train.loop import write_json
from txjax.train.multihost import is_lead
from txjax.train.plots import plot_loss_curve
from txjax.train.sharding import process_shard


PACKINGS = ("stream", "packed", "padded")


@dataclasses.dataclass(frozen=True)
class TextRunConfig(RunConfig):
    """The text run: corpus, sequence length, objective and evaluation."""

    corpus: str | None = None  # a UTF-8 file or a txjax.data corpus name; None: the packaged excerpt (the scripts pass ../shared/data/tinyshakespeare.txt when it is beside the repo)
    seq_len: int = 128  # tokens per example (BERT: with [CLS] and [SEP]; T5: encoder length)
    heldout_fraction: float = 0.1  # the last part of the corpus, never trained on
    heldout_examples: int = 256  # held-out examples scored at the end
    eval_batch_size: int = 64  # examples per held-out batch
    mask_rate: float = 0.15  # BERT: fraction of tokens chosen for prediction; T5: noise density
    mean_span: float = 3.0  # T5: mean corrupted-span length
    num_sentinels: int = 32  # T5: sentinel ids at the top of the vocabulary
    show: int = 3  # T5: held-out examples whose decoded spans are printed beside the truth
    packing: str = "stream"  # stream: the corpus as one token stream cut into rows (documents run across them); packed: its blank-line separated documents packed into rows with document ids (attention and positions kept per document); padded: one document per row

    def __post_init__(self):
        super().__post_init__()
        for name in ("seq_len", "heldout_examples", "eval_batch_size", "num_sentinels"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if not 0.0 < self.heldout_fraction < 1.0:
            raise ValueError(f"heldout_fraction must be in (0, 1), got {self.heldout_fraction}")
        if not 0.0 < self.mask_rate < 1.0:
            raise ValueError(f"mask_rate must be in (0, 1), got {self.mask_rate}")
        if self.mean_span < 1.0:
            raise ValueError(f"mean_span must be >= 1, got {self.mean_span}")
        if self.show < 0:
            raise ValueError(f"show must be >= 0, got {self.show}")
        if self.packing not in PACKINGS:
            raise ValueError(f"packing must be one of {PACKINGS}, got {self.packing!r}")


def corpus_split(run_cfg: TextRunConfig, family: str, num_sentinels: int | None = None):
    """(tokenizer, train ids, held-out ids, corpus name) with a char tokenizer for `family`."""
    name = run_cfg.corpus if run_cfg.corpus is not None else "default"
    text = load_corpus(name)
    tok = CharTokenizer.from_corpus(text, family=family, num_sentinels=num_sentinels)
    ids = tok.encode(text)
    cut = int(len(ids) * (1.0 - run_cfg.heldout_fraction))
    return tok, ids[:cut], ids[cut:], name


def corpus_documents(run_cfg: TextRunConfig, family: str, num_sentinels: int | None = None):
    """(tokenizer, train documents, held-out documents, corpus name): the corpus's documents
    (`txjax.data.split_documents`) as id arrays, the last `heldout_fraction` of them held out;
    the tokenizer is `corpus_split`'s."""
    name = run_cfg.corpus if run_cfg.corpus is not None else "default"
    text = load_corpus(name)
    tok = CharTokenizer.from_corpus(text, family=family, num_sentinels=num_sentinels)
    docs = [tok.encode(d) for d in split_documents(text)]
    cut = int(len(docs) * (1.0 - run_cfg.heldout_fraction))
    if not 0 < cut < len(docs):
        raise ValueError(f"corpus {name} has {len(docs)} documents (blank-line separated), too few to hold "
                         f"out {run_cfg.heldout_fraction:.0%} of them; use --packing stream")
    return tok, docs[:cut], docs[cut:], name


def first_rows(rows, n: int):
    """The first n rows of an array, or of each array of a dict of rows."""
    return {k: v[:n] for k, v in rows.items()} if isinstance(rows, dict) else rows[:n]


def describe_rows(rows) -> str:
    """"N rows", and the padding share when the rows hold documents (a dict with lengths)."""
    if not isinstance(rows, dict):
        return f"{len(rows)} rows"
    pad = 1.0 - rows["lengths"].sum() / rows["tokens"].size
    return f"{len(rows['tokens'])} rows ({pad:.1%} padding)"


def n_params(model) -> int:
    return sum(x.size for x in jax.tree.leaves(nnx.state(model, nnx.Param)))


def batches_of(examples: dict[str, np.ndarray], size: int) -> list[dict[str, np.ndarray]]:
    """Consecutive batches of `size` examples (a last partial batch is dropped)."""
    n = len(next(iter(examples.values())))
    return [{k: v[i: i + size] for k, v in examples.items()} for i in range(0, n - size + 1, size)]


def tokenizer_meta(tok: CharTokenizer) -> dict:
    """The tokenizer as saved in config.json and every checkpoint."""
    return {"tokenizer": {"kind": "char", "family": tok.family, "chars": "".join(tok.chars),
                          "num_sentinels": tok.num_sentinels}}


def train_with_held_out(model, loss_fn, transform, train_rows, held_rows, tok: CharTokenizer,
                        train_cfg: TrainConfig, run_cfg: TextRunConfig, *, stop_at=None, log=print):
    """train_run on `transform`ed rows, evaluated on one fixed transform of the held-out rows.

    Returns (stepper, state, fit summary, the held-out batch, final held-out metrics).
    """
    batches = BatchIterator(train_rows, train_cfg.batch_size, seed=train_cfg.seed, transform=transform,
                            shard=process_shard())
    held = transform(held_rows, np.random.default_rng([train_cfg.seed, 99]))  # one fixed masking
    held_batches = batches_of(held, run_cfg.eval_batch_size) or [held]

    def eval_fn(stepper, params):
        return stepper.evaluate(params, held_batches[: train_cfg.eval_batches])

    stepper, state, fit_summary = train_run(model, loss_fn, train_cfg, run_cfg, batches,
                                            extra_meta=tokenizer_meta(tok), eval_fn=eval_fn,
                                            stop_at=stop_at, log=log)
    return stepper, state, fit_summary, held, stepper.evaluate(stepper.eval_params(state), held_batches)


def tokenizer_from_meta(meta: dict) -> CharTokenizer:
    t = meta["tokenizer"]
    return CharTokenizer(list(t["chars"]), family=t["family"], num_sentinels=t["num_sentinels"])


def masked_prompt(text: str) -> list[tuple[str, int]]:
    """Split text into (chunk, masked-run length) pieces at runs of '_'."""
    return [(m.group(1), len(m.group(2))) for m in re.finditer(r"([^_]*)(_*)", text) if m.group(0)]


def encode_masked(tok: CharTokenizer, prompt: str, mask_run) -> list[int]:
    """The prompt's ids with each run k of '_' (length n) replaced by mask_run(k, n)."""
    ids: list[int] = []
    for k, (chunk, run) in enumerate(masked_prompt(prompt)):
        ids += tok.encode(chunk, unknown="unk").tolist()
        ids += mask_run(k, run) if run else []
    return ids


FROM_TOKENIZER = {name: "the character tokenizer built from the corpus sets it"
                  for name in ("vocab_size", "pad_id", "eos_id", "decoder_start_id")}
"""The model fields `with_vocab` sets: the text scripts refuse them as flags (txjax.train.cli `fixed`)."""


def with_vocab(model_cfg, vocab_size: int, **ids):
    """The config with the tokenizer's vocabulary and special ids (they come from the data)."""
    assert set(ids) | {"vocab_size"} <= set(FROM_TOKENIZER), ids
    return model_cfg.replace(vocab_size=vocab_size, **ids)


def check_len(model_cfg, length: int) -> None:
    if model_cfg.position == "learned" and model_cfg.max_len < length:
        raise ValueError(f"max_len={model_cfg.max_len} is shorter than the sequence length {length}")


def fit_numbers(fit_summary: dict) -> dict:
    return {"steps": fit_summary["steps"], "train_loss": fit_summary["train_loss"],
            "train_ms_per_step": fit_summary["ms_per_step"], "train_tokens_per_s": fit_summary["tokens_per_s"],
            "train_wall_s": fit_summary["wall_s"], "resumed_from": fit_summary["resumed_from"],
            "backend": jax.default_backend()}


def write_summary(run_cfg, summary: dict, ylabel: str) -> None:
    """loss.png and summary.json in the run folder (by process 0 alone, in a run of several)."""
    if not is_lead():
        return
    run_dir = run_cfg.run_dir
    plot_loss_curve(run_dir / "metrics.jsonl", run_dir / "loss.png", ylabel=ylabel)
    write_json(run_dir / "summary.json", summary)


__all__ = ["PACKINGS", "TextRunConfig", "batches_of", "corpus_documents", "corpus_split", "describe_rows", "first_rows", "encode_masked", "masked_prompt", "tokenizer_from_meta",
           "tokenizer_meta"]
