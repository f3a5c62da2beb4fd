"""`doc`: a dataclass field that carries its own help text, for the configs' command-line flags."""

from __future__ import annotations

import dataclasses
from typing import Any


def doc(default: Any, text: str) -> Any:
    """`name: int = doc(4, "what it is")`: the default, with `text` in the field's metadata,
    where `txjax.train.cli` reads each flag's --help (no source parsing)."""
    return dataclasses.field(default=default, metadata={"doc": text})
