"""The files of a local Hugging Face folder: safetensors (sharded or not) or a PyTorch pickle."""

from __future__ import annotations

import json
import os

import numpy as np

SAFETENSORS = "model.safetensors"
TORCH_BIN = "pytorch_model.bin"


class CheckpointError(ValueError):
    """A checkpoint whose tensors do not fit the config: missing, misshaped or unmappable."""


def read_tensors(folder: str) -> dict[str, np.ndarray]:
    """All tensors of a local HF folder: model.safetensors (sharded or not) or pytorch_model.bin.

    safetensors is read with its numpy API, so loading needs no torch.
    """
    def has(name):
        return os.path.isfile(os.path.join(folder, name))

    if has(SAFETENSORS):
        return _read_safetensors([os.path.join(folder, SAFETENSORS)])
    if has(SAFETENSORS + ".index.json"):
        return _read_safetensors(_shards(folder, SAFETENSORS + ".index.json"))
    if has(TORCH_BIN) or has(TORCH_BIN + ".index.json"):
        files = [os.path.join(folder, TORCH_BIN)] if has(TORCH_BIN) else _shards(folder, TORCH_BIN + ".index.json")
        return _read_torch(files)
    raise CheckpointError(
        f"{folder}: no weights found; expected {SAFETENSORS}, {SAFETENSORS}.index.json, "
        f"{TORCH_BIN} or {TORCH_BIN}.index.json"
    )


def _shards(folder: str, index_name: str) -> list[str]:
    with open(os.path.join(folder, index_name)) as f:
        weight_map = json.load(f)["weight_map"]
    return [os.path.join(folder, name) for name in sorted(set(weight_map.values()))]


def _read_safetensors(files: list[str]) -> dict[str, np.ndarray]:
    from safetensors.numpy import load_file

    tensors = {}
    for file in files:
        tensors.update(load_file(file))
    return tensors


def _read_torch(files: list[str]) -> dict[str, np.ndarray]:
    try:
        import torch
    except ImportError as err:
        raise CheckpointError(
            f"{files[0]} is a PyTorch pickle; reading it needs torch. Install torch, or convert the "
            "folder to model.safetensors"
        ) from err
    tensors = {}
    for file in files:
        state = torch.load(file, map_location="cpu", weights_only=True)
        tensors.update({k: v.detach().to(torch.float32).numpy() for k, v in state.items()})
    return tensors


def write_safetensors(tensors: dict[str, np.ndarray], folder: str) -> None:
    from safetensors.numpy import save_file

    # transformers refuses a safetensors file without format metadata.
    save_file({k: np.ascontiguousarray(v) for k, v in tensors.items()},
              os.path.join(folder, SAFETENSORS), metadata={"format": "pt"})
