"""Studies: experiments whose results are tables and plots, with the logic where tests reach it.

- `length`: length extrapolation of a character-level GPT across position encodings,
  bits per character with non-overlapping and sliding windows (scored by `windows`).
- `synthetic`: copy and reverse (Kazemnejad et al. 2023), decoder-only and encoder-decoder;
  `synthetic_data` holds their rows and the read-outs of a model's answers.
- `randomized`: Ruoss et al.'s algorithmic tasks with and without randomized positions;
  `randomized_tasks` holds the tasks and their rows.
- `mask_rate`: BERT MLM and T5 span corruption trained at several masking rates.
- `memory`: training memory against sequence length, XLA's plan beside `txjax.cost`'s model.
- `attention_maps`: every head's attention weights in one layer, as a PNG.
- `common`: fresh parameters, mean ± std, Markdown / CSV tables, resumable runs, run metadata.
- `schedule`: a study's parts run one process per core, with their wall times.
"""
