"""First-fit bin packing of items into rows of fixed capacity, in one or more dimensions.

Used by `txjax.data.packing`: documents into rows of L tokens (one dimension), and T5's
(encoder, decoder) pairs into rows of S and T tokens (two dimensions, both must fit).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

__all__ = ["first_fit"]


def first_fit(sizes_NK: np.ndarray, capacity_K: Sequence[int], *, max_visits: int = 256
              ) -> np.ndarray:
    """Row index of each item: item i, in the given order, goes into the earliest row whose free
    space is >= its size in every one of the K dimensions. Rows used: max(result) + 1, all of
    0..max used. Deterministic.

    A segment tree holds, per dimension, the most free space below each node, and the search
    skips subtrees that cannot fit. In one dimension that is exact and O(log n) per item. In two
    it may backtrack (one row with encoder room, another with decoder room), so a search that
    visits more than `max_visits` nodes stops and takes the last opened row if the item fits
    there, else a new row: O(n log n) always, first fit exactly unless that happens.
    """
    sizes_NK = np.asarray(sizes_NK, dtype=np.int64)
    if sizes_NK.ndim == 1:
        sizes_NK = sizes_NK[:, None]
    cap = [int(c) for c in capacity_K]
    if sizes_NK.ndim != 2 or sizes_NK.shape[1] != len(cap) or not cap:
        raise ValueError(f"sizes must be [N, {len(cap)}] for capacity {cap}, got {sizes_NK.shape}")
    if sizes_NK.size and (sizes_NK.min() < 0 or (sizes_NK > np.asarray(cap)).any()):
        raise ValueError(f"item sizes must lie in [0, capacity={cap}]")
    n = sizes_NK.shape[0]
    leaves = 1 << max(n - 1, 0).bit_length()  # >= n rows: every item has a fresh row left
    free = [[c] * (2 * leaves) for c in cap]  # free[k][node]: most room below node, dimension k
    rows = np.empty(n, dtype=np.int64)
    opened = 0  # rows 0..opened-1 hold items, the rest are empty
    for i, need in enumerate(sizes_NK.tolist()):
        last = leaves + opened - 1
        fits_last = opened > 0 and all(f[last] >= s for f, s in zip(free, need))
        stack, node, visits = [1], last if fits_last else last + 1, 0  # the fallback
        while stack and visits < max_visits:
            top = stack.pop()
            visits += 1
            if any(f[top] < s for f, s in zip(free, need)):
                continue
            if top >= leaves:
                node = top
                break
            stack += [2 * top + 1, 2 * top]  # left child popped first: the earliest row wins
        rows[i] = node - leaves
        opened = max(opened, rows[i] + 1)
        for f, s in zip(free, need):
            f[node] -= s
            up = node // 2
            while up:
                f[up] = max(f[2 * up], f[2 * up + 1])
                up //= 2
    return rows
