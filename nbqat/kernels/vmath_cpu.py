"""Vectorisable transcendentals for the CPU kernels: :func:`vexp`, :func:`vsigmoid`, :func:`vexpm1`.

Plain-Python stubs replaced inside compiled code by their overloads (``numba.extending.overload``),
so any kernel may call them; kernels that do are keyed on this file's source too
(:class:`nbqat._jit.SourceClosureCache`), so an edit here never leaves a stale cached kernel.
Used by :mod:`nbqat.kernels.nn_cpu` (GLU gate, ELU), which re-exports them.
"""

from __future__ import annotations

import math

import numpy as np
from llvmlite import ir
from numba.core import types
from numba.extending import intrinsic, overload

from nbqat._jit import cpu_kernel

__all__ = ["vexp", "vexpm1", "vsigmoid"]

# Inside a Numba loop ``np.exp`` on float32 is a call into the C library per element, which LLVM
# cannot turn into vector code (~2.5 ns per element here, against ~0.5 ns for the loops below).
# :func:`vexp` is a float32 exponential built only from arithmetic, ``rint`` and a bit cast, so a
# loop that calls it compiles to AVX2/AVX-512 code and can fuse the exponential with the
# surrounding arithmetic (one pass over memory instead of NumPy's pass per ufunc).
#
# * float32: Cephes' ``expf`` (S. L. Moshier): ``x = n ln2 + r``, a degree-6 polynomial for
#   ``exp(r)`` on ``|r| <= ln2 / 2``, and ``2^n`` assembled in the exponent bits. Measured maximum
#   relative error 1.1 float32 ulp against float64 ``exp`` on [-87, 88]. Inputs above 88.72 give
#   ``inf`` and below -87.34 give 0 (no subnormal results), so ``sigmoid(-inf) = 0`` and a GLU
#   turns ``inf * sigmoid(-inf)`` into NaN as PyTorch does; between 88.38 and 88.72 the result
#   stays at 2.4e38 (the exponent is clamped to a normal float). NaN propagates.
# * float64: ``np.exp`` (the C library's, correctly rounded in practice): the float64 build is the
#   checking build, where accuracy matters more than speed.
#
# :func:`vsigmoid` is built on it (the GLU gate, :func:`glu_forward`), and
# :func:`vexpm1` (ELU) on it and a degree-9 Taylor polynomial for ``|x| <= 0.5``, where
# ``exp(x) - 1`` would cancel (measured within 1.5 float32 ulp).
#
# Whether a calling loop vectorises is LLVM's decision: the GLU's loop did (measured 1.5-2x
# faster than NumPy's ``exp`` plus a compiled pass); an LSTM cell written the same way (four
# gate blocks of 32 per row, seven arrays) did not and ran 6x slower than NumPy's SIMD ``tanh``
# over the whole (B, 4d) block, so the LSTM keeps NumPy's ufuncs (not investigated further).


@intrinsic
def _f32_from_bits(typingctx, bits):  # pragma: no cover - compiled
    """Reinterpret an int32 as float32 (LLVM ``bitcast``; vectorises)."""
    sig = types.float32(types.int32)

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.FloatType())

    return sig, codegen


def vexp(x):  # pragma: no cover - replaced by the overload inside compiled code
    """``e**x`` (float32: see the comment above for accuracy and range)."""
    return np.exp(x)


def vsigmoid(x):  # pragma: no cover - replaced by the overload inside compiled code
    """``1 / (1 + e**-x)``."""
    return 1.0 / (1.0 + np.exp(-x))


def vexpm1(x):  # pragma: no cover - replaced by the overload inside compiled code
    """``e**x - 1``."""
    return np.expm1(x)


#: Cephes ``expf``'s polynomial for ``(exp(r) - 1 - r) / r**2``, highest degree first.
_EXP_COEFS = tuple(
    np.float32(c)
    for c in (
        1.9875691500e-4,
        1.3981999507e-3,
        8.3334519073e-3,
        4.1665795894e-2,
        1.6666665459e-1,
        0.5000000120,
    )
)
#: Taylor coefficients ``1/k!`` of ``(exp(x) - 1 - x) / x**2``, k = 9 .. 2, highest first.
_EXPM1_COEFS = tuple(np.float32(1.0 / math.factorial(k)) for k in range(9, 1, -1))


@cpu_kernel(parallel=False, inline="always")
def _horner(coefs, x):  # pragma: no cover - compiled
    """``((c0 * x + c1) * x + c2) ...``: Horner's rule in the coefficients' dtype (float32)."""
    p = coefs[0]
    for k in range(1, len(coefs)):
        p = p * x + coefs[k]
    return p


def _expf(x):  # pragma: no cover - compiled
    T = np.float32
    xc = min(max(x, T(-87.33654)), T(88.3762626647949))  # 2**n stays a normal float32
    n = np.rint(xc * T(1.44269504088896341))
    r = xc - n * T(0.693359375)
    r = r - n * T(-2.12194440e-4)
    p = _horner(_EXP_COEFS, r)
    p = p * r * r + r + T(1.0)
    e = _f32_from_bits((np.int32(n) + np.int32(127)) << np.int32(23))
    y = p * e
    y = T(np.inf) if x > T(88.72283905206835) else y  # overflow, as expf
    y = T(0.0) if x < T(-87.33654) else y  # no subnormal results: 0 below the normal range
    return y if x == x else x  # NaN in, NaN out


def _float32_overload(stub, impl32, impl64):
    """Register ``stub``'s compiled implementations: ``impl32`` for float32, ``impl64`` (NumPy's
    ufunc) for the other float types."""

    def typer(x):  # pragma: no cover - compiled
        if x == types.float32:
            return impl32
        if isinstance(x, types.Float):
            return impl64
        return None

    overload(stub)(typer)


_float32_overload(vexp, _expf, lambda x: np.exp(x))


@overload(vsigmoid)
def _sigmoid_ov(x):  # pragma: no cover - compiled
    if isinstance(x, types.Float):
        one = np.float32(1.0) if x == types.float32 else np.float64(1.0)

        def impl(x):
            return one / (one + vexp(-x))

        return impl
    return None


def _expm1f(x):  # pragma: no cover - compiled
    T = np.float32
    # |x| <= 0.5: Taylor series to x**9 / 9! (truncation below 2e-9 relative), no cancellation;
    # elsewhere exp(x) - 1, whose rounding error is below 1 ulp of a result >= 0.39 in size
    p = _horner(_EXPM1_COEFS, x)
    small = x * (T(1.0) + p * x)  # x * (...) keeps the sign of -0.0
    big = vexp(x) - T(1.0)
    return small if abs(x) <= T(0.5) else big


_float32_overload(vexpm1, _expm1f, lambda x: np.expm1(x))
