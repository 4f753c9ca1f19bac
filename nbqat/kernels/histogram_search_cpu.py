"""CPU kernels of ``HistogramObserver.calculate_qparams``: torch's float32 ``torch.sum`` order
and its L2 range search (compiled code only).

:func:`torch_sum_f32` reproduces the summation order of ``torch.sum`` on a contiguous float32
vector (``LANES`` lanes, torch's ``multi_row_sum`` cascade); :func:`l2_search` is
``_non_linear_param_search`` with ``_compute_quantization_error`` (:func:`quant_error`), operation
by operation in float32, and :func:`l2_search_wide` its float64 twin on the unit range for
ranges whose float32 norms overflow or underflow.
"""

from __future__ import annotations

import math

import numpy as np

from nbqat._jit import cpu_kernel

__all__ = ["LANES", "l2_search", "l2_search_wide", "quant_error", "torch_sum_f32"]

#: float32 lanes of torch's vectorized sum (8: torch 2.13's CPU build, measured on AVX-512 and
#: matched bit for bit by tests/test_histogram_observers.py).
LANES = 8

_F32 = np.float32


@cpu_kernel(parallel=False)
def _add_row(acc, v, o, w):  # pragma: no cover
    """``acc[0, k] += v[o + k * w : o + (k + 1) * w]`` for the 4 rows ``k`` (one step of
    torch's ``multi_row_sum``, in its order)."""
    for k in range(4):
        for q in range(w):
            acc[0, k, q] += v[o + k * w + q]


