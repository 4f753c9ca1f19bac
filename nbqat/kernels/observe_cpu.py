"""CPU kernels of the min/max observers: one pass computes min and max together.

Compiled code only; validation, the non-finite policy and the state update live in
:mod:`nbqat.quantization.observers`.

The hot kernels work on the IEEE-754 bits of float32 data (an ``int32`` view, no copy) mapped to
*order keys*: ``key = w ^ ((w >> 31) & 0x7fffffff)`` is a signed integer whose order is the float
order (``-0.0`` sorts just below ``+0.0``; +NaN sorts above +Inf and -NaN below -Inf). Integer
min/max reductions vectorize (SIMD) where float ``select`` reductions do not (LLVM may not reorder
a float min without ``nnan``), and the mapping is its own inverse, so the result decodes back to
the exact float32 value. NaN and Inf need no test in the hot loop: they show up in the result
(``kmin <= KEY_NEG_INF`` or ``kmax >= KEY_POS_INF``), and only then does the caller run the slow
kernel (:func:`minmax_finite_3d`, also used per tensor as one channel), which counts
NaN/+Inf/-Inf and reduces over the finite values.

float16 data is reduced on its own bits, without a float32 copy: the ``int16`` view, shifted
into the top half of an int32 (:func:`widen`), has the sign bit, the exponent and the mantissa
where the formula expects them, so the same keys order it (the half +Inf and -Inf keys are
:data:`KEY_POS_INF_H`, :data:`KEY_NEG_INF_H`, strictly inside the float32 ones), and the decoded
float16 extremes convert exactly to float32, as ``x.astype(float32)`` would have given them.

Reductions are deterministic: work is split into chunks fixed by index (never by the thread
count), each chunk writes its own partial, and the partials are merged serially in index order.
Integer min/max are exact, so the result does not depend on the chunking either.
"""

from __future__ import annotations

import numpy as np
from numba import prange
from numba import types as nbtypes
from numba.extending import overload

from nbqat._jit import cpu_kernel, renamed

#: Elements per chunk of the per-tensor reduction (fixed: results never depend on threads).
CHUNK = 1 << 16
#: Order key of +Inf (0x7f800000) and of -Inf (bits 0xff800000 -> 0x807fffff).
KEY_POS_INF = np.int32(0x7F800000)
KEY_NEG_INF = np.int32(-0x7F800001)
#: The same keys of float16 +Inf and -Inf (bits 0x7c00, 0xfc00, shifted up 16 bits).
KEY_POS_INF_H = np.int32(0x7C000000)
KEY_NEG_INF_H = np.int32(-0x7C000001)
#: Rows at least this long are reduced one (outer, channel) row at a time; shorter rows are
#: handled by a sweep over whole outer slices with per-chunk (C,) partials.
ROW_MIN = 32
#: Fixed number of outer chunks for the short-row per-channel kernel.
OUTER_CHUNKS = 64

_M = np.int32(0x7FFFFFFF)
_E = np.int32(0x7F800000)
_S = np.int32(31)
_Z = np.int32(0)
_SH = np.int32(16)


@cpu_kernel(parallel=False, inline="always")
def order_key(w):  # pragma: no cover
    """The order key of float32 bits ``w`` (int32): ``w ^ ((w >> 31) & 0x7fffffff)``, the
    module docstring's map, written once for every CPU kernel (inlined: loops still vectorise);
    the map is its own inverse."""
    return np.int32(w ^ ((w >> _S) & _M))


def widen(w):  # pragma: no cover - compiled through the overload below
    """int32 bits of a float32 as they are, int16 bits of a float16 shifted up 16 bits (the
    same for the unsigned integers of those widths: only the low 16 bits are shifted in)."""
    return np.int32(w)


@overload(widen, inline="always")
def _widen_impl(w):  # pragma: no cover
    if isinstance(w, nbtypes.Integer) and w.bitwidth == 16:
        return lambda w: np.int32(np.int32(w) << _SH)
    return lambda w: np.int32(w)


@cpu_kernel(parallel=False, inline="always")
def wide_key(w):  # pragma: no cover
    """:func:`order_key` of :func:`widen` ``(w)`` (int32 or int16 bits), as a select on the
    sign (``v ^ (M if v < 0 else 0)``, the same map): for int16 input it stays in 32-bit lanes
    (load, shift, compare to a mask, masked xor), where the shift form widens to 64-bit lanes."""
    v = widen(w)
    return np.int32(v ^ (_M if v < _Z else _Z))


