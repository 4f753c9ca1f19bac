"""Fake quantization (quantize -> dequantize), its STE mask and the LSQ gradients.

Public functions carry PyTorch's names and, on float32 input, give PyTorch 2.13's exact bits
(``torch.fake_quantize_per_tensor_affine``, ``torch.fake_quantize_per_channel_affine``, their
``_cachemask`` forms, ``torch._fake_quantize_learnable_per_tensor_affine`` /
``_per_channel_affine`` and their backward). The arithmetic, in float32::

    inv  = float32(1) / float32(scale)          # reciprocal, then multiply
    r    = rint(x * inv) + zero_point           # round half to even, then add zp
    mask = (quant_min <= r) & (r <= quant_max)  # on the unclamped rounded value
    q    = fmin(fmax(r, quant_min), quant_max)  # clamp in float: NaN -> quant_min
    y    = (q - zero_point) * scale

NaN maps to ``(quant_min - zp) * scale`` with mask False, +Inf to the top of the grid and -Inf
to the bottom (mask False). nbqat uses this clamp-first arithmetic in the per-channel path too,
where PyTorch's CPU kernel casts to int64 before clamping and so gives undefined results for
NaN, Inf and huge values (pytorch#111471); for finite values in the int64 range both agree.

dtypes
------
* float32: the arithmetic above, bit-exact with PyTorch.
* float16: computed in float32 and rounded once to float16 (as PyTorch does on CPU).
* float64: the scale is narrowed to float32 (PyTorch does the same; nbqat's qparams are float32
  everywhere) and ``inv`` is its float32 reciprocal, so the rounding decisions and the mask are
  PyTorch's; ``x * inv``, the rounding and ``(q - zp) * scale`` are computed in float64. The
  output is therefore the exact multiple of the float32 scale, where PyTorch's per-tensor path
  rounds it to float32 (``0.1 -> 0.10000000149``): the two differ by at most 2**-24 relative.

Every function validates its arguments in plain Python before any compiled code runs (a
ValueError/TypeError naming the argument, nothing written into ``out`` or ``mask``), accepts any
shape (0-d and empty too), non-contiguous and negative-stride views (computed through a
contiguous copy; ``out`` is always honoured, ``out=x`` works in place), and NumPy arrays (CPU
kernels, NumPy results) or C-contiguous float32/float64 CUDA device arrays (``@cuda.jit``
kernels, Numba device array results; a RuntimeError when CUDA is unavailable).

References
----------
PyTorch ``aten/src/ATen/native/quantized/FakeQuantPerTensorAffine.cpp``,
``FakeQuantPerChannelAffine.cpp``, ``cpu/kernels/QuantizedOpKernels.cpp``.
S. K. Esser et al., "Learned Step Size Quantization", ICLR 2020 (LSQ).
"""

from __future__ import annotations

import math
from typing import Any

import numba
import numpy as np

from nbqat import _validate as V
from nbqat._jit import threads_for
from nbqat.kernels import fake_quant_cpu as _k

__all__ = [
    "fake_quantize_backward",
    "fake_quantize_learnable_per_channel_affine",
    "fake_quantize_learnable_per_channel_affine_backward",
    "fake_quantize_learnable_per_tensor_affine",
    "fake_quantize_learnable_per_tensor_affine_backward",
    "fake_quantize_per_channel_affine",
    "fake_quantize_per_channel_affine_cachemask",
    "fake_quantize_per_tensor_affine",
    "fake_quantize_per_tensor_affine_cachemask",
]

_NO_MASK = np.zeros(1, np.bool_)  # dummy mask argument when no mask is wanted
_F16 = np.dtype(np.float16)
_F32 = np.dtype(np.float32)
_F64 = np.dtype(np.float64)


# ----------------------------------------------------------------------------------------------
# helpers: dtypes, flat views, outputs
# ----------------------------------------------------------------------------------------------
def _compute_dtype(dt: np.dtype) -> np.dtype:
    """float16 and float32 compute in float32, float64 in float64."""
    return _F64 if np.dtype(dt) == _F64 else _F32


def _flat_in(x: np.ndarray, t: np.dtype) -> np.ndarray:
    """A flat C-contiguous ``t`` view of ``x`` (a copy when strided or of another dtype)."""
    if x.dtype == t and x.flags.c_contiguous:
        return x.reshape(-1)
    return np.ascontiguousarray(x, dtype=t).reshape(-1)


