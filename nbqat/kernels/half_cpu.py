"""float16 <-> float64 conversions on IEEE half bit patterns (``uint16``) for the CPU kernels:
Numba has no CPU float16. Round half to even, exactly like NumPy's conversions (tests check all
65,536 patterns and every tie). Used by :mod:`nbqat.kernels.norm_cpu`, which re-exports them.
"""

from __future__ import annotations

import math

import numba
import numpy as np

from nbqat._jit import cpu_kernel

__all__ = ["f64_to_half_bits", "half_bits_to_f64", "half_decode", "half_roundtrip"]

_HALF_SCALE = np.array([2.0 ** (e - 25) for e in range(32)], np.float64)  # (32,)


@numba.njit
def half_bits_to_f64(h):
    """Decode IEEE half bits (uint16) to float64, exactly."""
    hi = np.int64(h)
    sign = (hi >> 15) & 1
    e = (hi >> 10) & 0x1F
    m = hi & 0x3FF
    if e == 31:
        v = np.inf if m == 0 else np.nan
    elif e == 0:
        v = np.float64(m) * 5.9604644775390625e-08  # m * 2**-24 (subnormal)
    else:
        v = np.float64(m + 1024) * _HALF_SCALE[e]
    return -v if sign else v


@numba.njit
def f64_to_half_bits(v):
    """Round float64 to the nearest IEEE half (ties to even) and return its bits (uint16)."""
    if v != v:
        return np.uint16(0xFE00) if math.copysign(1.0, v) < 0 else np.uint16(0x7E00)
    sign = 0x8000 if math.copysign(1.0, v) < 0 else 0
    a = abs(v)
    if a >= 65520.0:  # rounds to inf
        return np.uint16(sign | 0x7C00)
    if a < 6.103515625e-05:  # below 2**-14: subnormal grid 2**-24
        n = np.int64(np.rint(a * 16777216.0))
        return np.uint16(sign | n)  # n == 1024 is the smallest normal, encoded the same way
    mant, ex = math.frexp(a)  # a = mant * 2**ex, mant in [0.5, 1)
    e = ex - 1
    n = np.int64(np.rint(math.ldexp(a, 10 - e)))  # in [1024, 2048]
    if n == 2048:
        n = 1024
        e += 1
    if e > 15:
        return np.uint16(sign | 0x7C00)
    return np.uint16(sign | ((e + 15) << 10) | (n - 1024))


@cpu_kernel(parallel=False)
def _half_codec(values, bits, encode):  # (n,) float64, (n,) uint16: one side written
    """``bits = f64_to_half_bits(values)`` (``encode``) or ``values = half_bits_to_f64(bits)``."""
    for i in range(values.size):
        if encode:
            bits[i] = f64_to_half_bits(values[i])
        else:
            values[i] = half_bits_to_f64(bits[i])


def half_roundtrip(x: np.ndarray) -> np.ndarray:
    """(n,) float64 -> (n,) uint16 bits of the nearest float16 (:func:`f64_to_half_bits`)."""
    out = np.empty(x.size, np.uint16)
    _half_codec(np.ascontiguousarray(x, np.float64), out, True)
    return out


def half_decode(h: np.ndarray) -> np.ndarray:
    """(n,) uint16 float16 bits -> (n,) float64 values (:func:`half_bits_to_f64`)."""
    out = np.empty(h.size, np.float64)
    _half_codec(out, np.ascontiguousarray(h, np.uint16), False)
    return out
