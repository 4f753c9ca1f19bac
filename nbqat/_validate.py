"""Argument checks shared by nbqat's public functions, in plain Python.

Every public function validates its arguments with these helpers *before* any compiled code
runs, so bad input raises a clear :class:`ValueError` / :class:`TypeError` that names the
argument and the fix, and nothing is written into caller buffers. Kernels assume clean input.

The helpers accept NumPy arrays and CUDA device arrays (anything with ``shape`` and ``dtype``,
see :func:`nbqat._cuda.is_cuda_array`); they never copy data between host and device, except
:func:`host_vector`, which brings a small per-channel parameter vector to the host.

Helpers (general, for every nbqat module):

* :func:`check_float_array` -- a float16/float32/float64 array (TypeError with an
  ``.astype(np.float32)`` hint otherwise).
* :func:`check_same_shape` -- two arrays of the same shape.
* :func:`check_int` / :func:`check_positive_finite` -- Python scalars.
* :func:`check_quant_range`, :func:`check_scale`, :func:`check_zero_point`,
  :func:`check_channel_qparams`, :func:`check_float_zero_point` -- quantization parameters.
* :func:`normalize_axis` -- an axis in ``[-ndim, ndim)`` to ``[0, ndim)``.
* :func:`check_out`, :func:`check_mask` -- preallocated outputs.
* :func:`split_axis` -- the ``(outer, C, inner)`` factorisation of a shape around an axis.
"""

from __future__ import annotations

import math
import numbers
from typing import Any

import numpy as np


def is_cuda_array(x: Any) -> bool:
    """Whether ``x`` is a CUDA device array, without importing :mod:`numba.cuda`.

    Anything exposing ``__cuda_array_interface__`` (Numba device arrays, CuPy, PyTorch CUDA
    tensors) counts, and so does the CUDA simulator's ``FakeCUDAArray`` (which has
    ``copy_to_host`` but no interface); NumPy arrays and scalars do not. Agrees with
    :func:`nbqat._cuda.is_cuda_array` on real devices.
    """
    if x is None or isinstance(x, np.ndarray) or np.isscalar(x):
        return False
    return hasattr(x, "__cuda_array_interface__") or hasattr(x, "copy_to_host")


#: Floating dtypes nbqat's kernels accept.
FLOAT_DTYPES = (np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64))

#: Largest magnitude of a quantization bound: every integer of the grid is exact in float32,
#: which nbqat's float arithmetic (and its bit-exactness with PyTorch) relies on.
QUANT_BOUND = 2**24

__all__ = [
    "FLOAT_DTYPES",
    "QUANT_BOUND",
    "as_array",
    "check_channel_qparams",
    "check_float_array",
    "check_finite_real",
    "check_float_zero_point",
    "check_int",
    "check_mask",
    "check_out",
    "check_positive_finite",
    "check_quant_range",
    "check_same_dtype",
    "check_same_shape",
    "check_scale",
    "check_zero_point",
    "host_vector",
    "is_cuda_array",
    "normalize_axis",
    "split_axis",
]


def as_array(x: Any, name: str) -> Any:
    """Return ``x`` unchanged if it is a NumPy or CUDA array, else ``np.asarray(x)``.

    Raises
    ------
    TypeError
        When ``x`` cannot be converted to an array (e.g. ``None``).
    """
    if isinstance(x, np.ndarray) or is_cuda_array(x):
        return x
    if x is None:
        raise TypeError(f"`{name}` must be an array, got None")
    try:
        return np.asarray(x)
    except Exception as exc:  # pragma: no cover - exotic objects
        raise TypeError(f"`{name}` must be an array, got {type(x).__name__}") from exc


def check_float_array(x: Any, name: str = "x", dtypes: tuple = FLOAT_DTYPES) -> Any:
    """Check that ``x`` is a floating-point array (NumPy or CUDA) of an accepted dtype.

    Parameters
    ----------
    x : array_like or CUDA array
        The array. Non-arrays (lists, scalars) are converted with :func:`numpy.asarray`.
    name : str
        The argument name used in the error message.
    dtypes : tuple of numpy.dtype
        Accepted dtypes (default float16, float32, float64).

    Returns
    -------
    numpy.ndarray or CUDA array
        ``x`` (converted to a NumPy array if it was not an array).

    Raises
    ------
    TypeError
        For integer, bool, complex, object or other unsupported dtypes, with an
        ``.astype(np.float32)`` hint.
    """
    x = as_array(x, name)
    dt = np.dtype(x.dtype)
    if dt not in dtypes:
        names = ", ".join(str(d) for d in dtypes)
        raise TypeError(
            f"`{name}` must be a floating-point array ({names}), got dtype {dt}; "
            f"convert it first, e.g. `{name}.astype(np.float32)`"
        )
    return x