def _flat_out(dst: np.ndarray | None, t: np.dtype, n: int, inputs: tuple) -> np.ndarray:
    """A flat buffer the kernel may write: ``dst`` itself when it is C-contiguous of dtype
    ``t`` and is either exactly one of the flat ``inputs`` or overlaps none of them; else a
    temporary (copied into ``dst`` afterwards by :func:`_finish`)."""
    if dst is not None and dst.dtype == t and dst.flags.c_contiguous:
        d = dst.reshape(-1)
        ok = True
        for a in inputs:
            same = (
                a.__array_interface__["data"][0] == d.__array_interface__["data"][0]
                and a.dtype.itemsize == d.dtype.itemsize
            )
            if not same and np.may_share_memory(a, d):
                ok = False
        if ok:
            return d
    return np.empty(n, t)


def _finish(dst: np.ndarray | None, buf: np.ndarray, shape: tuple, dtype: np.dtype) -> np.ndarray:
    """Return the result of ``shape``/``dtype``: ``dst`` (filled from ``buf`` unless the kernel
    wrote it directly) or a new array."""
    if dst is None:
        if buf.dtype == dtype:
            return buf.reshape(shape)
        return buf.astype(dtype).reshape(shape)
    if not np.may_share_memory(buf, dst) or buf.size == 0:
        dst[...] = buf.reshape(shape)  # float32 -> float16 rounds once here
    return dst


def _check_common_float(x: Any, out: Any, mask: Any, with_mask: bool) -> Any:
    x = V.check_float_array(x, "x")
    if out is not None:
        V.check_out(out, x.shape, x.dtype, "out")
    if with_mask and mask is not None:
        V.check_mask(mask, x.shape, "mask")
    return x


def _is_gpu(*arrays: Any) -> bool:
    """True when any of ``arrays`` is a CUDA array; then all non-None ones must be."""
    flags = [V.is_cuda_array(a) for a in arrays if a is not None]
    if any(flags) and not all(flags):
        raise TypeError(
            "mixing CUDA and NumPy arrays: pass x, out, mask (and grad_y) all on the host or "
            "all on the device (cuda.to_device(a) / a.copy_to_host())"
        )
    return bool(flags) and flags[0]


def _gpu():
    """The CUDA twin module, imported only now (RuntimeError when CUDA is unavailable)."""
    from nbqat import _cuda

    _cuda.require_cuda("nbqat fake quantization")
    from nbqat.kernels import fake_quant_cuda

    return fake_quant_cuda


def _tensor_scalars(t: np.dtype, s32: np.float32, zp: float, qmin: int, qmax: int) -> tuple:
    T = t.type
    inv32 = np.float32(1.0) / s32
    return T(s32), T(inv32), T(zp), T(qmin), T(qmax)


def _channel_arrays(t: np.dtype, s32: np.ndarray, zp: np.ndarray) -> tuple:
    inv32 = np.float32(1.0) / s32
    return (
        np.ascontiguousarray(s32, dtype=t),
        np.ascontiguousarray(inv32, dtype=t),
        np.ascontiguousarray(zp, dtype=t),
    )


def _by_outer(outer: int, inner: int) -> bool:
    return inner == 1 and outer >= 2 * numba.get_num_threads()


# ----------------------------------------------------------------------------------------------
# per tensor
# ----------------------------------------------------------------------------------------------
def _per_tensor(x, scale, zero_point, quant_min, quant_max, out, mask, with_mask, zp_float=False):
    qmin, qmax = V.check_quant_range(quant_min, quant_max)
    s32 = V.check_scale(scale)
    if zp_float:
        zp = float(min(max(np.rint(V.check_float_zero_point(zero_point)), qmin), qmax))
    else:
        zp = V.check_zero_point(zero_point, qmin, qmax)
    x = _check_common_float(x, out, mask, with_mask)
    if _is_gpu(x, out, mask if with_mask else None):
        G = _gpu()
        return G.per_tensor(x, s32, zp, qmin, qmax, out, mask, with_mask)
    t = _compute_dtype(x.dtype)
    n = x.size
    xf = _flat_in(x, t)
    of = _flat_out(out, t, n, (xf,))
    mf = _flat_out(mask, np.dtype(np.bool_), n, (xf, of)) if with_mask else _NO_MASK
    if n:
        s, inv, z, lo, hi = _tensor_scalars(t, s32, zp, qmin, qmax)
        with threads_for(n):
            _k.fq_tensor_kernel(xf, of, mf, s, inv, z, lo, hi, with_mask)
    y = _finish(out, of, x.shape, x.dtype)
    if not with_mask:
        return y
    return y, _finish(mask, mf, x.shape, np.dtype(np.bool_))


