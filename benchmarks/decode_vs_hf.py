"""Cached sampling: txjax's `generate` against Hugging Face `GPT2LMHeadModel.generate`, same shapes.

    python benchmarks/decode_vs_hf.py --rounds 3            # batch 16, 196 new tokens (the MNIST GPT)

Both models have the MNIST cpu preset's shapes (vocab 17, 197 positions, D 128, 4 heads,
4 layers, F 512), random weights, a one-token prompt, and sample 196 new tokens at
temperature 1 with their KV caches. Each round runs `python -m txjax.decoding --bench`
and this script's `--impl hf` in fresh processes, alternated; compile and first-call
time are excluded on both sides (each is called once before it is timed). Needs the
`parity` extra (torch, transformers). The last line printed is JSON.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

from _run import run_json  # benchmarks/_run.py


def hf_tokens_per_s(batch: int, new_tokens: int, repeats: int) -> dict:
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(vocab_size=17, n_positions=197, n_embd=128, n_layer=4, n_head=4, n_inner=512,
                        bos_token_id=16, eos_token_id=None, pad_token_id=0)
    model = GPT2LMHeadModel(config).eval()
    prompt = torch.full((batch, 1), 16, dtype=torch.long)

    def run():
        with torch.inference_mode():
            return model.generate(prompt, attention_mask=torch.ones_like(prompt), do_sample=True,
                                  temperature=1.0, top_k=0, max_new_tokens=new_tokens,
                                  min_new_tokens=new_tokens, use_cache=True)

    assert run().shape == (batch, 1 + new_tokens)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return {"tokens_per_s": batch * new_tokens / statistics.median(times), "times_s": times,
            "torch": torch.__version__, "threads": torch.get_num_threads()}


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--new-tokens", type=int, default=196)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--impl", choices=("both", "hf"), default="both", help="hf: time Hugging Face here, print JSON")
    args = p.parse_args(argv)
    if args.impl == "hf":
        result = hf_tokens_per_s(args.batch, args.new_tokens, args.repeats)
        print(json.dumps(result))
        return result
    sizes = [f"--batch={args.batch}", f"--new-tokens={args.new_tokens}", f"--repeats={args.repeats}"]
    commands = {"txjax": [sys.executable, "-m", "txjax.decoding", "--bench", *sizes],
                "hf": [sys.executable, __file__, "--impl=hf", *sizes]}
    speeds = {name: [] for name in commands}
    for r in range(args.rounds):
        for name in (("txjax", "hf") if r % 2 == 0 else ("hf", "txjax")):
            out = run_json(commands[name])
            speeds[name].append(out["cache"]["tokens_per_s"] if name == "txjax" else out["tokens_per_s"])
            print(f"round {r + 1}: {name:<6} {speeds[name][-1]:9.0f} tokens/s", flush=True)
    medians = {name: statistics.median(v) for name, v in speeds.items()}
    result = {"batch": args.batch, "new_tokens": args.new_tokens, "tokens_per_s": medians,
              "all_tokens_per_s": speeds, "txjax_over_hf": medians["txjax"] / medians["hf"]}
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
