"""Let XLA:CPU reuse its scratch memory from one run to the next (glibc malloc only).

XLA:CPU allocates an executable's temporary buffer at every run and frees it after:
495 MB for the benchmark's GPT train step. glibc serves an allocation that large
with a fresh mmap (on a worker thread it has no choice: a thread arena cannot grow
past 64 MB), so every step page-faults and zeroes the whole buffer again — 28% of
that step's CPU time was spent in the kernel doing so. With one malloc arena that
never mmaps and never trims, the freed buffer stays mapped and the next run gets the
same pages back (most of the time: while the heap settles in the first steps, one now and then
still faults it in again): the step took 0.80 of the time (589 vs 736 ms, median of 5 runs each,
2 cores), at the price of compiling ~9% slower (XLA's compiler threads share the arena).

Nothing calls it at import: the entry points that train or time steps do, first thing
in `if __name__ == "__main__":` (every experiments/*.py script, `python -m txjax.bench`),
before JAX has run anything — importing jax starts none of XLA's threads, running a
computation does, and a thread that already holds an arena keeps it. Notebooks and
other programs opt in the same way: `txjax.hostmem.reuse_host_memory()` before their
first computation. The cost: memory once used is not returned to the OS until the
process exits. `TXJAX_MALLOC=default` in the environment leaves malloc alone, and so
does a GPU or TPU plugin being installed (unless `JAX_PLATFORMS` starts with cpu): the
trade is for XLA:CPU only.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import importlib.util
import os
import platform

ENV = "TXJAX_MALLOC"
# mallopt(3) parameter numbers from glibc's malloc.h.
M_TRIM_THRESHOLD, M_MMAP_MAX, M_ARENA_MAX = -1, -4, -8


def _glibc():
    """The C library if it is glibc (the one whose mallopt these numbers belong to), else None."""
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return None
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None


def _runs_on_accelerator() -> bool:
    """JAX will pick a GPU or TPU: JAX_PLATFORMS says so, or (unset) such a plugin is installed."""
    platforms = os.environ.get("JAX_PLATFORMS", "").strip()
    if platforms:
        return platforms.split(",")[0].strip().lower() != "cpu"
    return any(importlib.util.find_spec(name) is not None for name in ("jax_plugins", "libtpu"))


def reuse_host_memory() -> bool:
    """Serve every allocation from one never-trimmed heap; True if glibc accepted all three settings."""
    if os.environ.get(ENV, "").strip().lower() == "default" or _runs_on_accelerator():
        return False
    libc = _glibc()
    if libc is None:
        return False
    settings = ((M_ARENA_MAX, 1), (M_MMAP_MAX, 0), (M_TRIM_THRESHOLD, 2**31 - 1))
    return all([libc.mallopt(param, value) == 1 for param, value in settings])
