"""The data folder beside the repository, `../shared/data`, which the scripts read when it is there.

Only the scripts look beside the repo; the library takes paths, $TXJAX_DATA and its cache.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

SHARED_DATA = Path(__file__).resolve().parent.parent.parent / "shared" / "data"


def local_data(name: str) -> str | None:
    """`../shared/data/<name>` beside the repository if that file exists, else None."""
    path = SHARED_DATA / name
    return str(path) if path.is_file() else None


def or_local(config, field: str, name: str):
    """`config` with `field` set to `../shared/data/<name>` when the field is None and that file exists."""
    path = local_data(name)
    if getattr(config, field) is None and path is not None:
        return dataclasses.replace(config, **{field: path})
    return config
