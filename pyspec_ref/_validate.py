"""Argument checks shared by `pyspec_ref.trees` and `pyspec_ref.attention`.

Every helper takes the argument's `name` and puts it, with the offending index,
into the message, so that a caller always learns WHICH argument is wrong and
where. Wrong kinds of value raise TypeError, wrong values raise ValueError.
Each helper returns a fresh plain-Python copy, so the callers never alias (or
are surprised by later mutation of) what they were given.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping, Sequence, Set

_NOT_SEQUENCES = (str, bytes, bytearray)


def type_name(value: object) -> str:
    """The short type name used in messages, e.g. 'float' or 'ndarray'."""
    return type(value).__name__


def as_sequence(value: object, name: str, what: str) -> list:
    """`value` as a list, if it is an ordered sequence (list, tuple, range, ...).

    Strings, mappings and sets are refused: they iterate, but not as a row of
    values. NumPy arrays and torch tensors are refused too (they are not
    `collections.abc.Sequence`); the hint says to call `.tolist()`, which keeps
    this package free of any third-party import.
    """
    if isinstance(value, _NOT_SEQUENCES + (Mapping, Set)) or not isinstance(value, Sequence):
        raise TypeError(
            f"{name} must be {what}, got {type_name(value)}"
            " (convert arrays and tensors with .tolist())"
        )
    return list(value)


def as_int(value: object, name: str) -> int:
    """`value` as an int; bools, floats, None and strings are refused.

    bool is a subclass of int in Python, so it is checked first: True as a
    node id is almost certainly a bug, never an intended 1.
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int, got {value!r} of type {type_name(value)}")
    return int(value)


def positive_int(value: object, name: str) -> int:
    """`value` as an int >= 1."""
    n = as_int(value, name)
    if n < 1:
        raise ValueError(f"{name} must be a positive int, got {n}")
    return n


def index(value: object, name: str, n: int, what: str) -> int:
    """`value` as an index into `n` items of kind `what` (e.g. 'node')."""
    i = as_int(value, name)
    if not 0 <= i < n:
        raise ValueError(f"{name} = {i} is out of range: there are {n} {what}s (0..{n - 1})")
    return i


def int_list(value: object, name: str, *, allow_empty: bool = False) -> list[int]:
    """A sequence of ints (non-empty unless `allow_empty`), as a list."""
    items = as_sequence(value, name, "a sequence of ints (list, tuple or range)")
    if not items and not allow_empty:
        raise ValueError(f"{name} must not be empty")
    return [as_int(x, f"{name}[{i}]") for i, x in enumerate(items)]


def permutation(value: object, name: str, n: int) -> list[int]:
    """A permutation of 0..n-1, as a list."""
    items = int_list(value, name)
    if len(items) != n:
        raise ValueError(f"{name} has {len(items)} entries, expected {n}")
    first_at: dict[int, int] = {}
    for i, x in enumerate(items):
        if not 0 <= x < n:
            raise ValueError(
                f"{name}[{i}] = {x} is out of range: {name} must be a permutation of 0..{n - 1}"
            )
        if x in first_at:
            raise ValueError(
                f"{name}[{i}] = {x} repeats {name}[{first_at[x]}]: "
                f"{name} must be a permutation of 0..{n - 1}"
            )
        first_at[x] = i
    return items


def as_real(
    value: object, name: str, *, allow_neg_inf: bool = False, any_value: bool = False
) -> float:
    """`value` as a float: a real number (not bool), finite, or -inf if allowed.

    NaN and +inf are refused: no softmax or attention output is defined for
    them, and silently propagating them is exactly what a spec must not do.
    `any_value` lifts that for numbers that are about to be ignored (the output
    of a partial that saw no key, see `attention.merge_attention`).
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a real number, got {value!r} of type {type_name(value)}")
    x = float(value)
    if any_value or math.isfinite(x) or (allow_neg_inf and x == -math.inf):
        return x
    allowed = "finite or -inf" if allow_neg_inf else "finite"
    raise ValueError(f"{name} = {x} is not allowed: it must be {allowed}")


def positive_finite(value: object, name: str) -> float:
    """`value` as a finite float > 0 (e.g. a softmax scale)."""
    x = as_real(value, name)
    if x <= 0.0:
        raise ValueError(f"{name} must be positive, got {x}")
    return x


def real_list(
    value: object,
    name: str,
    *,
    allow_neg_inf: bool = False,
    any_value: bool = False,
    expected_len: int | None = None,
    len_note: str = "",
) -> list[float]:
    """A non-empty sequence of real numbers (see `as_real`), as a list of floats."""
    items = as_sequence(value, name, "a sequence of real numbers")
    if not items:
        raise ValueError(f"{name} must not be empty")
    if expected_len is not None and len(items) != expected_len:
        raise ValueError(f"{name} has {len(items)} entries, expected {len_note or expected_len}")
    return [
        as_real(x, f"{name}[{i}]", allow_neg_inf=allow_neg_inf, any_value=any_value)
        for i, x in enumerate(items)
    ]


def _rows(value: object, name: str, n_rows: int | None, rows_note: str) -> list:
    """The rows of a matrix argument, checking their number."""
    rows = as_sequence(value, name, "a list of rows (a sequence of sequences)")
    if not rows:
        raise ValueError(f"{name} must have at least one row, got none")
    if n_rows is not None and len(rows) != n_rows:
        raise ValueError(f"{name} has {len(rows)} rows, expected {rows_note}")
    return rows


def _row(value: object, name: str, n_cols: int | None, cols_note: str, what: str) -> list:
    """One row of a matrix argument, checking its length."""
    row = as_sequence(value, name, f"a row: a sequence of {what}")
    if not row:
        raise ValueError(f"{name} is empty: every row needs at least one column")
    if n_cols is not None and len(row) != n_cols:
        raise ValueError(f"{name} has {len(row)} columns, expected {cols_note}")
    return row


def real_matrix(
    value: object,
    name: str,
    *,
    n_rows: int | None = None,
    rows_note: str = "",
    n_cols: int | None = None,
    cols_note: str = "",
) -> list[list[float]]:
    """A rectangular matrix of finite real numbers, rows first, as floats.

    Without `n_cols` the width is the first row's; every other row must match.
    `rows_note` / `cols_note` explain an expected size in messages, e.g.
    "d = 4 (the width of q)".
    """
    rows = _rows(value, name, n_rows, rows_note)
    out: list[list[float]] = []
    for i, r in enumerate(rows):
        if n_cols is None and i > 0:
            n_cols, cols_note = len(out[0]), f"{len(out[0])} (the width of {name}[0])"
        row = _row(r, f"{name}[{i}]", n_cols, cols_note, "real numbers")
        out.append([as_real(x, f"{name}[{i}][{j}]") for j, x in enumerate(row)])
    return out


def bool_matrix(
    value: object, name: str, *, n_rows: int, rows_note: str, n_cols: int, cols_note: str
) -> list[list[bool]]:
    """An n_rows x n_cols matrix of bools (True/False only; 0/1 are refused)."""
    rows = _rows(value, name, n_rows, rows_note)
    out: list[list[bool]] = []
    for i, r in enumerate(rows):
        row = _row(r, f"{name}[{i}]", n_cols, cols_note, "bools")
        for j, x in enumerate(row):
            if not isinstance(x, bool):
                raise TypeError(
                    f"{name}[{i}][{j}] must be a bool (True = visible), got {x!r} "
                    f"of type {type_name(x)}"
                )
        out.append(list(row))
    return out
