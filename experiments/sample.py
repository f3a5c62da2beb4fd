"""Load a run's checkpoint and generate: MNIST digits (GPT) or filled-in text (BERT, T5).

    python experiments/sample.py --run runs/gpt_mnist_cpu --temperature 0.8
    python experiments/sample.py --run runs/t5_spans_cpu --prompt "To be, or not to b_"

Intentionally kept short: the logic lives in txjax.tasks.sample.
"""

from __future__ import annotations

import sys

from txjax.train.checkpoint import CheckpointMismatch
from txjax.train.cli import build_parser, parse_configs
from txjax.train.experiment import fail
from txjax.tasks.sample import SampleConfig, sample_from_run


def make_parser(configs):
    return build_parser(__doc__.splitlines()[0], {"sample": ("sampling (SampleConfig)", configs["sample"])})


def main(argv=None) -> dict:
    _, cfg = parse_configs(make_parser, {"default": {"sample": SampleConfig()}}, argv, "default")
    try:
        return sample_from_run(cfg["sample"])
    except (CheckpointMismatch, FileNotFoundError, ValueError, KeyError) as err:
        fail(str(err))


if __name__ == "__main__":
    from txjax.hostmem import reuse_host_memory

    reuse_host_memory()  # before JAX runs anything: see txjax/hostmem.py
    main(sys.argv[1:])
