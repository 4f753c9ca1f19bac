"""CPU kernels of the percentile and MSE observers: fixed-grid ("order key") histograms.

:func:`key_counts` / :func:`key_counts_channel` bin float32 values by the top bits of their
order key (a logarithmic grid fixed in advance), so two histograms merge by adding counts;
:func:`mse_errors` evaluates candidate fake-quant qparams on such a histogram and
:func:`exact_mse_errors` on the observed values themselves. Counting is
deterministic and thread-count independent (chunks fixed by index, integer counts).
"""

from __future__ import annotations

import numpy as np
from numba import prange

from nbqat._jit import cpu_kernel
from nbqat.kernels.histogram_cpu import CHUNK, MAX_ROWS
from nbqat.kernels.observe_cpu import order_key

#: Elements per block of the counting loops (bins computed into a buffer, then scattered).
BLOCK = 2048


@cpu_kernel(parallel=False)
def _count_keys(bs, shift, buf, acc):  # pragma: no cover
    """Add the grid bins of the int32 bits ``bs`` (a slice starting at 0, any length) into
    ``acc`` ((nb + 1,) int64; NaN/Inf go to the dummy bin ``nb``).

    Per block of ``BLOCK`` elements the bins are computed branch-free into ``buf`` (a
    vectorised loop: indices from 0 carry no wraparound check) and then scattered with
    unsigned indices.
    """
    nb = acc.size - 1
    sh = np.int32(shift)
    off = np.int32(1 << (31 - shift))
    inf_bits = np.int32(0x7F800000)
    for s in range(0, bs.size, BLOCK):
        blk = bs[s : min(bs.size, s + BLOCK)]
        for j in range(blk.size):
            w = blk[j]
            k = (order_key(w) >> sh) + off
            buf[j] = k if (w & inf_bits) != inf_bits else np.int32(nb)
        for j in range(blk.size):
            acc[np.uint64(buf[j])] += 1


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
    rows = max(1, min(nch, MAX_ROWS))
    per = (nch + rows - 1) // rows
    acc = np.zeros((rows, nb + 1), np.int64)
    for r in prange(rows):
        s = min(n, r * per * CHUNK)
        buf = np.empty(BLOCK, np.int32)
        _count_keys(b[s : min(n, s + per * CHUNK)], shift, buf, acc[r])
    out = acc[0, :nb]  # rows added in order into the first
    for r in range(1, rows):
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
    out = np.zeros((nchan, nb + 1), np.int64)
    for c in prange(nchan):
        buf = np.empty(BLOCK, np.int32)
        for o in range(outer):
            base = (o * nchan + c) * inner
            _count_keys(b[base : base + inner], shift, buf, out[c])
    return out[:, :nb].copy()


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


@cpu_kernel(parallel=True)
def exact_mse_errors(vals, scales, zps, qmin, qmax):  # pragma: no cover
    """(K, C) exact squared fake-quant errors of the values ``vals`` (C, n) float32 (each row
    ascending, padded with +inf, which is skipped) for K candidate qparams (``scales`` float32,
    ``zps`` float64 (K, C)); float64, the values in row order (deterministic)."""
    nch, n = vals.shape
    nk = scales.shape[0]
    err = np.zeros((nk, nch), np.float64)
    for c in prange(nch):
        m = n
        while m > 0 and vals[c, m - 1] == np.inf:
            m -= 1
        for k in range(nk):
            sc = np.float64(scales[k, c])
            z = np.float64(zps[k, c])
            acc = 0.0
            for i in range(m):
                v = np.float64(vals[c, i])
                q = min(max(np.rint(v / sc) + z, qmin), qmax)
                d = (q - z) * sc - v
                acc += d * d
            err[k, c] = acc
    return err
