"""Train a GPT on binarized MNIST (2×2 patches, 197 tokens), score the test set, draw digits.

    python experiments/train_gpt.py --preset cpu     # ~10 min on 2 CPU cores
    python experiments/train_gpt.py --help           # every flag, with its default

Intentionally kept short: the logic lives in txjax.tasks.mnist, where tests reach it.
"""

from __future__ import annotations

import sys

from _local_data import or_local  # experiments/_local_data.py: ../shared/data beside the repo
from txjax.config import ExecutionConfig, GPTConfig
from txjax.tasks.mnist import MnistRunConfig, run_gpt_mnist
from txjax.train.cli import script_parser
from txjax.train.config import TrainConfig
from txjax.train.experiment import cpu_compute_dtype, train_script

CPU_DTYPE, CPU_DTYPE_WHY = cpu_compute_dtype()

PRESETS = {
    # Sized for one accelerator: 6.4M parameters, 12,000 steps of 128 images (25 epochs). Not yet
    # run on a GPU (none lent so far); expected to beat the cpu preset's 59 nats/image clearly.
    # Its feed-forward stays GELU: SwiGLU was measured only at the cpu preset's size.
    "default": {
        "model": GPTConfig(vocab_size=17, max_len=197, d_model=256, num_heads=8, num_layers=8,
                           d_ff=1024, dropout=0.1),
        "train": TrainConfig(learning_rate=1e-3, warmup_steps=500, steps=12000, batch_size=128,
                             weight_decay=0.1, eval_every=1000, checkpoint_every=1000),
        "run": MnistRunConfig(),
        "execution": ExecutionConfig(),
    },
    # Sized for 2 CPU cores and at most 10 minutes, training plus scoring and sampling:
    # 826k parameters, a SwiGLU feed-forward (d_ff 344: the GELU layer's 512 in parameters and
    # FLOPs, 0.9 nats better), 4,000 steps of 16 images (64,000 images, 1.07 epochs) in mixed
    # bfloat16 (float32 parameters) on a CPU with bfloat16 dot instructions (AMX machine,
    # 2026-12-04: 125 ms/step, 9 min 24 s in all; test NLL 58.75 nats/image, samples'
    # confident share 0.83 of real digits': BUILD.md, "CPU presets"; 2026-12-06, with the fused
    # CPU attention: 85 ms/step, 6 min 32 s in all, 58.76 nats/image; 2026-12-07, with the CPU
    # norm kernel: 74 ms/step, 5 min 40 s, 58.78 nats/image, share 0.795; then with the SiLU
    # kernel and attention on AMX tiles: 73 ms/step, 5 min 38 s, 58.83, share 0.820). Elsewhere (no
    # avx512_bf16 / amx_bf16 in /proc/cpuinfo) bfloat16 is slower than float32, so the preset
    # computes in float32 there and takes longer (its first line says which).
    "cpu": {
        "model": GPTConfig(vocab_size=17, max_len=197, d_model=128, num_heads=4, num_layers=4,
                           d_ff=344, gated=True, activation="silu", dtype=CPU_DTYPE),
        "train": TrainConfig(learning_rate=2e-3, warmup_steps=100, steps=4000, batch_size=16,
                             weight_decay=0.01, checkpoint_every=500, eval_every=1000, eval_batches=4),
        "run": MnistRunConfig(name="gpt_mnist_cpu", eval_batch_size=250),
        "execution": ExecutionConfig(),
    },
}


def make_parser(configs):
    return script_parser(__doc__.splitlines()[0], configs, PRESETS)


def main(argv=None) -> dict:
    dtype_given = any(a == "--dtype" or a.startswith("--dtype=") for a in argv or ())
    return train_script(run_gpt_mnist, PRESETS, make_parser, argv,
                        locate=lambda run: or_local(run, "data", "mnist.npz"),
                        notes={} if dtype_given else {"cpu": f"compute dtype {CPU_DTYPE}: {CPU_DTYPE_WHY}"})


if __name__ == "__main__":
    from txjax.hostmem import reuse_host_memory

    reuse_host_memory()  # before JAX runs anything: see txjax/hostmem.py
    main(sys.argv[1:])
