"""Training settings: one frozen dataclass, a comment on every field, validated when made."""

from __future__ import annotations

import dataclasses

PARALLELISMS = ("none", "dp", "fsdp")
"""TrainConfig.parallelism: one device; data parallel; data parallel with sharded state (txjax.train.sharding)."""


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """How to train: optimizer, schedule, batching, logging and checkpoints."""

    # Optimizer (optax AdamW with global-norm clipping).
    learning_rate: float = 3e-4  # peak learning rate, reached at the end of warmup
    min_lr_ratio: float = 0.1  # the cosine decays to learning_rate * min_lr_ratio at the last step
    warmup_steps: int = 100  # linear warmup from 0 over this many steps
    weight_decay: float = 0.1  # AdamW decoupled decay, on dense kernels only (see make_optimizer)
    b1: float = 0.9  # Adam first-moment decay
    b2: float = 0.95  # Adam second-moment decay
    eps: float = 1e-8  # Adam denominator epsilon
    grad_clip: float = 1.0  # clip gradients to this global L2 norm; 0 disables clipping
    ema_decay: float = 0.0  # 0: off; else keep an exponential moving average of the parameters (Polyak averaging, debiased; PixelCNN++ used 0.9995) and evaluate, score and sample with it
    relative_bias_lr_multiplier: float = 1.0  # the learned relative position biases (T5's bucket table, FIRE, KERPLE) learn at learning_rate times this: under Adam a bias moves ~lr a step, too slowly for a short run to make attention local (BUILD.md, "CPU presets")
    # Steps and batches.
    steps: int = 1000  # optimizer steps in the whole run (the schedule's length)
    batch_size: int = 64  # examples per optimizer step, summed over micro-batches
    grad_accum: int = 1  # micro-batches per step; batch_size must be divisible by it
    seed: int = 0  # seeds the parameters, the data order and dropout
    # Devices (txjax.train.sharding).
    parallelism: str = "none"  # "none": one device; "dp": batch split over all devices; "fsdp": params and Adam moments split too
    # Logging, evaluation and checkpoints.
    log_every: int = 10  # append a metrics.jsonl row every this many steps
    eval_every: int = 0  # evaluate on held-out batches every this many steps; 0: only at the end
    eval_batches: int = 8  # held-out batches per evaluation during training
    checkpoint_every: int = 200  # save a checkpoint every this many steps (and always at the end)
    keep_checkpoints: int = 2  # newest checkpoints kept on disk
    progress: bool = True  # show a tqdm progress bar on stderr
    tensorboard: bool = True  # also write metrics.jsonl's rows and the run's plots as TensorBoard events in the run folder (needs tensorboardX)

    # Fields that may change when a run resumes: they do not alter the trajectory.
    RESUMABLE_CHANGES = ("log_every", "eval_every", "eval_batches", "checkpoint_every",
                         "keep_checkpoints", "progress", "tensorboard")

    def __post_init__(self):
        positive = ("learning_rate", "relative_bias_lr_multiplier", "steps", "batch_size", "grad_accum", "log_every",
                    "eval_batches", "checkpoint_every", "keep_checkpoints")
        for name in positive:
            value = getattr(self, name)
            if not value > 0:
                raise ValueError(f"TrainConfig.{name} must be > 0, got {value!r}")
        for name in ("warmup_steps", "weight_decay", "grad_clip", "eps", "seed", "eval_every"):
            if getattr(self, name) < 0:
                raise ValueError(f"TrainConfig.{name} must be >= 0, got {getattr(self, name)!r}")
        if not 0.0 <= self.ema_decay < 1.0:
            raise ValueError(f"TrainConfig.ema_decay must be in [0, 1), got {self.ema_decay!r}")
        for name in ("b1", "b2", "min_lr_ratio"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"TrainConfig.{name} must be in [0, 1], got {getattr(self, name)!r}")
        if self.parallelism not in PARALLELISMS:
            raise ValueError(f"TrainConfig.parallelism={self.parallelism!r} is not one of {PARALLELISMS}")
        if self.batch_size % self.grad_accum:
            raise ValueError(
                f"TrainConfig.batch_size={self.batch_size} is not divisible by "
                f"grad_accum={self.grad_accum}"
            )

    @property
    def micro_batch_size(self) -> int:
        return self.batch_size // self.grad_accum

    def replace(self, **changes) -> "TrainConfig":
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)
