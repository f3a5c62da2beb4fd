"""Hardware and the roofline: accelerator presets, arithmetic intensity, attainable FLOP/s.

AI = FLOPs / bytes moved, compared with the ridge point peak FLOP/s / bandwidth.
"""

from __future__ import annotations

import dataclasses

GiB = 2**30


@dataclasses.dataclass(frozen=True)
class Hardware:
    """Peak dense matmul throughput, memory bandwidth and memory of one accelerator."""

    name: str
    peak_flops: float  # FLOP/s, dense bf16 tensor-core (no sparsity)
    bandwidth: float  # bytes/s of main (HBM) memory
    memory_bytes: float  # capacity of main memory

    @property
    def ridge_point(self) -> float:
        """I* = peak / bandwidth, in FLOPs per byte: above it a kernel is compute-bound."""
        return self.peak_flops / self.bandwidth

    @classmethod
    def a100(cls) -> "Hardware":
        """A100 80GB SXM: 312 TFLOP/s bf16, HBM2e 2.0 TB/s (the notes' figures)."""
        return cls("A100 80GB", 312e12, 2.0e12, 80 * GiB)

    @classmethod
    def h100(cls) -> "Hardware":
        """H100 SXM: 989 TFLOP/s bf16, HBM3 3.35 TB/s, 80 GB."""
        return cls("H100 SXM", 989e12, 3.35e12, 80 * GiB)

    @classmethod
    def h200(cls) -> "Hardware":
        """H200: the H100's 989 TFLOP/s bf16 with HBM3e 4.8 TB/s, 141 GB."""
        return cls("H200", 989e12, 4.8e12, 141e9)


def hardware(name: str) -> Hardware:
    """Hardware preset by name: "a100", "h100", "h200"."""
    presets = {"a100": Hardware.a100, "h100": Hardware.h100, "h200": Hardware.h200}
    key = name.lower().replace("-", "").replace(" ", "").replace("sxm", "")
    if key not in presets:
        raise ValueError(f"unknown hardware {name!r}; expected one of {sorted(presets)}")
    return presets[key]()

# ----------------------------------------------------------------------------- intensity, roofline


def linear_intensity(batch: int, seq_len: int, d_in: int, d_out: int | None = None,
                     bytes_per_element: float = 2) -> float:
    """FLOPs per byte of X[b·t, d] @ W[d, d]: 2btd² / ((2btd + d²)·s), the notes' AI_lin.

    With d_out given, W is [d_in, d_out]: 2·bt·d_in·d_out / ((bt·d_in + d_in·d_out + bt·d_out)·s).
    It tends to d/s when bt ≫ d (training) and to 2b/s when t = 1 and b ≪ d (decoding).
    """
    d_out = d_in if d_out is None else d_out
    m = batch * seq_len
    flops = 2 * m * d_in * d_out
    moved = (m * d_in + d_in * d_out + m * d_out) * bytes_per_element
    return flops / moved


def attention_intensity(batch: int, seq_len: int, d_model: int, num_heads: int,
                        bytes_per_element: float = 2) -> float:
    """FLOPs per byte of softmax(QKᵀ)V with the score matrix in main memory.

    FLOPs 4·b·t²·d; bytes (4·b·t·d + 2·b·a·t²)·s (read Q, K, V, write O; write and
    read S), so AI = 2td / (s·(2d + a·t)) → 2d / (s·a) when t ≫ 2d/a: memory-bound.
    """
    b, t, d, a, s = batch, seq_len, d_model, num_heads, bytes_per_element
    return (4 * b * t * t * d) / ((4 * b * t * d + 2 * b * a * t * t) * s)


def roofline(intensity: float, hw: Hardware) -> dict[str, float | str]:
    """Attainable FLOP/s = min(peak, AI · bandwidth), and which roof limits it."""
    attainable = min(hw.peak_flops, intensity * hw.bandwidth)
    bound = "compute-bound" if intensity >= hw.ridge_point else "memory-bound"
    return {"intensity": intensity, "ridge_point": hw.ridge_point,
            "attainable_flops": attainable, "bound": bound}
