"""Compiled CPU kernels of the QAT hot path (:class:`nbqat.FakeQuantize`'s private fast path).

A QAT training step calls its quantizers ~200 times on small tensors, so these kernels are serial
(a parallel-region launch costs more than the work) and fold the observer update and the qparams
into one compiled call. Every result is bit for bit that of the public, validated path.
"""

from __future__ import annotations

import types

import numpy as np

from nbqat._jit import cpu_kernel
from nbqat.kernels import fake_quant_cpu as _fqk


# ---------------------------------------------------------------------------------------------
# QAT hot path: one per-tensor observer step + qparams (nbqat.observers' private fast path)
# ---------------------------------------------------------------------------------------------
@cpu_kernel(parallel=False)
def observe_tensor_qparams(
    b, kmin, kmax, old_min, old_max, moving, cst, symmetric, qmin, qmax, eps
):
    """A min/max observer's update and ``calculate_qparams`` for one finite float32 batch, as
    scalars (the per-tensor hot path of :class:`nbqat.FakeQuantize`).

    ``b`` (n,) int32 holds the bits of the float32 batch, ``kmin``/``kmax`` its min/max order
    keys (:mod:`nbqat.kernels.observe_cpu`); ``old_min``/``old_max`` float32 the state
    (+inf/-inf when unset). Returns ``(ok, new_min, new_max, scale, zero_point)`` with the
    float32 expressions of :meth:`nbqat.observers._MinMaxBase._update` and ``_qparams``
    (NumPy's ``minimum(a, b) = a if a < b else b``); ``ok`` is False -- the caller then takes the
    full path -- when the batch or the new state is not finite or the zero point would need
    torch's out-of-range conversion. Symmetric: the zero point returned is 0 (callers fill it).
    """
    T = np.float32
    zero = T(0.0)
    buf = np.empty(2, np.int32)
    k0 = np.int64(kmin)
    k1 = np.int64(kmax)
    if k0 < 0:
        k0 = k0 ^ 0x7FFFFFFF
    if k1 < 0:
        k1 = k1 ^ 0x7FFFFFFF
    buf[0] = k0
    buf[1] = k1
    f = buf.view(np.float32)
    fmin = f[0]
    fmax = f[1]
    if old_min == np.inf and old_max == -np.inf:
        nmin = fmin
        nmax = fmax
    elif moving:
        nmin = old_min + cst * (fmin - old_min)
        nmax = old_max + cst * (fmax - old_max)
    else:
        nmin = fmin if fmin < old_min else old_min
        nmax = fmax if fmax > old_max else old_max
    if not (np.isfinite(nmin) and np.isfinite(nmax)):
        return False, nmin, nmax, T(1.0), 0
    min_neg = nmin if nmin < zero else zero
    max_pos = nmax if nmax > zero else zero
    if symmetric:
        mneg = -min_neg
        mp = mneg if mneg > max_pos else max_pos
        scale = mp / T((qmax - qmin) / 2.0)
        scale = scale if scale > eps else eps
        return True, nmin, nmax, scale, 0
    scale = (max_pos - min_neg) / T(qmax - qmin)
    scale = scale if scale > eps else eps
    r = np.rint(min_neg / scale)
    if not (np.isfinite(r) and r >= -(2.0**31) and r < 2.0**31):
        return False, nmin, nmax, scale, 0
    z = np.int64(qmin) - np.int64(r)
    if z < -(2**31) or z >= 2**31:
        return False, nmin, nmax, scale, 0
    z = max(min(z, np.int64(qmax)), np.int64(qmin))
    return True, nmin, nmax, scale, z


@cpu_kernel(parallel=False)
def observe_channel_qparams(
    kmin, kmax, old_min, old_max, moving, cst, symmetric, zp_sym, qmin, qmax, eps, out
):
    """Per-channel twin of :func:`observe_tensor_qparams` for C channels.

    ``kmin``/``kmax`` (C,) int32 order keys of the batch's per-channel min/max; ``old_min``/
    ``old_max`` (C,) float32 state, or (0,) when unset. Writes ``out`` (4, C) float32: rows new
    min, new max, scale and zero point (integral values). Returns False (``out`` partly
    written, nothing else changed) when a value is not finite or a zero point would need
    torch's out-of-range conversion. ``zp_sym`` is the symmetric qschemes' zero point.
    """
    T = np.float32
    zero = T(0.0)
    c = kmin.size
    buf = np.empty(2 * c, np.int32)
    for j in range(c):
        k0 = np.int64(kmin[j])
        k1 = np.int64(kmax[j])
        if k0 < 0:
            k0 = k0 ^ 0x7FFFFFFF
        if k1 < 0:
            k1 = k1 ^ 0x7FFFFFFF
        buf[j] = k0
        buf[c + j] = k1
    f = buf.view(np.float32)
    has_old = old_min.size == c
    for j in range(c):
        fmin = f[j]
        fmax = f[c + j]
        if not has_old:
            nmin = fmin
            nmax = fmax
        else:
            om = old_min[j]
            oM = old_max[j]
            if om == np.inf and oM == -np.inf:
                return False
            if moving:
                nmin = om + cst * (fmin - om)
                nmax = oM + cst * (fmax - oM)
            else:
                nmin = fmin if fmin < om else om
                nmax = fmax if fmax > oM else oM
        if not (np.isfinite(nmin) and np.isfinite(nmax)):
            return False
        min_neg = nmin if nmin < zero else zero
        max_pos = nmax if nmax > zero else zero
        if symmetric:
            mneg = -min_neg
            mp = mneg if mneg > max_pos else max_pos
            scale = mp / T((qmax - qmin) / 2.0)
            scale = scale if scale > eps else eps
            z = np.int64(zp_sym)
        else:
            scale = (max_pos - min_neg) / T(qmax - qmin)
            scale = scale if scale > eps else eps
            r = np.rint(min_neg / scale)
            if not (np.isfinite(r) and r >= -(2.0**31) and r < 2.0**31):
                return False
            z = np.int64(qmin) - np.int64(r)
            if z < -(2**31) or z >= 2**31:
                return False
            z = max(min(z, np.int64(qmax)), np.int64(qmin))
        out[0, j] = nmin
        out[1, j] = nmax
        out[2, j] = scale
        out[3, j] = T(z)
    return True


def _renamed(f, name):
    """A copy of ``f`` under another name (Numba's on-disk cache is keyed by qualname)."""
    g = types.FunctionType(f.__code__, f.__globals__, name, f.__defaults__, f.__closure__)
    g.__qualname__ = name
    g.__doc__ = f.__doc__
    return g


#: Serial builds of the fake-quantize kernels (:mod:`nbqat.kernels.fake_quant_cpu`) for the
#: small tensors of a QAT step: launching a parallel region costs more than the work there.
fq_tensor_serial = cpu_kernel(parallel=False)(
    _renamed(_fqk.fq_tensor_kernel.py_func, "fq_tensor_serial")
)
fq_channel_serial = cpu_kernel(parallel=False)(
    _renamed(_fqk.fq_channel_kernel.py_func, "fq_channel_serial")
)
ste_backward_serial = cpu_kernel(parallel=False)(
    _renamed(_fqk.ste_backward_kernel.py_func, "ste_backward_serial")
)
