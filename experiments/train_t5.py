"""Train T5 with span corruption on a character-level corpus; print decoded spans beside the truth.

    python experiments/train_t5.py --preset cpu
    python experiments/train_t5.py --help

Intentionally kept short: the logic lives in txjax.tasks.spans, where tests reach it.
The vocabulary size and special ids come from the tokenizer, not from the flags.
"""

from __future__ import annotations

import sys

from _local_data import or_local  # experiments/_local_data.py: ../shared/data beside the repo
from txjax.config import ExecutionConfig, T5Config
from txjax.tasks.spans import run_t5
from txjax.tasks.text import FROM_TOKENIZER, TextRunConfig
from txjax.train.cli import script_parser
from txjax.train.config import TrainConfig
from txjax.train.experiment import train_script

PRESETS = {
    # Sized for one accelerator: 6 layers, D 384. Not yet run on a GPU.
    "default": {
        "model": T5Config(d_model=384, num_heads=6, num_layers=6, d_ff=1536, dropout=0.1),
        "train": TrainConfig(learning_rate=5e-4, warmup_steps=500, steps=10000, batch_size=128,
                             weight_decay=0.01, relative_bias_lr_multiplier=10.0, eval_every=1000,
                             checkpoint_every=1000),
        "run": TextRunConfig(name="t5_spans", seq_len=256, mean_span=20.0),
        "execution": ExecutionConfig(),
    },
    # Sized for 2 CPU cores: 64-character encoder rows, one 11-character span each (ByT5's mean
    # span of 20 characters), B 64, T5's own init, the relative bias learning 10x faster, and
    # dropout 0.1, without which the 1,200 steps overfit the shipped excerpt (62 passes over its
    # rows: 0.445 accuracy, held-out loss 4.90; with it 0.466; on tinyshakespeare 0.526 without,
    # 0.513 with, 4 min 42 s on 2 AMX cores). BUILD.md, "CPU presets", has the measured runs.
    "cpu": {
        "model": T5Config(d_model=128, num_heads=4, num_layers=3, d_ff=512, dropout=0.1),
        "train": TrainConfig(learning_rate=3e-3, warmup_steps=100, steps=1200, batch_size=64,
                             weight_decay=0.01, relative_bias_lr_multiplier=10.0, checkpoint_every=1200,
                             eval_batches=2),
        "run": TextRunConfig(name="t5_spans_cpu", seq_len=64, mean_span=20.0),
        "execution": ExecutionConfig(),
    },
}


def make_parser(configs):
    return script_parser(__doc__.splitlines()[0], configs, PRESETS, fixed=FROM_TOKENIZER)


def main(argv=None) -> dict:
    return train_script(run_t5, PRESETS, make_parser, argv,
                        locate=lambda run: or_local(run, "corpus", "tinyshakespeare.txt"))


if __name__ == "__main__":
    from txjax.hostmem import reuse_host_memory

    reuse_host_memory()  # before JAX runs anything: see txjax/hostmem.py
    main(sys.argv[1:])