def unsigned(w):  # pragma: no cover - compiled through the overload below
    """The same bits as an unsigned integer of the same width (a no-op bitcast)."""
    return np.uint32(w)


@overload(unsigned, inline="always")
def _unsigned_impl(w):  # pragma: no cover
    if isinstance(w, nbtypes.Integer) and w.bitwidth == 16:
        return lambda w: np.uint16(w)
    return lambda w: np.uint32(w)


@cpu_kernel(parallel=False)
def row_keys(b, start, stop, kmin, kmax):  # pragma: no cover
    """Reduce the order keys of ``b[start:stop]`` into ``(kmin, kmax)``.

    Parameters
    ----------
    b : (n,) int32 or int16, the bits of float32 (float16) data
    start, stop : int, element range (unsigned loop: no wraparound check, so it vectorizes)
    kmin, kmax : int32, running keys

    Returns
    -------
    (int32, int32)

    Notes
    -----
    The loop keeps three integer reductions of the raw bits, in their own width (16 lanes a
    256-bit vector for float16), and no key: the signed minimum and maximum and the unsigned
    maximum. Keys order the non-negative bit patterns as signed integers, above every negative
    one, and the negative ones by descending magnitude; so the largest key is the signed
    maximum if it is non-negative (else, all negative, the signed minimum: least magnitude), and
    the smallest key is the unsigned maximum if it is negative (the negative pattern of largest
    magnitude), else the signed minimum. Three SIMD ops a vector where the key formula took
    five; the keys, NaN and -0.0 included, are the same.
    """
    if stop <= start:
        return np.int32(kmin), np.int32(kmax)
    smin = b[start]
    smax = b[start]
    umax = unsigned(b[start])
    for i in range(np.uint64(start) + np.uint64(1), np.uint64(stop)):
        w = b[i]
        smin = min(smin, w)
        smax = max(smax, w)
        umax = max(umax, unsigned(w))
    lo, hi, neg = widen(smin), widen(smax), widen(umax)
    top = order_key(hi if hi >= _Z else lo)
    bottom = order_key(neg if neg < _Z else lo)
    return np.int32(min(np.int32(kmin), bottom)), np.int32(max(np.int32(kmax), top))


@cpu_kernel(parallel=True)
def minmax_keys_1d(b):  # pragma: no cover
    """Order keys of the minimum and maximum of float32 data (one parallel pass).

    Parameters
    ----------
    b : (n,) int32, C-contiguous
        ``x.view(np.int32)`` of the float32 data, ``n >= 1``.

    Returns
    -------
    kmin, kmax : int32
        Keys of the minimum and maximum (decode with the same xor). Without NaN/Inf in the data
        ``KEY_NEG_INF < kmin <= kmax < KEY_POS_INF``.
    """
    n = b.size
    nch = (n + CHUNK - 1) // CHUNK
    pmin = np.empty(nch, np.int32)
    pmax = np.empty(nch, np.int32)
    for c in prange(nch):
        s = c * CHUNK
        e = min(n, s + CHUNK)
        pmin[c], pmax[c] = row_keys(b, s, e, KEY_POS_INF, KEY_NEG_INF)
    kmin = KEY_POS_INF
    kmax = KEY_NEG_INF
    for c in range(nch):  # fixed-order merge
        kmin = min(kmin, pmin[c])
        kmax = max(kmax, pmax[c])
    return kmin, kmax


@cpu_kernel(parallel=False)
def _count_row(b, start, stop, acc, e):  # pragma: no cover
    """Slow path over ``b[start:stop]``: ``acc = [kmin_finite, kmax_finite, nan, +inf, -inf]``.

    Parameters
    ----------
    b : (n,) int32 or int16 (bits of float32 or float16 data)
    start, stop : int
    acc : (5,) int64, updated in place
    e : int32, the +Inf bits of the format (:func:`widen` ed)
    """
    for i in range(np.uint64(start), np.uint64(stop)):
        w = widen(b[i])
        a = w & _M
        if a > e:
            acc[2] += 1
        elif a == e:
            if w < 0:
                acc[4] += 1
            else:
                acc[3] += 1
        else:
            k = np.int64(order_key(w))
            if k < acc[0]:
                acc[0] = k
            if k > acc[1]:
                acc[1] = k


