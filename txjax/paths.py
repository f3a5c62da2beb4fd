"""Where txjax keeps what it makes: the user cache folder, for every layer that writes there
(the data modules' downloads, the digit classifier, the CPU kernels' builds)."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    """`$XDG_CACHE_HOME/txjax`, else `~/.cache/txjax` (not created here: writers create it)."""
    xdg = os.environ.get("XDG_CACHE_HOME", "").strip()
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "txjax"
