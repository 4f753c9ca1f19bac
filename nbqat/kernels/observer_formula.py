"""The scalar formulas of the min/max observers, written once: the running update, the
qparams and torch's int32 zero point.

Plain Python compiled with ``njit(inline="always")`` (:func:`nbqat._jit.cpu_kernel`), all
float32 (no fastmath), torch 2.13's expressions operation by operation
(``torch/ao/quantization/observer.py``). Two paths call them and no other copy exists: the
NumPy-facing observers through :mod:`nbqat.quantization._minmax_math` (the row kernels
:func:`nbqat.kernels.qat_cpu.fold_rows` / ``qparams_rows``) and
:class:`nbqat.FakeQuantize`'s fused forward (:func:`nbqat.kernels.qat_cpu.fq_tensor_fused`).
"""

from __future__ import annotations

import numpy as np
from numpy import rint

from nbqat._jit import cpu_kernel
from nbqat.kernels.fake_quant_formula import max_nan, min_nan

_inline = cpu_kernel(parallel=False, inline="always")


@_inline
def fold_min_max(old_min, old_max, cur_min, cur_max, moving, c):  # pragma: no cover
    """The running ``(min, max)`` of one tensor or channel after a batch's ``(cur_min,
    cur_max)`` (float32 scalars).

    A batch that saw nothing (``cur_min > cur_max``: ``(+inf, -inf)``) keeps the old values;
    an unset state (``(+inf, -inf)``) takes the batch's. Otherwise ``moving``:
    ``old + c * (cur - old)`` (``MovingAverage*MinMaxObserver``), else ``torch.min(cur, old)``
    / ``torch.max(cur, old)`` (NaN-propagating; a tie keeps ``old``, as ``numpy.minimum``).
    """
    if cur_min > cur_max:
        return old_min, old_max
    if old_min == np.inf and old_max == -np.inf:
        return cur_min, cur_max
    if moving:
        return old_min + c * (cur_min - old_min), old_max + c * (cur_max - old_max)
    return min_nan(cur_min, old_min), max_nan(cur_max, old_max)


@_inline
def affine_scale(mn, mx, eps, symmetric, div):  # pragma: no cover
    """``(scale, min_neg)`` of a float32 min/max: the scale rule that torch's observers
    (``_calculate_qparams``) and torchao's ``choose_qparams_affine`` share.

    ``min_neg = min(mn, 0)``, ``max_pos = max(mx, 0)``; symmetric:
    ``scale = max(max(-min_neg, max_pos) / div, eps)``; affine:
    ``scale = max((max_pos - min_neg) / div, eps)``, with ``div`` the float32
    ``(qmax - qmin) / 2`` or ``qmax - qmin``. NaN propagates (as torch.min / torch.max do).
    """
    zero = np.float32(0.0)
    min_neg = min_nan(mn, zero)
    max_pos = max_nan(mx, zero)
    if symmetric:
        return max_nan(max_nan(-min_neg, max_pos) / div, eps), min_neg
    return max_nan((max_pos - min_neg) / div, eps), min_neg


@_inline
def qparams_scale(mn, mx, qmin, qmax, eps, symmetric):  # pragma: no cover
    """``(scale, r)`` of a float32 running min/max: torch's ``_calculate_qparams``
    (``torch/ao/quantization/observer.py``) for one tensor or channel.

    :func:`affine_scale` with ``div = (qmax - qmin) / 2`` (symmetric; ``r = 0``) or
    ``qmax - qmin`` (affine; ``r = rint(min_neg / scale)``, half to even, the zero point
    being ``qmin - r`` clamped by :func:`zero_point_of`); all arithmetic in float32.
    """
    T = np.float32
    if symmetric:
        scale, _ = affine_scale(mn, mx, eps, True, T((qmax - qmin) / 2.0))
        return scale, T(0.0)
    scale, min_neg = affine_scale(mn, mx, eps, False, T(qmax - qmin))
    return scale, rint(min_neg / scale)


@_inline
def zero_point_of(r, qmin, qmax):  # pragma: no cover
    """torch's affine zero point ``clamp(qmin - int32(r), qmin, qmax)`` (int64) of the float32
    ``r = rint(min_neg / scale)``, as torch computes it on x86: a NaN or out-of-range ``r``
    converts to INT32_MIN (``cvttss2si``'s "integer indefinite") and the int32 subtraction
    wraps around."""
    I = np.int64
    if np.isfinite(r) and r >= -2147483648.0 and r < 2147483648.0:
        ri = I(r)
    else:
        ri = I(-2147483648)
    z = (I(qmin) - ri + I(2147483648)) % I(4294967296) - I(2147483648)
    return max(min(z, I(qmax)), I(qmin))


@_inline
def minmax_qparams(mn, mx, qmin, qmax, eps, symmetric, zp_sym):  # pragma: no cover
    """``(scale float32, zero_point int64)`` of one set tensor or channel: torch's
    ``_calculate_qparams`` (:func:`qparams_scale`, then :func:`zero_point_of`; ``zp_sym`` for
    a symmetric qscheme).

    A finite affine range whose width ``max_pos - min_neg`` overflows float32 (scale ``inf``,
    e.g. ``[-3e38, 3e38]``) gets the qparams of the range halved with the scale doubled back:
    halving and doubling are exact there (the ends are far from the subnormals), so the scale
    is the float32 rounding of the true ``width / (qmax - qmin)`` and ``r`` is unchanged;
    torch itself returns ``inf`` (and then rejects that scale when fake-quantizing).
    """
    scale, r = qparams_scale(mn, mx, qmin, qmax, eps, symmetric)
    if symmetric:
        return scale, np.int64(zp_sym)
    if np.isinf(scale) and np.isfinite(mn) and np.isfinite(mx):
        half = np.float32(0.5)
        s2, r = qparams_scale(mn * half, mx * half, qmin, qmax, eps, False)
        scale = s2 * np.float32(2.0)
    return scale, zero_point_of(r, qmin, qmax)
