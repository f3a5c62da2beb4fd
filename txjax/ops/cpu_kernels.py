"""txjax's CPU kernels: C++ sources in this folder, built on first use and called through XLA's FFI.

- `cpu_activation.cc`: GELU and SiLU, forward and backward (`txjax.ops.cpu_activation`);
- `cpu_attention.cc`: fused attention, forward and backward (`txjax.ops.cpu_attention`), its
  float32 products in `cpu_attention_f32.h` and its bfloat16 products where the CPU has them, on
  AMX tiles or by AVX512-BF16 (`cpu_bf16_dot.h`, `cpu_attention_bf16.h`, `bf16_min_head` below);
- `cpu_norm.cc`: layer norm and RMS norm, forward and backward (`txjax.ops.cpu_norm`);
- `cpu_transpose.cc`: a 2-D transpose whose operand XLA materializes first (`transpose` below,
  used by `txjax.ops.xla_cpu.transposed` for the weight gradients' x^T).

They are compiled together with the system's C++ compiler (`$CXX`, else `g++`) for this CPU
(`-march=native`) into one library kept in the cache folder (`$XDG_CACHE_HOME/txjax/kernels`
or `~/.cache/txjax/kernels`), keyed by the sources, the compiler, jaxlib and the CPU's flags.
`available()` says whether that worked; without a compiler txjax warns once and runs the
XLA forms instead (the same values, slower on the CPU).
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import shlex
import subprocess
import tempfile
import warnings
from pathlib import Path

import jax
import jax.numpy as jnp

from txjax import paths

HERE = Path(__file__).parent
SOURCES = (HERE / "cpu_activation.cc", HERE / "cpu_attention.cc", HERE / "cpu_norm.cc", HERE / "cpu_transpose.cc")
HEADERS = (HERE / "cpu_kernels.h", HERE / "cpu_bf16_dot.h", HERE / "cpu_attention_f32.h",
           HERE / "cpu_attention_bf16.h")
FLAGS = ("-O3", "-march=native", "-std=c++17", "-shared", "-fPIC")
TARGETS = {"txjax_attention_forward": "TxjaxAttentionForward", "txjax_attention_backward": "TxjaxAttentionBackward",
           "txjax_norm_forward": "TxjaxNormForward", "txjax_norm_backward": "TxjaxNormBackward",
           "txjax_transpose": "TxjaxTranspose",
           "txjax_activation_forward": "TxjaxActivationForward", "txjax_activation_backward": "TxjaxActivationBackward"}
"""FFI target name -> the handler's symbol in the library."""
DTYPES = (jnp.dtype(jnp.float32), jnp.dtype(jnp.bfloat16))
"""What the norm and activation kernels read and write (`by_dtype` in cpu_kernels.h); they compute in float32."""


def cache_dir() -> Path:
    """Where built kernels are kept: `kernels` in txjax's cache folder (`txjax.paths.cache_dir`)."""
    return paths.cache_dir() / "kernels"


def _cpu_flags() -> str:
    """The CPU's feature flags (Linux), else its name: `-march=native` code is built per CPU."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return line
    except OSError:
        pass
    return platform.processor() or platform.machine()


@functools.cache
def build() -> Path:
    """The compiled library, built now if these sources, compiler, jaxlib and CPU have none yet.
    Raises RuntimeError (with the compiler's message) when it cannot be built."""
    compiler = shlex.split(os.environ.get("CXX", "g++"))
    try:
        version = subprocess.run([*compiler, "--version"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError) as e:
        raise RuntimeError(f"txjax's CPU kernels need a C++ compiler ($CXX or g++): {e}") from e
    texts = [p.read_text() for p in (*SOURCES, *HEADERS)]
    key = hashlib.sha256("\n".join([*texts, " ".join(compiler + list(FLAGS)), version,
                                    jax.lib.__version__, _cpu_flags()]).encode()).hexdigest()[:16]
    path = cache_dir() / f"cpu_kernels-{key}.so"
    if path.exists():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=path.parent) as tmp:
        out = Path(tmp) / path.name
        cmd = [*compiler, *FLAGS, "-isystem", jax.ffi.include_dir(), *map(str, SOURCES), "-o", str(out)]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"txjax's CPU kernels: building them failed:\n{shlex.join(cmd)}\n"
                               f"{done.stderr[-4000:]}")
        os.replace(out, path)  # atomic: a concurrent build of the same key writes the same bytes
    return path


@functools.cache
def register() -> None:
    """Builds the library if needed and registers its handlers with XLA (once)."""
    library = ctypes.cdll.LoadLibrary(str(build()))
    for target, symbol in TARGETS.items():
        jax.ffi.register_ffi_target(target, jax.ffi.pycapsule(getattr(library, symbol)), platform="cpu")


@functools.cache
def available() -> bool:
    """Whether the kernels are built (or could be now) and registered with XLA; warns once if not."""
    try:
        register()
    except (RuntimeError, OSError) as e:
        warnings.warn(f"txjax: the CPU kernels are not available; attention_impl='auto' falls back to "
                      f"'reference' and the weight gradients' transposes to identity dots (the same values, "
                      f"slower on the CPU): {e}", RuntimeWarning, stacklevel=2)
        return False
    return True


@functools.cache
def bf16_min_head() -> int:
    """The narrowest bfloat16 attention heads that run their products in bfloat16 here, 0 for none:
    the kernels were built for a CPU with AMX (and Linux grants the tile state) or with AVX512-BF16
    (`cpu_bf16_dot.h`). Builds the kernels if needed."""
    return int(ctypes.cdll.LoadLibrary(str(build())).TxjaxBf16MinHead())


def transpose(x_KM: jax.Array) -> jax.Array:
    """x^T, [M, K], for a 2-D x of 2- or 4-byte elements: a copy made by `cpu_transpose.cc`, of an
    x that XLA materializes first. Builds the kernels on first use."""
    register()
    if x_KM.ndim != 2 or x_KM.dtype.itemsize not in (2, 4):
        raise ValueError(f"transpose takes a 2-D array of 2- or 4-byte elements, got {x_KM.dtype}{list(x_KM.shape)}")
    k, m = x_KM.shape
    if k == 0 or m == 0:
        return jnp.zeros((m, k), x_KM.dtype)
    return jax.ffi.ffi_call("txjax_transpose", jax.ShapeDtypeStruct((m, k), x_KM.dtype),
                            vmap_method="sequential")(x_KM)
