"""Per-task pipelines on the generic trainer (`txjax.train`): data, run, evaluation, sampling.

- `mnist`: the binarized-MNIST GPT (2×2 patches), its test NLL, unigram baseline and samples.
- `text`: what the text tasks share: `TextRunConfig`, the corpus split, tokenizer metadata, "_" prompts.
- `mlm`: BERT masked-language modelling and "_" filling.
- `spans`: T5 span corruption, decoding and "_" span in-filling.
- `sample`: load a run's parameters and generate from it.

Imports point down: tasks use train, decoding and data; train never imports tasks.
"""
