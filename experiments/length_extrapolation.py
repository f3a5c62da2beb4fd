"""Length extrapolation: a character-level GPT per position encoding, held-out bits/char at 1x..16x the training length.

    python experiments/length_extrapolation.py --preset cpu      # ~67 min on one core; ~35 on two as parts
    python experiments/length_extrapolation.py --preset cpu --positions rope,alibi --seeds 1 --steps 50
    python experiments/length_extrapolation.py --help

Intentionally kept short: the logic lives in txjax.studies.length, where tests reach it.
Writes table.md, table.csv, runs.csv, results.json and length_extrapolation.png to --out_dir.
"""

from __future__ import annotations

import sys

from _local_data import or_local  # experiments/_local_data.py: ../shared/data beside the repo
from txjax.config import GPTConfig
from txjax.studies.length import LengthStudyConfig, run_study
from txjax.train.cli import build_parser, parse_configs
from txjax.train.config import TrainConfig
from txjax.train.experiment import cpu_compute_dtype

PRESETS = {
    # Sized for one accelerator: 6 layers, D 384, context 256 (evaluated up to 4096).
    "default": {
        "model": GPTConfig(d_model=384, num_heads=6, num_layers=6, d_ff=1536, dropout=0.1),
        "train": TrainConfig(learning_rate=1e-3, warmup_steps=200, steps=5000, batch_size=64,
                             weight_decay=0.1, progress=False),
        "study": LengthStudyConfig(train_len=256, eval_tokens=32768, randomized="rope", random_max=8192,
                                   rope_scalings="linear,ntk,yarn", out_dir="runs/length_extrapolation"),
    },
    # Sized for 2 idle CPU cores: 9 encodings and rope with random positions x 3 seeds, 6,000 steps of
    # 32 x 64 characters each (rope reaches 2.006 bits/char at 1x, 0.11-0.14 from the same model trained
    # to convergence: docs/results/README.md, "trained near convergence"); each rope and xpos model also scored
    # with linear, NTK and YaRN scaling. bfloat16 matmuls where the CPU has bfloat16 dot
    # instructions (~1.3x faster steps with AMX, the same table: docs/results/README.md, "The studies
    # in bfloat16"), float32 elsewhere.
    "cpu": {
        # max_distance: the T5 bias's offsets beyond it share one bucket. With 64-character training
        # windows the buckets for offsets 64..128 are never trained (docs/results); stated here so a
        # run chooses it (--max_distance 64 ties it to the window).
        "model": GPTConfig(d_model=64, num_heads=4, num_layers=2, d_ff=256, max_distance=128,
                           dtype=cpu_compute_dtype()[0]),
        "train": TrainConfig(learning_rate=3e-3, warmup_steps=100, steps=6000, batch_size=32,
                             weight_decay=0.01, progress=False),
        "study": LengthStudyConfig(randomized="rope", rope_scalings="linear,ntk,yarn"),
    },
}


def make_parser(configs):
    return build_parser(
        __doc__.splitlines()[0],
        {"model": ("model (GPTConfig; position and max_len are set per run)", configs["model"]),
         "train": ("training (TrainConfig)", configs["train"]),
         "study": ("study (LengthStudyConfig)", configs["study"])},
        presets=list(PRESETS), default_preset="cpu",
    )


def main(argv=None) -> dict:
    _, cfg = parse_configs(make_parser, PRESETS, argv, "cpu")
    return run_study(cfg["model"], cfg["train"], or_local(cfg["study"], "corpus", "tinyshakespeare.txt"))


if __name__ == "__main__":
    from txjax.hostmem import reuse_host_memory

    reuse_host_memory()  # before JAX runs anything: see txjax/hostmem.py
    main(sys.argv[1:])
