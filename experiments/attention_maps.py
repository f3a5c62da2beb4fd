"""Attention maps: every head of one self-attention layer of a trained model on a given input, as a PNG.

    python experiments/attention_maps.py                                  # trains a small char GPT first
    python experiments/attention_maps.py --run_dir runs/bert_mlm_cpu --layer 1 --text "To be, or not to be"
    python experiments/attention_maps.py --help

Intentionally kept short: the logic lives in txjax.studies.attention_maps, where tests reach it.
"""

from __future__ import annotations

import sys

from _local_data import or_local  # experiments/_local_data.py: ../shared/data beside the repo
from txjax.config import GPTConfig
from txjax.studies.attention_maps import AttentionMapConfig, draw
from txjax.train.cli import build_parser, parse_configs
from txjax.train.config import TrainConfig

PRESETS = {
    # The char GPT trained when no --run_dir is given: the length study's cpu model, context 64.
    "cpu": {
        "model": GPTConfig(max_len=64, position="rope", d_model=64, num_heads=4, num_layers=2, d_ff=256),
        "train": TrainConfig(learning_rate=3e-3, warmup_steps=40, steps=300, batch_size=32,
                             weight_decay=0.01, progress=False),
        "maps": AttentionMapConfig(),
    },
}


def make_parser(configs):
    return build_parser(
        __doc__.splitlines()[0],
        {"model": ("model (GPTConfig, without --run_dir)", configs["model"]),
         "train": ("training (TrainConfig, without --run_dir)", configs["train"]),
         "maps": ("maps (AttentionMapConfig)", configs["maps"])},
        presets=list(PRESETS), default_preset="cpu",
    )


def main(argv=None):
    _, cfg = parse_configs(make_parser, PRESETS, argv, "cpu")
    return draw(cfg["model"], cfg["train"], or_local(cfg["maps"], "corpus", "tinyshakespeare.txt"))


if __name__ == "__main__":
    from txjax.hostmem import reuse_host_memory

    reuse_host_memory()  # before JAX runs anything: see txjax/hostmem.py
    main(sys.argv[1:])
