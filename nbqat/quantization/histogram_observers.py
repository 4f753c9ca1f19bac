"""``HistogramObserver``: torch 2.13's histogram calibration, with a non-finite policy.

The running histogram (``bins`` equal bins over the running ``[min_val, max_val]``), its growth
when a batch widens the range (the old histogram is split ``upsample_rate`` times and re-binned
by mid point, torch's ``_upscale_histogram``) and the L2 range search of ``calculate_qparams``
(torch's ``_non_linear_param_search``, after caffe2's ``NormMinimization``) are torch's,
operation by operation in float32, so that on float32 streams the qparams equal
``torch.ao.quantization.HistogramObserver``'s (tested: identical zero point and scale). The
compiled kernels live in :mod:`nbqat.kernels.histogram_cpu` (``@cuda.jit`` twin of the counting
pass in :mod:`nbqat.kernels.histogram_cuda`). In steady state (the batch
inside the running range) an update is ONE pass over the data (min/max and the counts over the
running range together); a widening range takes torch's two (min/max, then counts over the new
range).

Where torch is wrong, nbqat is not:

* constant (all-zero included) input: torch loops 50 000 times through its search; nbqat returns
  the same qparams at once;
* huge values: torch's float32 bin arithmetic and its L2 norms overflow (bins and ranges become
  garbage); nbqat switches to float64 arithmetic there (bins and the unit-range search), and
  for ranges below 1e-7, where torch's norms underflow;
* NaN / Inf follow ``nonfinite=`` (see :mod:`nbqat.quantization.observers`): ``"raise"`` (default)
  rejects the
  batch, ``"ignore"`` skips those values, ``"propagate"`` is torch's behaviour (+-Inf skipped with
  a warning; a NaN makes torch's ``histc`` raise, so it raises ValueError here).
"""

from __future__ import annotations

import math
import warnings
from typing import Any

import numpy as np

from nbqat import _cuda, _jit
from nbqat.kernels import histogram_cpu as _hk
from nbqat.kernels import observe_cpu as _ok
from nbqat.quantization import _minmax_math as _mm
from nbqat.quantization import _observer_args as _args
from nbqat.quantization._observer_args import DTYPES, int_in_range
from nbqat.quantization._observer_stats import INF_NOTE
from nbqat.quantization._observer_stats import batch_stats as _batch_stats_any
from nbqat.quantization._observer_stats import check_input as _check_input
from nbqat.quantization._observer_stats import decode as _decode
from nbqat.quantization._observer_stats import device as _device
from nbqat.quantization.observers import _MinMaxBase

__all__ = ["HistogramObserver"]

_F32 = np.float32
#: Largest float32 range whose L2 norms (range ** 3, total * range ** 2) stay finite in float32,
#: and the smallest whose norms stay normal; outside, the search runs in float64.
_WIDE_ABOVE = 1e36
_NARROW_BELOW = 1e-7


def _apply_policy(obs: Any, fmin, fmax, nnan, npinf, nninf, who: str) -> None:
    """Raise or warn for a batch's NaN/Inf under ``obs.nonfinite`` (before any state change)."""
    n_nan, n_inf = int(nnan.sum()), int(npinf.sum() + nninf.sum())
    if n_nan + n_inf == 0:
        return
    if obs.nonfinite == "raise" or (obs.nonfinite == "propagate" and n_nan):
        raise ValueError(
            f"{who}: the batch holds {n_nan} NaN, {int(npinf.sum())} +Inf and "
            f"{int(nninf.sum())} -Inf values{INF_NOTE if n_inf else ''}; the observer state is "
            "unchanged. Fix the "
            "input, or construct the observer with nonfinite='ignore' (skip them)"
            + ("" if n_nan == 0 else "; torch's HistogramObserver fails on NaN too")
        )
    if obs.nonfinite == "propagate":
        warnings.warn(
            "torch.inf detected in input tensor, ignoring input", UserWarning, stacklevel=4
        )


