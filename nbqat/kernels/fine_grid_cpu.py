"""CPU kernels of :class:`nbqat.MSEObserver`'s fine grid: bounds on every candidate's exact error.

The grid of a channel is ``N`` bins of width ``w = 2 ** e`` over ``[-N/2 * w, N/2 * w)``
(``e`` the smallest with ``max(|min|, |max|) < N/2 * w``): bin ``k = floor(x / w) + N/2``.
Each bin keeps its count, the sums of ``u`` and ``u ** 2`` (``u = x / w - floor(x / w) - 0.5``,
the offset from the bin centre in units of ``w``, exact in float64) and the smallest and largest
value in it. Coarsening (``e`` up by ``d``: ``2 ** d`` bins into one) is exact for the counts
and the extremes and moves the moments by float64 rounding only.

:func:`grid_bounds` then bounds the exact squared fake-quant error ``sum_x (fq(x) - x) ** 2`` of
the values in the grid, for K candidate qparams: a bin whose smallest and largest value fall in
the same quantisation cell (``clamp(rint(x / s) + z)``, the exact kernel's float64 expression,
monotone in ``x``) contributes exactly ``sum (x - q) ** 2`` from its moments; a bin with one
cell boundary ``t`` inside contributes ``sum u_t ** 2 - s * sum |u_t| + n * s ** 2 / 4``
(``u_t = x - t``; the error is ``(|u_t| - s / 2) ** 2`` on both sides, clamped cells included),
with ``sum |u_t|`` bounded below by ``max(|sum u_t|, sum u_t ** 2 / max(a, b))`` and above by
the chord of ``|u|`` over ``[-a, b]`` (``a``, ``b`` the distances of the bin's extremes to
``t``); a bin with several boundaries (bins wider than the step: small candidates) gets
``[0, n * max(e(lo), e(hi), s ** 2 / 4)]``. Runs of bins away from every boundary are summed
from prefix sums (the count terms in exact int64).
"""

from __future__ import annotations

import numpy as np
from numba import prange

from nbqat._jit import cpu_kernel


@cpu_kernel(parallel=True)
def grid_add(v, outer, nchan, inner, exps, cnt, s1, s2, lo, hi):  # pragma: no cover
    """Add the finite float32 values of a C-contiguous (outer, nchan, inner) array (flat ``v``)
    into the grids (``cnt`` (C, N) int64, ``s1``/``s2`` (C, N) float64, ``lo``/``hi`` (C, N)
    float32; ``exps`` (C,) int64 the bins' exponents, wide enough for every value); ``-0.0`` is
    stored as ``+0.0``. Values of a channel in index order (deterministic)."""
    nb = cnt.shape[1]
    half = nb // 2
    for c in prange(nchan):
        inv = 2.0 ** -np.float64(exps[c])
        for o in range(outer):
            base = (o * nchan + c) * inner
            for j in range(inner):
                x = v[base + j]
                if not np.isfinite(x):
                    continue
                y = np.float64(x) * inv
                f = np.floor(y)
                k = min(max(np.int64(f) + half, 0), nb - 1)
                u = y - f - 0.5
                cnt[c, k] += 1
                s1[c, k] += u
                s2[c, k] += u * u
                xz = x + np.float32(0.0)
                if xz < lo[c, k]:
                    lo[c, k] = xz
                if xz > hi[c, k]:
                    hi[c, k] = xz


@cpu_kernel(parallel=True)
def grid_coarsen(cnt, s1, s2, lo, hi, d):  # pragma: no cover
    """Coarsen row ``c`` of the grids by ``2 ** d[c]`` (``d`` (C,) int64 >= 0), in place."""
    nch, nb = cnt.shape
    half = nb // 2
    for c in prange(nch):
        dc = d[c]
        if dc <= 0:
            continue
        f = 2.0 ** -np.float64(dc)
        nc = np.zeros(nb, np.int64)
        n1 = np.zeros(nb, np.float64)
        n2 = np.zeros(nb, np.float64)
        nlo = np.full(nb, np.inf, np.float32)
        nhi = np.full(nb, -np.inf, np.float32)
        for k in range(nb):
            n = cnt[c, k]
            if n == 0:
                continue
            m = k - half
            q = m >> dc if dc < 63 else (-1 if m < 0 else 0)
            r = m - (q << dc) if dc < 63 else 0
            off = (r + 0.5) * f - 0.5
            t = q + half
            a1 = s1[c, k]
            nc[t] += n
            n1[t] += a1 * f + n * off
            n2[t] += s2[c, k] * f * f + 2.0 * off * a1 * f + n * off * off
            nlo[t] = min(nlo[t], lo[c, k])
            nhi[t] = max(nhi[t], hi[c, k])
        cnt[c, :] = nc
        s1[c, :] = n1
        s2[c, :] = n2
        lo[c, :] = nlo
        hi[c, :] = nhi


@cpu_kernel(parallel=False)
def _cell(x, s, z, qmin, qmax):  # pragma: no cover
    """The clamped code of ``x`` (float64) under scale ``s``, zero point ``z`` (float64)."""
    return min(max(np.rint(x / s) + z, qmin), qmax)


