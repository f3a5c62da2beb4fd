"""Copy and reverse (Kazemnejad et al. 2023): exact match in and out of distribution per position encoding.

A decoder-only (GPT) and an encoder-decoder (T5) model per encoding, trained on short rows, tested on longer ones.

    python experiments/synthetic_tasks.py --preset cpu
    python experiments/synthetic_tasks.py --families gpt --tasks copy --positions none,rope --steps 100
    python experiments/synthetic_tasks.py --help

Intentionally kept short: the logic lives in txjax.studies.synthetic, where tests reach it.
"""

from __future__ import annotations

import sys

from txjax.studies.synthetic import SyntheticConfig, run_study
from txjax.train.cli import build_parser, parse_configs
from txjax.train.config import TrainConfig
from txjax.train.experiment import cpu_compute_dtype

PRESETS = {
    # Sized for one accelerator: wider models, a longer budget (not yet run on one).
    "default": {
        "train": TrainConfig(learning_rate=1e-3, warmup_steps=200, steps=10000, batch_size=64,
                             weight_decay=0.01, progress=False),
        "study": SyntheticConfig(d_model=256, num_heads=8, num_layers=4, d_ff=1024, check_every=500,
                                 out_dir="runs/synthetic"),
    },
    # Sized for 2 idle CPU cores: each run stops once it reaches 95% in distribution, else at 3,000 steps.
    # bfloat16 matmuls where the CPU has bfloat16 dot instructions (~1.3x faster steps with AMX, the
    # same table: docs/results/README.md, "The studies in bfloat16"), float32 elsewhere.
    "cpu": {
        "train": TrainConfig(learning_rate=3e-3, warmup_steps=50, steps=3000, batch_size=32,
                             weight_decay=0.01, progress=False),
        "study": SyntheticConfig(dtype=cpu_compute_dtype()[0]),
    },
}


def make_parser(configs):
    return build_parser(
        __doc__.splitlines()[0],
        {"train": ("training (TrainConfig)", configs["train"]),
         "study": ("study (SyntheticConfig)", configs["study"])},
        presets=list(PRESETS), default_preset="cpu",
    )


def main(argv=None) -> dict:
    _, cfg = parse_configs(make_parser, PRESETS, argv, "cpu")
    return run_study(cfg["train"], cfg["study"])


if __name__ == "__main__":
    from txjax.hostmem import reuse_host_memory

    reuse_host_memory()  # before JAX runs anything: see txjax/hostmem.py
    main(sys.argv[1:])
