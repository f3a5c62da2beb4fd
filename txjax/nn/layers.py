"""The small NNX modules: embedding, norms, dense, feed-forward."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from txjax import ops
from txjax.config import ExecutionConfig, TransformerConfig
from txjax.ops import cpu_activation, cpu_norm, xla_cpu
from txjax.ops.checks import is_concrete  # noqa: F401 (nn's modules import it from here)

INIT = nnx.initializers.normal(stddev=0.02)


def kernel_init(config: TransformerConfig):
    """Dense kernels: INIT, or (init "t5") N(0, 1/fan_in) as t5x does. t5x folds attention's
    1/sqrt(H) into the query kernel's init; here it stays in the logits, which is the same."""
    return INIT if config.init == "normal" else nnx.initializers.variance_scaling(1.0, "fan_in", "normal")


def embedding_init(config: TransformerConfig):
    """The token table: INIT, or (init "t5") N(0, 1) as t5x and Hugging Face's T5 do."""
    return INIT if config.init == "normal" else nnx.initializers.normal(stddev=1.0)


def check_tokens(tokens, vocab_size: int, name: str = "tokens") -> jax.Array:
    """The ids as an array (lists accepted): rank and dtype always; the id range too when the
    values are concrete.

    Under jit the ids are unknown at trace time; `Embed` then looks out-of-range ids
    (negative ones included) up as NaN, never another row, so a bad id poisons the loss.
    """
    tokens = jnp.asarray(tokens)
    if tokens.ndim != 2:
        raise ValueError(f"{name} must be [B, T], got shape {tokens.shape}")
    if not jnp.issubdtype(tokens.dtype, jnp.integer):
        raise ValueError(f"{name} must be integer ids, got dtype {tokens.dtype}")
    if is_concrete(tokens) and tokens.size:
        ids = np.asarray(tokens)  # host-side: also works for a constant captured inside jit
        lo, hi = int(ids.min()), int(ids.max())
        if lo < 0 or hi >= vocab_size:
            raise ValueError(f"{name} has ids in [{lo}, {hi}], outside the vocabulary [0, {vocab_size})")
    return tokens


def check_document_ids(document_ids_BT: jax.Array, shape: tuple[int, ...], name: str = "document_ids") -> jax.Array:
    """Packed sequences' document ids: integers of the tokens' shape, non-decreasing along each row
    (each document one contiguous run; checked when the values are concrete). Returns them as an array."""
    document_ids_BT = jnp.asarray(document_ids_BT)
    if document_ids_BT.shape != tuple(shape):
        raise ValueError(f"{name} {document_ids_BT.shape} must have the shape of the tokens {tuple(shape)}")
    if not jnp.issubdtype(document_ids_BT.dtype, jnp.integer):
        raise ValueError(f"{name} must be integers, got dtype {document_ids_BT.dtype}")
    if is_concrete(document_ids_BT) and document_ids_BT.size:
        steps = np.diff(np.asarray(document_ids_BT), axis=-1)
        if (steps < 0).any():
            row, col = map(int, np.argwhere(steps < 0)[0])
            raise ValueError(
                f"{name} decrease inside row {row} (at token {col + 1}); each document must be one "
                "contiguous run, numbered in increasing order along the row")
    return document_ids_BT


class Embed(nnx.Module):
    """Token embedding [V, D]; `attend` is the tied output head x @ E^T."""

    def __init__(self, num_embeddings: int, features: int, *, rngs: nnx.Rngs, dtype=jnp.float32, init=INIT):
        self.num_embeddings = num_embeddings
        self.dtype = jnp.dtype(dtype)  # of the looked-up rows; the table itself is float32
        self.embedding = nnx.Param(init(rngs.params(), (num_embeddings, features)))

    def __call__(self, ids: jax.Array) -> jax.Array:
        """Rows [..., D]; an id outside [0, V) gives a NaN row. jnp.take wraps negative ids
        (-1 is row V-1) before mode="fill" sees them, so they are moved past the end first."""
        ids = jnp.asarray(ids)
        ids = jnp.where(ids < 0, self.num_embeddings, ids)
        rows = jnp.take(self.embedding[...], ids, axis=0, mode="fill", fill_value=jnp.nan)
        return rows.astype(self.dtype)

    def attend(self, x_BTD: jax.Array) -> jax.Array:
        """Logits in float32 whatever the compute dtype: they feed softmax and the loss."""
        table_VD = self.embedding[...].astype(x_BTD.dtype)
        return jnp.einsum("BTD,VD->BTV", x_BTD, table_VD, preferred_element_type=jnp.float32)


