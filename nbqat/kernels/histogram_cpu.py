"""CPU kernels of the histogram observers (compiled code only; validation in the observers).

Two families:

* torch's ``HistogramObserver`` arithmetic, reproduced operation by operation in float32:
  :func:`histc_counts` (``torch.histc``'s bin of each element) and :func:`upscale_histogram`
  (``_upscale_histogram``) here; ``torch.sum``'s order and the L2 range search in
  :mod:`nbqat.kernels.histogram_search_cpu` (re-exported here).
* (the fixed-grid histograms of the percentile and MSE observers are in
  :mod:`nbqat.kernels.keygrid_cpu`).

Counting is deterministic and thread-count independent: the data is cut into chunks fixed by
index, each chunk owns a row of integer counts, and the rows are added serially; integer
addition is exact, so the result never depends on the number of threads.
"""

from __future__ import annotations

import math

import numpy as np
from numba import prange

from nbqat._jit import cpu_kernel
from nbqat.kernels.histogram_search_cpu import (  # re-exported: the observer's kernels
    LANES,
    l2_search,
    l2_search_wide,
    quant_error,
    torch_sum_f32,
)
from nbqat.kernels.observe_cpu import order_key

__all__ = [
    "BLOCK",
    "CHUNK",
    "LANES",
    "MAX_ROWS",
    "bin_f32",
    "histc_counts",
    "l2_search",
    "l2_search_wide",
    "linspace_f32",
    "minmax_histc",
    "quant_error",
    "torch_sum_f32",
    "upscale_histogram",
]

#: Elements per counting chunk (fixed; results do not depend on it).
CHUNK = 1 << 18
#: Most chunk rows (bins x MAX_ROWS int64 counts of scratch).
MAX_ROWS = 16

_F32 = np.float32


@cpu_kernel(parallel=False)
def bin_f32(v, lo, hi, bins, wide):  # pragma: no cover
    """``torch.histc``'s bin of ``v`` in ``[lo, hi]`` (-1 outside, NaN included).

    ``pos = int((v - lo) * bins / (hi - lo))`` in float32 (torch's CPU kernel); ``wide`` does it
    in float64 (ranges whose float32 arithmetic overflows, where torch's bins are garbage).
    """
    if not (v >= lo and v <= hi):
        return -1
    if hi == lo:
        return bins // 2
    if wide:
        p = (np.float64(v) - np.float64(lo)) * np.float64(bins)
        p = p / (np.float64(hi) - np.float64(lo))
    else:
        p = np.float64((v - lo) * _F32(bins) / (hi - lo))
    pos = np.int64(p)
    if pos >= bins:
        pos = bins - 1
    if pos < 0:
        pos = 0
    return pos


#: Elements per block of the counting loops (bins computed into a buffer, then scattered).
BLOCK = 2048
#: Interleaved sub-histograms per counting row (runs of equal bins do not serialise on one
#: counter).
SUB = 4


@cpu_kernel(parallel=False, error_model="numpy")
def _bins_block(xs, bs, lo, hi, bins, keys, buf, mn, mx):  # pragma: no cover
    """torch's float32 bins of the block ``xs`` (``xs.size <= BLOCK``) into ``buf``; with
    ``keys``, also fold the order keys of its int32 view ``bs`` into ``(mn, mx)``.

    The bin is torch's ``(v - lo) * bins / (hi - lo)`` in float32, capped at ``bins - 1`` and
    truncated, or the dummy bin ``bins`` for values outside ``[lo, hi]`` and NaN; computed
    branch-free so that the loop is vectorised. ``xs`` and ``bs`` are slices starting at 0:
    a loop over ``range(start, stop)`` indexes with a possibly negative start, whose
    wraparound check keeps LLVM from vectorising (measured: 4x slower).
    """
    d = hi - lo
    fb = _F32(bins)
    top = _F32(bins - 1)
    if keys and xs.size:  # raw-bit reductions, keys derived once (observe_cpu.row_keys)
        smin = bs[0]
        smax = bs[0]
        umax = np.uint32(bs[0])
        for j in range(xs.size):
            w = bs[j]
            smin = min(smin, w)
            smax = max(smax, w)
            umax = max(umax, np.uint32(w))
            v = xs[j]
            t = min((v - lo) * fb / d, top)
            buf[j] = np.int32(t if (v >= lo) & (v <= hi) else fb)
        neg = np.int32(umax)
        mn = min(mn, order_key(neg if neg < 0 else smin))
        mx = max(mx, order_key(smax if smax >= 0 else smin))
    else:
        for j in range(xs.size):
            v = xs[j]
            t = min((v - lo) * fb / d, top)
            buf[j] = np.int32(t if (v >= lo) & (v <= hi) else fb)
    return mn, mx