def _flat_data(x: Any, is_cuda: bool) -> Any:
    """The batch as flat float32 host data, or a flat device array (converted per element)."""
    if is_cuda:
        data = _device(x)
        return data.reshape(data.size)
    return np.ravel(x if x.dtype == _F32 else x.astype(_F32), order="K")


def _batch_stats(obs: Any, x: Any, who: str) -> tuple[Any, np.float32, np.float32] | None:
    """Flat float32 host data (or device array) and its finite-policy min/max; None to skip."""
    x, is_cuda = _check_input(x, who)
    if math.prod(x.shape) == 0:
        return None
    fmin, fmax, nnan, npinf, nninf = _batch_stats_any(x, is_cuda, None)
    _apply_policy(obs, fmin, fmax, nnan, npinf, nninf, who)
    if fmin[0] > fmax[0]:  # no finite value at all
        return None
    return _flat_data(x, is_cuda), _F32(fmin[0]), _F32(fmax[0])


def _edges(lo: np.float32, hi: np.float32, bins: int) -> tuple[np.float32, np.float32, bool]:
    """``torch.histc``'s outer edges (``lo == hi`` widens by 1 each way, in float64) and
    whether the float32 bin arithmetic would overflow."""
    if lo == hi:
        lo, hi = _F32(float(lo) - 1.0), _F32(float(hi) + 1.0)
    with np.errstate(over="ignore"):
        wide = not np.isfinite(_F32((hi - lo) * _F32(bins)))
    return lo, hi, wide


def _histc(data: Any, bins: int, lo: Any, hi: Any) -> np.ndarray:
    """float32 counts of ``torch.histc(data, bins, min=lo, max=hi)`` (host or CUDA data)."""
    elo, ehi, wide = _edges(lo, hi, bins)
    if _cuda.is_cuda_array(data):
        from nbqat.kernels import histogram_cuda as _hc

        counts = _hc.histc_counts(data, elo, ehi, bins, wide)
    else:
        with _jit.threads_for(data.size):
            counts = _hk.histc_counts(data, elo, ehi, bins, wide)
    return counts.astype(_F32)


def _transform(
    obs: HistogramObserver, hist: np.ndarray, omin: Any, omax: Any, nmin: Any, nmax: Any
) -> np.ndarray:
    """``hist`` over ``[omin, omax]`` in the bins of ``[nmin, nmax]`` (torch's combine rules)."""
    if omin == nmin and omax == nmax:
        return hist
    if omin == omax:  # a constant: all its mass in the bin of that value
        out = np.zeros(obs.bins, _F32)
        elo, ehi, wide = _edges(_F32(nmin), _F32(nmax), obs.bins)
        out[_hk.bin_f32(_F32(omin), elo, ehi, obs.bins, wide)] = _hk.torch_sum_f32(hist)
        return out
    with np.errstate(over="ignore"):
        wide = not np.isfinite(_F32(nmax) - _F32(nmin))
    return _hk.upscale_histogram(
        hist, _F32(omin), _F32(omax), _F32(nmin), _F32(nmax), obs.upsample_rate, wide
    )


