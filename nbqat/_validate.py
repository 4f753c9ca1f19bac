"""Argument checks shared by nbqat's public functions, in plain Python.

Every public function validates its arguments with these helpers *before* any compiled code
runs, so bad input raises a clear :class:`ValueError` / :class:`TypeError` that names the
argument and the fix, and nothing is written into caller buffers. Kernels assume clean input.

The helpers accept NumPy arrays, CUDA device arrays (:func:`nbqat._cuda.is_cuda_array`, the one
"is this a CUDA array" predicate, re-exported here) and host array-likes, converted the same way
everywhere by :func:`as_array`: objects with ``__array__`` (``np.asarray``, no copy where
possible) or only ``__dlpack__`` (``np.from_dlpack``), such as torch CPU tensors; a tensor that
requires grad is a TypeError that says ``.detach()``. They never copy data between host and
device, except :func:`host_vector`, which brings a small per-channel parameter vector to the
host. Exceptions: TypeError for a wrong type or dtype, ValueError for a wrong value or shape.

Helpers (general, for every nbqat module):

* :func:`check_float_array` -- a float16/float32/float64 array (TypeError with an
  ``.astype(np.float32)`` hint otherwise).
* :func:`check_same_shape` -- two arrays of the same shape.
* :func:`check_same_dtype`, :func:`check_same_device`, :func:`check_device_contiguous`.
* :func:`check_int` / :func:`check_positive_finite` / :func:`check_finite_real` -- scalars.
* :func:`normalize_axis` -- an axis in ``[-ndim, ndim)`` to ``[0, ndim)``.
* :func:`check_out`, :func:`check_mask` -- preallocated outputs.
* :func:`split_axis` -- the ``(outer, C, inner)`` factorisation of a shape around an axis.
* :func:`first_shared_pair` -- two NumPy arrays of a list that share an element.

Two sibling modules hold the checks of one domain each, built on these:
:mod:`nbqat.quantization._validate_qparams` (quantization range, scales, zero points) and
:mod:`nbqat.quantization._validate_state` (quantizer construction and state dicts); their names are
reachable from this module as well (``_validate.check_scale``), imported on first use.
"""

from __future__ import annotations

import math
import numbers
from typing import Any

import numpy as np
from numpy.lib.array_utils import byte_bounds

from nbqat._cuda import device_span, is_cuda_array

#: Floating dtypes nbqat's kernels accept.
FLOAT_DTYPES = (np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64))

#: Largest magnitude of a quantization bound: every integer of the grid is exact in float32,
#: which nbqat's float arithmetic (and its bit-exactness with PyTorch) relies on.
QUANT_BOUND = 2**24

__all__ = [
    "QUANT_BOUND",
    "FLOAT_DTYPES",
    "as_array",
    "check_float_array",
    "check_finite_real",
    "check_int",
    "check_mask",
    "check_out",
    "check_positive_finite",
    "check_positive_int_fields",
    "check_quantiles",
    "check_device_contiguous",
    "check_same_device",
    "check_same_dtype",
    "check_same_shape",
    "host_vector",
    "is_cuda_array",
    "normalize_axis",
    "split_axis",
]


def as_array(x: Any, name: str) -> Any:
    """Return ``x`` unchanged if it is a NumPy or CUDA array, else as a NumPy array.

    Parameters
    ----------
    x : array_like or CUDA array
        Anything with ``__array__`` (lists, scalars, torch CPU tensors: ``np.asarray``, no copy
        where possible) or only ``__dlpack__`` (``np.from_dlpack``, no copy); an ``np.matrix``
        as its plain ndarray view.
    name : str
        The argument name used in error messages.

    Returns
    -------
    numpy.ndarray or CUDA array

    Raises
    ------
    TypeError
        When ``x`` is None, a tensor that requires grad (pass ``x.detach()``), or cannot be
        converted to an array.
    """
    if isinstance(x, np.ndarray):
        # np.matrix stays 2-D under reshape(-1) and indexing: its plain ndarray view
        return x.view(np.ndarray) if isinstance(x, np.matrix) else x
    if x is None:
        raise TypeError(f"`{name}` must be an array, got None")
    if getattr(x, "requires_grad", False) is True:
        raise TypeError(
            f"`{name}` is a tensor that requires grad; nbqat computes its own gradients: pass "
            f"`{name}.detach()`"
        )
    if is_cuda_array(x):
        return x
    try:
        if not hasattr(x, "__array__") and hasattr(x, "__dlpack__"):
            return np.from_dlpack(x)
        return np.asarray(x)
    except Exception as exc:
        raise TypeError(
            f"`{name}` must be an array (NumPy, CUDA, or anything with __array__ or "
            f"__dlpack__), got {type(x).__name__}: {exc}"
        ) from exc


def _host_scalar_or_array(v: Any, name: str) -> Any:
    """``v`` itself when it is a Python / NumPy scalar, else the host array of
    :func:`as_array` (CUDA arrays copied to the host: parameters are small)."""
    if isinstance(v, (numbers.Number, np.generic, np.ndarray)):
        return v
    v = as_array(v, name)
    if is_cuda_array(v):
        v = v.copy_to_host() if hasattr(v, "copy_to_host") else np.asarray(v)
    return v


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


def check_positive_int_fields(obj: Any, names: tuple[str, ...]) -> None:
    """Check that each field ``names`` of the dataclass ``obj`` is a positive int (not a bool)
    and store it as a Python ``int`` (``object.__setattr__``: frozen dataclasses too).

    Raises
    ------
    ValueError
        Naming ``<class>.<field>`` and the value.
    """
    for name in names:
        v = getattr(obj, name)
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
            raise ValueError(f"{type(obj).__name__}.{name} must be a positive int, got {v!r}")
        object.__setattr__(obj, name, int(v))


