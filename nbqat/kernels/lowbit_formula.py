"""The scalar formulas of block-wise affine and float8 fake quantization, written once.

Like :mod:`nbqat.kernels.fake_quant_formula`, every function here is plain Python compiled for
the CPU kernels of :mod:`nbqat.kernels.lowbit_cpu` with ``njit(inline="always")`` and, by
:func:`nbqat._cuda.device_function`, for the ``@cuda.jit`` twins of
:mod:`nbqat.kernels.lowbit_cuda`. All arithmetic is float32 (no fastmath: this is the rounding
path); the sources are torchao 0.18's ``torchao/quantization/quant_primitives.py``.

Rounding half to even is ``rint``, imported by name from NumPy as in
:mod:`nbqat.kernels.fake_quant_formula`: :func:`nbqat._cuda.device_function` rebinds it to the
device's ``rint`` (libdevice ``rintf``; ``np.rint`` does not lower in CUDA device code). Three
more per-target helpers are substituted by the CUDA twins (``device_function(...,
f32_bits=..., bits_f32=..., mul_rn=...)`` with :func:`nbqat._cuda.device_scalar_helpers`):

* :func:`f32_bits` / :func:`bits_f32`: reinterpret a float32 as its uint32 bits and back (an
  LLVM ``bitcast`` here; libdevice ``float_as_int`` / ``int_as_float`` on the device);
* :func:`mul_rn`: a product that is never contracted into a fused multiply-add (a plain
  multiply here, where nothing contracts without fastmath; libdevice ``fmul_rn`` on the
  device, where NVVM contracts ``a * b + c`` by default).
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba.core import types
from numba.extending import intrinsic
from numpy import rint  # by name: nbqat._cuda.device_function rebinds it to the device's rint

from nbqat._jit import cpu_kernel
from nbqat.kernels.fake_quant_formula import (  # noqa: F401 - the reductions of lowbit_cpu/_cuda
    max_nan,
    min_nan,
)
from nbqat.kernels.observer_formula import affine_scale  # the scale rule torch's observers share

_inline = cpu_kernel(parallel=False, inline="always")

#: Format ids of the float8 kernels (``fmt`` arguments).
E4M3FN = 0
E5M2 = 1
#: ``torch.finfo(dtype).max`` of each format.
FLOAT8_MAX = {E4M3FN: 448.0, E5M2: 57344.0}


@intrinsic
def _bitcast_f32_u32(typingctx, x):  # pragma: no cover - compiled
    if x != types.float32:
        return None

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.IntType(32))

    return types.uint32(types.float32), codegen


@intrinsic
def _bitcast_u32_f32(typingctx, u):  # pragma: no cover - compiled
    if u != types.uint32:
        return None

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.FloatType())

    return types.float32(types.uint32), codegen


@_inline
def mul_rn(a, b):  # pragma: no cover
    """``a * b`` rounded on its own (CUDA substitutes libdevice ``fmul_rn``: no FMA)."""
    return a * b


@_inline
def f32_bits(v):  # pragma: no cover
    """The uint32 bits of a float32."""
    return _bitcast_f32_u32(v)


@_inline
def bits_f32(u):  # pragma: no cover
    """The float32 whose bits are the uint32 ``u``."""
    return _bitcast_u32_f32(u)


@_inline
def clamp_nan(v, lo, hi):  # pragma: no cover
    """``torch.clamp(v, lo, hi)``: NaN stays NaN (unlike ``fmin``/``fmax``)."""
    w = lo if v < lo else v
    return hi if w > hi else w


@_inline
def unit_span(u, P, G, Cp):  # pragma: no cover
    """``(j, a, b)``: unit ``u`` of a row is segment ``j``'s span ``[a, b)`` of the row (the
    unit geometry of :mod:`nbqat.quantization._blocks`, for the CPU kernels and the CUDA twins)."""
    if P == 1:
        return u, u * G, u * G + G
    j = u // P
    a = j * G + (u - j * P) * Cp
    return j, a, min(a + Cp, j * G + G)


# ------------------------------------------------------------------------------------- affine
@_inline
def affine_elem(xi, s, inv, z, qmin, qmax):  # pragma: no cover
    """``(y, mask)`` of one element, torchao's ``_quantize_affine_no_dtype_cast`` then
    ``_dequantize_affine_no_dtype_check``: ``r = round(x * (1/s)) + z``,
    ``q = clamp(r, qmin, qmax)`` (NaN propagates), ``y = (q - z) * s``; ``mask`` is True where
    ``qmin <= r <= qmax`` (the gradient mask of ``torch.clamp``; False for NaN)."""
    r = rint(xi * inv) + z
    q = clamp_nan(r, qmin, qmax)
    return (q - z) * s, (r >= qmin) & (r <= qmax)


@_inline
def affine_grad_elem(xi, gi, s, inv, z, qmin, qmax):  # pragma: no cover
    """Element terms of the LSQ backward of :func:`affine_elem` (torch autograd of torchao's
    formula with the STE round), all float32: ``dx = where(mask, g*s, 0) * inv``,
    ``a = g * (q - z)`` (d y / d s directly), ``b = where(mask, g*s, 0) * x`` (the gradient
    reaching ``inv``) and ``c = where(mask, 0, -(g*s))`` (d y / d zero_point)."""
    r = rint(xi * inv) + z
    q = clamp_nan(r, qmin, qmax)
    gs = gi * s
    zero = z - z
    if (r >= qmin) & (r <= qmax):
        return gs * inv, gi * (q - z), gs * xi, zero
    return zero * inv, gi * (q - z), zero, -gs


@_inline
def affine_grad_block(a, b, c, inv):  # pragma: no cover
    """``(dscale, dzero_point)`` (float32) of one block from the float64 sums of
    :func:`affine_grad_elem`'s ``a``, ``b``, ``c``, each rounded once to float32 and combined
    as torch autograd does: ``dscale = a + (b * 1) * -(inv * inv)`` (``1.0 / scale`` is
    ``reciprocal(scale) * 1.0``), ``dzero_point = c``."""
    T = np.float32
    return T(a) + mul_rn(T(b) * T(1.0), -(inv * inv)), T(c)


@_inline
def affine_qparams(mn, mx, qmin, qmax, eps, symmetric, div, zp_sym):  # pragma: no cover
    """``(scale, zero_point)`` (float32) of one block from its NaN-propagating min and max:
    torchao's ``_choose_qparams_affine``. ``min_neg = min(mn, 0)``, ``max_pos = max(mx, 0)``;
    symmetric: ``scale = max(-min_neg, max_pos) / div`` with ``div = (qmax - qmin) / 2``,
    ``zero_point = zp_sym``; asymmetric: ``scale = (max_pos - min_neg) / div`` with
    ``div = qmax - qmin`` and ``zero_point = clamp(qmin - round(min_neg / scale), qmin,
    qmax)``; the scale clamped below by ``eps``; NaN propagates. The scale is
    :func:`~nbqat.kernels.observer_formula.affine_scale`, the rule torch's observers use."""
    scale, min_neg = affine_scale(mn, mx, eps, symmetric, div)
    if symmetric:
        return scale, zp_sym
    zp = clamp_nan(qmin - rint(min_neg / scale), qmin, qmax)
    return scale, zp


