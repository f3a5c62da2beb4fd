"""Masking rate: BERT MLM and T5 span corruption trained at p in {0.05, 0.15, 0.3, 0.5}, scored on one fixed 15% task and at their own p.

    python experiments/mask_rate.py --preset cpu
    python experiments/mask_rate.py --families bert --rates 0.15,0.5 --steps 50
    python experiments/mask_rate.py --help

Intentionally kept short: the logic lives in txjax.studies.mask_rate, where tests reach it.
"""

from __future__ import annotations

import sys

from _local_data import or_local  # experiments/_local_data.py: ../shared/data beside the repo
from txjax.studies.mask_rate import MaskRateConfig, run_study
from txjax.train.cli import build_parser, parse_configs
from txjax.train.config import TrainConfig
from txjax.train.experiment import cpu_compute_dtype

PRESETS = {
    # Sized for one accelerator (not yet run on one).
    "default": {
        "train": TrainConfig(learning_rate=1e-3, warmup_steps=200, steps=5000, batch_size=64,
                             weight_decay=0.01, b2=0.98, relative_bias_lr_multiplier=10.0, progress=False),
        "study": MaskRateConfig(seq_len=128, mean_span=20.0, d_model=256, num_heads=8, num_layers=4, d_ff=1024,
                                out_dir="runs/mask_rate"),
    },
    # 2 CPU cores: the recipe of train_bert.py's and train_t5.py's cpu presets, which learn (BERT
    # 0.55 masked accuracy, T5 0.53 target accuracy): D 128, 3 layers, 64-token rows, B 64, AdamW
    # 3e-3, T5's relative bias at 10x and ByT5's 20-character spans. One step count for both
    # (T5's 1,200; BERT's preset runs 1,300) and BERT's b2 0.98 (T5's preset: 0.95). bfloat16
    # matmuls where the CPU has bfloat16 dot instructions (1.5-1.65x faster steps with AMX, the same
    # table within its spread: docs/results/README.md, "The masking rate in bfloat16"), float32 elsewhere.
    "cpu": {
        "train": TrainConfig(learning_rate=3e-3, warmup_steps=100, steps=1200, batch_size=64,
                             weight_decay=0.01, b2=0.98, relative_bias_lr_multiplier=10.0, progress=False),
        "study": MaskRateConfig(seq_len=64, mean_span=20.0, d_model=128, num_heads=4, num_layers=3, d_ff=512,
                                dtype=cpu_compute_dtype()[0]),
    },
}


def make_parser(configs):
    return build_parser(
        __doc__.splitlines()[0],
        {"train": ("training (TrainConfig)", configs["train"]),
         "study": ("study (MaskRateConfig)", configs["study"])},
        presets=list(PRESETS), default_preset="cpu",
    )


def main(argv=None) -> dict:
    _, cfg = parse_configs(make_parser, PRESETS, argv, "cpu")
    return run_study(cfg["train"], or_local(cfg["study"], "corpus", "tinyshakespeare.txt"))


if __name__ == "__main__":
    from txjax.hostmem import reuse_host_memory

    reuse_host_memory()  # before JAX runs anything: see txjax/hostmem.py
    main(sys.argv[1:])