@cpu_kernel(parallel=False)
def _scatter(buf, m, sub):  # pragma: no cover
    """Count ``buf[:m]`` into the ``SUB`` interleaved int32 rows of ``sub`` (unsigned indices:
    no wraparound check)."""
    m4 = m // SUB * SUB
    for j in range(0, m4, SUB):
        sub[0, np.uint64(buf[j])] += 1
        sub[1, np.uint64(buf[j + 1])] += 1
        sub[2, np.uint64(buf[j + 2])] += 1
        sub[3, np.uint64(buf[j + 3])] += 1
    for j in range(m4, m):
        sub[0, np.uint64(buf[j])] += 1


@cpu_kernel(parallel=False)
def _flush(sub, acc):  # pragma: no cover
    """``acc += sum of the rows of sub`` (int64 (bins + 1,)); ``sub`` is cleared."""
    for q in range(sub.shape[0]):
        for i in range(acc.size):
            acc[i] += sub[q, i]
            sub[q, i] = 0


@cpu_kernel(parallel=False, error_model="numpy")
def _count_span(x, b, s, e, lo, hi, bins, wide, keys, acc):  # pragma: no cover
    """Add the :func:`bin_f32` bins of ``x[s:e]`` into ``acc`` ((bins + 1,) int64, the last
    entry the dummy bin); with ``keys``, return the min/max order keys of ``b[s:e]``."""
    mn = np.int32(0x7FFFFFFF)
    mx = np.int32(-0x80000000)
    if wide or hi == lo:
        for i in range(s, e):
            if keys:
                k = order_key(b[i])
                mn = min(k, mn)
                mx = max(k, mx)
            p = bin_f32(x[i], lo, hi, bins, wide)
            if p >= 0:
                acc[p] += 1
        return mn, mx
    buf = np.empty(BLOCK, np.int32)
    sub = np.zeros((SUB, bins + 1), np.int32)  # int32: half the L1 footprint of int64
    for c in range(s, e, CHUNK):  # flushed every CHUNK (< 2 ** 31) elements
        ce = min(e, c + CHUNK)
        for blk in range(c, ce, BLOCK):
            be = min(ce, blk + BLOCK)
            mn, mx = _bins_block(x[blk:be], b[blk:be], lo, hi, bins, keys, buf, mn, mx)
            _scatter(buf, be - blk, sub)
        _flush(sub, acc)
    return mn, mx


@cpu_kernel(parallel=True)
def _counts(x, b, lo, hi, bins, wide, keys):  # pragma: no cover
    """Counts of ``x`` over ``MAX_ROWS`` fixed spans (one row each, added in order) and, with
    ``keys``, the min/max order keys of ``b``: (kmin, kmax, (bins,) int64)."""
    n = x.size
    nch = (n + CHUNK - 1) // CHUNK
    rows = max(1, min(nch, MAX_ROWS))
    acc = np.zeros((rows, bins + 1), np.int64)
    kmins = np.empty(rows, np.int32)
    kmaxs = np.empty(rows, np.int32)
    per = (nch + rows - 1) // rows
    for r in prange(rows):
        s = min(n, r * per * CHUNK)
        e = min(n, s + per * CHUNK)
        kmins[r], kmaxs[r] = _count_span(x, b, s, e, lo, hi, bins, wide, keys, acc[r])
    out = np.zeros(bins, np.int64)
    for r in range(rows):
        for q in range(bins):
            out[q] += acc[r, q]
    return kmins.min(), kmaxs.max(), out


