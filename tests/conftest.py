"""Test-wide settings: implicit rank promotion is an error, as in nanodo and t5x; glibc's own malloc.

The suite compiles hundreds of small programs and runs each a few times; there the one
shared malloc arena of `txjax.hostmem` made the whole suite ~10% slower (10:55 vs 9:56 on
2 cores) and saved nothing, so the tests keep glibc's default. Importing txjax leaves
malloc alone; the entry points (experiments/*.py, `python -m txjax.bench`) call
`reuse_host_memory()`, and the tests that run them in subprocesses (tests/test_studies.py)
inherit `TXJAX_MALLOC=default` from here. tests/test_hostmem.py runs the explicit call,
without it, in fresh processes.
"""

import os

os.environ.setdefault("TXJAX_MALLOC", "default")  # inherited by the entry points tests run as subprocesses

import jax  # noqa: E402

jax.config.update("jax_numpy_rank_promotion", "raise")