def fake_quantize_per_tensor_affine(
    x: Any,
    scale: Any,
    zero_point: Any,
    quant_min: int,
    quant_max: int,
    *,
    out: Any = None,
) -> Any:
    """Fake-quantize ``x`` with one scale and zero point (quantize, then dequantize).

    Parameters
    ----------
    x : array of float16, float32 or float64, any shape
        NumPy array, or C-contiguous float32/float64 CUDA device array.
    scale : float, NumPy floating scalar or size-1 float array
        Narrowed to float32; must be finite and > 0.
    zero_point : int, NumPy integer or size-1 integer array
        Inside ``[quant_min, quant_max]``.
    quant_min, quant_max : int
        The integer grid, ``quant_min < quant_max`` (e.g. -128, 127 for int8; 0, 255 for uint8).
    out : array, optional
        Preallocated result of ``x``'s shape and dtype; ``out=x`` works in place.

    Returns
    -------
    y : array of ``x``'s shape and dtype
        ``(clamp(rint(x * inv) + zp, quant_min, quant_max) - zp) * scale`` (module docstring).

    Raises
    ------
    TypeError
        Non-float ``x`` (integer, bool, complex), non-integer ``zero_point`` or bounds, ``out``
        of the wrong dtype, mixed host/device arrays.
    ValueError
        ``scale`` <= 0, NaN or infinite; ``quant_min >= quant_max``; ``zero_point`` outside
        the range; ``out`` of the wrong shape.
    RuntimeError
        A CUDA array when CUDA is unavailable.

    Notes
    -----
    Matches ``torch.fake_quantize_per_tensor_affine`` bit for bit on float32 and float16; see
    the module docstring for float64.
    """
    return _per_tensor(x, scale, zero_point, quant_min, quant_max, out, None, False)


def fake_quantize_per_tensor_affine_cachemask(
    x: Any,
    scale: Any,
    zero_point: Any,
    quant_min: int,
    quant_max: int,
    *,
    out: Any = None,
    mask: Any = None,
) -> tuple[Any, Any]:
    """Per-tensor fake quantization that also returns the straight-through-estimator mask.

    Parameters
    ----------
    x, scale, zero_point, quant_min, quant_max, out
        As :func:`fake_quantize_per_tensor_affine`.
    mask : bool array of ``x``'s shape, optional
        Preallocated mask output.

    Returns
    -------
    y : array of ``x``'s shape and dtype
    mask : bool array of ``x``'s shape
        True exactly where the rounded, unclamped value ``rint(x * inv) + zp`` lies in
        ``[quant_min, quant_max]`` (False for NaN and +-Inf). Feed it to
        :func:`fake_quantize_backward`.

    Raises
    ------
    TypeError, ValueError, RuntimeError
        As :func:`fake_quantize_per_tensor_affine`; also for a ``mask`` of the wrong dtype or
        shape.

    Notes
    -----
    Matches ``torch.fake_quantize_per_tensor_affine_cachemask`` (an ATen op) bit for bit on
    float32 and float16.
    """
    return _per_tensor(x, scale, zero_point, quant_min, quant_max, out, mask, True)


# ----------------------------------------------------------------------------------------------
# per channel
# ----------------------------------------------------------------------------------------------
def _per_channel(
    x, scale, zero_point, axis, quant_min, quant_max, out, mask, with_mask, zp_float=False
):
    qmin, qmax = V.check_quant_range(quant_min, quant_max)
    x = V.check_float_array(x, "x")
    ax = V.normalize_axis(axis, x.ndim)
    outer, C, inner = V.split_axis(tuple(x.shape), ax)
    s32, zp = V.check_channel_qparams(scale, zero_point, C, qmin, qmax, float_zero_point=zp_float)
    if zp_float:  # learnable zero point: round half to even, clamp (torch's round().clamp_())
        zp = np.clip(np.rint(zp), qmin, qmax).astype(np.int32)
    x = _check_common_float(x, out, mask, with_mask)
    if _is_gpu(x, out, mask if with_mask else None):
        G = _gpu()
        return G.per_channel(x, s32, zp, outer, C, inner, qmin, qmax, out, mask, with_mask)
    t = _compute_dtype(x.dtype)
    n = x.size
    xf = _flat_in(x, t)
    of = _flat_out(out, t, n, (xf,))
    mf = _flat_out(mask, np.dtype(np.bool_), n, (xf, of)) if with_mask else _NO_MASK
    if n:
        s, inv, z = _channel_arrays(t, s32, zp)
        T = t.type
        with threads_for(n):
            _k.fq_channel_kernel(
                xf,
                of,
                mf,
                s,
                inv,
                z,
                outer,
                C,
                inner,
                T(qmin),
                T(qmax),
                with_mask,
                _by_outer(outer, inner),
            )
    y = _finish(out, of, x.shape, x.dtype)
    if not with_mask:
        return y
    return y, _finish(mask, mf, x.shape, np.dtype(np.bool_))


