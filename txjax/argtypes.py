"""argparse types for the command lines: a bad number is one line naming the flag and the rule."""

from __future__ import annotations

import argparse
from collections.abc import Callable


def _number(kind: type, ok: Callable[[float], bool], rule: str) -> Callable[[str], float]:
    """An argparse `type` parsing `kind` (int or float) and refusing values where not ok(value)."""

    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {kind.__name__}, got {text!r}") from None
        if not ok(value):  # NaN fails every comparison, so it is refused too
            raise argparse.ArgumentTypeError(f"must be {rule}, got {text}")
        return value

    parse.__name__ = f"{kind.__name__} {rule}"
    return parse


def at_least(low: float, kind: type = int) -> Callable[[str], float]:
    """An argparse `type` for a number >= low."""
    return _number(kind, lambda v: v >= low, f">= {low}")


def positive(kind: type = float) -> Callable[[str], float]:
    """An argparse `type` for a number > 0."""
    return _number(kind, lambda v: v > 0, "> 0")