class LayerNorm(nnx.Module):
    """`ops.layer_norm`; `fused`: by the CPU kernel (`ops.cpu_norm`), the same math."""

    def __init__(self, dim: int, eps: float = 1e-5, fused: bool = False):
        self.eps, self.fused = eps, fused
        self.scale = nnx.Param(jnp.ones((dim,)))
        self.bias = nnx.Param(jnp.zeros((dim,)))

    def __call__(self, x):
        norm = cpu_norm.layer_norm if self.fused else ops.layer_norm
        return norm(x, self.scale[...], self.bias[...], self.eps)


class RMSNorm(nnx.Module):
    """`ops.rms_norm`; `fused`: by the CPU kernel (`ops.cpu_norm`), the same math."""

    def __init__(self, dim: int, eps: float = 1e-6, fused: bool = False):
        self.eps, self.fused = eps, fused
        self.scale = nnx.Param(jnp.ones((dim,)))

    def __call__(self, x):
        norm = cpu_norm.rms_norm if self.fused else ops.rms_norm
        return norm(x, self.scale[...], self.eps)


def check_width(x: jax.Array, width: int, name: str) -> None:
    """A clear error for an input of the wrong width, before any matmul sees it."""
    if x.ndim != 3 or x.shape[-1] != width:
        raise ValueError(f"{name} expects [B, T, {width}], got shape {x.shape}")


def make_norm(config: TransformerConfig, execution: ExecutionConfig = ExecutionConfig()) -> LayerNorm | RMSNorm:
    cls = LayerNorm if config.norm == "layer" else RMSNorm
    return cls(config.d_model, config.norm_eps, fused=execution.norm(jax.default_backend()) == "cpu_fused")


class Dense(nnx.Linear):
    """`nnx.Linear` (same parameters, same values); with `xla_cpu_grads`, float32 and bfloat16
    run through `txjax.ops.xla_cpu.dense`: the forms XLA:CPU runs fast, float32 accumulation
    and a float32 bias."""

    def __init__(self, *args, xla_cpu_grads: bool = False, **kwargs):
        super().__init__(*args, **kwargs)
        self.xla_cpu_grads = xla_cpu_grads

    def __call__(self, inputs: jax.Array, out_sharding=None) -> jax.Array:
        fast = jnp.dtype(self.dtype or inputs.dtype) in xla_cpu.DTYPES
        if not (self.xla_cpu_grads and fast) or out_sharding is not None or self.precision is not None:
            return super().__call__(inputs, out_sharding)
        inputs, kernel = self.promote_dtype((inputs, self.kernel[...]), dtype=self.dtype)
        return xla_cpu.dense(inputs, kernel, self.bias[...] if self.bias is not None else None)


def dense_kwargs(config: TransformerConfig, execution: ExecutionConfig, rngs: nnx.Rngs, **changes) -> dict:
    """The keyword arguments every `Dense` of a model shares."""
    return {"use_bias": config.use_bias, "kernel_init": kernel_init(config), "dtype": jnp.dtype(config.dtype), "rngs": rngs,
            "xla_cpu_grads": execution.xla_cpu_grads(jax.default_backend()), **changes}


class FeedForward(nnx.Module):
    """D -> F -> D with an activation; gated: act(x W_in) * (x W_gate) (GEGLU, SwiGLU)."""

    def __init__(self, config: TransformerConfig, *, rngs: nnx.Rngs,
                 execution: ExecutionConfig = ExecutionConfig()):
        d, f = config.d_model, config.d_ff
        self.activation = config.activation
        self.fused_activation = execution.activation(jax.default_backend(), config.dtype) == "cpu_fused"
        self.d_model = d
        dense = dense_kwargs(config, execution, rngs)
        self.wi = Dense(d, f, **dense)
        self.wg = Dense(d, f, **dense) if config.gated else None
        self.wo = Dense(f, d, **dense)

    def __call__(self, x_BTD):
        check_width(x_BTD, self.d_model, "FeedForward")
        h_BTF = cpu_activation.activation(self.activation, self.fused_activation)(self.wi(x_BTD))
        if self.wg is not None:
            h_BTF = h_BTF * self.wg(x_BTD)
        return self.wo(h_BTF)