def fake_quantize_per_channel_affine(
    x: Any,
    scale: Any,
    zero_point: Any,
    axis: int,
    quant_min: int,
    quant_max: int,
    *,
    out: Any = None,
) -> Any:
    """Fake-quantize ``x`` with one scale and zero point per slice along ``axis``.

    Parameters
    ----------
    x : array of float16, float32 or float64, at least 1-D
        NumPy array, or C-contiguous float32/float64 CUDA device array.
    scale : float array of shape (C,), C = x.shape[axis]
        Narrowed to float32; every element finite and > 0. Host or device array.
    zero_point : integer array of shape (C,) (int32 like torch; integral floats accepted)
        Every element inside ``[quant_min, quant_max]``. Host or device array.
    axis : int
        The channel axis, negative values counted from the end (torch rejects them).
    quant_min, quant_max : int
        The integer grid, ``quant_min < quant_max``.
    out : array, optional
        Preallocated result of ``x``'s shape and dtype; ``out=x`` works in place.

    Returns
    -------
    y : array of ``x``'s shape and dtype
        Channel ``c`` uses ``scale[c]``, ``zero_point[c]`` with the per-tensor arithmetic.

    Raises
    ------
    TypeError
        Non-float ``x``, non-integer ``zero_point``, wrong ``out`` dtype, mixed host/device.
    ValueError
        ``axis`` out of range (or a 0-d ``x``); ``scale``/``zero_point`` lengths != C;
        a scale <= 0, NaN or infinite; a zero point outside the range;
        ``quant_min >= quant_max``; ``out`` of the wrong shape.
    RuntimeError
        A CUDA array when CUDA is unavailable.

    Notes
    -----
    Matches ``torch.fake_quantize_per_channel_affine`` bit for bit on finite float32 and float16
    input. For NaN, +-Inf and values whose rounded quotient overflows int64, PyTorch's CPU
    kernel casts to int64 before clamping (undefined behaviour, pytorch#111471, e.g. +Inf -> 0);
    nbqat clamps in float first, exactly like the per-tensor path (+Inf -> top of the grid).
    """
    return _per_channel(x, scale, zero_point, axis, quant_min, quant_max, out, None, False)


def fake_quantize_per_channel_affine_cachemask(
    x: Any,
    scale: Any,
    zero_point: Any,
    axis: int,
    quant_min: int,
    quant_max: int,
    *,
    out: Any = None,
    mask: Any = None,
) -> tuple[Any, Any]:
    """Per-channel fake quantization that also returns the STE mask.

    Parameters
    ----------
    x, scale, zero_point, axis, quant_min, quant_max, out
        As :func:`fake_quantize_per_channel_affine`.
    mask : bool array of ``x``'s shape, optional
        Preallocated mask output.

    Returns
    -------
    y : array of ``x``'s shape and dtype
    mask : bool array of ``x``'s shape
        True exactly where ``rint(x * inv[c]) + zp[c]`` lies in ``[quant_min, quant_max]``.

    Raises
    ------
    TypeError, ValueError, RuntimeError
        As :func:`fake_quantize_per_channel_affine`; also for a bad ``mask``.

    Notes
    -----
    Matches ``torch.fake_quantize_per_channel_affine_cachemask`` on finite float32 input.
    """
    return _per_channel(x, scale, zero_point, axis, quant_min, quant_max, out, mask, True)


