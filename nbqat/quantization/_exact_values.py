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

from nbqat._jit import threads_for
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


def gather_in_order(pg: Any, rows: np.ndarray) -> np.ndarray:
    """Every rank's (C, m_r) batch rows in rank order, padded with +inf (which the grid
    skips): each channel's values in the order of the shards concatenated, as one process
    fed the global batch sees them (the same on every rank)."""
    c = rows.shape[0]
    widths = [int(w) for w in pg.allgather(int(rows.shape[1]))]
    pad = np.full((c, max(widths)), np.inf, np.float64)
    pad[:, : rows.shape[1]] = rows
    parts = pg.allgather_array(pad.reshape(-1))  # float64: exact for float32 values
    return parts.reshape(len(widths), c, -1).transpose(1, 0, 2).reshape(c, -1).astype(_F32)


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


# -- past max_exact: the fine grid (bounds on every candidate's exact error) --------------------

#: Bins of the fine grid a channel (per channel) and per tensor.
GRID_BINS_CHANNEL = 1 << 13
GRID_BINS_TENSOR = 1 << 16
_GRID_KEYS = ("grid_exponent", "grid_index", "grid_count", "grid_sum", "grid_sumsq")
GRID_KEYS = _GRID_KEYS + ("grid_min", "grid_max")


def grid_exponents(mins: np.ndarray, maxs: np.ndarray, nb: int) -> np.ndarray:
    """(C,) int64: the smallest bin exponent ``e`` with ``max(|min|, |max|) < nb / 2 * 2 ** e``
    (unset channels as 0)."""
    m = np.maximum(np.abs(mins.astype(np.float64)), np.abs(maxs.astype(np.float64)))
    m = np.where(np.isfinite(m), m, 0.0)
    return (np.frexp(m)[1].astype(np.int64) - int(nb).bit_length() + 2).astype(np.int64)


class Grid:
    """The fine grid of :mod:`nbqat.kernels.fine_grid_cpu`: per channel ``exps`` (C,) int64,
    ``cnt`` (C, nb) int64, ``s1``/``s2`` (C, nb) float64, ``lo``/``hi`` (C, nb) float32."""

    def __init__(self, c: int, nb: int, exps: np.ndarray) -> None:
        self.exps = np.asarray(exps, np.int64).reshape(c).copy()
        self.cnt = np.zeros((c, nb), np.int64)
        self.s1 = np.zeros((c, nb), np.float64)
        self.s2 = np.zeros((c, nb), np.float64)
        self.lo = np.full((c, nb), np.inf, _F32)
        self.hi = np.full((c, nb), -np.inf, _F32)

    def arrays(self) -> tuple[np.ndarray, ...]:
        return self.cnt, self.s1, self.s2, self.lo, self.hi

    def copy(self) -> Grid:
        c, nb = self.cnt.shape
        g = Grid(c, nb, self.exps)
        for dst, src in zip(g.arrays(), self.arrays(), strict=True):
            dst[...] = src
        return g

    def widen(self, exps: np.ndarray) -> None:
        """Coarsen every channel to at least the exponents ``exps`` (in place)."""
        from nbqat.kernels import fine_grid_cpu as _fg

        new = np.maximum(self.exps, exps)
        if (new > self.exps).any():
            with threads_for(self.cnt.size):
                _fg.grid_coarsen(*self.arrays(), new - self.exps)
            self.exps = new

    def add(self, x: np.ndarray, outer: int, inner: int) -> None:
        """Add the finite values of a C-contiguous float32 (outer, C, inner) array."""
        from nbqat.kernels import fine_grid_cpu as _fg

        flat = np.ascontiguousarray(x, dtype=_F32).reshape(-1)
        with threads_for(flat.size):
            _fg.grid_add(flat, outer, self.cnt.shape[0], inner, self.exps, *self.arrays())

    def add_batch(self, data: Any, rows: bool, ch_axis: int | None) -> None:
        """Add a host batch (``ch_axis`` its channel axis, None per tensor) or, ``rows``, its
        (C, m) rows."""
        if rows:
            self.add_rows(data)
            return
        x32 = np.ascontiguousarray(data, dtype=_F32)
        if ch_axis is None:
            self.add(x32, 1, x32.size)
        else:
            outer, _, inner = split_axis(x32.shape, ch_axis % x32.ndim)
            self.add(x32, outer, inner)

    def add_rows(self, rows: np.ndarray) -> None:
        """Add (C, m) rows (non-finite entries skipped)."""
        c, m = rows.shape
        self.add(np.ascontiguousarray(rows.T), m, 1)

    def merge(self, other: Grid) -> None:
        """Add ``other``'s values (left unchanged) into this grid."""
        theirs = other.copy()
        exps = np.maximum(self.exps, theirs.exps)
        self.widen(exps)
        theirs.widen(exps)
        self.cnt += theirs.cnt
        self.s1 += theirs.s1
        self.s2 += theirs.s2
        np.minimum(self.lo, theirs.lo, out=self.lo)
        np.maximum(self.hi, theirs.hi, out=self.hi)

    def bounds(self, s: np.ndarray, z: np.ndarray, qmin: float, qmax: float) -> tuple:
        """(K, C) float64 lower and upper bounds of each candidate's exact error."""
        from nbqat.kernels import fine_grid_cpu as _fg

        return _fg.grid_bounds(*self.arrays(), self.exps, s, z, qmin, qmax)

    def state(self) -> dict[str, np.ndarray]:
        """The grid as sparse arrays: ``grid_exponent`` (C,) int64, ``grid_index`` (flat
        indices of the non-empty bins of the (C, nb) grid, ascending), ``grid_count`` int64,
        ``grid_sum``, ``grid_sumsq`` float64 (the moments about each bin's centre, in bin
        widths), ``grid_min``, ``grid_max`` float32 (the bin's extremes)."""
        idx = np.flatnonzero(self.cnt.reshape(-1))
        vals = [a.reshape(-1)[idx].copy() for a in self.arrays()]
        return dict(zip(GRID_KEYS, [self.exps.copy(), idx.astype(np.int64), *vals], strict=True))