def check_same_shape(a: Any, b: Any, name_a: str, name_b: str) -> None:
    """Raise ValueError unless ``a.shape == b.shape``."""
    if tuple(a.shape) != tuple(b.shape):
        raise ValueError(
            f"`{name_b}` must have the shape of `{name_a}` {tuple(a.shape)}, got {tuple(b.shape)}"
        )


def check_int(v: Any, name: str) -> int:
    """Return ``v`` as a Python int; accepts ints, NumPy integers and integral size-1 arrays.

    Raises
    ------
    TypeError
        For bools, non-integral floats and other types.
    """
    if isinstance(v, np.ndarray):
        if v.size != 1:
            raise ValueError(f"`{name}` must be a scalar or a size-1 array, got shape {v.shape}")
        v = v.reshape(-1)[0]
    if isinstance(v, (bool, np.bool_)):
        raise TypeError(f"`{name}` must be an integer, got a bool")
    if isinstance(v, numbers.Integral):
        return int(v)
    if isinstance(v, (float, np.floating)) and math.isfinite(float(v)) and float(v).is_integer():
        return int(v)
    raise TypeError(f"`{name}` must be an integer, got {v!r} ({type(v).__name__})")


def check_positive_finite(v: Any, name: str) -> float:
    """Return ``v`` as a Python float, raising ValueError unless it is finite and > 0."""
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (numbers.Real, np.floating)):
        raise TypeError(f"`{name}` must be a real number, got {type(v).__name__}")
    f = float(v)
    if not (math.isfinite(f) and f > 0.0):
        raise ValueError(f"`{name}` must be finite and > 0, got {f}")
    return f


def check_finite_real(v: Any, name: str) -> float:
    """Return ``v`` as a Python float, raising unless it is a finite real number.

    Raises
    ------
    TypeError
        For bools and non-real types.
    ValueError
        For NaN and +-Inf.
    """
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (numbers.Real, np.floating)):
        raise TypeError(f"`{name}` must be a real number, got {type(v).__name__}")
    f = float(v)
    if not math.isfinite(f):
        raise ValueError(f"`{name}` must be finite, got {f}")
    return f


def check_same_dtype(a: Any, b: Any, name_a: str, name_b: str) -> None:
    """Raise TypeError unless ``a.dtype == b.dtype`` (the message says how to convert)."""
    if np.dtype(a.dtype) != np.dtype(b.dtype):
        raise TypeError(
            f"`{name_b}` must have {name_a}'s dtype {np.dtype(a.dtype)}, got "
            f"{np.dtype(b.dtype)}; use {name_b}.astype({name_a}.dtype)"
        )


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
    with np.errstate(divide="ignore", over="ignore"):
        inv = np.float32(1.0) / s32
    return np.isfinite(s32) & (s32 > 0) & np.isfinite(inv)


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
    if is_cuda_array(scale):
        scale = scale.copy_to_host() if hasattr(scale, "copy_to_host") else np.asarray(scale)
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
    if is_cuda_array(zero_point):
        zero_point = np.asarray(zero_point.copy_to_host())
    zp = check_int(zero_point, name)
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
    if is_cuda_array(zero_point):
        zero_point = np.asarray(zero_point.copy_to_host())
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
    z = np.float32(zero_point)
    if not np.isfinite(z):
        raise ValueError(f"`{name}` must be finite, got {float(zero_point)!r}")
    return z


def host_vector(v: Any, name: str) -> np.ndarray:
    """Return a per-channel parameter vector as a 1-D NumPy array (device arrays are copied)."""
    if is_cuda_array(v):
        v = v.copy_to_host() if hasattr(v, "copy_to_host") else np.asarray(v)
    v = as_array(v, name)
    if v.ndim != 1:
        raise ValueError(f"`{name}` must be a 1-D array of length C, got shape {v.shape}")
    return v


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
    if float_zero_point:
        if not (np.issubdtype(z.dtype, np.floating) or np.issubdtype(z.dtype, np.integer)):
            raise TypeError(f"`zero_point` must be a float or int array, got dtype {z.dtype}")
        z32 = np.ascontiguousarray(z, dtype=np.float32)
        if not np.isfinite(z32).all():
            raise ValueError("`zero_point` must be finite in every channel")
        return s32, z32
    if np.issubdtype(z.dtype, np.integer):
        zi = z.astype(np.int64)
    elif np.issubdtype(z.dtype, np.floating):
        if not (np.isfinite(z).all() and (z == np.round(z)).all()):
            raise TypeError(
                "`zero_point` must hold integers, got non-integral floats; use "
                "`np.rint(zero_point).astype(np.int32)`"
            )
        zi = z.astype(np.int64)
    else:
        raise TypeError(
            f"`zero_point` must be an int32 array, got dtype {z.dtype}; "
            "use `zero_point.astype(np.int32)`"
        )
    out = (zi < quant_min) | (zi > quant_max)
    if out.any():
        i = int(np.flatnonzero(out)[0])
        raise ValueError(
            f"`zero_point` must lie in [quant_min, quant_max] = [{quant_min}, {quant_max}], "
            f"got zero_point[{i}] = {int(zi[i])}"
        )
    return s32, np.ascontiguousarray(zi, dtype=np.int32)


def normalize_axis(axis: Any, ndim: int, name: str = "axis") -> int:
    """Map ``axis`` in ``[-ndim, ndim)`` to ``[0, ndim)``.

    Raises
    ------
    TypeError
        When ``axis`` is not an integer.
    ValueError
        When it is out of range (including any axis of a 0-d array).
    """
    a = check_int(axis, name)
    if not -ndim <= a < ndim:
        raise ValueError(
            f"`{name}` ({a}) is out of range for an array with {ndim} dimension(s); "
            f"use a value in [{-ndim}, {ndim - 1}]"
            if ndim
            else f"`{name}` is invalid for a 0-d array: per-channel needs at least 1 dimension"
        )
    return a + ndim if a < 0 else a


def split_axis(shape: tuple[int, ...], axis: int) -> tuple[int, int, int]:
    """``(outer, C, inner)`` with ``outer = prod(shape[:axis])``, ``C = shape[axis]``,
    ``inner = prod(shape[axis+1:])``: a C-contiguous array of ``shape`` viewed as 3-D."""
    outer = int(np.prod(shape[:axis], dtype=np.int64))
    inner = int(np.prod(shape[axis + 1 :], dtype=np.int64))
    return outer, int(shape[axis]), inner


def check_out(out: Any, shape: tuple[int, ...], dtype: Any, name: str = "out") -> None:
    """Check a preallocated output: an array of exactly ``shape`` and ``dtype``.

    Raises
    ------
    TypeError
        When it is not an array or has the wrong dtype.
    ValueError
        When its shape differs, or it is a read-only NumPy array.
    """
    if not (isinstance(out, np.ndarray) or is_cuda_array(out)):
        raise TypeError(f"`{name}` must be a preallocated array, got {type(out).__name__}")
    if np.dtype(out.dtype) != np.dtype(dtype):
        raise TypeError(
            f"`{name}` must have dtype {np.dtype(dtype)}, got {np.dtype(out.dtype)}; "
            f"allocate it with np.empty(shape, dtype=np.{np.dtype(dtype).name})"
        )
    if tuple(out.shape) != tuple(shape):
        raise ValueError(f"`{name}` must have shape {tuple(shape)}, got {tuple(out.shape)}")
    if isinstance(out, np.ndarray) and not out.flags.writeable:
        raise ValueError(f"`{name}` is read-only; pass a writeable array")


def check_mask(
    mask: Any, shape: tuple[int, ...], name: str = "mask", *, writeable: bool = True
) -> None:
    """Check a boolean mask of exactly ``shape`` (an output by default; ``writeable=False``
    for a mask that is only read, e.g. the STE backward's).

    Raises
    ------
    TypeError
        When it is not a bool array.
    ValueError
        When its shape differs (or, as an output, it is read-only).
    """
    if not (isinstance(mask, np.ndarray) or is_cuda_array(mask)):
        raise TypeError(f"`{name}` must be a bool array, got {type(mask).__name__}")
    if np.dtype(mask.dtype) != np.dtype(np.bool_):
        raise TypeError(
            f"`{name}` must have dtype bool, got {np.dtype(mask.dtype)}; use `{name}.astype(bool)`"
        )
    if tuple(mask.shape) != tuple(shape):
        raise ValueError(f"`{name}` must have shape {tuple(shape)}, got {tuple(mask.shape)}")
    if writeable and isinstance(mask, np.ndarray) and not mask.flags.writeable:
        raise ValueError(f"`{name}` is read-only; pass a writeable array")
