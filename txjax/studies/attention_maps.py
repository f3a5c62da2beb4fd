"""Attention maps: the weights of every head of one self-attention layer, recomputed from the model.

`layer_attention` runs the stack up to the chosen block with the model's own modules,
then forms that block's queries and keys (after its norm, with RoPE where the model
uses it) and its mask plus relative bias (T5, ALiBi), and applies
`txjax.ops.attention_weights`; nothing in the model is changed. Row t of head n is
the distribution over the tokens that token t attends to (the picture of Jurafsky &
Martin's attention chapter). GPT and BERT are supported, and T5's encoder.
"""

from __future__ import annotations

import dataclasses
import itertools
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from txjax import GPT, T5, Bert, ops
from txjax.config import GPTConfig
from txjax.studies.common import init_params, pyplot
from txjax.studies.length import LengthStudyConfig, corpus_ids, lm_batches
from txjax.tasks.sample import load_run
from txjax.tasks.text import tokenizer_from_meta
from txjax.train.config import TrainConfig
from txjax.train.loop import fit
from txjax.train.steps import Stepper, gpt_loss


@dataclasses.dataclass(frozen=True)
class AttentionMapConfig:
    """Which model, which input and which layer to draw."""

    run_dir: str | None = None  # a run folder of a train_*.py script with a char tokenizer; None: train a small char GPT first
    text: str = "ROMEO: But soft, what light through yonder window breaks?"  # the input, one token per character
    layer: int = 0  # the block whose self-attention is drawn (0 = first)
    train_steps: int = 300  # without run_dir: steps of the char GPT trained on the corpus
    corpus: str | None = None  # without run_dir: a corpus file or name; None: the packaged excerpt (the script passes ../shared/data/tinyshakespeare.txt when it is beside the repo)
    out: str = "docs/results/attention_maps/attention_layer0.png"  # the PNG to write

    def __post_init__(self):
        if self.layer < 0 or self.train_steps < 0 or not self.text:
            raise ValueError("layer >= 0, train_steps >= 0 and a non-empty text are required")


def stack_and_inputs(model, tokens_BT: jax.Array):
    """(stack, x_BTD entering its first block, valid_BT or None, positions_T) for GPT, BERT or T5's encoder."""
    positions_T = jnp.arange(tokens_BT.shape[1])
    if isinstance(model, GPT):
        x = model.decoder.embed_positions(model.embed(tokens_BT), positions_T)
        return model.decoder, x, model.valid(tokens_BT), positions_T
    if isinstance(model, Bert):
        return model.encoder, model.embed_tokens(tokens_BT), model.valid(tokens_BT), positions_T
    if isinstance(model, T5):
        x = model.encoder.embed_positions(model.embed(tokens_BT), positions_T)
        return model.encoder, x, model.encoder_valid(tokens_BT), positions_T
    raise TypeError(f"attention maps need a GPT, Bert or T5, got {type(model).__name__}")


def layer_attention(model, tokens_BT: jax.Array, layer: int) -> jax.Array:
    """weights_BNTS of self-attention in block `layer` (dropout is not applied: use an eval model).

    The blocks below run as in the model; block `layer`'s queries and keys come from its own
    `qkv`, so the weights are those its `__call__` applies.
    """
    stack, x_BTD, valid_BT, positions_T = stack_and_inputs(model, tokens_BT)
    if not 0 <= layer < len(stack.blocks):
        raise ValueError(f"layer {layer} is outside 0 .. {len(stack.blocks) - 1}")
    bias = stack.self_bias(positions_T, positions_T, valid_BT)
    rotary = dict(rotary=stack.positions.rotary, positions=positions_T)
    for block in stack.blocks[:layer]:
        x_BTD, _ = block(x_BTD, bias, **rotary)
    block = stack.blocks[layer]
    h_BTD = block.self_norm(x_BTD) if block.pre else x_BTD
    q_BTNH, k_BSNH, _, _ = block.self_attn.qkv(h_BTD, **rotary)
    return ops.attention_weights(q_BTNH, k_BSNH, bias, block.self_attn.scale)


