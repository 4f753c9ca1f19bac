"""Vectorisable transcendentals for the compiled layer kernels.

Inside a Numba loop ``np.exp`` on float32 is a call into the C library per element, which LLVM
cannot turn into vector code (~2.5 ns per element here, against ~0.5 ns for the loops below).
:func:`exp` is a float32 exponential built only from arithmetic, ``rint`` and a bit cast, so a
loop that calls it compiles to AVX2/AVX-512 code and can fuse the exponential with the
surrounding arithmetic (one pass over memory instead of NumPy's pass per ufunc).

* float32: Cephes' ``expf`` (S. L. Moshier): ``x = n ln2 + r``, a degree-6 polynomial for
  ``exp(r)`` on ``|r| <= ln2 / 2``, and ``2^n`` assembled in the exponent bits. Measured maximum
  relative error 1.1 float32 ulp against float64 ``exp`` on [-87, 88]; inputs are clamped to
  [-87.34, 88.38] (so results below ~1.2e-38 are 1.2e-38 instead of a subnormal or 0, and
  results above 2.4e38 are 2.4e38); NaN propagates. Used through :func:`sigmoid`, where the
  clamping cannot show.
* float64: ``np.exp`` (the C library's, correctly rounded in practice): the float64 build is the
  checking build, where accuracy matters more than speed.

:func:`sigmoid` is built on it (the GLU gate, :func:`nbqat.kernels.nn_cpu.glu_forward`), and
:func:`expm1` (ELU) on it and a degree-9 Taylor polynomial for ``|x| <= 0.5``, where
``exp(x) - 1`` would cancel (measured within 1.5 float32 ulp).

Whether a calling loop vectorises is LLVM's decision: the GLU's loop did (measured 1.5-2x
faster than NumPy's ``exp`` plus a compiled pass); an LSTM cell written the same way (four
gate blocks of 32 per row, seven arrays) did not and ran 6x slower than NumPy's SIMD ``tanh``
over the whole (B, 4d) block, so the LSTM keeps NumPy's ufuncs (not investigated further).
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba.core import types
from numba.extending import intrinsic, overload


@intrinsic
def _f32_from_bits(typingctx, bits):  # pragma: no cover - compiled
    """Reinterpret an int32 as float32 (LLVM ``bitcast``; vectorises)."""
    sig = types.float32(types.int32)

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.FloatType())

    return sig, codegen


def exp(x):  # pragma: no cover - replaced by the overload inside compiled code
    """``e**x`` (see the module docstring for accuracy and range)."""
    return np.exp(x)


def sigmoid(x):  # pragma: no cover - replaced by the overload inside compiled code
    """``1 / (1 + e**-x)``."""
    return 1.0 / (1.0 + np.exp(-x))


def expm1(x):  # pragma: no cover - replaced by the overload inside compiled code
    """``e**x - 1``."""
    return np.expm1(x)


def _expf(x):  # pragma: no cover - compiled
    T = np.float32
    xc = min(max(x, T(-87.33654)), T(88.3762626647949))  # 2**n stays a normal float32
    n = np.rint(xc * T(1.44269504088896341))
    r = xc - n * T(0.693359375)
    r = r - n * T(-2.12194440e-4)
    p = T(1.9875691500e-4)
    p = p * r + T(1.3981999507e-3)
    p = p * r + T(8.3334519073e-3)
    p = p * r + T(4.1665795894e-2)
    p = p * r + T(1.6666665459e-1)
    p = p * r + T(5.0000001201e-1)
    p = p * r * r + r + T(1.0)
    e = _f32_from_bits((np.int32(n) + np.int32(127)) << np.int32(23))
    y = p * e
    return y if x == x else x  # NaN in, NaN out


@overload(exp)
def _exp_ov(x):  # pragma: no cover - compiled
    if x == types.float32:
        return _expf
    if isinstance(x, types.Float):
        return lambda x: np.exp(x)
    return None


@overload(sigmoid)
def _sigmoid_ov(x):  # pragma: no cover - compiled
    if isinstance(x, types.Float):
        one = np.float32(1.0) if x == types.float32 else np.float64(1.0)

        def impl(x):
            return one / (one + exp(-x))

        return impl
    return None


def _expm1f(x):  # pragma: no cover - compiled
    T = np.float32
    # |x| <= 0.5: Taylor series to x**9 / 9! (truncation below 2e-9 relative), no cancellation;
    # elsewhere exp(x) - 1, whose rounding error is below 1 ulp of a result >= 0.39 in size
    p = T(1.0 / 362880.0)
    p = p * x + T(1.0 / 40320.0)
    p = p * x + T(1.0 / 5040.0)
    p = p * x + T(1.0 / 720.0)
    p = p * x + T(1.0 / 120.0)
    p = p * x + T(1.0 / 24.0)
    p = p * x + T(1.0 / 6.0)
    p = p * x + T(0.5)
    small = p * x * x + x
    big = exp(x) - T(1.0)
    return small if abs(x) <= T(0.5) else big


@overload(expm1)
def _expm1_ov(x):  # pragma: no cover - compiled
    if x == types.float32:
        return _expm1f
    if isinstance(x, types.Float):
        return lambda x: np.expm1(x)
    return None