# ----------------------------------------------------------------------------------------------
# STE backward
# ----------------------------------------------------------------------------------------------
def fake_quantize_backward(grad_y: Any, mask: Any, *, out: Any = None) -> Any:
    """Straight-through-estimator backward of fake quantization: ``grad_x = grad_y * mask``.

    Parameters
    ----------
    grad_y : float16/float32/float64 array, any shape
        Gradient of the loss with respect to the fake-quantized output.
    mask : bool array of ``grad_y``'s shape, or None
        The mask returned by a ``*_cachemask`` function. None means "no fake quantization"
        (the identity): ``grad_y`` is copied.
    out : array, optional
        Preallocated result of ``grad_y``'s shape and dtype (``out=grad_y`` works in place).

    Returns
    -------
    grad_x : array of ``grad_y``'s shape and dtype
        ``grad_y`` where the mask is True, ``grad_y * 0`` (+-0, or NaN for NaN gradients, as
        torch's multiply) where it is False.

    Raises
    ------
    TypeError
        Non-float ``grad_y``, non-bool ``mask``, wrong ``out`` dtype, mixed host/device.
    ValueError
        ``mask`` or ``out`` of a shape other than ``grad_y``'s.
    RuntimeError
        A CUDA array when CUDA is unavailable.

    Notes
    -----
    The backward of ``torch.fake_quantize_per_tensor_affine`` / ``_per_channel_affine``
    (``FakeQuantPerTensorAffine.cpp``: ``dY * mask``).
    """
    g = V.check_float_array(grad_y, "grad_y")
    if mask is not None:
        V.check_mask(mask, g.shape, "mask", writeable=False)
    if out is not None:
        V.check_out(out, g.shape, g.dtype, "out")
    if _is_gpu(g, mask, out):
        G = _gpu()
        return G.ste_backward(g, mask, out)
    if mask is None:
        if out is None:
            return g.copy()
        if out is not g:
            out[...] = g
        return out
    if g.dtype == _F16:  # exact in float16: g * 1 or g * 0
        with np.errstate(invalid="ignore"):
            return np.multiply(g, mask, out=out) if out is not None else np.multiply(g, mask)
    t = g.dtype
    n = g.size
    gf = _flat_in(g, t)
    mf = _flat_in(mask, np.dtype(np.bool_))
    of = _flat_out(out, t, n, (gf, mf))
    if n:
        with threads_for(n):
            if of.__array_interface__["data"][0] == gf.__array_interface__["data"][0]:
                _k.ste_backward_inplace_kernel(of, mf)  # out=grad_y: in place
            else:
                _k.ste_backward_kernel(gf, mf, of)
    return _finish(out, of, g.shape, g.dtype)


# ----------------------------------------------------------------------------------------------
# LSQ: learnable scale and zero point
# ----------------------------------------------------------------------------------------------
def _check_grad_factor(grad_factor: Any) -> float:
    if isinstance(grad_factor, (bool, np.bool_)) or not isinstance(
        grad_factor, (int, float, np.integer, np.floating)
    ):
        raise TypeError(f"`grad_factor` must be a real number, got {type(grad_factor).__name__}")
    g = float(grad_factor)
    if not math.isfinite(g):
        raise ValueError(f"`grad_factor` must be finite, got {g}")
    return g


def fake_quantize_learnable_per_tensor_affine(
    x: Any,
    scale: Any,
    zero_point: Any,
    quant_min: int,
    quant_max: int,
    grad_factor: float = 1.0,
) -> Any:
    """Forward of learnable (LSQ) per-tensor fake quantization.

    Parameters
    ----------
    x : float16/float32/float64 array (NumPy or CUDA), any shape
    scale : float or size-1 float array (the learnable scale, e.g. float32 (1,))
        Narrowed to float32; finite and > 0.
    zero_point : float or size-1 float array (the learnable zero point)
        The zero point used is ``clamp(rint(zero_point), quant_min, quant_max)``.
    quant_min, quant_max : int
    grad_factor : float, default 1.0
        Unused by the forward (kept for torch's signature); see the backward.

    Returns
    -------
    y : array of ``x``'s shape and dtype
        :func:`fake_quantize_per_tensor_affine` with the rounded zero point.

    Raises
    ------
    TypeError, ValueError, RuntimeError
        As :func:`fake_quantize_per_tensor_affine`; also a NaN/Inf zero point.

    Notes
    -----
    Matches ``torch._fake_quantize_learnable_per_tensor_affine``.
    """
    _check_grad_factor(grad_factor)
    return _per_tensor(x, scale, zero_point, quant_min, quant_max, None, None, False, True)


