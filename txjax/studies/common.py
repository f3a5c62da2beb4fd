"""What every study shares: fresh parameters, mean ± std, tables, run metadata.

Studies train with the one loop, `txjax.train.loop.fit`, without a run folder.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from txjax.config import DTYPES
from txjax.nn.positions import FireBias, KerpleBias


def parse_list(text: str, kind: type = str) -> tuple:
    """'a,b, c' -> ('a', 'b', 'c') converted by `kind`; empty items are dropped."""
    return tuple(kind(x.strip()) for x in text.split(",") if x.strip())


def check_dtype(dtype: str) -> None:
    """A study's compute dtype, checked when its config is made (before any data is built)."""
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {DTYPES}, got {dtype!r}")


def init_params(model_cls, config, seed: int):
    """The parameters of a fresh `model_cls(config)` seeded by `seed` (an nnx.State)."""
    return nnx.split(model_cls(config, rngs=nnx.Rngs(seed)), nnx.Param, ...)[1]


PROFILE_DISTANCES = (0, 1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048)


def bias_learned(model: nnx.Module) -> dict:
    """The trained scalars of the model's first FIRE or KERPLE bias ({} for other encodings).
    FIRE: its threshold L and scale c, whether the normaliser psi(max(L, i, j)) varies with the
    positions (L below them) or is a constant, and its bias per head for a query at each of
    PROFILE_DISTANCES from a key at 0 (`fire_bias`, [distance][head]). KERPLE: r1 and r2 per head
    (per direction, then head, when directional), how far and how fast its bias falls with distance."""
    for _, module in nnx.iter_graph(model):
        if isinstance(module, FireBias):
            bias_1NT1 = module(jnp.asarray(PROFILE_DISTANCES), jnp.zeros((1,), jnp.int32))
            return {"fire_threshold": round(float(module.threshold), 3), "fire_c": round(float(module.scale), 4),
                    "fire_bias": _rounded(jnp.transpose(bias_1NT1[0, :, :, 0]))}
        if isinstance(module, KerpleBias):
            return {"kerple_r1": _rounded(module.r1), "kerple_r2": _rounded(module.r2)}
    return {}


def _rounded(x: jax.Array) -> list:
    return np.round(np.asarray(x, np.float64), 4).tolist()


def mean_std(values: Sequence[float | None]) -> tuple[float | None, float | None, int]:
    """(mean, sample std (ddof=1; 0 for one value), n) of the values that are not None."""
    xs = [float(v) for v in values if v is not None]
    if not xs:
        return None, None, 0
    return float(np.mean(xs)), float(np.std(xs, ddof=1)) if len(xs) > 1 else 0.0, len(xs)


def fmt_mean_std(mean: float | None, std: float | None, digits: int = 3) -> str:
    """'1.234 ± 0.010'; '1.234' when std is None (one seed); 'n/a' when there is no value."""
    if mean is None:
        return "n/a"
    return f"{mean:.{digits}f}" if std is None else f"{mean:.{digits}f} ± {std:.{digits}f}"


def markdown_table(header: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """A GitHub Markdown table."""
    lines = ["| " + " | ".join(map(str, header)) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(map(str, row)) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def write_csv(path: str | os.PathLike, rows: Sequence[dict]) -> Path:
    """Rows of dicts as CSV, one column per key of any row (in order of first appearance); None,
    and a key a row lacks (a FIRE scale on a RoPE run), are written as 'n/a'."""
    path = Path(path)
    if not rows:
        raise ValueError(f"no rows to write to {path}")
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(dict.fromkeys(k for row in rows for k in row)), restval="n/a")
        writer.writeheader()
        for row in rows:
            writer.writerow({k: "n/a" if v is None else v for k, v in row.items()})
    return path


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def run_key(row: dict, key: Sequence[str]) -> tuple:
    """The values of a run's `key` fields: what identifies one run of a study."""
    return tuple(row[f] for f in key)


def done_runs(path: Path, key: Sequence[str]) -> set[tuple]:
    """The keys of the runs already in a runs.jsonl: what a resumed study skips."""
    return {run_key(r, key) for r in read_jsonl(path)}


def unique_runs(rows: list[dict], key: Sequence[str]) -> list[dict]:
    """The first row of each distinct `key` (field names): parallel parts of a study may repeat a run."""
    seen: set = set()
    return [r for r in rows if not ((k := run_key(r, key)) in seen or seen.add(k))]


def append_jsonl(path: Path, rows: list[dict]) -> None:
    """Append rows, one JSON object a line (one write per call, so parallel parts interleave by line)."""
    with path.open("a") as f:
        f.write("".join(json.dumps(r) + "\n" for r in rows))


def write_outputs(out_dir: str | os.PathLike, result: dict, summary: Sequence[dict],
                  runs: Sequence[dict], table_md: str) -> Path:
    """results.json, table.csv, runs.csv and table.md in out_dir (the plot is the caller's)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")
    write_csv(out / "table.csv", summary)
    write_csv(out / "runs.csv", runs)
    (out / "table.md").write_text(table_md)
    return out


def git_revision() -> str:
    """The HEAD commit of the checkout holding this package, with '+dirty' when tracked files differ;
    'unknown' outside git (git finds the checkout from the package folder up)."""
    root = Path(__file__).resolve().parent
    try:
        rev = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True,
                             check=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return rev + ("+dirty" if dirty else "")


def run_metadata(configs: dict[str, Any], started: float, revision_at_start: str | None = None) -> dict:
    """What a result folder records about how it was made: command, revision, wall time, load.

    git_revision is read now (the end of the run); pass the one read at the start too.
    """
    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    return {
        "command": " ".join([Path(sys.argv[0]).name if sys.argv else "python", *sys.argv[1:]]),
        "argv": sys.argv,
        "git_revision_at_start": revision_at_start,
        "git_revision": git_revision(),
        "wall_s": round(time.time() - started, 1),
        "load_average_at_end": load,
        "cpu_count": os.cpu_count(),
        "backend": jax.default_backend(),
        "jax_version": jax.__version__,
        "configs": {k: dataclasses.asdict(v) for k, v in configs.items()},
    }


def pyplot():
    """matplotlib.pyplot with the Agg backend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt
