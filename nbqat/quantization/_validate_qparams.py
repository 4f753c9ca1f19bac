"""Checks of quantization parameters (the quantization range, scales, zero points), in plain
Python, before any compiled code runs; part of :mod:`nbqat._validate` (its rules: TypeError for
a wrong type or dtype, ValueError for a wrong value, messages that name the argument and the fix).
"""

from __future__ import annotations

import numbers
from typing import Any

import numpy as np

from nbqat._validate import QUANT_BOUND, _host_scalar_or_array, check_int, host_vector
from nbqat.kernels.fake_quant_cpu import scales_ok_kernel

__all__ = [
    "check_channel_qparams",
    "check_float_zero_point",
    "check_quant_range",
    "check_scale",
    "check_zero_point",
]


def check_quant_range(quant_min: Any, quant_max: Any) -> tuple[int, int]:
    """Validate the integer quantization range.

    Returns
    -------
    (int, int)
        ``(quant_min, quant_max)``.

    Raises
    ------
    TypeError
        When a bound is not an integer.
    ValueError
        When ``quant_min >= quant_max`` or a bound exceeds :data:`QUANT_BOUND` in magnitude.
    """
    qmin = check_int(quant_min, "quant_min")
    qmax = check_int(quant_max, "quant_max")
    if qmin >= qmax:
        raise ValueError(
            f"`quant_min` ({qmin}) must be < `quant_max` ({qmax}), e.g. (-128, 127) for int8"
        )
    if qmin < -QUANT_BOUND or qmax > QUANT_BOUND:
        raise ValueError(
            f"`quant_min`/`quant_max` must lie in [-2**24, 2**24] so that every grid point is "
            f"exact in float32, got ({qmin}, {qmax})"
        )
    return qmin, qmax


def _float32_scale_ok(s32: np.ndarray) -> np.ndarray:
    """Where the float32 ``s32`` is a usable scale: the compiled rule
    :func:`nbqat.kernels.fake_quant_formula.scale_ok`, which the fused kernels apply too."""
    flat = np.ascontiguousarray(s32, np.float32).reshape(-1)
    ok = np.empty(flat.shape, np.bool_)
    scales_ok_kernel(flat, ok)
    return ok.reshape(np.shape(s32))


def check_scale(scale: Any, name: str = "scale") -> np.float32:
    """Validate a per-tensor scale and return it narrowed to float32 (as PyTorch does).

    Parameters
    ----------
    scale : float, NumPy floating scalar or size-1 float array

    Returns
    -------
    numpy.float32

    Raises
    ------
    TypeError
        When ``scale`` is not a real number / float array of size 1.
    ValueError
        When ``float32(scale)`` is <= 0, NaN, infinite, or so small that its float32
        reciprocal overflows (below about 2.9e-39).
    """
    scale = _host_scalar_or_array(scale, name)
    if isinstance(scale, np.ndarray):
        if scale.size != 1:
            raise ValueError(
                f"`{name}` must be a scalar or a size-1 array for per-tensor "
                f"quantization, got shape {scale.shape}"
            )
        if not np.issubdtype(scale.dtype, np.floating):
            raise TypeError(
                f"`{name}` must be a float array, got dtype {scale.dtype}; "
                f"use `{name}.astype(np.float32)`"
            )
        scale = scale.reshape(-1)[0]
    if isinstance(scale, (bool, np.bool_)) or not isinstance(scale, (numbers.Real, np.floating)):
        raise TypeError(f"`{name}` must be a positive float, got {type(scale).__name__}")
    with np.errstate(over="ignore"):
        s32 = np.float32(scale)
    if not bool(_float32_scale_ok(np.asarray(s32))):
        raise ValueError(
            f"`{name}` must be finite and > 0 (and >= 2.9e-39 in float32), got {float(scale)!r}"
        )
    return s32


def check_zero_point(zero_point: Any, quant_min: int, quant_max: int, name: str = "zero_point"):
    """Validate an integer per-tensor zero point inside ``[quant_min, quant_max]``.

    Accepts an int, a NumPy integer, an integral float, or a size-1 array of those.

    Returns
    -------
    int

    Raises
    ------
    TypeError
        When it is not an integer (a float with a fractional part included).
    ValueError
        When it lies outside ``[quant_min, quant_max]``.
    """
    zp = check_int(_host_scalar_or_array(zero_point, name), name)
    if not quant_min <= zp <= quant_max:
        raise ValueError(
            f"`{name}` ({zp}) must lie in [quant_min, quant_max] = [{quant_min}, {quant_max}]"
        )
    return zp