def check_quantiles(obj: Any) -> None:
    """Check that ``obj.quantiles`` are strictly increasing values in (0, 1) and store them as a
    tuple of floats (``object.__setattr__``: frozen dataclasses too).

    Raises
    ------
    ValueError
        Naming ``<class>.quantiles`` and the values.
    """
    q = tuple(float(x) for x in obj.quantiles)
    if not q or any(not 0.0 < x < 1.0 for x in q) or any(a >= b for a, b in zip(q, q[1:])):
        raise ValueError(
            f"{type(obj).__name__}.quantiles must be strictly increasing values in (0, 1), got {q}"
        )
    object.__setattr__(obj, "quantiles", q)


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


def host_vector(v: Any, name: str) -> np.ndarray:
    """Return a per-channel parameter vector as a 1-D NumPy array (device arrays are copied)."""
    v = _host_scalar_or_array(v, name)
    if not isinstance(v, np.ndarray):
        v = np.asarray(v)
    if v.ndim != 1:
        raise ValueError(f"`{name}` must be a 1-D array of length C, got shape {v.shape}")
    return v


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


def first_shared_pair(arrays: list) -> tuple[int, int] | None:
    """The first pair ``(i, j)``, ``i < j``, of NumPy arrays that share an element, or None.

    A sweep over their byte ranges sorted by start: ``np.shares_memory`` (exact) only where two
    ranges intersect, so views of one flat buffer (adjacent ranges) cost a sort and interleaved
    views (intersecting ranges, no shared element) pass.
    """
    spans = sorted((*byte_bounds(a), i) for i, a in enumerate(arrays) if a.size)
    for k, (_, hi, i) in enumerate(spans):
        for lo2, _, j in spans[k + 1 :]:
            if lo2 >= hi:
                break
            if np.shares_memory(arrays[i], arrays[j]):
                return (min(i, j), max(i, j))
    return None


def partial_overlap(a: Any, b: Any, cuda: bool) -> bool:
    """Whether two contiguous 1-D arrays of one size (NumPy, or CUDA when ``cuda``) share
    memory without being the same elements (for contiguous arrays, intersecting byte ranges)."""
    (lo, hi), (lo2, hi2) = (
        (device_span(x) for x in (a, b)) if cuda else (byte_bounds(x) for x in (a, b))
    )
    return lo != lo2 and lo < hi2 and lo2 < hi


def writeable(a: np.ndarray) -> bool:
    """Whether ``a`` and every array it views are writeable (a view made before its base was
    set read-only keeps its own flag)."""
    x: Any = a
    while isinstance(x, np.ndarray):
        if not x.flags.writeable:
            return False
        x = x.base
    return True


def check_out(
    out: Any, shape: tuple[int, ...], dtype: Any, name: str = "out", contiguous: bool = False
) -> None:
    """Check a preallocated output: an array of exactly ``shape`` and ``dtype``.

    ``contiguous=True`` also requires a C-contiguous array (a compiled pass that writes it
    through a flat or reshaped view would otherwise write a copy, leaving ``out`` unwritten).

    Raises
    ------
    TypeError
        When it is not an array or has the wrong dtype.
    ValueError
        When its shape differs, it is a read-only NumPy array, or (``contiguous``) it is not
        C-contiguous.
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
    if contiguous and not out.flags.c_contiguous:
        raise ValueError(f"`{name}` must be C-contiguous; pass np.empty(shape, dtype)")


def check_mask(
    mask: Any, shape: tuple[int, ...], name: str = "mask", *, writeable: bool = True
) -> Any:
    """Check a boolean mask of exactly ``shape`` (an output by default; ``writeable=False``
    for a mask that is only read, e.g. the STE backward's, which may also be an array-like:
    see :func:`as_array`).

    Returns
    -------
    numpy.ndarray or CUDA array
        ``mask`` (an input array-like converted by :func:`as_array`).

    Raises
    ------
    TypeError
        When it is not a bool array.
    ValueError
        When its shape differs (or, as an output, it is read-only).
    """
    if not writeable:
        mask = as_array(mask, name)
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
    return mask


def check_same_device(arrays: dict[str, Any]) -> bool:
    """Whether the arrays (name -> array; None entries skipped) are on the device; TypeError
    when some are CUDA arrays and others are not.

    Raises
    ------
    TypeError
        Host and device arrays mixed (the message names them and how to move them).
    """
    where = {k: is_cuda_array(a) for k, a in arrays.items() if a is not None}
    if any(where.values()) and not all(where.values()):
        names = ", ".join(where)
        raise TypeError(
            f"mixing CUDA and NumPy arrays: pass {names} all on the host or all on the device "
            "(cuda.to_device(a) / a.copy_to_host())"
        )
    return any(where.values())


def check_device_contiguous(d: Any, name: str) -> None:
    """Raise ValueError unless the Numba device array ``d`` is C-contiguous (or empty)."""
    if d.size and not d.is_c_contiguous():
        raise ValueError(
            f"`{name}` must be a C-contiguous CUDA array (strided device arrays are not "
            "supported); make a contiguous copy first"
        )


#: The sibling modules whose checks are reachable here too (``V.check_scale``): imported on
#: first use (they import this module, so not at import time).
_SIBLINGS = ("nbqat.quantization._validate_qparams", "nbqat.quantization._validate_state")


def __getattr__(name: str) -> Any:
    import importlib

    for module in _SIBLINGS:
        mod = importlib.import_module(module)
        if name in mod.__all__:
            return getattr(mod, name)
    raise AttributeError(f"module 'nbqat._validate' has no attribute {name!r}")
