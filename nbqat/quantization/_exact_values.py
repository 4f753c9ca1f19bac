"""The exact observed values of :class:`nbqat.MSEObserver` (while they are few).

The state is a (C, n) float32 array (per tensor C = 1): each row the finite values of one
channel, ascending, padded at the end with ``+inf`` to the longest row (rows differ only when
``nonfinite="ignore"`` skipped values), ``-0.0`` stored as ``+0.0`` (the same error for every
candidate; one canonical order). It is a function of the multiset of values seen, so merging
(concatenate and sort) is exact and independent of the split and of the order of batches.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from nbqat._validate import split_axis

_F32 = np.float32


def canonical(rows: np.ndarray) -> np.ndarray:
    """Sort each row of (C, m) float32 values (non-finite become ``+inf``, ``-0.0`` ``+0.0``)
    and drop the trailing columns that are ``+inf`` in every row."""
    v = np.where(np.isfinite(rows), rows + _F32(0.0), _F32(np.inf)).astype(_F32)
    v.sort(axis=1)
    if v.size:
        width = int(np.isfinite(v).sum(axis=1).max())
        v = v[:, :width]
    return np.ascontiguousarray(v)


def batch_rows(x: np.ndarray, per_channel: bool, ch_axis: int) -> np.ndarray:
    """A host float32 batch as (C, m) rows, channel ``c`` of ``ch_axis`` in row ``c``."""
    x32 = np.asarray(x, dtype=_F32)
    if not per_channel:
        return x32.reshape(1, -1)
    outer, c, inner = split_axis(x32.shape, ch_axis % x32.ndim)
    return x32.reshape(outer, c, inner).transpose(1, 0, 2).reshape(c, outer * inner)


def union(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The canonical rows of the values of ``a`` and ``b`` together (same row count)."""
    if a.shape[1] == 0:
        return b.copy()
    if b.shape[1] == 0:
        return a.copy()
    return canonical(np.concatenate([a, b], axis=1))


def gather(pg: Any, rows: np.ndarray) -> np.ndarray:
    """Every rank's (C, m_r) batch rows (``pg`` a distributed process group), as the canonical
    rows of the global batch (the same on every rank)."""
    c = rows.shape[0]
    widths = [int(w) for w in pg.allgather(int(rows.shape[1]))]
    pad = np.full((c, max(widths)), np.inf, np.float64)
    pad[:, : rows.shape[1]] = rows
    parts = pg.allgather_array(pad.reshape(-1))  # float64: exact for float32 values
    allv = parts.reshape(len(widths), c, -1).transpose(1, 0, 2).reshape(c, -1)
    return canonical(allv.astype(_F32))


def check(v: np.ndarray, counts: np.ndarray) -> None:
    """Raise ValueError unless ``v`` (C, n) is canonical rows of exactly as many finite values
    per row as ``counts`` (C,) holds, or has no column (the values were given up)."""
    ok = v.ndim == 2 and v.shape[0] == counts.size
    if ok and v.shape[1]:
        ok = (
            bool(np.array_equal(np.isfinite(v).sum(axis=1), counts))
            and bool(np.array_equal(canonical(v), v))
            and v.shape[1] == int(counts.max(initial=0))
        )
    if not ok:
        raise ValueError(
            "load_state_dict: exact_values must be each channel's finite observed values, "
            "ascending, padded with +inf (as many as the histogram counts), or have no column"
        )
