"""GELU and SiLU for the CPU: `cpu_activation.cc`, called through XLA's FFI.

XLA:CPU computes erf and exp at 1-2 ns an element: in the larger bench config's bfloat16 step
GELU and its gradient took 8.5 ms a layer on one core, a third of what the step spent outside
the matmuls and attention (BUILD.md). The kernels make one vectorized pass each way. The math is
`txjax.ops.activations`' (float32 work, the result in x's dtype, the gradient recomputed from
x); erf and exp are polynomials within a few float32 ulp of XLA's, so values match to ~1e-6
relative, not bit for bit. x of float32 or bfloat16; other dtypes get the plain functions.
Built with txjax's other CPU kernels (`txjax.ops.cpu_kernels`).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from txjax.ops import activations
from txjax.ops.cpu_kernels import DTYPES, register

KINDS = {"gelu": 0, "silu": 1}
"""The activations the kernel computes -> its `kind` attribute (`Kind` in cpu_activation.cc)."""


def _call(name: str, kind: str, *args):
    like = jax.ShapeDtypeStruct(args[0].shape, args[0].dtype)
    return jax.ffi.ffi_call(f"txjax_activation_{name}", like, vmap_method="sequential")(*args, kind=np.int32(KINDS[kind]))


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _activation(kind: str, x):
    return _call("forward", kind, x)


def _activation_fwd(kind, x):
    return _call("forward", kind, x), x


def _activation_bwd(kind, x, dy):
    return (_call("backward", kind, x, dy.astype(x.dtype)),)


_activation.defvjp(_activation_fwd, _activation_bwd)


def _fused(kind: str):
    reference = activations.ACTIVATIONS[kind]

    def fn(x: jax.Array) -> jax.Array:
        x = jnp.asarray(x)
        if x.dtype not in DTYPES or x.size == 0:
            return reference(x)
        register()
        return _activation(kind, x)

    fn.__name__ = fn.__qualname__ = kind
    fn.__doc__ = f"`txjax.ops.activations.{kind}` by the kernel."
    return fn


FUSED = {kind: _fused(kind) for kind in KINDS}
"""config.activation -> the kernel's version, for the activations it has."""


def activation(name: str, fused: bool):
    """config.activation's function: the kernel's where `fused` and it has one, else the plain one."""
    return FUSED[name] if fused and name in FUSED else activations.ACTIVATIONS[name]
