"""Training: AdamW, jitted train/eval steps over NNX split state, the loop, Orbax checkpoints.

- `TrainConfig`: every training setting, one commented field each.
- `make_optimizer`, `make_schedule`, `decay_mask`: AdamW, warmup + cosine, clipping; decay on kernels only.
- `Stepper`: splits a model once and jits `train_step(state, batch, key)` (state donated,
  gradient accumulation; `step_leaves` is the same step over the state's leaves, which `fit`
  keeps) and `eval_step(params, batch)`; `gpt_loss`, `bert_loss`, `t5_loss`.
- `fit`: the loop (metrics one step late, tqdm, metrics.jsonl, checkpoints, NaN stop);
  `train_run`: run folder + resume-or-start + fit.
- `Checkpointer`: Orbax checkpoints of the state plus JSON metadata (data position, configs, tokenizer).
"""

from txjax.train.checkpoint import CheckpointDamaged, Checkpointer, CheckpointMismatch
from txjax.train.config import TrainConfig
from txjax.train.experiment import RunConfig, train_run
from txjax.train.loop import NonFiniteLoss, RunDirError, fit, restore_or_init
from txjax.train.optim import decay_mask, make_optimizer, make_schedule
from txjax.train.steps import LossSums, Stepper, TrainState, bert_loss, gpt_loss, t5_loss, token_sums

__all__ = [
    "CheckpointDamaged",
    "CheckpointMismatch",
    "Checkpointer",
    "LossSums",
    "NonFiniteLoss",
    "RunConfig",
    "RunDirError",
    "Stepper",
    "TrainConfig",
    "TrainState",
    "bert_loss",
    "decay_mask",
    "fit",
    "gpt_loss",
    "make_optimizer",
    "make_schedule",
    "restore_or_init",
    "t5_loss",
    "token_sums",
    "train_run",
]
