"""A minimal PyTorch GPT with nanoGPT's shapes and FLOPs, timed as a train step.

The model is nanoGPT's `model.py` (Karpathy) cut to what a train step runs: token and
learned position embeddings, pre-norm blocks of causal self-attention through
`F.scaled_dot_product_attention` and a GELU MLP, a final layer norm and a head tied to
the token embedding, biases everywhere; AdamW with nanoGPT's weight-decay groups and
gradient clipping at 1.0. No dropout. It is the reference of `benchmarks/cpu_vs_torch.py`:

    python benchmarks/torch_gpt.py --dtype float32            # or bfloat16 (autocast), --compile

The last line printed is JSON with ms_per_step (median) and the final loss.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, d: int, heads: int, d_ff: int):
        super().__init__()
        self.ln_1, self.ln_2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.c_attn, self.attn_proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.c_fc, self.mlp_proj = nn.Linear(d, d_ff), nn.Linear(d_ff, d)
        self.heads = heads

    def forward(self, x_BTD):
        B, T, D = x_BTD.shape
        q, k, v = self.c_attn(self.ln_1(x_BTD)).split(D, dim=2)
        q, k, v = (t.view(B, T, self.heads, D // self.heads).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x_BTD = x_BTD + self.attn_proj(y.transpose(1, 2).contiguous().view(B, T, D))
        return x_BTD + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x_BTD))))


class GPT(nn.Module):
    def __init__(self, vocab: int, seq: int, d: int, heads: int, layers: int, d_ff: int):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, d), nn.Embedding(seq, d)
        self.h = nn.ModuleList(Block(d, heads, d_ff) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d)
        self.lm_head = nn.Linear(d, vocab, bias=False)
        self.lm_head.weight = self.wte.weight
        for name, p in self.named_parameters():
            if p.dim() == 2:  # nanoGPT's init: N(0, 0.02), residual projections scaled down
                std = 0.02 / math.sqrt(2 * layers) if name.endswith("proj.weight") else 0.02
                nn.init.normal_(p, 0.0, std)
            elif name.endswith("bias"):
                nn.init.zeros_(p)

    def forward(self, idx_BT, targets_BT):
        x = self.wte(idx_BT) + self.wpe(torch.arange(idx_BT.shape[1]))
        for block in self.h:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets_BT.reshape(-1))


def optimizer(model: GPT, lr: float = 3e-4, weight_decay: float = 0.1):
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.95))


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for name, default in (("vocab", 17), ("seq", 197), ("d-model", 128), ("heads", 4), ("layers", 4),
                          ("d-ff", 512), ("batch", 32), ("steps", 20), ("warmup", 3)):
        p.add_argument(f"--{name}", type=int, default=default)
    p.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    p.add_argument("--compile", action="store_true", help="torch.compile the model")
    p.add_argument("--threads", type=int, default=0, help="torch.set_num_threads; 0: PyTorch's default")
    a = p.parse_args(argv)
    if a.threads:
        torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    model = GPT(a.vocab, a.seq, a.d_model, a.heads, a.layers, a.d_ff)
    opt = optimizer(model)
    forward = torch.compile(model) if a.compile else model
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, a.vocab, (a.batch, a.seq + 1), generator=g)
    x, y = tokens[:, :-1], tokens[:, 1:]

    def step():
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.dtype == "bfloat16"):
            loss = forward(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        return loss.item()

    start = time.perf_counter()
    for _ in range(a.warmup):
        loss = step()
    warm_s = time.perf_counter() - start
    times = []
    for _ in range(a.steps):
        start = time.perf_counter()
        loss = step()
        times.append(time.perf_counter() - start)
    result = {"impl": "torch" + ("-compile" if a.compile else ""), "dtype": a.dtype,
              "ms_per_step": 1e3 * statistics.median(times), "warmup_s": warm_s, "loss": loss,
              "threads": torch.get_num_threads(), "torch": torch.__version__}
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
