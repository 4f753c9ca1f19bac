"""CPU kernels of the percentile and MSE observers: fixed-grid ("order key") histograms.

:func:`key_counts` / :func:`key_counts_channel` bin float32 values by the top bits of their
order key (a logarithmic grid fixed in advance), so two histograms merge by adding counts;
:func:`mse_errors` evaluates candidate fake-quant qparams on such a histogram. Counting is
deterministic and thread-count independent (chunks fixed by index, integer counts).
"""

from __future__ import annotations

import numpy as np
from numba import prange

from nbqat._jit import cpu_kernel
from nbqat.kernels.histogram_cpu import CHUNK, MAX_ROWS
from nbqat.kernels.observe_cpu import order_key


@cpu_kernel(parallel=False)
def _key_bin(w, shift):  # pragma: no cover
    """Bin of float32 bits ``w``: ``(order_key >> shift) + offset``, or -1 for NaN/Inf."""
    if (w & np.int32(0x7F800000)) == np.int32(0x7F800000):
        return -1
    k = order_key(w)
    return np.int64(k >> np.int32(shift)) + (np.int64(1) << np.int64(31 - shift))


@cpu_kernel(parallel=True)
def key_counts(b, shift):  # pragma: no cover
    """Fixed-grid counts of float32 data by order key: bin ``(key >> shift) + 2**(31-shift)``.

    Parameters
    ----------
    b : (n,) int32, the bits of float32 data (``x.view(np.int32)``), C-contiguous
    shift : int, 16 keeps sign, exponent and 7 mantissa bits (65536 bins)

    Returns
    -------
    (2 ** (32 - shift),) int64; NaN and +-Inf are not counted
    """
    n = b.size
    nb = 1 << (32 - shift)
    nch = (n + CHUNK - 1) // CHUNK
    rows = min(nch, MAX_ROWS)
    per = (nch + rows - 1) // rows
    acc = np.zeros((rows, nb), np.int64)
    for r in prange(rows):
        s = r * per * CHUNK
        e = min(n, s + per * CHUNK)
        for i in range(s, e):
            p = _key_bin(b[i], shift)
            if p >= 0:
                acc[r, p] += 1
    out = np.zeros(nb, np.int64)
    for r in range(rows):
        for j in range(nb):
            out[j] += acc[r, j]
    return out


@cpu_kernel(parallel=True)
def key_counts_channel(b, outer, nchan, inner, shift):  # pragma: no cover
    """Per-channel :func:`key_counts` of a C-contiguous (outer, nchan, inner) float32 view.

    Returns
    -------
    (nchan, 2 ** (32 - shift)) int64
    """
    nb = 1 << (32 - shift)
    out = np.zeros((nchan, nb), np.int64)
    for c in prange(nchan):
        for o in range(outer):
            base = (o * nchan + c) * inner
            for i in range(inner):
                p = _key_bin(b[base + i], shift)
                if p >= 0:
                    out[c, p] += 1
    return out


@cpu_kernel(parallel=True)
def mse_errors(counts, vlo, vhi, mins, maxs, scales, zps, qmin, qmax, sub):  # pragma: no cover
    """(K, C) weighted squared fake-quant errors of ``counts`` (C, nb) for K candidate qparams
    (``scales``/``zps`` (K, C)); each bin's values spread uniformly over ``sub`` points."""
    nch, nb = counts.shape
    nk = scales.shape[0]
    err = np.zeros((nk, nch), np.float64)
    for c in prange(nch):
        for b in range(nb):
            n = counts[c, b]
            if n == 0:
                continue
            lo = max(vlo[b], mins[c])
            hi = min(vhi[b], maxs[c])
            w = n / sub
            for s in range(sub):
                v = lo + (hi - lo) * (s + 0.5) / sub
                for k in range(nk):
                    sc = np.float64(scales[k, c])
                    z = np.float64(zps[k, c])
                    q = min(max(np.rint(v / sc) + z, qmin), qmax)
                    d = (q - z) * sc - v
                    err[k, c] += w * d * d
    return err