def fake_quantize_learnable_per_tensor_affine_backward(
    grad_y: Any,
    x: Any,
    scale: Any,
    zero_point: Any,
    quant_min: int,
    quant_max: int,
    grad_factor: float = 1.0,
) -> tuple[Any, Any, Any]:
    """Backward of learnable (LSQ) per-tensor fake quantization.

    With ``s`` the float32 scale, ``inv = 1/s`` (float32), ``z`` the rounded, clamped zero
    point, ``g = grad_factor`` and ``xq = rint(x * inv) + z`` per element::

        grad_x = grad_y * (quant_min <= xq <= quant_max)
        xq < quant_min (or NaN): dS = grad_y * (quant_min - z) * g ; dZ = -grad_y * s * g
        xq > quant_max:          dS = grad_y * (quant_max - z) * g ; dZ = -grad_y * s * g
        otherwise:               dS = grad_y * ((xq - z) * s - x) * inv * g ; dZ = 0

    ``grad_scale`` and ``grad_zero_point`` are the sums of dS and dZ over all elements.

    Parameters
    ----------
    grad_y : float array of ``x``'s shape and dtype
    x : float16/float32/float64 array (NumPy or CUDA), the forward's input
    scale, zero_point, quant_min, quant_max
        As :func:`fake_quantize_learnable_per_tensor_affine`.
    grad_factor : float, default 1.0
        LSQ gradient scale (torch's module uses ``1 / sqrt(x.numel() * quant_max)``).

    Returns
    -------
    grad_x : array of ``x``'s shape and dtype
    grad_scale : float32 array of shape (1,)
    grad_zero_point : float32 array of shape (1,)
        NumPy arrays for NumPy input, device arrays for CUDA input. Zeros for an empty ``x``.

    Raises
    ------
    TypeError, ValueError, RuntimeError
        As the forward; also ``grad_y`` of another shape or dtype than ``x``.

    Notes
    -----
    Per-element terms equal ``torch._fake_quantize_learnable_per_tensor_affine_backward``'s
    (``QuantizedOpKernels.cpp``) bit for bit on float32, with two documented differences:
    torch's CPU backward rounds ``rint(z + x*inv)`` (adding first) and rounds the zero point as
    ``trunc(zp + 0.5)``; nbqat uses the forward's rules (``rint(x*inv) + z``, ``rint(zp)``) so
    the backward is the derivative of the forward actually computed. Sums are accumulated in
    float64 (deterministic fixed-order chunks) and rounded to float32 once, where torch sums in
    float32; they agree to float32 rounding of the sum.
    """
    gf = _check_grad_factor(grad_factor)
    qmin, qmax = V.check_quant_range(quant_min, quant_max)
    s32 = V.check_scale(scale)
    zp = float(min(max(np.rint(V.check_float_zero_point(zero_point)), qmin), qmax))
    x = V.check_float_array(x, "x")
    g = V.check_float_array(grad_y, "grad_y")
    V.check_same_shape(x, g, "x", "grad_y")
    if np.dtype(g.dtype) != np.dtype(x.dtype):
        raise TypeError(
            f"`grad_y` must have x's dtype {x.dtype}, got {g.dtype}; use grad_y.astype(x.dtype)"
        )
    if _is_gpu(x, g):
        G = _gpu()
        return G.lsq_tensor_backward(g, x, s32, zp, qmin, qmax, gf)
    t = _compute_dtype(x.dtype)
    n = x.size
    xf = _flat_in(x, t)
    gfl = _flat_in(g, t)
    gx = np.empty(n, t)
    ds = dz = 0.0
    if n:
        s, inv, z, lo, hi = _tensor_scalars(t, s32, zp, qmin, qmax)
        with threads_for(n):
            ds, dz = _k.lsq_tensor_backward_kernel(xf, gfl, gx, s, inv, z, lo, hi, t.type(gf))
    grad_x = gx.reshape(x.shape).astype(x.dtype, copy=False)
    return grad_x, np.array([ds], np.float32), np.array([dz], np.float32)