def empty_grid_state() -> dict[str, np.ndarray]:
    """The state of no grid (the values given up before a grid existed, or never past
    ``max_exact``)."""
    f, i = np.empty(0, np.float64), np.empty(0, np.int64)
    return dict(zip(GRID_KEYS, [i, i, i, f, f, f.astype(_F32), f.astype(_F32)], strict=True))


def load_grid(state: Any, counts: np.ndarray, nb: int) -> Grid | None:
    """The :meth:`Grid.state` in ``state`` (None when absent or empty); raise ValueError unless
    it holds exactly ``counts`` (C,) values a channel, each inside its bin."""
    if any(k not in state for k in GRID_KEYS):
        return None
    exps = np.array(state["grid_exponent"], dtype=np.int64).reshape(-1)
    if exps.size == 0:
        return None
    c = counts.size
    idx = np.array(state["grid_index"], dtype=np.int64).reshape(-1)
    vals = [np.asarray(state[k]).reshape(-1) for k in GRID_KEYS[2:]]
    ok = exps.size == c and all(v.shape == idx.shape for v in vals)
    ok = ok and bool((np.diff(idx) > 0).all())
    ok = ok and (idx.size == 0 or 0 <= idx[0] <= idx[-1] < c * nb)
    g = Grid(c, nb, exps if exps.size == c else np.zeros(c, np.int64))
    if ok:
        for a, v in zip(g.arrays(), vals, strict=True):
            a.reshape(-1)[idx] = v
        k = idx % nb - nb // 2
        w = np.ldexp(1.0, exps[idx // nb])
        inside = (g.lo.reshape(-1)[idx] >= k * w) & (g.hi.reshape(-1)[idx] < (k + 1) * w)
        ok = bool((vals[0] > 0).all() and inside.all() and (g.lo <= g.hi).reshape(-1)[idx].all())
        ok = ok and bool(np.array_equal(g.cnt.sum(axis=1), counts))
        ok = ok and bool((np.abs(vals[1]) <= 0.5 * vals[0]).all())
    if not ok:
        raise ValueError(
            "load_state_dict: the grid_* entries must be the fine grid of the counted values "
            "(ascending flat indices, positive counts, each bin's extremes inside it)"
        )
    return g


def grid_of_values(values: np.ndarray, exps: np.ndarray, nb: int) -> Grid:
    """The grid (exponents ``exps``, ``nb`` bins) of canonical (C, n) rows of values."""
    g = Grid(exps.size, nb, exps)
    if values.shape[1]:
        g.add_rows(values)
    return g


def merged_grid(sides: list[Any], exps: np.ndarray, nb: int) -> Grid | None:
    """The grid of two observers' values, each side a :class:`Grid`, canonical (C, n) rows or
    None (values unknown: then None); the sides are left unchanged."""
    if any(s is None for s in sides):
        return None
    grids = [s for s in sides if isinstance(s, Grid)]
    rows = [s for s in sides if not isinstance(s, Grid) and s.shape[1]]
    if not grids:  # both sides' values, sorted together: as one observer's forward builds it
        both = union(*rows) if len(rows) == 2 else (rows[0] if rows else np.empty((exps.size, 0)))
        return grid_of_values(both, exps, nb)
    g = grids[0].copy()
    g.widen(exps)
    for other in grids[1:]:
        g.merge(other)
    for r in rows:
        g.add_rows(r)
    return g


def choose(low: np.ndarray, high: np.ndarray) -> np.ndarray:
    """(C,) index of the chosen candidate from (K, C) error bounds, ``K - 1`` being min/max:
    the smallest midpoint among the candidates whose upper bound is at most min/max's lower
    bound (certainly no worse), min/max otherwise; ties the largest index."""
    mid = 0.5 * (low + high)
    ok = high <= low[-1][None, :]
    ok[-1] = True
    score = np.where(ok, mid, np.inf)
    return (low.shape[0] - 1) - np.argmin(score[::-1], axis=0)


def load_values(ev: Any, state: Any, counts: np.ndarray, nb: int) -> tuple[np.ndarray, Grid | None]:
    """The ``exact_values`` (``ev``, None when absent) and the grid of a state holding
    ``counts`` (C,) values a channel; ValueError unless they hold exactly those values."""
    v = np.empty((counts.size, 0), _F32)
    if ev is not None:
        v = np.array(ev, dtype=_F32).reshape(counts.size, -1) if counts.size else v
        check(v, counts)
    return v, (None if v.shape[1] else load_grid(state, counts, nb))


def side(obs: Any) -> Any:
    """What a merge needs of an MSEObserver: its values, its grid or None (unknown)."""
    return obs.exact_values if obs._exact() else obs.grid