@cpu_kernel(parallel=False)
def _one_boundary(n, a1, a2, kc, ylo, yhi, t, sw):  # pragma: no cover
    """(low, high) error bounds, in units of ``w ** 2``, of a bin (``n`` values, moments
    ``a1``, ``a2`` about its centre ``kc``, extremes ``ylo``, ``yhi``, all in ``x / w`` units)
    whose values lie in the two cells of step ``sw`` on either side of the boundary ``t``."""
    dt = kc - t
    su2 = a2 + 2.0 * dt * a1 + n * dt * dt  # sum u_t**2
    if yhi <= t or ylo >= t:  # one side: exact (|u_t| = -u_t or u_t)
        d = dt + 0.5 * sw if yhi <= t else dt - 0.5 * sw
        e = a2 + 2.0 * d * a1 + n * d * d
        return e, e
    su = a1 + n * dt  # sum u_t
    a = t - ylo
    b = yhi - t
    lo_abs = max(abs(su), su2 / max(a, b))
    hi_abs = max(((b - a) * su + 2.0 * a * b * n) / (a + b), lo_abs)
    base = su2 + n * sw * sw * 0.25
    return max(base - sw * hi_abs, 0.0), max(base - sw * lo_abs, 0.0)


@cpu_kernel(parallel=False)
def _bin_bounds(n, a1, a2, kc, vlo, vhi, w, s, z, qmin, qmax):  # pragma: no cover
    """(low, high) error bounds of one bin under one candidate, in units of ``w ** 2``: ``n``
    values with moments ``a1``, ``a2`` about the bin centre ``kc`` (``x / w`` units) and
    extremes ``vlo``, ``vhi`` (float32 values); scale ``s``, zero point ``z`` (float64)."""
    clo = _cell(np.float64(vlo), s, z, qmin, qmax)
    chi = _cell(np.float64(vhi), s, z, qmin, qmax)
    sw = s / w
    if clo == chi:  # one cell: exact
        d = kc - (clo - z) * sw
        e = a2 + 2.0 * d * a1 + n * d * d
        return e, e
    if chi == clo + 1.0:  # one boundary t (units of w, the same frame as kc)
        t = (clo - z + 0.5) * sw
        return _one_boundary(n, a1, a2, kc, np.float64(vlo) / w, np.float64(vhi) / w, t, sw)
    ylo, yhi = np.float64(vlo) / w, np.float64(vhi) / w
    elo = ylo - (clo - z) * sw
    ehi = yhi - (chi - z) * sw
    top = max(elo * elo, ehi * ehi, sw * sw * 0.25)
    return 0.0, n * top


@cpu_kernel(parallel=False)
def _prefix(cnt, s1, s2, half, pf, pe, pd, pc, pb, pa):  # pragma: no cover
    """Prefix sums over one grid row: count, count * m, count * m**2 (int64, ``m = k - half``),
    s1, m * s1, s2 (float64); index ``k + 1`` holds bins ``0 .. k``."""
    for k in range(cnt.size):
        n = cnt[k]
        m = np.int64(k - half)
        pf[k + 1] = pf[k] + n
        pe[k + 1] = pe[k] + n * m
        pd[k + 1] = pd[k] + n * m * m
        pc[k + 1] = pc[k] + s1[k]
        pb[k + 1] = pb[k] + m * s1[k]
        pa[k + 1] = pa[k] + s2[k]


@cpu_kernel(parallel=False)
def _run_error(g0, g1, yq, pf, pe, pd, pc, pb, pa):  # pragma: no cover
    """Exact ``sum (x / w - yq) ** 2`` over the values in bins ``g0 .. g1`` (one cell, code
    value ``yq`` in ``x / w`` units) from the prefix sums; the count terms in exact int64."""
    k0 = np.int64(np.floor(yq))  # yq = k0 + 0.5 + dl, bin m's centre m + 0.5
    dl = yq - 0.5 - k0
    f = pf[g1 + 1] - pf[g0]
    if f == 0:
        return 0.0
    e = pe[g1 + 1] - pe[g0]
    d = pd[g1 + 1] - pd[g0]
    cc = pc[g1 + 1] - pc[g0]
    bb = pb[g1 + 1] - pb[g0]
    aa = pa[g1 + 1] - pa[g0]
    ints = np.float64(d - 2 * k0 * e + k0 * k0 * f)
    lin = np.float64(e - k0 * f)
    return ints - 2.0 * dl * lin + dl * dl * f + 2.0 * (bb - k0 * cc) - 2.0 * dl * cc + aa


