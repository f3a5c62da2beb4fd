"""The algorithmic tasks of Ruoss et al. 2023 (from Delétang et al. 2023), as their code makes them.

Each task maps an input of n tokens to an output of `output_length(task, n)`. A row is the input
followed by one BLANK per output token; the model's outputs at the BLANKs are the answer, scored
per token. reverse_string (n), duplicate_string (2n) and parity_check (1) read bits;
modular_arithmetic (1) reads an expression of residues mod 5 and operators + - *, products
first, of an odd number of tokens (an even length drops its last token).
"""

from __future__ import annotations

import numpy as np

from txjax.data import IGNORE_INDEX

PAD, BLANK, FIRST = 0, 1, 2  # ids: padding, the output tape's empty cell, then the symbols
MODULUS = 5
OPERATORS = "+-*"
VOCAB_SIZE = FIRST + MODULUS + len(OPERATORS)  # one vocabulary for every task
TASKS = ("reverse_string", "duplicate_string", "parity_check", "modular_arithmetic")


def output_length(task: str, n: int) -> int:
    return {"reverse_string": n, "duplicate_string": 2 * n}.get(task, 1)


def width(task: str, n: int) -> int:
    """Tokens in a row of an n-token input: the input and its blank output tape."""
    return n + output_length(task, n)


def evaluate_modular(residues: np.ndarray, operators: np.ndarray) -> int:
    """r0 o1 r1 o2 r2 ... mod MODULUS, products first (the paper's _evaluate_expression)."""
    total, term = 0, int(residues[0])
    for op, r in zip(operators, residues[1:]):
        if OPERATORS[op] == "*":
            term *= int(r)
        else:
            total += term
            term = int(r) if OPERATORS[op] == "+" else -int(r)
    return (total + term) % MODULUS


def sample_task(task: str, rng: np.random.Generator, n: int, length: int) -> tuple[np.ndarray, np.ndarray]:
    """(inputs [n, L'], outputs [n, output_length(L')]) as token ids; L' = length, less one for an
    even-length modular_arithmetic expression."""
    if task == "modular_arithmetic":
        length -= 1 - length % 2
        residues = rng.integers(0, MODULUS, (n, length // 2 + 1))
        operators = rng.integers(0, len(OPERATORS), (n, length // 2))
        x = np.empty((n, length), np.int64)
        x[:, ::2], x[:, 1::2] = FIRST + residues, FIRST + MODULUS + operators
        y = np.array([[evaluate_modular(r, o)] for r, o in zip(residues, operators)])
        return x.astype(np.int32), (FIRST + y).astype(np.int32)
    bits = rng.integers(0, 2, (n, length))
    if task == "reverse_string":
        y = bits[:, ::-1]
    elif task == "duplicate_string":
        y = np.concatenate([bits, bits], axis=1)
    elif task == "parity_check":
        y = bits.sum(axis=1, keepdims=True) % 2
    else:
        raise ValueError(f"unknown task {task!r}; expected one of {TASKS}")
    return (FIRST + bits).astype(np.int32), (FIRST + y).astype(np.int32)


def encode(x: np.ndarray, y: np.ndarray, row_width: int) -> dict[str, np.ndarray]:
    """Rows `x BLANK*len(y)` right-padded to row_width; targets y at the blanks, -100 elsewhere."""
    n, k = x.shape
    m = y.shape[1]
    if k + m > row_width:
        raise ValueError(f"a row of {k + m} tokens does not fit width {row_width}")
    inputs = np.full((n, row_width), PAD, np.int32)
    targets = np.full((n, row_width), IGNORE_INDEX, np.int32)
    inputs[:, :k], inputs[:, k: k + m], targets[:, k: k + m] = x, BLANK, y
    return {"inputs": inputs, "targets": targets}