class HistogramObserver(_MinMaxBase):
    """Running histogram and the L2-optimal range (torch's ``HistogramObserver``), per tensor.

    Parameters
    ----------
    bins : int, default 2048
        Histogram bins over the running ``[min_val, max_val]``.
    upsample_rate : int, default 16
        Parts each old bin is split into when the range grows (torch 2.13's fixed value).
    dtype : str, default "quint8"
    qscheme : {"per_tensor_affine", "per_tensor_symmetric"}, default "per_tensor_affine"
    reduce_range, quant_min, quant_max, eps, nonfinite
        As :class:`~nbqat.MinMaxObserver` (``nonfinite`` as in this module's docstring).

    Attributes
    ----------
    histogram : (bins,) float32 ndarray
        Counts (fractional after range growth); float32 like torch's buffer, so exact up to
        2 ** 24 per bin.
    min_val, max_val : float32 0-d ndarray
        The histogram's range (+Inf/-Inf before the first batch).

    Notes
    -----
    The search bins of the quantized range are ``2 ** bits`` of the dtype (256 for 8-bit types,
    whatever ``reduce_range`` or a custom range says), as torch. ``calculate_qparams`` finds
    ``[new_min, new_max]`` and then applies :meth:`nbqat.MinMaxObserver.calculate_qparams`'s
    formula. float32 ``torch.sum`` order is reproduced with 8 lanes, as torch 2.13's x86 CPU build
    (:data:`nbqat.kernels.histogram_search_cpu.LANES`).

    References
    ----------
    ``torch.ao.quantization.observer.HistogramObserver`` (torch 2.13); caffe2
    ``norm_minimization.cc`` (``NonlinearQuantizationParamsSearch``).
    """

    OWN_PARAMS = (("bins", int, 2048), ("upsample_rate", int, 16))

    def _configure_own(self, a: dict[str, Any]) -> None:
        super()._configure_own(a)
        self.bins = int_in_range(a["bins"], "bins", 1)
        self.upsample_rate = int_in_range(a["upsample_rate"], "upsample_rate", 1)
        lo, hi, _ = DTYPES[_args.norm_name(a["dtype"], "dtype", tuple(DTYPES))]
        self.dst_nbins = hi - lo + 1

    set_min_max = _mm.refuse_set_min_max  # the counts are over [min_val, max_val]

    def reset_min_max_vals(self) -> None:
        """Forget the statistics (empty histogram, ``min_val = +Inf``, ``max_val = -Inf``)."""
        super().reset_min_max_vals()
        self.histogram = np.zeros(self.bins, _F32)
        #: Whether the last batch widened the range: then the next one skips the fused pass
        #: (whose counts a growing range throws away) and makes torch's two passes directly.
        self._grew = False

    def forward(self, x: Any) -> Any:
        """Observe a batch (update the histogram, growing its range) and return it unchanged.

        Parameters
        ----------
        x : ndarray, CUDA device array or array-like (as :meth:`nbqat.MinMaxObserver.forward`)
            Observed as float32; an empty batch is returned without observing.

        Returns
        -------
        x : the same object

        Raises
        ------
        TypeError, ValueError
            As :meth:`nbqat.MinMaxObserver.forward`; under ``"propagate"`` a NaN raises too
            (torch's ``histc`` fails on it).
        """
        who = f"{type(self).__name__}.forward"
        cur_min, cur_max = self._min[()], self._max[()]
        pg = self.process_group
        if pg is not None and pg.distributed:
            self._forward_synced(x, pg, who)
            return x
        if not self._grew and self._fused(x, cur_min, cur_max):
            return x
        got = _batch_stats(self, x, who)
        if got is None:
            return x
        data, x_min, x_max = got
        if cur_min == np.inf or cur_max == -np.inf:
            hist = _histc(data, self.bins, x_min, x_max)
            self._min, self._max = np.array(x_min, _F32), np.array(x_max, _F32)
            self.histogram = hist
            return x
        new_min, new_max = min(cur_min, x_min), max(cur_max, x_max)
        self._grew = bool(new_min < cur_min or new_max > cur_max)
        self._grow(_histc(data, self.bins, new_min, new_max), new_min, new_max)
        return x

    def _forward_synced(self, x: Any, pg: Any, who: str) -> None:
        """Data-parallel update (:func:`nbqat.distributed.sync_observers`): the ranks' batch
        min/max are combined first, every rank counts its shard over the same global range and
        the integer counts are summed, so every rank holds the histogram of one observer fed
        the global batch (exact), the empty shard included."""
        x, is_cuda = _check_input(x, who)
        n = math.prod(x.shape)
        stats = _batch_stats_any(x, is_cuda, None)  # an empty shard: "nothing seen"
        fmin, fmax, nnan, npinf, nninf = pg.combine_minmax_stats(stats, who, self._sync_config())
        _apply_policy(self, fmin, fmax, nnan, npinf, nninf, who)
        cur_min, cur_max = self._min[()], self._max[()]
        if fmin[0] > fmax[0]:
            return  # nothing finite on any rank
        x_min, x_max = _F32(fmin[0]), _F32(fmax[0])
        unset = cur_min == np.inf or cur_max == -np.inf
        lo, hi = (x_min, x_max) if unset else (min(cur_min, x_min), max(cur_max, x_max))
        if n:
            data = _flat_data(x, is_cuda)
            counts = _histc(data, self.bins, lo, hi).astype(np.float64)
        else:
            counts = np.zeros(self.bins, np.float64)
        update = pg.allreduce_sum(counts).astype(_F32)
        if unset:
            self._min, self._max = np.array(lo, _F32), np.array(hi, _F32)
            self.histogram = update
        else:
            self._grow(update, lo, hi)

    def _grow(self, update: np.ndarray, new_min: Any, new_max: Any) -> None:
        """Add ``update`` (counts over ``[new_min, new_max]``), re-binning the old histogram."""
        cur_min, cur_max = self._min[()], self._max[()]
        old = _transform(self, self.histogram, cur_min, cur_max, new_min, new_max)
        self.histogram = (update + old).astype(_F32)
        self._min, self._max = np.array(new_min, _F32), np.array(new_max, _F32)

    def _fused(self, x: Any, cur_min: Any, cur_max: Any) -> bool:
        """Steady-state fast path (float32 NumPy input, a running range already set): ONE pass
        finds the batch min/max and counts it over the current range; when the batch is
        finite, the counts are torch's update histogram. Returns False (nothing changed) when
        the general path must run; the second pass then runs only if the range grows."""
        if not (type(x) is np.ndarray and x.dtype == _F32 and x.size and cur_min < cur_max):
            return False
        if _edges(cur_min, cur_max, self.bins)[2]:
            return False
        flat = np.ravel(x, order="K")
        with _jit.threads_for(flat.size):
            kmin, kmax, counts = _hk.minmax_histc(
                flat, flat.view(np.int32), cur_min, cur_max, self.bins
            )
        if not (kmin > _ok.KEY_NEG_INF and kmax < _ok.KEY_POS_INF):
            return False  # NaN/Inf: the policy path decides
        x_min, x_max = _decode([kmin])[0], _decode([kmax])[0]
        if x_min >= cur_min and x_max <= cur_max:
            self.histogram = (self.histogram + counts.astype(_F32)).astype(_F32)
            return True
        new_min, new_max = min(cur_min, x_min), max(cur_max, x_max)
        self._grew = True
        with _jit.threads_for(flat.size):
            self._grow(_histc(flat, self.bins, new_min, new_max), new_min, new_max)
        return True

    def _search(self) -> tuple[Any, Any]:
        """torch's ``_non_linear_param_search``: the clipped range ``(new_min, new_max)``."""
        mn, mx = self._min[()], self._max[()]
        if mn == mx:
            return mn, mx
        rng = float(mx) - float(mn)
        total = float(self.histogram.astype(np.float64).sum())
        with np.errstate(over="ignore"):
            f32_ok = np.isfinite(_F32(mx - mn))
        if f32_ok and _NARROW_BELOW <= rng and rng**3 <= _WIDE_ABOVE and total * rng**2 <= 1e36:
            s, e = _hk.l2_search(self.histogram, mn, mx, self.dst_nbins)
            bw = (mx - mn) / _F32(self.bins)
            return _F32(mn + bw * _F32(s)), _F32(mn + bw * _F32(e + 1))
        s, e = _hk.l2_search_wide(self.histogram, self.dst_nbins)
        bw64 = rng / self.bins
        return _F32(float(mn) + bw64 * s), _F32(float(mn) + bw64 * (e + 1))

    def calculate_qparams(self) -> tuple[np.ndarray, np.ndarray]:
        """Scale and zero point of the L2-optimal range of the histogram.

        Returns
        -------
        scale : (1,) float32 ndarray
        zero_point : (1,) int32 ndarray

        Warns
        -----
        UserWarning
            Nothing observed yet: ``([1.0], [0])``, as torch.
        """
        new_min, new_max = (self._min, self._max) if self._min[()] == np.inf else self._search()
        return self._qparams(np.asarray(new_min), np.asarray(new_max))

    def merge(self, other: HistogramObserver) -> HistogramObserver:  # type: ignore[override]
        """Add another observer's histogram into this one (in place; returns self).

        Both histograms are re-binned onto the union of the two ranges with the rule a growing
        range uses (exact when the ranges are equal; otherwise the mid-point approximation of
        torch's ``_upscale_histogram``). Deterministic; ``a.merge(b)`` and ``b.merge(a)`` agree
        up to float32 rounding of the sum.

        Parameters
        ----------
        other : HistogramObserver with the same configuration (left unchanged)

        Returns
        -------
        HistogramObserver
            ``self``, holding both histograms.

        Raises
        ------
        TypeError, ValueError
            As :meth:`nbqat.MinMaxObserver.merge`; ``bins`` and ``upsample_rate`` are part of
            the configuration.
        """
        self._check_mergeable(other)
        if other._min[()] == np.inf:
            return self
        if self._min[()] == np.inf:
            self.load_state_dict(other.state_dict())
            return self
        a0, a1, b0, b1 = self._min[()], self._max[()], other._min[()], other._max[()]
        lo, hi = min(a0, b0), max(a1, b1)
        ha = _transform(self, self.histogram, a0, a1, lo, hi)
        hb = _transform(self, other.histogram, b0, b1, lo, hi)
        self.histogram = (ha + hb).astype(_F32)
        self._min, self._max = np.array(lo, _F32), np.array(hi, _F32)
        return self

    def _merge_key(self) -> tuple[object, ...]:
        return super()._merge_key() + (self.bins, self.upsample_rate)

    def state_dict(self) -> dict[str, np.ndarray]:
        """Copies of torch's buffers: ``eps`` (1,), ``min_val``/``max_val`` (), ``histogram``."""
        d = super().state_dict()
        d["histogram"] = self.histogram.copy()
        return d

    def load_state_dict(self, state: dict[str, Any], strict: bool = True) -> None:
        """Load :meth:`state_dict` output (or torch's, converted with ``.numpy()``).

        Parameters
        ----------
        state : mapping with ``min_val``, ``max_val``, ``histogram`` (``eps`` optional)
        strict : bool, default True
            Whether keys beyond those (and ``eps``) are an error.

        Raises
        ------
        KeyError, ValueError
            As :meth:`nbqat.MinMaxObserver.load_state_dict`, and for a histogram that is not
            ``(bins,)`` finite non-negative counts. Nothing is changed on error.
        """
        if not hasattr(state, "keys"):
            raise TypeError(f"state must be a mapping (a state_dict()), got {type(state).__name__}")
        if "histogram" not in state:
            raise KeyError("load_state_dict: missing key 'histogram'")
        h = np.array(state["histogram"], dtype=_F32)
        if h.shape != (self.bins,):
            raise ValueError(
                f"load_state_dict: histogram must have shape ({self.bins},), got {h.shape}"
            )
        if not (np.isfinite(h).all() and (h >= 0).all()):
            i = int(np.flatnonzero(~(np.isfinite(h) & (h >= 0)))[0])
            raise ValueError(
                "load_state_dict: histogram must hold finite non-negative counts, got "
                f"histogram[{i}] = {h[i]}"
            )
        rest = {k: v for k, v in state.items() if k != "histogram"}
        super().load_state_dict(rest, strict=strict)
        self.histogram = h

    def _extra_repr(self) -> str:
        return f"bins={self.bins}, upsample_rate={self.upsample_rate}, " + super()._extra_repr()
