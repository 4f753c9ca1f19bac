"""Compiled CPU kernels of the QAT hot path (:class:`nbqat.FakeQuantize`'s private fast path).

A QAT training step calls its quantizers ~200 times on small tensors, so these kernels are serial
(a parallel-region launch costs more than the work) and each quantizer call is ONE compiled call:
the observer's min/max pass, the observer update, ``calculate_qparams`` and the fake
quantization with its STE mask (:func:`fq_tensor_fused`, :func:`fq_channel_fused`). Every result
is bit for bit that of the public, validated path
(:meth:`nbqat.quantization.observers._MinMaxBase.forward`,
``calculate_qparams`` and :mod:`nbqat.quantization.fake_quant`); whenever the data or the state is
not plain
finite data they report failure with nothing written that the caller keeps, and the caller takes
the public path.
"""

from __future__ import annotations

import types

import numpy as np

from nbqat._jit import cpu_kernel
from nbqat._validate import QUANT_BOUND
from nbqat.kernels import fake_quant_cpu as _fqk
from nbqat.kernels.fake_quant_formula import qparams_scale
from nbqat.kernels.observe_cpu import KEY_NEG_INF, KEY_POS_INF, order_key, row_keys

_QB = np.int64(QUANT_BOUND)


@cpu_kernel(parallel=False, inline="always")
def _fq_args_ok(scale, z, qmin, qmax):  # pragma: no cover
    """What :mod:`nbqat.quantization.fake_quant` accepts (else it raises, and so must the caller): a
    range
    ``qmin < qmax`` inside ``[-QUANT_BOUND, QUANT_BOUND]``, a zero point inside it, a float32
    scale that is finite, > 0 and has a finite reciprocal."""
    if not (qmin < qmax and qmin >= -_QB and qmax <= _QB and qmin <= z and z <= qmax):
        return False
    inv = np.float32(1.0) / scale
    return scale > 0 and np.isfinite(scale) and np.isfinite(inv)


@cpu_kernel(parallel=False, inline="always")
def _keys_to_f32(k0, k1):  # pragma: no cover
    """float32 values of two order keys (the key map is its own inverse)."""
    buf = np.empty(2, np.int32)
    buf[0] = order_key(np.int32(k0))
    buf[1] = order_key(np.int32(k1))
    f = buf.view(np.float32)
    return f[0], f[1]


@cpu_kernel(parallel=False, inline="always")
def _update_qparams(fmin, fmax, om, oM, has_old, moving, cst, symmetric, qmin, qmax, eps):
    """One (channel's) observer update and qparams, as float32 scalars.

    torch's expressions (:meth:`nbqat.quantization.observers._MinMaxBase._update` and ``_qparams``),
    with
    NumPy's ``minimum(a, b) = a if a < b else b``. Returns ``(ok, new_min, new_max, scale, z)``;
    ``ok`` is False when the new state is not finite or the zero point would need torch's
    out-of-range conversion (the public path handles those). Symmetric: ``z`` is 0.
    """
    T = np.float32
    if not has_old:
        nmin = fmin
        nmax = fmax
    elif moving:
        nmin = om + cst * (fmin - om)
        nmax = oM + cst * (fmax - oM)
    else:
        nmin = fmin if fmin < om else om
        nmax = fmax if fmax > oM else oM
    if not (np.isfinite(nmin) and np.isfinite(nmax)):
        return False, nmin, nmax, T(1.0), np.int64(0)
    scale, r = qparams_scale(nmin, nmax, qmin, qmax, eps, symmetric)
    if symmetric:
        return True, nmin, nmax, scale, np.int64(0)
    if not (np.isfinite(r) and r >= -(2.0**31) and r < 2.0**31):
        return False, nmin, nmax, scale, np.int64(0)
    z = np.int64(qmin) - np.int64(r)
    if z < -(2**31) or z >= 2**31:
        return False, nmin, nmax, scale, np.int64(0)
    z = max(min(z, np.int64(qmax)), np.int64(qmin))
    return True, nmin, nmax, scale, z