@cpu_kernel(parallel=False)
def _candidate(cnt, s1, s2, lo, hi, w, pre, s, z, qmin, qmax):  # pragma: no cover
    """(low, high) bounds of one channel's error under one candidate, units of ``w ** 2``
    (``pre`` the six prefix sums of :func:`_prefix`)."""
    pf, pe, pd, pc, pb, pa = pre
    nb = cnt.size
    half = nb // 2
    sw = s / w
    iw = 1.0 / w  # a power of two: exact
    span = (half + 2) / sw
    j0 = max(0.0, np.floor(-span + z - qmin - 0.5) - 1.0)
    j1 = min(qmax - qmin, np.ceil(span + z - qmin - 0.5) + 2.0)
    lsum = 0.0
    hsum = 0.0
    if j1 - j0 > nb:  # more boundaries than bins: every bin on its own
        for k in range(nb):
            if cnt[k]:
                a, b = _bin_bounds(
                    cnt[k], s1[k], s2[k], k - half + 0.5, lo[k], hi[k], w, s, z, qmin, qmax
                )
                lsum += a
                hsum += b
        return lsum, hsum
    prev = -1  # the last bin accounted for
    for j in range(np.int64(j0), np.int64(j1) + 1):
        first = nb  # after the last boundary: the rest is a run
        t = (qmin + j - z + 0.5) * sw  # boundary j, x / w units (in bin kb - half)
        if j < j1:
            first = min(max(np.int64(np.floor(t)) + half, 0), nb)
        if first - 1 >= prev + 1:  # bins between boundaries j - 1 and j: one code
            yq = (min(qmin + j, qmax) - z) * sw
            e = _run_error(prev + 1, first - 1, yq, pf, pe, pd, pc, pb, pa)
            lsum += e
            hsum += e
        if first <= prev or first >= nb:
            continue
        prev = first
        n = cnt[first]
        if n == 0:
            continue
        kc = first - half + 0.5
        if sw > 1.0:  # one boundary in the bin: the codes on its sides are known
            a, b = _one_boundary(n, s1[first], s2[first], kc, lo[first] * iw, hi[first] * iw, t, sw)
        else:
            a, b = _bin_bounds(
                n, s1[first], s2[first], kc, lo[first], hi[first], w, s, z, qmin, qmax
            )
        lsum += a
        hsum += b
    return lsum, hsum


@cpu_kernel(parallel=False)
def _clip_bound(nb, pre, s, z, qmin, qmax, w):  # pragma: no cover
    """A lower bound of one candidate's error, units of ``w ** 2``: the exact error of the bins
    wholly beyond its clamp values (their values all clamp)."""
    pf, pe, pd, pc, pb, pa = pre
    half = nb // 2
    sw = s / w
    ylo, yhi = (qmin - z) * sw, (qmax - z) * sw
    klo = np.int64(np.floor(min(max(ylo, -half - 2.0), half + 2.0))) + half
    khi = np.int64(np.floor(min(max(yhi, -half - 2.0), half + 2.0))) + half
    e = 0.0
    if klo - 1 >= 0:
        e += _run_error(0, min(klo - 1, nb - 1), ylo, pf, pe, pd, pc, pb, pa)
    if khi + 1 <= nb - 1:
        e += _run_error(max(khi + 1, 0), nb - 1, yhi, pf, pe, pd, pc, pb, pa)
    return e


@cpu_kernel(parallel=True)
def grid_bounds(cnt, s1, s2, lo, hi, exps, scales, zps, qmin, qmax):  # pragma: no cover
    """(K, C) lower and upper bounds (float64) of the exact squared fake-quant error of each
    channel's values in the grid under K candidates (``scales`` float32, ``zps`` float64,
    (K, C); the last is min/max), as the module docstring describes.

    Candidates are bounded in the order of a cheap lower bound (:func:`_clip_bound`), min/max
    first; once that bound exceeds the smallest upper bound so far, the rest can neither be
    certified nor chosen and get ``(bound, inf)``."""
    nch, nb = cnt.shape
    half = nb // 2
    nk = scales.shape[0]
    low = np.zeros((nk, nch), np.float64)
    high = np.full((nk, nch), np.inf, np.float64)
    for c in prange(nch):
        w = 2.0 ** np.float64(exps[c])
        ints = np.zeros((3, nb + 1), np.int64)
        flts = np.zeros((3, nb + 1), np.float64)
        pre = (ints[0], ints[1], ints[2], flts[0], flts[1], flts[2])
        _prefix(cnt[c], s1[c], s2[c], half, *pre)
        clip = np.empty(nk, np.float64)
        for kk in range(nk):
            clip[kk] = _clip_bound(nb, pre, np.float64(scales[kk, c]), zps[kk, c], qmin, qmax, w)
        clip[nk - 1] = -1.0  # min/max first: its lower bound certifies the others
        best = np.inf
        for kk in np.argsort(clip, kind="mergesort"):
            if clip[kk] * w * w > best:
                low[kk, c] = clip[kk] * w * w
                continue
            sk = np.float64(scales[kk, c])
            a, b = _candidate(
                cnt[c], s1[c], s2[c], lo[c], hi[c], w, pre, sk, zps[kk, c], qmin, qmax
            )
            low[kk, c] = a * w * w
            high[kk, c] = b * w * w
            best = min(best, high[kk, c])
    return low, high
