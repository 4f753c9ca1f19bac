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
kernels, Numba device array results; a RuntimeError when CUDA is unavailable). Host array-likes
(anything with ``__array__`` or ``__dlpack__``, e.g. torch CPU tensors, for ``x``, ``scale``,
``zero_point`` and an input mask) are converted as :func:`nbqat._validate.as_array` does, without
a copy where possible, and give NumPy results; a tensor that requires grad is a TypeError that
says ``.detach()``.

The learnable (LSQ) functions live in :mod:`nbqat.quantization.lsq` and are re-exported
here; the scalar arithmetic of every kernel is :mod:`nbqat.kernels.fake_quant_formula`.

References
----------
PyTorch ``aten/src/ATen/native/quantized/FakeQuantPerTensorAffine.cpp``,
``FakeQuantPerChannelAffine.cpp``, ``cpu/kernels/QuantizedOpKernels.cpp``.
S. K. Esser et al., "Learned Step Size Quantization", ICLR 2020 (LSQ).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from nbqat import _validate as V
from nbqat._docs import CACHEMASK_IO, fill_doc
from nbqat._jit import threads_for
from nbqat.kernels import fake_quant_cpu as _k
from nbqat.quantization._fake_quant_core import (
    _F16,
    _finish,
    _flat_in,
    _flat_out,
    _gpu,
    _is_gpu,
    _per_channel,
    _per_tensor,
)
from nbqat.quantization.lsq import (
    fake_quantize_learnable_per_channel_affine,
    fake_quantize_learnable_per_channel_affine_backward,
    fake_quantize_learnable_per_tensor_affine,
    fake_quantize_learnable_per_tensor_affine_backward,
)

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

_MASK_IO = CACHEMASK_IO.format(y="array of ``x``'s shape and dtype")


# ----------------------------------------------------------------------------------------------
# per tensor
# ----------------------------------------------------------------------------------------------
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


@fill_doc(cachemask_io=_MASK_IO)
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
    {cachemask_io}
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


@fill_doc(cachemask_io=_MASK_IO)
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
    {cachemask_io}
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
        mask = V.check_mask(mask, g.shape, "mask", writeable=False)
    if out is not None:
        V.check_out(out, g.shape, g.dtype, "out")
    if _is_gpu(grad_y=g, mask=mask, out=out):
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
