"""Cross-entropy that ignores label -100 and normalises by the real token count."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from txjax.ops.checks import is_concrete


def token_nll(
    logits_BTV: jax.Array, labels_BT: jax.Array, ignore_index: int = -100
) -> tuple[jax.Array, jax.Array]:
    """Per-token negative log-likelihood (float32, 0 where ignored) and the bool weights.

    A label is a class id in [0, V) or `ignore_index`; any other is a ValueError when the
    labels are concrete, and under jit its NLL is NaN: never another class (jnp indexing
    would read -1 as class V-1), so the loss shows it.
    """
    logits_BTV, labels_BT = jnp.asarray(logits_BTV), jnp.asarray(labels_BT)
    if logits_BTV.shape[:-1] != labels_BT.shape:
        raise ValueError(
            f"cross_entropy: logits {logits_BTV.shape} do not match labels {labels_BT.shape}"
        )
    if not jnp.issubdtype(labels_BT.dtype, jnp.integer):
        raise ValueError(f"cross_entropy: labels must be integer class ids, got dtype {labels_BT.dtype}")
    v = logits_BTV.shape[-1]
    if v == 0:
        raise ValueError(f"cross_entropy: empty vocabulary: logits of shape {logits_BTV.shape} have no class")
    weights_BT = labels_BT != ignore_index
    in_range_BT = (labels_BT >= 0) & (labels_BT < v)
    if is_concrete(labels_BT) and labels_BT.size:
        bad = np.asarray(weights_BT & ~in_range_BT)
        if bad.any():
            values = np.asarray(labels_BT)[bad]
            raise ValueError(f"cross_entropy: labels must be in [0, {v}) or ignore_index={ignore_index}, got "
                             f"{values[0]} ({values.size} such labels, in [{values.min()}, {values.max()}])")
    logp_BTV = jax.nn.log_softmax(logits_BTV.astype(jnp.float32), axis=-1)
    safe_BT = jnp.where(weights_BT & in_range_BT, labels_BT, 0)
    nll_BT = -jnp.take_along_axis(logp_BTV, safe_BT[..., None], axis=-1)[..., 0]
    return jnp.where(weights_BT, jnp.where(in_range_BT, nll_BT, jnp.nan), 0.0), weights_BT


def cross_entropy(logits_BTV: jax.Array, labels_BT: jax.Array, ignore_index: int = -100) -> jax.Array:
    """Mean NLL over tokens whose label is not `ignore_index` (0 if there are none); NaN under
    jit if a label is out of range (see `token_nll`)."""
    nll_BT, weights_BT = token_nll(logits_BTV, labels_BT, ignore_index)
    return jnp.sum(nll_BT) / jnp.maximum(jnp.sum(weights_BT), 1)
