"""Slow, obviously-correct NumPy references for fake quantization (the test oracle when torch
is absent or has undefined behaviour: NaN/Inf in its per-channel path).

One element at a time with NumPy scalars of the compute dtype, exactly the formula of
``/work/shared/reference/torch-semantics.md`` sections 1-4.
"""

from __future__ import annotations

import numpy as np


def _ct(dtype):
    return np.float64 if np.dtype(dtype) == np.float64 else np.float32


def fq_element(xi, s32, zp, qmin, qmax, T):
    """(y, mask) of one element: T is the compute type (np.float32 / np.float64)."""
    inv = T(np.float32(1.0) / np.float32(s32))
    s = T(np.float32(s32))
    with np.errstate(over="ignore", invalid="ignore"):
        r = T(np.rint(T(xi) * inv)) + T(zp)
    m = bool(T(qmin) <= r <= T(qmax))
    q = np.fmin(np.fmax(r, T(qmin)), T(qmax))
    return T((q - T(zp)) * s), m


def fake_quant_ref(x, scale, zero_point, quant_min, quant_max, axis=None):
    """Per-tensor (``axis=None``, scalar qparams) or per-channel reference; returns (y, mask)."""
    x = np.asarray(x)
    T = _ct(x.dtype)
    y = np.empty(x.shape, T)
    m = np.empty(x.shape, bool)
    for idx in np.ndindex(x.shape):
        if axis is None:
            s, z = scale, zero_point
        else:
            c = idx[axis]
            s, z = scale[c], zero_point[c]
        y[idx], m[idx] = fq_element(x[idx], s, z, quant_min, quant_max, T)
    return y.astype(x.dtype), m


def lsq_ref(grad_y, x, scale, zero_point, quant_min, quant_max, grad_factor, axis=None):
    """LSQ backward reference: (grad_x, grad_scale, grad_zero_point), sums with math.fsum over
    float64 copies of the float32 per-element terms."""
    import math

    x = np.asarray(x, np.float32)
    g = np.asarray(grad_y, np.float32)
    T = np.float32
    C = 1 if axis is None else x.shape[axis]
    sc = np.atleast_1d(np.asarray(scale, np.float32))
    zf = np.atleast_1d(np.asarray(zero_point, np.float32))
    zr = np.clip(np.rint(zf), quant_min, quant_max)
    gx = np.empty_like(x)
    dsl = [[] for _ in range(C)]
    dzl = [[] for _ in range(C)]
    gf = T(grad_factor)
    for idx in np.ndindex(x.shape):
        c = 0 if axis is None else idx[axis]
        s = T(sc[c])
        inv = T(1.0) / s
        z = T(zr[c])
        xi, gi = x[idx], g[idx]
        xq = T(np.rint(xi * inv)) + z
        if T(quant_min) <= xq <= T(quant_max):
            gx[idx] = gi * T(1)
            # (xq - z) * s - x exactly, rounded once (torch's FMA-contracted x86 build)
            d = T(float(xq - z) * float(s) - float(xi))
            dsl[c].append(float(((gi * d) * inv) * gf))
            dzl[c].append(0.0)
        else:
            gx[idx] = gi * T(0)
            lim = T(quant_max) if xq > T(quant_max) else T(quant_min)
            dsl[c].append(float((gi * (lim - z)) * gf))
            dzl[c].append(float(((-gi) * s) * gf))
    ds = np.array([math.fsum(v) for v in dsl], np.float32)
    dz = np.array([math.fsum(v) for v in dzl], np.float32)
    return gx, ds, dz