def plot_heads(weights_NTS: np.ndarray, labels: list[str], path: str | Path, title: str) -> Path:
    """One heat map per head: row = query token, column = key token it attends to."""
    plt = pyplot()
    n = weights_NTS.shape[0]
    cols = max(1, int(np.ceil(np.sqrt(n))))
    rows = -(-n // cols)
    size = max(3.0, 0.14 * len(labels) + 1.0)
    fig, axes = plt.subplots(rows, cols, figsize=(size * cols, size * rows), squeeze=False)
    shown = [repr(c)[1:-1] if c.strip() else "␣" for c in labels]
    for i, ax in enumerate(axes.flat):
        if i >= n:
            ax.axis("off")
            continue
        im = ax.imshow(weights_NTS[i], cmap="viridis", vmin=0.0, interpolation="nearest")
        fig.colorbar(im, ax=ax, fraction=0.046, pad=0.02)
        ax.set_title(f"head {i} (colour scale per head)", fontsize=9)
        ax.set_xticks(range(len(shown)), shown, fontsize=5, rotation=90)
        ax.set_yticks(range(len(shown)), shown, fontsize=5)
        ax.set_xlabel("key (attended to)", fontsize=7)
        ax.set_ylabel("query", fontsize=7)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return Path(path)


def train_char_gpt(model_cfg: GPTConfig, train_cfg: TrainConfig, cfg: AttentionMapConfig, log=print):
    """(model, tokenizer): a char GPT trained for cfg.train_steps on the corpus (the length study's data)."""
    study = LengthStudyConfig(corpus=cfg.corpus, train_len=model_cfg.max_len, multiples="1",
                              eval_tokens=model_cfg.max_len)
    tok, train_ids, _, name = corpus_ids(study)
    model_cfg = model_cfg.replace(vocab_size=tok.vocab_size)
    train_cfg = train_cfg.replace(steps=max(cfg.train_steps, 1))
    stepper = Stepper(GPT(model_cfg), gpt_loss, train_cfg)
    t0 = time.time()
    state, loss = stepper.init_state(), float("nan")
    if cfg.train_steps:
        batch_fn = lm_batches(train_ids, model_cfg.max_len, train_cfg.batch_size, train_cfg.seed)
        state, summary = fit(stepper, stepper.init_state(init_params(GPT, model_cfg, train_cfg.seed)),
                             map(batch_fn, itertools.count()), key=jax.random.key(train_cfg.seed))
        loss = summary["train_loss"]
    log(f"trained a {model_cfg.position} char GPT on {name} for {cfg.train_steps} steps in {time.time() - t0:.0f}s, "
        f"final loss {loss:.3f} nats")
    return stepper.model(state.params), tok


def draw(model_cfg: GPTConfig, train_cfg: TrainConfig, cfg: AttentionMapConfig, log=print) -> Path:
    """Load or train the model, encode cfg.text, and write the PNG of layer cfg.layer."""
    if cfg.run_dir is not None:
        model, meta, step = load_run(cfg.run_dir)
        if "tokenizer" not in meta:
            raise ValueError(f"{cfg.run_dir} has no character tokenizer in its metadata")
        tok = tokenizer_from_meta(meta)
        what = f"{type(model).__name__} from {cfg.run_dir} at step {step}"
    else:
        model, tok = train_char_gpt(model_cfg, train_cfg, cfg, log)
        what = f"char GPT ({model.config.position}), {cfg.train_steps} steps"
    ids = tok.encode(cfg.text, unknown="unk") if tok.unk_id is not None else tok.encode(cfg.text)
    if isinstance(model, Bert):
        ids = np.concatenate([[tok.cls_id], ids, [tok.sep_id]])
    labels = [tok.id_to_token(int(i)) for i in ids]
    weights_BNTS = layer_attention(model, jnp.asarray(ids[None], jnp.int32), cfg.layer)
    path = plot_heads(np.asarray(weights_BNTS[0]), labels, cfg.out, f"{what}: layer {cfg.layer} self-attention")
    log(f"wrote {path}")
    return path