@_inline
def zp_to_int32(zp):  # pragma: no cover
    """``zero_point.to(torch.int32)`` of a float32 in range; NaN gives x86's "integer
    indefinite" ``-2**31`` (what torch's CPU cast produces) on every target."""
    if zp != zp:
        return np.int32(-2147483648)
    return np.int32(zp)


# ------------------------------------------------------------------------------------- float8
@_inline
def round_float8(t, fmt):  # pragma: no cover
    """``t.to(float8).to(float32)`` of one float32 (round to nearest even), as torch 2.13's
    CPU casts (``c10/util/Float8_e4m3fn.h``, ``Float8_e5m2.h``): e4m3fn saturates (finite
    overflow and +-Inf give +-448, NaN stays NaN); e5m2 keeps Inf (overflow past the last
    rounding midpoint gives +-Inf). Subnormals round on the format's fixed subnormal grid."""
    I = np.int64
    u = I(f32_bits(t))
    sign = u & I(0x80000000)
    a = u ^ sign
    if fmt == E4M3FN:
        top = I(0x43F00000)  # 480: the first value past 448's rounding interval
        minnorm = I(121 << 23)  # 2**-6
        magic = np.float32(16384.0)  # 2**14: its float32 ulp is the subnormal step 2**-9
        drop = I(20)
    else:
        top = I(0x47800000)  # 65536 = 2**16
        minnorm = I(113 << 23)  # 2**-14
        magic = np.float32(128.0)  # 2**7: ulp 2**-16
        drop = I(21)
    if a > I(0x7F800000):  # NaN
        return t
    if a < minnorm:
        r = (bits_f32(np.uint32(a)) + magic) - magic  # exact: the add rounds half to even
        rb = I(f32_bits(r))
    else:
        odd = (a >> drop) & I(1)
        half = (I(1) << (drop - I(1))) - I(1)
        rb = (a + half + odd) & ~((I(1) << drop) - I(1))
    if rb >= top or a >= top:
        rb = I(0x43E00000) if fmt == E4M3FN else I(0x7F800000)  # 448 | Inf
    return bits_f32(np.uint32(rb | sign))


@_inline
def float8_elem(xi, s, fmt):  # pragma: no cover
    """``(y, mask)`` of one element, torchao's ``_quantize_affine_float8`` then
    ``_dequantize_affine_float8``: ``t = x / s`` (a true division), ``clamp(t, -max, max)``
    (NaN propagates), the float8 cast (:func:`round_float8`), ``y = t8 * s``; ``mask`` is
    True where ``-max <= t <= max`` (``torch.clamp``'s gradient mask; False for NaN)."""
    if fmt == E4M3FN:
        m = np.float32(448.0)
    else:
        m = np.float32(57344.0)
    t = xi / s
    return round_float8(clamp_nan(t, -m, m), fmt) * s, (t >= -m) & (t <= m)


@_inline
def float8_scale(amax, lo, hi, fmt):  # pragma: no cover
    """torchao's ``_choose_scale_float8`` of one block from its NaN-propagating ``max |x|``:
    ``clamp(amax, lo, hi) / finfo(float8).max`` in float32 (``lo = -inf``, ``hi = inf`` when
    unbounded)."""
    if fmt == E4M3FN:
        m = np.float32(448.0)
    else:
        m = np.float32(57344.0)
    return clamp_nan(amax, lo, hi) / m
