"""Analytic cost model: parameters, FLOPs, arithmetic intensity, memory.

Everything here is arithmetic on a config; nothing is built or run. The formulas
are the course notes' ("RAM Systems", "The Forward Pass of Attention Models",
"A Mental Model for GPU memory"):

- a matmul [m, k] @ [k, n] costs 2·m·k·n FLOPs;
- one attention layer over n tokens costs 8·n·D² (Q, K, V, O projections)
  + 4·n²·D (Q Kᵀ and weights·V); softmax, scaling, norms, activations, biases and
  the loss are lower order and left out (XLA counts them: tests/test_cost_xla.py);
- a training step costs 3× the forward pass (backward = 2× forward);
- arithmetic intensity AI = FLOPs / bytes moved, compared with the ridge point
  peak FLOP/s / bandwidth of the hardware (roofline);
- the KV cache holds L·B·2·D·T·s bytes; mixed-precision AdamW training holds
  2 + 2 + 4 + 4 bytes per parameter (+ 4 for an fp32 master copy).

Where the notes write D for the attention width, the code uses the inner width
N·H, which is D unless `head_dim` is set.

Where each part lives: `counts` (parameters, FLOPs), `intensity` (hardware presets,
arithmetic intensity, roofline), `memory` (KV cache, training state, activations) and
`cli` (named configs, `report`, `main`). Every name is re-exported here.

`python -m txjax.cost NAME` prints the table for a named config.
"""

from txjax.cost.cli import llama_7b, main, named_config, report
from txjax.cost.counts import (
    attention_flops,
    flops_per_token,
    forward_flops,
    matmul_flops,
    param_count,
    param_counts,
    tokens_per_step,
    train_flops,
)
from txjax.cost.intensity import (
    GiB,
    Hardware,
    attention_intensity,
    hardware,
    linear_intensity,
    roofline,
)
from txjax.cost.memory import (
    activation_bytes,
    config_kv_cache_bytes,
    kv_cache_bytes,
    max_batch,
    train_step_bytes,
    training_bytes_per_param,
    training_state_bytes,
)

__all__ = [
    "GiB",
    "Hardware",
    "activation_bytes",
    "attention_flops",
    "attention_intensity",
    "config_kv_cache_bytes",
    "flops_per_token",
    "forward_flops",
    "hardware",
    "kv_cache_bytes",
    "linear_intensity",
    "llama_7b",
    "main",
    "matmul_flops",
    "max_batch",
    "named_config",
    "param_count",
    "param_counts",
    "report",
    "roofline",
    "tokens_per_step",
    "train_flops",
    "train_step_bytes",
    "training_bytes_per_param",
    "training_state_bytes",
]
