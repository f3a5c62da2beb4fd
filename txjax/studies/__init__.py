"""Studies: experiments whose results are tables and plots, with the logic where tests reach it.

- `length`: length extrapolation of a character-level GPT across position encodings,
  bits per character with non-overlapping and sliding windows.
- `synthetic`: copy and reverse (Kazemnejad et al. 2023), decoder-only and encoder-decoder.
- `mask_rate`: BERT MLM and T5 span corruption trained at several masking rates.
- `attention_maps`: every head's attention weights in one layer, as a PNG.
- `common`: the small training loop, mean ± std, Markdown / CSV tables, run metadata.
"""