@cpu_kernel(parallel=False)  # the threads are _counts' own prange
def histc_counts(x, lo, hi, bins, wide):  # pragma: no cover
    """Counts of float32 ``x`` in ``bins`` equal bins over ``[lo, hi]`` (torch.histc's bins).

    Parameters
    ----------
    x : (n,) float32, C-contiguous
    lo, hi : float32, the outer bin edges (``lo < hi``); values outside (and NaN) are skipped
    bins : int
    wide : bool, float64 bin arithmetic (see :func:`bin_f32`)

    Returns
    -------
    (bins,) int64
    """
    return _counts(x, x.view(np.int32), lo, hi, bins, wide, False)[2]


@cpu_kernel(parallel=False)  # the threads are _counts' own prange
def minmax_histc(x, b, lo, hi, bins):  # pragma: no cover
    """One pass: order keys of the min and max of ``x`` and its float32 :func:`histc_counts`
    over the *current* range ``[lo, hi]`` (values outside skipped). When the batch lies inside
    that range (steady-state calibration) the counts are the update histogram and no second
    pass is needed.

    Parameters
    ----------
    x : (n,) float32, C-contiguous; b : its int32 view
    lo, hi : float32 (``lo < hi``, float32 arithmetic safe); bins : int

    Returns
    -------
    (int32 kmin, int32 kmax, (bins,) int64 counts)
    """
    return _counts(x, b, lo, hi, bins, False, True)


@cpu_kernel(parallel=False)
def linspace_f32(start, end, steps):  # pragma: no cover
    """``torch.linspace(start, end, steps)`` in float32: ``start + step * i`` for the first half,
    ``end - step * (steps - 1 - i)`` for the second, each a fused multiply-add (one rounding:
    torch's CPU kernel is compiled with FMA contraction; the float64 product is exact)."""
    out = np.empty(steps, np.float32)
    step = np.float64((end - start) / _F32(steps - 1))
    half = steps // 2
    for i in range(steps):
        if i < half:
            out[i] = _F32(np.float64(start) + step * i)
        else:
            out[i] = _F32(np.float64(end) - step * (steps - i - 1))
    return out


@cpu_kernel(parallel=False)
def upscale_histogram(hist, omin, omax, nmin, nmax, rate, wide):  # pragma: no cover
    """torch's ``_upscale_histogram``: ``hist`` over ``[omin, omax]`` re-binned onto
    ``[nmin, nmax]`` (each bin split in ``rate`` parts placed by their mid points).

    Parameters
    ----------
    hist : (bins,) float32
    omin, omax, nmin, nmax : float32 (``nmin <= omin <= omax <= nmax``)
    rate : int, torch's ``upsample_rate``
    wide : bool, float64 arithmetic (ranges whose float32 arithmetic overflows)

    Returns
    -------
    (bins,) float32 (float32 accumulation in source order, as ``torch.bincount``)
    """
    bins = hist.size
    m = bins * rate
    out = np.zeros(bins, np.float32)
    frate = _F32(rate)
    if wide:
        w = (np.float64(omax) - np.float64(omin)) / m
        nw = (np.float64(nmax) - np.float64(nmin)) / bins
        for i in range(m):
            mid = np.float64(omin) + w * (i + 0.5)
            b = np.int64(math.floor((mid - np.float64(nmin)) / nw))
            b = min(max(b, 0), bins - 1)
            out[b] += hist[i // rate] / frate
        return out
    lin = linspace_f32(omin, omax, m + 1)
    bounds = linspace_f32(nmin, nmax, bins + 1)
    half_bin = _F32(0.5) * ((omax - omin) / _F32(m))
    for i in range(m):
        mid = lin[i] + half_bin
        b = np.searchsorted(bounds, mid, side="right") - 1
        b = min(max(b, 0), bins - 1)
        out[b] += hist[i // rate] / frate
    return out