def _minmax_keys_3d(b, outer, nchan, inner):  # pragma: no cover
    """Per-channel order keys of min and max over an (outer, C, inner) view, one pass.

    ``b`` is the flat C-contiguous bits of an array viewed as ``(outer, C, inner)``: channel
    ``c`` owns the elements ``(o * C + c) * inner + j``. Any ``ch_axis`` maps to this view
    without a transpose or a copy (``outer`` = product of the dims before the axis, ``inner`` =
    product of the dims after it).

    Parameters
    ----------
    b : (outer * C * inner,) int32, C-contiguous
    outer, nchan, inner : int, all >= 1

    Returns
    -------
    kmin, kmax : (C,) int32
        Keys of each channel's minimum and maximum.

    Notes
    -----
    Long rows (``inner >= ROW_MIN``): every (outer, channel) row is one contiguous vectorized
    reduction, rows run in parallel, then each channel's rows are merged in outer order.
    Short rows (``ch_axis`` last, ``inner == 1``, ...): ``OUTER_CHUNKS`` fixed chunks of the
    outer index run in parallel, each sweeping whole contiguous ``(C, inner)`` slices into its
    own (C,) partials (element-wise min/max over channels vectorizes), merged in chunk order.
    """
    kmin = np.empty(nchan, np.int32)
    kmax = np.empty(nchan, np.int32)
    if inner >= ROW_MIN:
        units = outer * nchan
        pmin = np.empty(units, np.int32)
        pmax = np.empty(units, np.int32)
        for u in prange(units):
            s = u * inner
            pmin[u], pmax[u] = row_keys(b, s, s + inner, KEY_POS_INF, KEY_NEG_INF)
        for c in range(nchan):
            mn = KEY_POS_INF
            mx = KEY_NEG_INF
            for o in range(outer):
                mn = min(mn, pmin[o * nchan + c])
                mx = max(mx, pmax[o * nchan + c])
            kmin[c] = mn
            kmax[c] = mx
        return kmin, kmax
    nch = min(outer, OUTER_CHUNKS)
    per = (outer + nch - 1) // nch
    pmin = np.empty((nch, nchan), np.int32)
    pmax = np.empty((nch, nchan), np.int32)
    for p in prange(nch):
        rmin = pmin[p]
        rmax = pmax[p]
        rmin[:] = KEY_POS_INF
        rmax[:] = KEY_NEG_INF
        for o in range(p * per, min(outer, (p + 1) * per)):
            base = o * nchan * inner
            if inner == 1:
                for c in range(np.uint64(nchan)):
                    k = wide_key(b[np.uint64(base) + c])
                    rmin[c] = min(rmin[c], k)
                    rmax[c] = max(rmax[c], k)
            else:
                for c in range(nchan):
                    s = base + c * inner
                    rmin[c], rmax[c] = row_keys(b, s, s + inner, rmin[c], rmax[c])
    kmin[:] = KEY_POS_INF
    kmax[:] = KEY_NEG_INF
    for p in range(nch):
        for c in range(nchan):
            kmin[c] = min(kmin[c], pmin[p, c])
            kmax[c] = max(kmax[c], pmax[p, c])
    return kmin, kmax


minmax_keys_3d = cpu_kernel(parallel=True)(renamed(_minmax_keys_3d, "minmax_keys_3d"))
#: The same kernel compiled without threads, for small inputs (``size < _jit.PARALLEL_MIN``),
#: where waking the thread pool costs more than the whole reduction (results are identical).
minmax_keys_3d_serial = cpu_kernel(parallel=False)(
    renamed(_minmax_keys_3d, "minmax_keys_3d_serial")
)


@cpu_kernel(parallel=True)
def minmax_finite_3d(b, outer, nchan, inner):  # pragma: no cover
    """Per-channel finite min/max keys and NaN/+Inf/-Inf counts (the slow path).

    Parameters
    ----------
    b : (outer * C * inner,) int32 or int16, C-contiguous (bits of float32 or float16 data)
    outer, nchan, inner : int, all >= 1

    Returns
    -------
    (C, 5) int64
        Per channel ``[kmin, kmax, n_nan, n_pos_inf, n_neg_inf]``: the keys of the finite
        minimum/maximum (``KEY_POS_INF``/``KEY_NEG_INF`` when no value is finite) and the counts.

    Notes
    -----
    The rare path (only when the fast kernel saw NaN/Inf): parallel over channels, so a single
    channel (the per-tensor case, ``outer = nchan = 1``) runs on one thread.
    """
    e = KEY_POS_INF_H if b.itemsize == 2 else _E  # the +Inf bits (widened)
    out = np.zeros((nchan, 5), np.int64)
    for c in prange(nchan):
        acc = out[c]
        acc[0] = KEY_POS_INF
        acc[1] = KEY_NEG_INF
        for o in range(outer):
            s = (o * nchan + c) * inner
            _count_row(b, s, s + inner, acc, e)
    return out
