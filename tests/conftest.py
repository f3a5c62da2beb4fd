"""Test-wide settings: implicit rank promotion is an error, as in nanodo and t5x; glibc's own malloc.

The suite compiles hundreds of small programs and runs each a few times; there the one
shared malloc arena of `txjax.hostmem` made the whole suite ~10% slower (10:55 vs 9:56 on
2 cores) and saved nothing, so the tests keep glibc's default. tests/test_hostmem.py runs
the default-on behaviour in fresh processes.
"""

import os

os.environ.setdefault("TXJAX_MALLOC", "default")  # before anything imports txjax

import jax  # noqa: E402

jax.config.update("jax_numpy_rank_promotion", "raise")