@cpu_kernel(parallel=False, inline="always")
def _minmax_keys(b):  # pragma: no cover
    """Min and max order keys of the float32 bits ``b`` (1-D int32 view): the observers' own
    reduction (:func:`nbqat.kernels.observe_cpu.row_keys`, where the key formula lives)."""
    return row_keys(b, 0, b.size, KEY_POS_INF, KEY_NEG_INF)


@cpu_kernel(parallel=False, inline="always")
def _fq_span(x, y, m8, s, zf, lo, hi):  # pragma: no cover
    """Fake-quantize the 1-D span ``x`` with one float32 scale / zero point into ``y`` and the
    byte mask ``m8`` (:func:`nbqat.kernels.fake_quant_cpu.fq_span`, ``inv`` as torch's)."""
    _fqk.fq_span(x, y, m8, s, np.float32(1.0) / s, zf, lo, hi, True)


@cpu_kernel(parallel=False, inline="always")
def _observe(b, old_min, old_max, has_old, obs):  # pragma: no cover
    """Min/max of the float32 span whose bits are ``b`` (int32), the observer update and its
    qparams: :func:`_update_qparams`'s ``(ok, new_min, new_max, scale, z)`` with the symmetric
    zero point of ``obs`` substituted; ``ok`` False also for NaN/Inf in the span."""
    moving, cst, symmetric, zp_sym, oqmin, oqmax, eps = obs
    kmin, kmax = _minmax_keys(b)
    if not (kmin > KEY_NEG_INF and kmax < KEY_POS_INF):
        return False, old_min, old_max, eps, np.int64(0)
    fmin, fmax = _keys_to_f32(kmin, kmax)
    ok, nmin, nmax, scale, z = _update_qparams(
        fmin, fmax, old_min, old_max, has_old, moving, cst, symmetric, oqmin, oqmax, eps
    )
    return ok, nmin, nmax, scale, np.int64(zp_sym) if symmetric else z


@cpu_kernel(parallel=False)
def qparams_rows(mn, mx, qmin, qmax, eps, symmetric, scale, r):  # pragma: no cover
    """:func:`~nbqat.kernels.fake_quant_formula.qparams_scale` of every (C,) float32 entry
    into ``scale`` and ``r`` (the observers' ``calculate_qparams``)."""
    for c in range(mn.shape[0]):
        scale[c], r[c] = qparams_scale(mn[c], mx[c], qmin, qmax, eps, symmetric)


@cpu_kernel(parallel=False)
def fq_tensor_fused(x, y, mask, scale, zp, observe, fake, old, obs, qrange):  # pragma: no cover
    """One per-tensor :class:`nbqat.FakeQuantize` forward on finite float32 data.

    Parameters
    ----------
    x : (n,) float32, C-contiguous, ``n >= 1``
    y, mask : (n,) float32 / bool outputs (written only when ``fake``; (1,) dummies otherwise)
    scale, zp : float32, int32
        The current qparams (used when not ``observe``).
    observe, fake : bool
        Observer / fake quantization enabled.
    old : (float32, float32)
        The observer state ``(min_val, max_val)`` (``+inf``/``-inf`` when unset).
    obs : tuple (bool, float32, bool, int, int, int, float32)
        The observer's settings ``(moving, averaging_constant, symmetric, symmetric zero point,
        quant_min, quant_max, eps)`` (values unused when not ``observe``).
    qrange : (int, int)
        The fake-quantize range ``(quant_min, quant_max)``.

    Returns
    -------
    (ok, new_min, new_max, scale, zero_point) : (bool, float32, float32, float32, int64)
        ``ok`` False (NaN/Inf in ``x``, a non-finite state, an overflowing zero point, qparams
        or a range that :mod:`nbqat.quantization.fake_quant` rejects): the caller keeps nothing and
        takes the
        public path.
    """
    T = np.float32
    qmin, qmax = qrange
    z = np.int64(zp)
    old_min, old_max = old
    nmin = old_min
    nmax = old_max
    if observe:
        has_old = not (old_min == np.inf and old_max == -np.inf)
        ok, nmin, nmax, scale, z = _observe(x.view(np.int32), old_min, old_max, has_old, obs)
        if not ok:
            return False, nmin, nmax, scale, z
    if fake:
        if not _fq_args_ok(scale, z, np.int64(qmin), np.int64(qmax)):
            return False, nmin, nmax, scale, z
        _fq_span(x, y, mask.view(np.uint8), scale, T(z), T(qmin), T(qmax))
    return True, nmin, nmax, scale, z


