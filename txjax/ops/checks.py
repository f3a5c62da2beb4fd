"""Input checks the ops share: whether values can be inspected now, and floating-point inputs."""

from __future__ import annotations

import jax
import jax.numpy as jnp


def is_concrete(x) -> bool:
    """True when `x` holds values we can inspect now (not a tracer under jit)."""
    return not isinstance(x, jax.core.Tracer)


def check_float(name: str, what: str, *xs: jax.Array) -> None:
    """ValueError unless every array in `xs` is floating point: integer or boolean input would
    run through the float formulas and come out as garbage (an int layer_norm gives {-1, 0, 1})."""
    for x in xs:
        if not jnp.issubdtype(x.dtype, jnp.floating):
            raise ValueError(f"{name}: {what} must be floating point, got dtype {x.dtype}")
