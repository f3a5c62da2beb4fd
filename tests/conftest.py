"""Test-wide settings: implicit rank promotion is an error, as in nanodo and t5x."""

import jax

jax.config.update("jax_numpy_rank_promotion", "raise")
