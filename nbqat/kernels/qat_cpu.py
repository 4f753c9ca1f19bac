"""Compiled CPU kernels of the QAT hot path (:class:`nbqat.FakeQuantize`'s private fast path).

A QAT training step calls its quantizers ~200 times on small tensors, so these kernels are serial
(a parallel-region launch costs more than the work) and each quantizer call is ONE compiled call:
the observer's min/max pass, the observer update, ``calculate_qparams`` and the fake
quantization with its STE mask (:func:`fq_tensor_fused`, :func:`fq_channel_fused`). Every result
is bit for bit that of the public, validated path
(:meth:`nbqat.quantization.observers._MinMaxBase.forward`, ``calculate_qparams`` and
:mod:`nbqat.quantization.fake_quant`) because both call the same scalar formulas
(:mod:`nbqat.kernels.observer_formula` through :func:`fold_rows` / :func:`qparams_rows` here,
:mod:`nbqat.kernels.fake_quant_formula`); whenever the data or the state is not plain finite
data they report failure with nothing written that the caller keeps, and the caller takes the
public path.
"""

from __future__ import annotations

import numpy as np

from nbqat._jit import cpu_kernel, renamed
from nbqat.kernels import fake_quant_cpu as _fqk
from nbqat.kernels.fake_quant_formula import qparams_ok
from nbqat.kernels.observe_cpu import KEY_NEG_INF, KEY_POS_INF, order_key, row_keys
from nbqat.kernels.observer_formula import fold_min_max, minmax_qparams


@cpu_kernel(parallel=False, inline="always")
def _keys_to_f32(k0, k1):  # pragma: no cover
    """float32 values of two order keys (the key map is its own inverse)."""
    buf = np.empty(2, np.int32)
    buf[0] = order_key(np.int32(k0))
    buf[1] = order_key(np.int32(k1))
    f = buf.view(np.float32)
    return f[0], f[1]


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
def _observe(b, old_min, old_max, obs):  # pragma: no cover
    """Min/max of the float32 span whose bits are ``b`` (int32), the observer update and its
    qparams (:mod:`nbqat.kernels.observer_formula`, the observers' own formulas):
    ``(ok, new_min, new_max, scale, z)``; ``ok`` False for NaN/Inf in the span (the
    observer's non-finite policy) or a state that is not finite (the public path warns)."""
    moving, cst, symmetric, zp_sym, oqmin, oqmax, eps = obs
    kmin, kmax = _minmax_keys(b)
    if not (kmin > KEY_NEG_INF and kmax < KEY_POS_INF):
        return False, old_min, old_max, eps, np.int64(0)
    fmin, fmax = _keys_to_f32(kmin, kmax)
    nmin, nmax = fold_min_max(old_min, old_max, fmin, fmax, moving, cst)
    if not (np.isfinite(nmin) and np.isfinite(nmax)):
        return False, nmin, nmax, eps, np.int64(0)
    scale, z = minmax_qparams(nmin, nmax, oqmin, oqmax, eps, symmetric, zp_sym)
    return True, nmin, nmax, scale, z


@cpu_kernel(parallel=False)
def fold_rows(old_min, old_max, cur_min, cur_max, moving, c, new_min, new_max):  # pragma: no cover
    """:func:`~nbqat.kernels.observer_formula.fold_min_max` of every (C,) float32 entry into
    ``new_min`` / ``new_max`` (the observers' update,
    :func:`nbqat.quantization._minmax_math.fold_batch`)."""
    for j in range(old_min.shape[0]):
        new_min[j], new_max[j] = fold_min_max(
            old_min[j], old_max[j], cur_min[j], cur_max[j], moving, c
        )


@cpu_kernel(parallel=False)
def qparams_rows(mn, mx, qmin, qmax, eps, symmetric, zp_sym, scale, zp):  # pragma: no cover
    """:func:`~nbqat.kernels.observer_formula.minmax_qparams` of every (C,) float32 entry
    into ``scale`` (float32) and ``zp`` (int64): the observers' ``calculate_qparams``."""
    for j in range(mn.shape[0]):
        scale[j], zp[j] = minmax_qparams(mn[j], mx[j], qmin, qmax, eps, symmetric, zp_sym)


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
        ``ok`` False (NaN/Inf in ``x``, a non-finite state, qparams that
        :func:`~nbqat.kernels.fake_quant_formula.qparams_ok` rejects, which
        :mod:`nbqat.quantization.fake_quant` would refuse): the caller keeps nothing and takes the
        public
        path. The range ``qrange`` is the module's, validated when it was built.
    """
    T = np.float32
    qmin, qmax = qrange
    z = np.int64(zp)
    old_min, old_max = old
    nmin = old_min
    nmax = old_max
    if observe:
        ok, nmin, nmax, scale, z = _observe(x.view(np.int32), old_min, old_max, obs)
        if not ok:
            return False, nmin, nmax, scale, z
    if fake:
        if not qparams_ok(scale, z, np.int64(qmin), np.int64(qmax)):
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
        False (NaN/Inf in ``x``, a non-finite state, qparams that
        :func:`~nbqat.kernels.fake_quant_formula.qparams_ok` rejects): the outputs are partly
        written and the caller keeps nothing.
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
            om = old_min[j] if has_old else T(np.inf)
            oM = old_max[j] if has_old else T(-np.inf)
            bj = b[j * inner : (j + 1) * inner]
            ok, out[0, j], out[1, j], sc[j], z = _observe(bj, om, oM, obs)
            if not ok:
                return False
            zp[j] = z
    if fake:
        for j in range(c):
            if not qparams_ok(sc[j], np.int64(zp[j]), np.int64(qmin), np.int64(qmax)):
                return False
        m8 = mask.view(np.uint8)
        for j in range(c):
            sl = slice(j * inner, (j + 1) * inner)
            _fq_span(x[sl], y[sl], m8[sl], sc[j], T(zp[j]), T(qmin), T(qmax))
    return True


#: Serial build of the STE kernel (:func:`nbqat.kernels.fake_quant_cpu.ste_backward_kernel`) for
#: the small tensors of a QAT step: launching a parallel region costs more than the work there.
ste_backward_serial = cpu_kernel(parallel=False)(
    renamed(_fqk.ste_backward_kernel.py_func, "ste_backward_serial")
)
#: Serial build of :func:`nbqat.kernels.fake_quant_cpu.ste_backward_inplace_kernel`
#: (``FakeQuantize.backward(g, ctx, out=g)``).
ste_backward_inplace = cpu_kernel(parallel=False)(
    renamed(_fqk.ste_backward_inplace_kernel.py_func, "ste_backward_inplace")
)
