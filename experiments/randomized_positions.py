"""Randomized positions (Ruoss et al. 2023): per-token accuracy beyond the training lengths, per encoding.

Their algorithmic tasks, each position encoding with and without random positions.

    python experiments/randomized_positions.py --preset cpu
    python experiments/randomized_positions.py --tasks reverse_string --positions rope --seeds 1 --steps 100
    python experiments/randomized_positions.py --help

Intentionally kept short: the logic lives in txjax.studies.randomized, where tests reach it.
"""

from __future__ import annotations

import sys

from txjax.studies.randomized import RandomizedConfig, run_study
from txjax.train.cli import build_parser, parse_configs
from txjax.train.config import TrainConfig
from txjax.train.experiment import cpu_compute_dtype

# The paper's optimizer: optax.adam at a constant 1e-3 (its default betas 0.9, 0.999), gradients
# clipped to norm 1, no weight decay.
PAPER_OPTIMIZER = dict(learning_rate=1e-3, warmup_steps=0, min_lr_ratio=1.0, weight_decay=0.0, b2=0.999,
                       progress=False)

PRESETS = {
    # Their example.py, sized for one accelerator: 10k steps of 128, every encoding, tested to 500,
    # ALiBi and RoPE randomized as their code does, training rows padded to multiples of 8 (not yet run).
    "default": {
        "train": TrainConfig(steps=10_000, batch_size=128, **PAPER_OPTIMIZER),
        "study": RandomizedConfig(positions="sinusoidal,learned,rope,t5,alibi,fire,kerple,none",
                                  test_max=500, test_step=10, eval_examples=512, train_width_multiple=8,
                                  random_positions_form="theirs", out_dir="runs/randomized_positions"),
    },
    # 2 idle CPU cores: the same model on a quarter of the batch and a fifth of the steps, tested to
    # 100, on the three tasks with the shortest rows and two encodings; training rows padded to
    # multiples of 8. Its 36 runs took 64 core-minutes (32 min on two cores) on an idle 2-core AMX
    # Xeon (2026-12-05; docs/results/README.md, "How they were run"). The committed
    # docs/results/randomized_positions/ table padded every row to the widest: --train_width_multiple 0.
    # bfloat16 matmuls where the CPU has bfloat16 dot instructions (~1.3x faster steps with AMX, the
    # same table: docs/results/README.md, "The studies in bfloat16"), float32 elsewhere.
    "cpu": {
        "train": TrainConfig(steps=2_000, batch_size=32, **PAPER_OPTIMIZER),
        "study": RandomizedConfig(tasks="reverse_string,parity_check,modular_arithmetic",
                                  positions="rope,sinusoidal", train_width_multiple=8,
                                  dtype=cpu_compute_dtype()[0]),
    },
}


def make_parser(configs):
    return build_parser(
        __doc__.splitlines()[0],
        {"train": ("training (TrainConfig)", configs["train"]),
         "study": ("study (RandomizedConfig)", configs["study"])},
        presets=list(PRESETS), default_preset="cpu",
    )


def main(argv=None) -> dict:
    _, cfg = parse_configs(make_parser, PRESETS, argv, "cpu")
    return run_study(cfg["train"], cfg["study"])


if __name__ == "__main__":
    from txjax.hostmem import reuse_host_memory

    reuse_host_memory()  # before JAX runs anything: see txjax/hostmem.py
    main(sys.argv[1:])
