"""`python -m txjax.hf PATH ...`: run a downloaded gpt2 / bert-base-uncased / t5-small folder.

GPT-2 continues the prompt, T5 generates from its input, BERT fills in [MASK]
tokens (or, with none, shows its top guess at every position); an encoder-only
BERT (BertModel) prints its sentence embedding. `--text` is tokenized by the
folder's own tokenizer (`txjax.hf.load_tokenizer`). `--compare` runs transformers
on the same input and prints the largest logit (or hidden-state) difference, so a
checkpoint can be checked on any machine with torch.
"""

from __future__ import annotations

import argparse
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from txjax.hf import Tokenizer, from_pretrained, load_tokenizer, parameters
from txjax.models import GPT, T5, Bert


def folder_tokenizer(path: str) -> Tokenizer | None:
    """The folder's tokenizer, or None if it has none (or its library is missing)."""
    try:
        return load_tokenizer(path)
    except (FileNotFoundError, ImportError):
        return None


def _encoder_only(model) -> bool:
    return isinstance(model, Bert) and model.config.head != "mlm"


def reference_logits(path: str, model, tokens_BT: np.ndarray, dec_BT: np.ndarray | None = None) -> np.ndarray:
    """transformers' logits for the same folder and input (needs torch and transformers)."""
    import torch
    import transformers

    cls = {GPT: "GPT2LMHeadModel", Bert: "BertForMaskedLM", T5: "T5ForConditionalGeneration"}[type(model)]
    ref = getattr(transformers, "BertModel" if _encoder_only(model) else cls).from_pretrained(path).eval()
    ids = torch.tensor(np.asarray(tokens_BT), dtype=torch.long)
    pad = model.config.pad_id
    mask = torch.ones_like(ids) if pad is None or isinstance(model, GPT) else (ids != pad).long()
    with torch.no_grad():
        if isinstance(model, T5):
            out = ref(input_ids=ids, attention_mask=mask, decoder_input_ids=torch.tensor(np.asarray(dec_BT)))
        else:
            out = ref(input_ids=ids, attention_mask=mask)
    return (out.last_hidden_state if _encoder_only(model) else out.logits).float().numpy()


def _logits(model, tokens_BT, dec_BT=None) -> np.ndarray:
    if isinstance(model, T5):
        return np.asarray(model(jnp.asarray(tokens_BT), jnp.asarray(dec_BT)))
    return np.asarray(model(jnp.asarray(tokens_BT)))


def _show(ids, tokenizer) -> str:
    ids = [int(i) for i in ids]
    if tokenizer is None:
        return " ".join(map(str, ids))
    return repr(tokenizer.decode(ids, skip_special_tokens=True))


def _fill_mask(model, tokens_BT, tokenizer, mask_id, top) -> list[str]:
    logits_TV = _logits(model, tokens_BT)[0]
    row = tokens_BT[0]
    where = [i for i, t in enumerate(row) if t == mask_id] if mask_id is not None else []
    lines = []
    for i in where or range(len(row)):
        best = np.argsort(-logits_TV[i])[:top]
        words = [tokenizer.id_to_token(int(b)) if tokenizer else str(int(b)) for b in best]
        lines.append(f"position {i}: " + "  ".join(words))
    return lines


def parse_args(argv):
    p = argparse.ArgumentParser(prog="python -m txjax.hf", description=__doc__.split("\n\n")[0])
    p.add_argument("path", help="a local Hugging Face folder: config.json + model.safetensors")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--text", help="input text (needs the folder's tokenizer.json, or a T5 spiece.model)")
    src.add_argument("--prompt-ids", type=int, nargs="+", help="input token ids")
    p.add_argument("--max-new-tokens", type=int, default=20, help="GPT-2 / T5: tokens to generate")
    p.add_argument("--temperature", type=float, default=0.0, help="0: greedy")
    p.add_argument("--top-k", type=int, default=None)
    p.add_argument("--top-p", type=float, default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--top", type=int, default=5, help="BERT: guesses shown per position")
    p.add_argument("--mask-id", type=int, default=None, help="BERT: the [MASK] id, if no tokenizer names it")
    p.add_argument("--compare", action="store_true",
                   help="also run transformers and print the max |logit diff| (hidden states for an encoder)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    from txjax.decoding import generate

    args = parse_args(argv)
    start = time.perf_counter()
    model = from_pretrained(args.path)
    count = sum(int(v.size) for v in parameters(model).values())
    c = model.config
    print(f"{type(model).__name__} from {args.path}: {count:,} parameters, {c.num_layers} layers, "
          f"D {c.d_model}, {c.num_heads} heads, V {c.vocab_size} ({time.perf_counter() - start:.1f} s)")
    tokenizer = folder_tokenizer(args.path)
    if args.text is not None:
        if tokenizer is None:
            sys.exit(f"{args.path} has no tokenizer.json (or spiece.model with `sentencepiece`); pass --prompt-ids")
        ids = tokenizer.encode(args.text)
    elif args.prompt_ids is not None:
        ids = args.prompt_ids
    else:
        sys.exit("nothing to run: pass --text or --prompt-ids")
    tokens_BT = np.asarray([ids], np.int32)
    print(f"input  {ids}")
    dec_BT = None
    if _encoder_only(model):
        h_TD = _logits(model, tokens_BT)[0]
        embedding = h_TD.mean(0) / np.linalg.norm(h_TD.mean(0))
        print(f"hidden states {h_TD.shape}; mean-pooled, L2-normalized embedding "
              f"[{', '.join(f'{x:.4f}' for x in embedding[:8])}{', ...' if len(embedding) > 8 else ''}]")
    elif isinstance(model, Bert):
        mask_id = args.mask_id
        if mask_id is None and tokenizer is not None:
            mask_id = tokenizer.mask_id
        print("\n".join(_fill_mask(model, tokens_BT, tokenizer, mask_id, args.top)))
    else:
        out = np.asarray(generate(model, jnp.asarray(tokens_BT), args.max_new_tokens, jax.random.key(args.seed),
                                  temperature=args.temperature, top_k=args.top_k, top_p=args.top_p))[0]
        new = out[1:] if isinstance(model, T5) else out[len(ids):]
        print(f"output {[int(t) for t in new]}")
        print(f"text   {_show(out if isinstance(model, GPT) else new, tokenizer)}")
        if isinstance(model, T5):
            dec_BT = out[None, :-1]  # the decoder inputs that produced `new`
    if args.compare:
        diff = np.abs(reference_logits(args.path, model, tokens_BT, dec_BT) - _logits(model, tokens_BT, dec_BT))
        what = "hidden" if _encoder_only(model) else "logits"
        print(f"max |{what}(txjax) - {what}(transformers)| = {diff.max():.3e}")
    return 0