@cpu_kernel(parallel=False)
def fq_channel_fused(
    x, y, mask, scale, observe, fake, out, zp, old_min, old_max, obs, qrange
):  # pragma: no cover
    """One per-channel (channel axis first) :class:`nbqat.FakeQuantize` forward.

    Parameters
    ----------
    x : (c * inner,) float32, C-contiguous: the ``(c, inner)`` data, ``c = zp.size >= 1``
    y, mask : (c * inner,) float32 / bool outputs (written only when ``fake``; dummies otherwise)
    scale : (c,) float32
        The current scales (used when not ``observe``).
    observe, fake : bool
        Observer / fake quantization enabled.
    out : (3, c) float32
        Output when ``observe``: rows new min_val, new max_val, new scale ((3, 0) otherwise).
    zp : (c,) int32
        Output (the new zero points) when ``observe``; else the zero points to use.
    old_min, old_max : (c,) float32
        The observer state, or (0,) when unset.
    obs, qrange
        As :func:`fq_tensor_fused`.

    Returns
    -------
    bool
        False (NaN/Inf in ``x``, an unset channel in the state, a non-finite state, an
        overflowing zero point, qparams or a range that :mod:`nbqat.quantization.fake_quant`
        rejects): the
        outputs are partly written and the caller keeps nothing.
    """
    T = np.float32
    qmin, qmax = qrange
    c = zp.size
    inner = x.size // c
    sc = scale
    if observe:
        sc = out[2]
        b = x.view(np.int32)
        has_old = old_min.size == c
        for j in range(c):
            om = T(np.inf)
            oM = T(-np.inf)
            if has_old:
                om = old_min[j]
                oM = old_max[j]
                if om == np.inf and oM == -np.inf:
                    return False
            bj = b[j * inner : (j + 1) * inner]
            ok, out[0, j], out[1, j], sc[j], z = _observe(bj, om, oM, has_old, obs)
            if not ok:
                return False
            zp[j] = z
    if fake:
        for j in range(c):
            if not _fq_args_ok(sc[j], np.int64(zp[j]), np.int64(qmin), np.int64(qmax)):
                return False
        m8 = mask.view(np.uint8)
        for j in range(c):
            sl = slice(j * inner, (j + 1) * inner)
            _fq_span(x[sl], y[sl], m8[sl], sc[j], T(zp[j]), T(qmin), T(qmax))
    return True


def _renamed(f, name):
    """A copy of ``f`` under another name (Numba's on-disk cache is keyed by qualname)."""
    g = types.FunctionType(f.__code__, f.__globals__, name, f.__defaults__, f.__closure__)
    g.__qualname__ = name
    g.__doc__ = f.__doc__
    return g


#: Serial build of the STE kernel (:func:`nbqat.kernels.fake_quant_cpu.ste_backward_kernel`) for
#: the small tensors of a QAT step: launching a parallel region costs more than the work there.
ste_backward_serial = cpu_kernel(parallel=False)(
    _renamed(_fqk.ste_backward_kernel.py_func, "ste_backward_serial")
)
#: Serial build of :func:`nbqat.kernels.fake_quant_cpu.ste_backward_inplace_kernel`
#: (``FakeQuantize.backward(g, ctx, out=g)``).
ste_backward_inplace = cpu_kernel(parallel=False)(
    _renamed(_fqk.ste_backward_inplace_kernel.py_func, "ste_backward_inplace")
)
