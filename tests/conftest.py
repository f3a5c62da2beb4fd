"""Test-wide settings: implicit rank promotion is an error, as in nanodo and t5x; glibc's own malloc;
compiled programs shared across the run and compiled without LLVM's optimizations (below).

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


def _share_compiled_programs():
    """One persistent XLA compilation cache for this test run, in a fresh temporary folder.

    Compiling is ~80% of the suite's time, and many tests build the same tiny models and
    steps (in other files, other xdist workers, the entry points run as subprocesses). The
    cache returns the identical executable, keyed on the program and the compile options, so
    a program is compiled once per run. The first process (pytest itself, before xdist starts
    its workers) makes the folder and removes it at exit; every other process inherits it
    through the environment. A folder the caller set is used as it is.
    """
    if "JAX_COMPILATION_CACHE_DIR" in os.environ:
        return
    import atexit
    import shutil
    import tempfile

    folder = tempfile.mkdtemp(prefix="txjax-tests-xla-")
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    os.environ.update(JAX_COMPILATION_CACHE_DIR=folder, JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
                      JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0")


_share_compiled_programs()


def _compile_without_llvm_optimization():
    """XLA's LLVM backend at -O0 for the tests: the same HLO passes and fusions, unoptimized machine code.

    The suite runs tiny programs a few times each, so LLVM's optimization pipeline was most of
    the compile time and none of the run time that mattered; at -O0 the suite took 8:22
    instead of ~14:30 on 2 cores (together with the shared cache above). XLA:CPU runs without
    fast-math either way, so results can differ only in the last bits (FMA contraction), which
    the tests' tolerances allow for, as they do between backends. Inherited by the subprocesses;
    `XLA_FLAGS=--xla_backend_optimization_level=2 pytest ...` tests the optimized code instead.
    """
    flags = os.environ.get("XLA_FLAGS", "")
    if "xla_backend_optimization_level" not in flags:
        os.environ["XLA_FLAGS"] = f"{flags} --xla_backend_optimization_level=0".strip()


_compile_without_llvm_optimization()

import jax  # noqa: E402

jax.config.update("jax_numpy_rank_promotion", "raise")
