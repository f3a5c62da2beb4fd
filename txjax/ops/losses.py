"""Cross-entropy that ignores label -100 and normalises by the real token count."""

from __future__ import annotations

import jax
import jax.numpy as jnp


def token_nll(
    logits_BTV: jax.Array, labels_BT: jax.Array, ignore_index: int = -100
) -> tuple[jax.Array, jax.Array]:
    """Per-token negative log-likelihood (float32, 0 where ignored) and the bool weights."""
    if logits_BTV.shape[:-1] != labels_BT.shape:
        raise ValueError(
            f"cross_entropy: logits {logits_BTV.shape} do not match labels {labels_BT.shape}"
        )
    weights_BT = labels_BT != ignore_index
    logp_BTV = jax.nn.log_softmax(logits_BTV.astype(jnp.float32), axis=-1)
    safe_BT = jnp.where(weights_BT, labels_BT, 0)
    nll_BT = -jnp.take_along_axis(logp_BTV, safe_BT[..., None], axis=-1)[..., 0]
    return jnp.where(weights_BT, nll_BT, 0.0), weights_BT


def cross_entropy(logits_BTV: jax.Array, labels_BT: jax.Array, ignore_index: int = -100) -> jax.Array:
    """Mean NLL over tokens whose label is not `ignore_index` (0 if there are none)."""
    nll_BT, weights_BT = token_nll(logits_BTV, labels_BT, ignore_index)
    return jnp.sum(nll_BT) / jnp.maximum(jnp.sum(weights_BT), 1)