def fake_quantize_learnable_per_channel_affine(
    x: Any,
    scale: Any,
    zero_point: Any,
    axis: int,
    quant_min: int,
    quant_max: int,
    grad_factor: float = 1.0,
) -> Any:
    """Forward of learnable (LSQ) per-channel fake quantization.

    Parameters
    ----------
    x : float16/float32/float64 array (NumPy or CUDA), at least 1-D
    scale : float array (C,), C = x.shape[axis]; narrowed to float32, finite and > 0
    zero_point : float (or int) array (C,)
        The zero points used are ``clamp(rint(zero_point), quant_min, quant_max)`` (torch's
        ``round().clamp_()``, half to even).
    axis : int (negative accepted)
    quant_min, quant_max : int
    grad_factor : float, default 1.0
        Unused by the forward (torch's signature).

    Returns
    -------
    y : array of ``x``'s shape and dtype

    Raises
    ------
    TypeError, ValueError, RuntimeError
        As :func:`fake_quantize_per_channel_affine`; also non-finite zero points.

    Notes
    -----
    Matches ``torch._fake_quantize_learnable_per_channel_affine``.
    """
    _check_grad_factor(grad_factor)
    return _per_channel(
        x, scale, zero_point, axis, quant_min, quant_max, None, None, False, zp_float=True
    )


def fake_quantize_learnable_per_channel_affine_backward(
    grad_y: Any,
    x: Any,
    scale: Any,
    zero_point: Any,
    axis: int,
    quant_min: int,
    quant_max: int,
    grad_factor: float = 1.0,
) -> tuple[Any, Any, Any]:
    """Backward of learnable (LSQ) per-channel fake quantization.

    The per-element rule of :func:`fake_quantize_learnable_per_tensor_affine_backward` with the
    scale and zero point of each element's channel; ``grad_scale[c]`` and
    ``grad_zero_point[c]`` sum over all axes but ``axis``.

    Parameters
    ----------
    grad_y : float array of ``x``'s shape and dtype
    x, scale, zero_point, axis, quant_min, quant_max
        As :func:`fake_quantize_learnable_per_channel_affine`.
    grad_factor : float, default 1.0

    Returns
    -------
    grad_x : array of ``x``'s shape and dtype
    grad_scale : float32 array (C,)
    grad_zero_point : float32 array (C,)

    Raises
    ------
    TypeError, ValueError, RuntimeError
        As the forward; also ``grad_y`` of another shape or dtype than ``x``.

    Notes
    -----
    Per-element terms match ``torch._fake_quantize_learnable_per_channel_affine_backward``
    bit for bit on float32 except that torch rounds ``rint(z + x*inv)`` (adding first) where
    nbqat uses the forward's ``rint(x*inv) + z``. Sums are float64, deterministic (fixed
    chunks merged in order, independent of the thread count), rounded to float32 once.
    """
    gf = _check_grad_factor(grad_factor)
    qmin, qmax = V.check_quant_range(quant_min, quant_max)
    x = V.check_float_array(x, "x")
    g = V.check_float_array(grad_y, "grad_y")
    V.check_same_shape(x, g, "x", "grad_y")
    if np.dtype(g.dtype) != np.dtype(x.dtype):
        raise TypeError(
            f"`grad_y` must have x's dtype {x.dtype}, got {g.dtype}; use grad_y.astype(x.dtype)"
        )
    ax = V.normalize_axis(axis, x.ndim)
    outer, C, inner = V.split_axis(tuple(x.shape), ax)
    s32, zpf = V.check_channel_qparams(scale, zero_point, C, qmin, qmax, float_zero_point=True)
    zp = np.clip(np.rint(zpf), qmin, qmax).astype(np.int32)
    if _is_gpu(x, g):
        G = _gpu()
        return G.lsq_channel_backward(g, x, s32, zp, outer, C, inner, qmin, qmax, gf)
    t = _compute_dtype(x.dtype)
    n = x.size
    xf = _flat_in(x, t)
    gfl = _flat_in(g, t)
    gx = np.empty(n, t)
    if n:
        s, inv, z = _channel_arrays(t, s32, zp)
        T = t.type
        rows = max(64, -(-outer // 64)) if (inner < 16 and outer >= 256) else 0
        with threads_for(n):
            res = _k.lsq_channel_backward_kernel(
                xf, gfl, gx, s, inv, z, outer, C, inner, T(qmin), T(qmax), T(gf), rows
            )
    else:
        res = np.zeros((C, 2))
    grad_x = gx.reshape(x.shape).astype(x.dtype, copy=False)
    return grad_x, res[:, 0].astype(np.float32), res[:, 1].astype(np.float32)
