"""Learnable (LSQ) fake quantization: forward and backward with a trainable scale and zero
point (torch's ``_fake_quantize_learnable_per_{tensor,channel}_affine`` and their backward).

Re-exported by :mod:`nbqat.quantization.fake_quant` and ``nbqat``; the arithmetic and the dtype,
layout and
device rules are those of :mod:`nbqat.quantization.fake_quant` (module docstring there), the
per-element
gradient is :func:`nbqat.kernels.fake_quant_formula.lsq_terms`.

References
----------
S. K. Esser et al., "Learned Step Size Quantization", ICLR 2020 (LSQ).
PyTorch ``aten/src/ATen/native/quantized/cpu/kernels/QuantizedOpKernels.cpp``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from nbqat import _validate as V
from nbqat._jit import threads_for
from nbqat.kernels import fake_quant_cpu as _k
from nbqat.quantization import _validate_qparams as VQ
from nbqat.quantization._fake_quant_core import (
    _channel_arrays,
    _compute_dtype,
    _flat_in,
    _gpu,
    _is_gpu,
    _per_channel,
    _per_tensor,
    _tensor_scalars,
)

__all__ = [
    "fake_quantize_learnable_per_channel_affine",
    "fake_quantize_learnable_per_channel_affine_backward",
    "fake_quantize_learnable_per_tensor_affine",
    "fake_quantize_learnable_per_tensor_affine_backward",
]


# ----------------------------------------------------------------------------------------------
# LSQ: learnable scale and zero point
# ----------------------------------------------------------------------------------------------
def _check_backward(grad_y: Any, x: Any, grad_factor: Any, quant_min: Any, quant_max: Any):
    """The backward functions' shared checks: ``(grad_y, x, grad_factor, qmin, qmax)``."""
    gf = V.check_finite_real(grad_factor, "grad_factor")
    qmin, qmax = VQ.check_quant_range(quant_min, quant_max)
    x = V.check_float_array(x, "x")
    g = V.check_float_array(grad_y, "grad_y")
    V.check_same_shape(x, g, "x", "grad_y")
    V.check_same_dtype(x, g, "x", "grad_y")
    return g, x, gf, qmin, qmax


def _host_backward(g: Any, x: Any, sums: Any, empty: Any) -> tuple[np.ndarray, Any]:
    """The host side of an LSQ backward: flat compute-dtype views of ``x`` and ``grad_y``, a
    new ``grad_x`` buffer, ``sums(xf, gf, gx, t)`` (the kernel: it fills ``gx`` and returns the
    scale / zero-point sums) run on the kernel threads when ``x`` is not empty (``empty``
    otherwise); returns ``grad_x`` in ``x``'s shape and dtype and the sums."""
    t = _compute_dtype(x.dtype)
    n = x.size
    gx = np.empty(n, t)
    res = empty
    if n:
        xf, gfl = _flat_in(x, t), _flat_in(g, t)
        with threads_for(n):
            res = sums(xf, gfl, gx, t)
    return gx.reshape(x.shape).astype(x.dtype, copy=False), res


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
    V.check_finite_real(grad_factor, "grad_factor")
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
    g, x, gf, qmin, qmax = _check_backward(grad_y, x, grad_factor, quant_min, quant_max)
    s32 = VQ.check_scale(scale)
    zp = float(min(max(np.rint(VQ.check_float_zero_point(zero_point)), qmin), qmax))
    if _is_gpu(x=x, grad_y=g):
        return _gpu().lsq_tensor_backward(g, x, s32, zp, qmin, qmax, gf)

    def sums(xf, gfl, gx, t):
        s, inv, z, lo, hi = _tensor_scalars(t, s32, zp, qmin, qmax)
        return _k.lsq_tensor_backward_kernel(xf, gfl, gx, s, inv, z, lo, hi, t.type(gf))

    grad_x, (ds, dz) = _host_backward(g, x, sums, (0.0, 0.0))
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
    V.check_finite_real(grad_factor, "grad_factor")
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
    g, x, gf, qmin, qmax = _check_backward(grad_y, x, grad_factor, quant_min, quant_max)
    ax = V.normalize_axis(axis, x.ndim)
    outer, C, inner = V.split_axis(tuple(x.shape), ax)
    s32, zpf = VQ.check_channel_qparams(scale, zero_point, C, qmin, qmax, float_zero_point=True)
    zp = np.clip(np.rint(zpf), qmin, qmax).astype(np.int32)
    if _is_gpu(x=x, grad_y=g):
        return _gpu().lsq_channel_backward(g, x, s32, zp, outer, C, inner, qmin, qmax, gf)
    rows = max(64, -(-outer // 64)) if (inner < 16 and outer >= 256) else 0

    def sums(xf, gfl, gx, t):
        s, inv, z = _channel_arrays(t, s32, zp)
        T = t.type
        return _k.lsq_channel_backward_kernel(
            xf, gfl, gx, s, inv, z, outer, C, inner, T(qmin), T(qmax), T(gf), rows
        )

    grad_x, res = _host_backward(g, x, sums, np.zeros((C, 2)))
    return grad_x, res[:, 0].astype(np.float32), res[:, 1].astype(np.float32)