def check_float_zero_point(zero_point: Any, name: str = "zero_point") -> np.float32:
    """Validate a learnable (float) per-tensor zero point and return it as float32.

    Raises
    ------
    TypeError
        When it is not a real number / size-1 numeric array.
    ValueError
        When it is NaN or infinite.
    """
    zero_point = _host_scalar_or_array(zero_point, name)
    if isinstance(zero_point, np.ndarray):
        if zero_point.size != 1:
            raise ValueError(
                f"`{name}` must be a scalar or a size-1 array, got shape {zero_point.shape}"
            )
        if not (
            np.issubdtype(zero_point.dtype, np.floating)
            or np.issubdtype(zero_point.dtype, np.integer)
        ):
            raise TypeError(f"`{name}` must be a float or int array, got {zero_point.dtype}")
        zero_point = zero_point.reshape(-1)[0]
    if isinstance(zero_point, (bool, np.bool_)) or not isinstance(
        zero_point, (numbers.Real, np.floating, np.integer)
    ):
        raise TypeError(f"`{name}` must be a real number, got {type(zero_point).__name__}")
    with np.errstate(over="ignore"):  # past float32: Inf, refused below (no RuntimeWarning)
        z = np.float32(zero_point)
    if not np.isfinite(z):
        raise ValueError(f"`{name}` must be finite, got {float(zero_point)!r}")
    return z


def check_channel_qparams(
    scale: Any,
    zero_point: Any,
    channels: int,
    quant_min: int,
    quant_max: int,
    *,
    float_zero_point: bool = False,
) -> tuple[np.ndarray, np.ndarray]:
    """Validate per-channel ``scale`` (float, (C,)) and ``zero_point`` ((C,)).

    Parameters
    ----------
    scale : array of shape (C,), floating dtype
        Every element must be finite and > 0 in float32.
    zero_point : array of shape (C,)
        Integer dtype (or integral floats) inside ``[quant_min, quant_max]``; with
        ``float_zero_point=True`` any finite floats (learnable zero points).
    channels : int
        ``C = x.shape[axis]``.
    quant_min, quant_max : int
    float_zero_point : bool

    Returns
    -------
    (numpy.ndarray, numpy.ndarray)
        ``scale`` as contiguous float32 (C,), ``zero_point`` as contiguous int32 (C,) or,
        with ``float_zero_point``, float32 (C,).

    Raises
    ------
    TypeError, ValueError
        On wrong dtypes, lengths other than C, non-positive/non-finite scales, out-of-range or
        non-integral zero points.
    """
    s = host_vector(scale, "scale")
    z = host_vector(zero_point, "zero_point")
    if s.shape[0] != channels:
        raise ValueError(f"`scale` must have length x.shape[axis] = {channels}, got {s.shape[0]}")
    if z.shape[0] != channels:
        raise ValueError(
            f"`zero_point` must have length x.shape[axis] = {channels}, got {z.shape[0]}"
        )
    if not np.issubdtype(s.dtype, np.floating):
        raise TypeError(
            f"`scale` must be a float array, got dtype {s.dtype}; use `scale.astype(np.float32)`"
        )
    with np.errstate(over="ignore"):
        s32 = np.ascontiguousarray(s, dtype=np.float32)
    bad = ~_float32_scale_ok(s32)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise ValueError(
            f"`scale` must be finite and > 0 in every channel, got scale[{i}] = {s[i]!r}"
        )
    return s32, _channel_zero_points(z, quant_min, quant_max, float_zero_point)


def _channel_zero_points(z: np.ndarray, quant_min: int, quant_max: int, float_zp: bool):
    """:func:`check_channel_qparams`'s zero points: float32 finite ones (``float_zp``), else
    int32 ones (integral floats accepted) inside ``[quant_min, quant_max]``."""
    if float_zp:
        if not (np.issubdtype(z.dtype, np.floating) or np.issubdtype(z.dtype, np.integer)):
            raise TypeError(f"`zero_point` must be a float or int array, got dtype {z.dtype}")
        z32 = np.ascontiguousarray(z, dtype=np.float32)
        if not np.isfinite(z32).all():
            raise ValueError("`zero_point` must be finite in every channel")
        return z32
    if np.issubdtype(z.dtype, np.floating):
        if not (np.isfinite(z).all() and (z == np.round(z)).all()):
            raise TypeError(
                "`zero_point` must hold integers, got non-integral floats; use "
                "`np.rint(zero_point).astype(np.int32)`"
            )
    elif not np.issubdtype(z.dtype, np.integer):
        raise TypeError(
            f"`zero_point` must be an int32 array, got dtype {z.dtype}; "
            "use `zero_point.astype(np.int32)`"
        )
    # the range check in z's own dtype (a uint64 2**64 - 1 must not wrap to -1 in a cast)
    out = (z < quant_min) | (z > quant_max)
    if out.any():
        i = int(np.flatnonzero(out)[0])
        raise ValueError(
            f"`zero_point` must lie in [quant_min, quant_max] = [{quant_min}, {quant_max}], "
            f"got zero_point[{i}] = {z[i].item()!r}"
        )
    return np.ascontiguousarray(z, dtype=np.int32)
