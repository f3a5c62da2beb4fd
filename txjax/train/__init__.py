"""Training: AdamW, jitted train/eval steps over NNX split state, the loop, Orbax checkpoints."""
