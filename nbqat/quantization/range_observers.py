"""Percentile and MSE calibration from an exactly mergeable histogram.

Both observers count every finite float32 value in a *fixed* logarithmic grid: the bin of ``v``
is the top ``9 + mantissa_bits`` bits of its order key (sign, exponent and ``mantissa_bits``
mantissa bits; 65 536 bins for the default 7), so a bin spans a relative width of at most
``2 ** -mantissa_bits`` (0.8 %) at any magnitude, tiny and huge values included. The grid never
moves, so two observers merge by adding integer counts: :meth:`merge` is exact (the result
equals one observer that saw every batch, whatever the split; data-parallel ranks stay in sync)
and the counts do not depend on the thread count or the CUDA schedule. Exact running
``min_val``/``max_val`` are kept beside the counts, as :class:`~nbqat.MinMaxObserver` does.

* :class:`PercentileObserver`: ``[min, max] = [q(1 - p), q(p)]`` of the observed values
  (linear interpolation inside a bin), per tensor (TensorRT / ModelOpt's percentile calibration).
* :class:`MSEObserver`: the range ``alpha * [min_val, max_val]`` (``num_candidates`` alphas in
  ``(0, 1]``) of least fake-quant squared error on the values seen, per tensor or per channel.

Non-finite values: ``nonfinite="raise"`` (default) rejects a batch with NaN/Inf and keeps the
state; ``"ignore"`` skips them; ``"propagate"`` (meaningless for a histogram) is refused.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from nbqat import _cuda, _jit
from nbqat._docs import MERGE_RESULT, fill_doc
from nbqat._validate import check_finite_real, split_axis
from nbqat.kernels import keygrid_cpu as _kg
from nbqat.quantization import _exact_values as _ev
from nbqat.quantization import _minmax_math as _mm
from nbqat.quantization._observer_args import int_in_range
from nbqat.quantization._observer_stats import device as _device
from nbqat.quantization._observer_stats import grid_edges as _grid_edges
from nbqat.quantization.observers import _MinMaxBase

__all__ = ["MSEObserver", "PercentileObserver"]

_F32 = np.float32


class _KeyHistBase(_MinMaxBase):
    """Order-key grid counts + exact min/max; subclasses choose the range in :meth:`_range`."""

    def _configure_own(self, a: dict[str, Any]) -> None:
        super()._configure_own(a)
        self.mantissa_bits = int_in_range(a["mantissa_bits"], "mantissa_bits", 0, 10)
        if str(a["nonfinite"]).removeprefix("torch.") == "propagate":
            raise ValueError(
                f"{type(self).__name__}: nonfinite='propagate' has no meaning for a histogram of "
                "finite values: use 'raise' (default) or 'ignore'"
            )
        self._shift = 23 - self.mantissa_bits
        self.nbins = 1 << (32 - self._shift)

    set_min_max = _mm.refuse_set_min_max  # the counts are over [min_val, max_val]

    def reset_min_max_vals(self) -> None:
        """Forget the statistics (no counts, min/max unset)."""
        super().reset_min_max_vals()
        shape = (0, self.nbins) if self._per_channel else (self.nbins,)
        self.histogram = np.zeros(shape, np.int64)

    def forward(self, x: Any) -> Any:
        """Observe a batch (count it in the grid, update min/max) and return it unchanged.

        Parameters
        ----------
        x : ndarray, CUDA device array or array-like (as :meth:`nbqat.MinMaxObserver.forward`)
            Observed as float32 (per channel, CUDA input is counted on the host).

        Returns
        -------
        x : the type of the input
            ``x`` itself, unchanged (not a copy).

        Raises
        ------
        TypeError, ValueError
            As :meth:`nbqat.MinMaxObserver.forward`; the state is unchanged on any error.
        """
        a = self._observe(x)  # validates, applies the policy and updates min/max (or raises)
        pg = self.process_group
        synced = pg is not None and pg.distributed
        empty = math.prod(a.shape) == 0
        if empty and not synced:
            return x
        if empty:  # take part in the ranks' sum with nothing observed
            c = a.shape[self.ch_axis % len(a.shape)] if self._per_channel else 0
            counts = np.zeros((c, self.nbins) if self._per_channel else self.nbins, np.int64)
        else:
            counts = self._count(a)
        if synced:  # every rank adds every rank's counts: exact below 2**53 per bin
            counts = pg.allreduce_sum(counts.astype(np.float64)).astype(np.int64)
        extra = self._batch_extra(a, counts, synced)
        if self._per_channel and self.histogram.shape[0] == 0:
            self.histogram = counts
        else:  # in place: the counts are complete, nothing below can fail
            self.histogram += counts
        self._commit_extra(extra)
        return x

    def _batch_extra(self, a: Any, counts: np.ndarray, synced: bool) -> Any:
        """A subclass's further state of the batch ``a`` (computed before any change)."""
        return None

    def _commit_extra(self, extra: Any) -> None:
        """Fold :meth:`_batch_extra`'s result into the state (after the counts)."""

    def _count(self, x: Any) -> np.ndarray:
        is_dev = _cuda.is_cuda_array(x)
        if is_dev and not self._per_channel and np.dtype(x.dtype) == np.float32:
            from nbqat.kernels import histogram_cuda as _hc

            d = _device(x)
            return _hc.key_counts(d.reshape(d.size).view(np.int32), self._shift)
        h = _device(x).copy_to_host() if is_dev else x
        x32 = np.ascontiguousarray(h, dtype=_F32)
        b = x32.reshape(-1).view(np.int32)
        with _jit.threads_for(b.size):
            if not self._per_channel:
                return _kg.key_counts(b, self._shift)
            outer, c, inner = split_axis(x32.shape, self.ch_axis % x32.ndim)
            return _kg.key_counts_channel(b, outer, c, inner, self._shift)

    def _range(self) -> tuple[np.ndarray, np.ndarray]:  # pragma: no cover - abstract
        raise NotImplementedError

    def calculate_qparams(self) -> tuple[np.ndarray, np.ndarray]:
        """Scale and zero point of the calibrated range (the min/max observers' formula on it).

        Returns
        -------
        scale : float32 ndarray, (1,) per tensor or (C,) per channel
        zero_point : int32 ndarray, same shape

        Warns
        -----
        UserWarning
            Nothing observed yet (``([1.0], [0])``), or channels without a finite value.
        """
        if self._min.size == 0 or (self._min.reshape(-1) == np.inf).all():
            return self._qparams(self._min, self._max)
        lo, hi = self._range()
        return self._qparams(lo, hi)

    def _bins_2d(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        h = self.histogram.reshape(-1, self.nbins)
        return h, self._min.reshape(-1).astype(np.float64), self._max.reshape(-1).astype(np.float64)

    @fill_doc(merge_result=MERGE_RESULT)
    def merge(self, other: _KeyHistBase) -> _KeyHistBase:  # type: ignore[override]
        """Add another observer's counts and min/max into this one (exact; returns self).

        Parameters
        ----------
        other : observer of the same class, configuration and ``mantissa_bits``
            Its counts are added (it is left unchanged).

        {merge_result}
            As :meth:`nbqat.MinMaxObserver.merge` (``mantissa_bits`` is part of the
            configuration).
        """
        mine, theirs = self.histogram, other.histogram
        super().merge(other)  # checks the configuration and merges min/max exactly
        if theirs.size == 0:
            return self
        self.histogram = theirs.copy() if mine.size == 0 else mine + theirs
        return self

    def _merge_key(self) -> tuple[object, ...]:
        return super()._merge_key() + (self.mantissa_bits,)

    def state_dict(self) -> dict[str, np.ndarray]:
        """``eps``, ``min_val``, ``max_val`` (as the min/max observers) and the grid counts,
        sparse: ``histogram_index`` (int64 flat indices of the non-empty bins of the
        ``(nbins,)`` or ``(C, nbins)`` counts, ascending) and ``histogram_count`` (int64)."""
        d = super().state_dict()
        flat = self.histogram.reshape(-1)
        idx = np.flatnonzero(flat)
        d["histogram_index"] = idx.astype(np.int64)
        d["histogram_count"] = flat[idx].copy()
        return d

    def load_state_dict(self, state: dict[str, Any], strict: bool = True) -> None:
        """Load :meth:`state_dict` output.

        Parameters
        ----------
        state : mapping with ``min_val``, ``max_val``, ``histogram_index``,
            ``histogram_count`` (``eps`` optional)
        strict : bool, default True
            Whether other keys (but ``eps``) are an error.

        Raises
        ------
        KeyError, ValueError
            As :meth:`nbqat.MinMaxObserver.load_state_dict`; also for indices not ascending or
            out of range and non-positive counts. Nothing is changed on error.
        """
        keys = ("histogram_index", "histogram_count")
        if not hasattr(state, "keys") or any(k not in state for k in keys):
            raise KeyError(f"load_state_dict: missing key(s) {list(keys)}")
        idx = np.array(state["histogram_index"], dtype=np.int64).reshape(-1)
        cnt = np.array(state["histogram_count"], dtype=np.int64).reshape(-1)
        mn = np.asarray(state.get("min_val", np.empty(0)))
        shape = (mn.size, self.nbins) if self._per_channel else (self.nbins,)
        size = int(np.prod(shape))
        ok = idx.shape == cnt.shape and (cnt > 0).all() and (np.diff(idx) > 0).all()
        if not ok or (idx.size and (idx[0] < 0 or idx[-1] >= size)):
            raise ValueError(
                "load_state_dict: histogram_index must be ascending flat indices into "
                f"{shape} counts, with as many positive histogram_count values"
            )
        h = np.zeros(size, np.int64)
        h[idx] = cnt
        super().load_state_dict({k: v for k, v in state.items() if k not in keys}, strict)
        self.histogram = h.reshape(shape)


class PercentileObserver(_KeyHistBase):
    """Range from percentiles of the observed values, per tensor (exactly mergeable).

    Parameters
    ----------
    percentile : float in (50, 100], default 99.99
        ``max = q(percentile / 100)``, ``min = q(1 - percentile / 100)`` of all finite values
        seen, interpolated linearly inside a grid bin and clamped to ``[min_val, max_val]``
        (100 gives min/max exactly).
    mantissa_bits : int in [0, 10], default 7
        Grid resolution: a bin is at most ``2 ** -mantissa_bits`` relative wide.
    dtype, qscheme, reduce_range, quant_min, quant_max, eps
        As :class:`~nbqat.MinMaxObserver` (per-tensor qschemes).
    nonfinite : {"raise", "ignore"}, default "raise"

    Notes
    -----
    The quantile error is at most one bin, ``|q - q_exact| <= 2 ** -mantissa_bits * |q|``.

    References
    ----------
    NVIDIA TensorRT / ModelOpt percentile calibration (``HistogramCalibrator``, method
    ``"percentile"``); Wu et al. 2020, "Integer Quantization for Deep Learning Inference".
    """

    OWN_PARAMS = (("percentile", float, 99.99), ("mantissa_bits", int, 7))

    def _configure_own(self, a: dict[str, Any]) -> None:
        percentile = a["percentile"]
        if isinstance(percentile, bool) or not isinstance(percentile, (int, float, np.number)):
            raise TypeError(f"percentile must be a float in (50, 100], got {percentile!r}")
        if not 50.0 < float(percentile) <= 100.0:
            raise ValueError(f"percentile must be in (50, 100], got {percentile}")
        self.percentile = float(percentile)
        super()._configure_own(a)

    def quantile(self, q: float) -> np.float32:
        """The ``q``-quantile (``0 <= q <= 1``) of the observed values from the grid counts.

        Parameters
        ----------
        q : float in [0, 1]

        Returns
        -------
        float32
            NaN when nothing was observed; ``min_val`` for ``q = 0``, ``max_val`` for ``q = 1``.

        Raises
        ------
        TypeError, ValueError
            ``q`` not a real number in [0, 1] (as ``numpy.quantile``).
        """
        q = check_finite_real(q, "q")
        if not 0.0 <= q <= 1.0:
            raise ValueError(f"`q` must be in [0, 1], got {q}")
        h = self.histogram
        total = int(h.sum())
        if total == 0:
            return _F32(np.nan)
        mn, mx = float(self._min), float(self._max)
        vlo, vhi = _grid_edges(self._shift)
        target = q * total
        cum = np.cumsum(h)
        # the first bin whose count reaches the target and holds values: q = 0 is the first
        # non-empty bin's bottom (the minimum), not the empty NaN/-Inf bin below it
        b = int(np.searchsorted(cum, target, side="left"))
        b = int(np.flatnonzero(h)[0]) if target <= 0.0 else min(b, h.size - 1)
        before = float(cum[b] - h[b])
        lo, hi = max(vlo[b], mn), min(vhi[b], mx)
        frac = 0.0 if h[b] == 0 else min(max((target - before) / h[b], 0.0), 1.0)
        return _F32(min(max(lo + frac * (hi - lo), mn), mx))

    def _range(self) -> tuple[np.ndarray, np.ndarray]:
        p = self.percentile / 100.0
        if p >= 1.0:
            return self._min, self._max
        return np.asarray(self.quantile(1.0 - p)), np.asarray(self.quantile(p))


class MSEObserver(_KeyHistBase):
    """Clipping range minimising the fake-quant MSE, per tensor or per channel (mergeable).

    Parameters
    ----------
    num_candidates : int, default 100
        Candidate ranges ``alpha * [min_val, max_val]``, ``alpha = k / num_candidates``,
        ``k = 1 .. num_candidates`` (per channel: each channel its own alpha). Ties keep the
        widest range.
    ch_axis : int, default 0
        Channel axis for the per-channel qschemes (weights: 0).
    mantissa_bits : int in [0, 10], default 7 (per tensor) / 5 (per channel)
        Resolution of the counts (per channel ``C * 2 ** (9 + mantissa_bits)`` int64).
    max_exact : int >= 0 or None, default None
        The observed values themselves are kept while no channel (per tensor: the tensor) has
        seen more than ``max_exact`` finite values; None: ``2 * 2 ** (9 + mantissa_bits)``
        (32 768 per channel, 131 072 per tensor). Beyond, the fine grid (0: from the start).
    dtype, qscheme, reduce_range, quant_min, quant_max, eps
        As :class:`~nbqat.MinMaxObserver` / :class:`~nbqat.PerChannelMinMaxObserver`.
    nonfinite : {"raise", "ignore"}, default "raise"

    Notes
    -----
    A candidate's error is the exact squared fake-quant error of the values seen,
    ``sum_v (fq(v) - v) ** 2`` in float64. While the values are kept (``exact_values``, sorted,
    exactly mergeable) every candidate is evaluated on them: the exact best is chosen. Beyond
    ``max_exact`` a fine grid a channel (8192 bins, 65 536 per tensor, 256 KiB / 2 MiB; each
    bin's count, moments and extremes; :mod:`nbqat.kernels.fine_grid_cpu`) gives each
    candidate's error exactly over the bins inside one quantisation cell and bounds for the few
    that straddle a boundary; the choice is the best of the candidates certainly no worse than
    min/max (``alpha = 1``), else min/max: never worse than min/max on the data seen (to
    float64 rounding), within the bound widths of the exact best (docs/semantics.md). The grid
    merges exactly in counts and extremes, to float64 rounding in the moments.

    References
    ----------
    NVIDIA ModelOpt ``MseCalibrator``; Banner et al. 2019, "Post-training 4-bit quantization of
    convolution networks for rapid-deployment" (MSE-optimal clipping).
    """

    OWN_PARAMS = (
        ("num_candidates", int, 100),
        ("ch_axis", int, 0),
        ("mantissa_bits", int | None, None),
        ("max_exact", int | None, None),
    )

    def _configure_own(self, a: dict[str, Any]) -> None:
        self.num_candidates = int_in_range(a["num_candidates"], "num_candidates", 1)
        self._per_channel = str(a["qscheme"]).removeprefix("torch.").startswith("per_channel")
        if a["mantissa_bits"] is None:
            a["mantissa_bits"] = 5 if self._per_channel else 7
        super()._configure_own(a)
        m = a["max_exact"]
        self.max_exact = 2 * self.nbins if m is None else int_in_range(m, "max_exact", 0)
        self._grid_bins = _ev.GRID_BINS_CHANNEL if self._per_channel else _ev.GRID_BINS_TENSOR

    def reset_min_max_vals(self) -> None:
        """Forget the statistics (no counts, no values, no grid, min/max unset)."""
        super().reset_min_max_vals()
        self.exact_values = np.empty((0 if self._per_channel else 1, 0), _F32)
        self.grid: _ev.Grid | None = None

    def _exact(self) -> bool:
        """Whether every finite value seen is in ``exact_values``."""
        return self.exact_values.shape[1] > 0 or not self.histogram.any()

    def _seen(self) -> np.ndarray:
        """(C,) int64: the finite values counted a channel (per tensor (1,))."""
        return self.histogram.reshape(-1, self.nbins).sum(axis=1)

    def _batch_extra(self, a: Any, counts: np.ndarray, synced: bool) -> Any:
        exact = self._exact()
        if not exact and self.grid is None:  # the values were lost (an older state): estimate
            return None
        h = _device(a).copy_to_host() if _cuda.is_cuda_array(a) else a
        if not synced and not exact:  # the common case past max_exact: the batch as it is
            return ("batch", h)
        n = counts.reshape(-1, self.nbins).sum(axis=1)
        n = n + self._seen() if self.histogram.size else n
        rows = _ev.batch_rows(h, self._per_channel, self.ch_axis if self._per_channel else 0)
        if not exact:  # synced: the global batch, the shards in rank order
            return ("rows", _ev.gather_in_order(self.process_group, rows))
        rows = _ev.gather(self.process_group, rows) if synced else _ev.canonical(rows)
        return rows if n.max(initial=0) <= self.max_exact else ("start", rows)

    def _commit_extra(self, extra: Any) -> None:
        if not isinstance(extra, tuple):
            if extra is not None:
                self.exact_values = _ev.union(self.exact_values, extra)
            return
        kind, data = extra
        exps = self._grid_exponents()
        if kind == "start":  # the values so far and this batch, sorted: as a merge builds it
            both = _ev.union(self.exact_values, data)
            self.grid = _ev.grid_of_values(both, exps, self._grid_bins)
            self.exact_values = np.empty((exps.size, 0), _F32)
        elif self.grid is not None:
            self.grid.widen(exps)
            self.grid.add_batch(data, kind == "rows", self.ch_axis if self._per_channel else None)

    @fill_doc(merge_result=MERGE_RESULT)
    def merge(self, other: MSEObserver) -> MSEObserver:  # type: ignore[override]
        """Add another observer's counts, values (or fine grid) and min/max into this one.

        Parameters
        ----------
        other : MSEObserver of the same configuration (``mantissa_bits``, ``max_exact``)
            Left unchanged. Counts, values and extremes merge exactly; past ``max_exact`` the
            grids add, their moments to float64 rounding.

        {merge_result}
            As :meth:`nbqat.MinMaxObserver.merge`.
        """
        keep = isinstance(other, MSEObserver) and self._exact() and other._exact()
        sides = [_ev.side(o) if isinstance(o, MSEObserver) else None for o in (self, other)]
        mine, theirs = self.exact_values, other.exact_values
        super().merge(other)
        n = self._seen()
        self.grid = None
        if keep and n.max(initial=0) <= self.max_exact:
            self.exact_values = _ev.union(mine, theirs) if theirs.shape[0] else mine.copy()
            return self
        self.exact_values = np.empty((n.size, 0), _F32)
        if n.size:
            self.grid = _ev.merged_grid(sides, self._grid_exponents(), self._grid_bins)
        return self

    def _grid_exponents(self) -> np.ndarray:
        return _ev.grid_exponents(self._min.reshape(-1), self._max.reshape(-1), self._grid_bins)

    def _merge_key(self) -> tuple[object, ...]:
        return super()._merge_key() + (self.max_exact,)

    def state_dict(self) -> dict[str, np.ndarray]:
        """As :meth:`nbqat.PercentileObserver.state_dict`, ``exact_values`` (float32, each
        channel's finite values ascending, (n,) or (C, n) padded with +inf; no column past
        ``max_exact``) and the grid's ``grid_*`` arrays
        (:meth:`nbqat.quantization._exact_values.Grid.state`)."""
        d = super().state_dict()
        v = self.exact_values
        d["exact_values"] = (v if self._per_channel else v.reshape(-1)).copy()
        d.update(self.grid.state() if self.grid is not None else _ev.empty_grid_state())
        return d

    def load_state_dict(self, state: dict[str, Any], strict: bool = True) -> None:
        """Load :meth:`state_dict` output (without ``exact_values`` and the grid, e.g. an older
        state: the values are unknown, the histogram estimate is used).

        Parameters
        ----------
        state : mapping, as :meth:`nbqat.PercentileObserver.load_state_dict`
        strict : bool, default True

        Raises
        ------
        KeyError, ValueError
            As :meth:`nbqat.PercentileObserver.load_state_dict`; also for ``exact_values`` or
            a grid that do not hold the counted values. Nothing is changed on error.
        """
        keys = list(state.keys()) if hasattr(state, "keys") else []
        rest = {k: state[k] for k in keys if k not in ("exact_values",) + _ev.GRID_KEYS}
        ev = state["exact_values"] if "exact_values" in keys else None
        before = (self.histogram, self._min, self._max, self.eps, self.exact_values, self.grid)
        super().load_state_dict(rest, strict)
        n = self._seen()
        try:
            self.exact_values, self.grid = _ev.load_values(ev, state, n, self._grid_bins)
        except ValueError:
            self.histogram, self._min, self._max, self.eps, self.exact_values, self.grid = before
            raise

    def _range(self) -> tuple[np.ndarray, np.ndarray]:
        h, mins, maxs = self._bins_2d()
        unset = ~np.isfinite(mins)
        m0, m1 = np.where(unset, 0.0, mins), np.where(unset, 0.0, maxs)
        alphas = np.arange(1, self.num_candidates + 1, dtype=np.float64) / self.num_candidates
        cand_lo = (alphas[:, None] * m0[None, :]).astype(_F32)
        cand_hi = (alphas[:, None] * m1[None, :]).astype(_F32)
        s, z = self._qparams(cand_lo.reshape(-1), cand_hi.reshape(-1))
        k, c = cand_lo.shape
        s, z = s.reshape(k, c), z.reshape(k, c).astype(np.float64)
        qmin, qmax = float(self.quant_min), float(self.quant_max)
        with _jit.threads_for(_jit.PARALLEL_MIN if c > 1 else 0):  # per tensor: no wake-up
            if self._exact() and self.exact_values.shape[1]:
                low = high = _kg.exact_mse_errors(self.exact_values, s, z, qmin, qmax)
            elif self.grid is not None:
                low, high = self.grid.bounds(s, z, qmin, qmax)
            else:  # the values are unknown (an older state): the histogram estimate
                vlo, vhi = _grid_edges(self._shift)
                low = high = _kg.mse_errors(h, vlo, vhi, m0, m1, s, z, qmin, qmax, 4)
        best = _ev.choose(low, high)  # exact errors: the best (ties: the largest alpha)
        idx = np.arange(c)
        lo = np.where(unset, self._min.reshape(-1), cand_lo[best, idx]).astype(_F32)
        hi = np.where(unset, self._max.reshape(-1), cand_hi[best, idx]).astype(_F32)
        return lo.reshape(self._min.shape), hi.reshape(self._max.shape)