@cpu_kernel(parallel=False)
def _multi_row_sum(v, base, size, w):  # pragma: no cover
    """torch's ``multi_row_sum`` (4 rows, 4 levels) over ``size`` rows of 4 elements of ``w``
    lanes starting at ``v[base]``; returns (4, w) partials."""
    nlev = 4
    clog = 1
    if size > 2:
        clog = 0
        t = size - 1
        while t > 0:
            clog += 1
            t >>= 1
    lp = max(4, clog // nlev)
    step = 1 << lp
    mask0 = step - 1
    acc = np.zeros((nlev, 4, w), np.float32)
    i = 0
    while i + step <= size:
        for _ in range(step):
            _add_row(acc, v, base + i * 4 * w, w)
            i += 1
        for j in range(1, nlev):
            for k in range(4):
                for q in range(w):
                    acc[j, k, q] += acc[j - 1, k, q]
                    acc[j - 1, k, q] = _F32(0)
            if (i & (mask0 << (j * lp))) != 0:
                break
    while i < size:
        _add_row(acc, v, base + i * 4 * w, w)
        i += 1
    for j in range(1, nlev):
        for k in range(4):
            for q in range(w):
                acc[0, k, q] += acc[j, k, q]
    return acc[0]


@cpu_kernel(parallel=False)
def _row_sum(v, size, w):  # pragma: no cover
    """torch's ``row_sum`` (ilp factor 4) over ``size`` elements of ``w`` lanes; (w,) lanes."""
    size_ilp = size // 4
    part = _multi_row_sum(v, 0, size_ilp, w)
    for i in range(size_ilp * 4, size):
        for q in range(w):
            part[0, q] += v[i * w + q]
    for k in range(1, 4):
        for q in range(w):
            part[0, q] += part[k, q]
    return part[0]


@cpu_kernel(parallel=False)
def torch_sum_f32(v):  # pragma: no cover
    """``torch.sum`` of a contiguous float32 vector with torch's CPU summation order.

    The vectorized inner sum (``LANES`` lanes, cascade over groups of 4 vectors), the scalar
    tail, then the lanes in order; vectors shorter than ``LANES`` take the scalar cascade.

    Parameters
    ----------
    v : (n,) float32

    Returns
    -------
    float32
    """
    n = v.size
    if n < LANES:
        return _row_sum(v, n, 1)[0]
    nvec = n // LANES
    lanes = _row_sum(v, nvec, LANES)
    acc = _F32(0)
    for k in range(nvec * LANES, n):
        acc += v[k]
    for q in range(LANES):
        acc += lanes[q]
    return acc


@cpu_kernel(parallel=False)
def _div_floor(a, b):  # pragma: no cover
    """``torch.div(a, b, rounding_mode="floor")`` in float32 (``c10::div_floor_floating``)."""
    if b == 0:
        return a / b
    mod = _F32(np.fmod(a, b))
    div = _F32(a - mod) / b
    if mod != 0 and (b < 0) != (mod < 0):
        div = div - _F32(1)
    if div != 0:
        fl = _F32(math.floor(div))
        if div - fl > _F32(0.5):
            fl = fl + _F32(1)
        return fl
    return _F32(math.copysign(0.0, a / b))


@cpu_kernel(parallel=False)
def quant_error(hist, bin_width, s, e, dst_nbins, norm):  # pragma: no cover
    """torch's ``_compute_quantization_error(s, e)``: float32 elementwise, torch's sum.

    ``bin_width`` is torch's Python float ``(max - min) / bins``; ``norm`` is (bins,) scratch.
    """
    bins = hist.size
    dbw = bin_width * (e - s + 1) / dst_nbins
    if dbw == 0.0:
        return 0.0
    bw = _F32(bin_width)
    d = _F32(dbw)
    half = _F32(dbw / 2)
    nhalf = _F32(-dbw / 2)
    three = _F32(3)
    hi = _F32(dst_nbins - 1)
    mid = (half * half * half - nhalf * nhalf * nhalf) / three
    for i in range(bins):
        sb = _F32(i - s) * bw
        se = sb + bw
        dob = min(max(_div_floor(sb, d), _F32(0)), hi)
        doe = min(max(_div_floor(se, d), _F32(0)), hi)
        dens = hist[i] / bw
        db = sb - (dob + _F32(0.5)) * d
        n1 = dens * ((half * half * half - db * db * db) / three)
        n2 = (doe - dob - _F32(1)) * (dens * mid)
        de = se - (doe * d + half)
        n3 = dens * ((de * de * de - nhalf * nhalf * nhalf) / three)
        norm[i] = (n1 + n2) + n3
    return np.float64(torch_sum_f32(norm))


@cpu_kernel(parallel=False)
def l2_search(hist, min_val, max_val, dst_nbins):  # pragma: no cover
    """torch's ``_non_linear_param_search``: the (start_bin, end_bin) minimising the L2 error.

    Parameters
    ----------
    hist : (bins,) float32, the histogram over ``[min_val, max_val]``
    min_val, max_val : float32
    dst_nbins : int, ``2 ** bits`` of the quantized dtype

    Returns
    -------
    (int64, int64)
        ``new_min = min_val + (max_val - min_val) / bins * start`` and
        ``new_max = min_val + ... * (end + 1)`` in float32 (done by the caller).
    """
    bins = hist.size
    bin_width = (np.float64(max_val) - np.float64(min_val)) / bins
    total = np.float64(torch_sum_f32(hist))
    csum = np.empty(bins, np.float32)
    run = 0.0
    for i in range(bins):
        run += np.float64(hist[i])
        csum[i] = _F32(run)
    norm = np.empty(bins, np.float32)
    step = 1e-5
    alpha = 0.0
    beta = 1.0
    start = 0
    end = bins - 1
    norm_min = np.inf
    while alpha < beta:
        na = alpha + step
        nb = beta - step
        ta = _F32(na * total)
        tb = _F32(nb * total)
        l = start  # noqa: E741 - torch's name
        r = end
        while l < end and csum[l] < ta:
            l += 1  # noqa: E741
        while r > start and csum[r] > tb:
            r -= 1
        ns = start
        ne = end
        if (l - start) > (end - r):
            ns = l
            alpha = na
        else:
            ne = r
            beta = nb
        if ns == start and ne == end:
            continue
        nrm = quant_error(hist, bin_width, ns, ne, dst_nbins, norm)
        if nrm > norm_min:
            break
        norm_min = nrm
        start = ns
        end = ne
    return start, end


@cpu_kernel(parallel=False)
def l2_search_wide(hist, dst_nbins):  # pragma: no cover
    """:func:`l2_search` in float64 on the unit range (the error is scale invariant): for
    ranges whose float32 norms overflow or underflow (where torch's search is garbage)."""
    bins = hist.size
    h = hist.astype(np.float64)
    total = h.sum()
    csum = np.cumsum(h)
    bw = 1.0 / bins
    src = np.arange(bins).astype(np.float64)
    alpha, beta, start, end, norm_min = 0.0, 1.0, 0, bins - 1, np.inf
    while alpha < beta:
        na, nb = alpha + 1e-5, beta - 1e-5
        l, r = start, end  # noqa: E741
        while l < end and csum[l] < na * total:
            l += 1  # noqa: E741
        while r > start and csum[r] > nb * total:
            r -= 1
        ns, ne = start, end
        if (l - start) > (end - r):
            ns, alpha = l, na
        else:
            ne, beta = r, nb
        if ns == start and ne == end:
            continue
        d = bw * (ne - ns + 1) / dst_nbins
        sb = (src - ns) * bw
        se = sb + bw
        dob = np.minimum(np.maximum(np.floor(sb / d), 0.0), dst_nbins - 1.0)
        doe = np.minimum(np.maximum(np.floor(se / d), 0.0), dst_nbins - 1.0)
        dens = h / bw
        db = sb - (dob + 0.5) * d
        de = se - (doe * d + d / 2)
        nrm = dens * ((d / 2) ** 3 - db**3) / 3 + (doe - dob - 1) * dens * (d**3 / 12)
        nrm = (nrm + dens * (de**3 + (d / 2) ** 3) / 3).sum()
        if nrm > norm_min:
            break
        norm_min, start, end = nrm, ns, ne
    return start, end
