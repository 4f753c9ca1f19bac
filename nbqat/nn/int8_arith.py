"""The integer arithmetic of the int8 reference engine: PyTorch's per-tensor / per-channel
quantization codes, the exact accumulator type and the integer linear layer :func:`qlinear`
(the engine's formulas are in :mod:`nbqat.nn.int8`'s docstring; importable from there)."""

from __future__ import annotations

import numpy as np

from nbqat.kernels.int8_cpu import (
    qlinear_kernel,
    quantize_per_row_kernel,
    quantize_per_tensor_kernel,
)

__all__ = ["accumulator_dtype", "qlinear", "quantize_per_channel", "quantize_per_tensor"]


def _code_dtype(qmin: int, qmax: int) -> np.dtype:
    for dt in (np.int8, np.uint8, np.int16, np.uint16):
        info = np.iinfo(dt)
        if info.min <= qmin and qmax <= info.max:
            return np.dtype(dt)
    return np.dtype(np.int32)


_INT32_MAX = int(np.iinfo(np.int32).max)
_INT64_MAX = int(np.iinfo(np.int64).max)


def accumulator_dtype(in_features: int, x_span: int, w_span: int) -> np.dtype:
    """The integer type in which ``sum_k (x_q - zp_x) * (w_q - zp_w)`` is exact.

    Parameters
    ----------
    in_features : int
        K, the number of products summed.
    x_span : int
        Largest ``|x_q - zp_x|`` an activation code can have (from its quant range).
    w_span : int
        Largest ``|w_q - zp_w|`` over the weight codes.

    Returns
    -------
    numpy.dtype
        ``int32`` when ``K * x_span * w_span <= 2**31 - 1`` (every partial sum fits), else
        ``int64``.

    Raises
    ------
    ValueError
        When even an int64 sum could overflow (``K * x_span * w_span >= 2**63``).
    """
    bound = int(in_features) * int(x_span) * int(w_span)
    if bound <= _INT32_MAX:
        return np.dtype(np.int32)
    if bound <= _INT64_MAX:
        return np.dtype(np.int64)
    raise ValueError(
        f"in_features={in_features} with activation codes up to {x_span} and weight codes up "
        f"to {w_span} from their zero points could overflow even an int64 accumulator "
        f"(bound {bound}); use narrower quant ranges or split the layer"
    )


def quantize_per_tensor(
    x: np.ndarray, scale: float | np.floating, zero_point: int, quant_min: int, quant_max: int
) -> np.ndarray:
    """Integer codes of ``x`` with PyTorch's per-tensor fake-quantize arithmetic.

    Parameters
    ----------
    x : ndarray, float
        Any shape; computed in float32.
    scale : float
        > 0 (used as ``float32(1) / float32(scale)``).
    zero_point : int
        Code of the real value 0.
    quant_min, quant_max : int
        The code range, e.g. 0 and 255 for quint8.

    Returns
    -------
    ndarray of int32, shape of ``x``
        ``clamp(rint(x * (1/scale)) + zero_point, quant_min, quant_max)``; NaN -> quant_min.
        ``(codes - zero_point) * scale`` equals ``torch.fake_quantize_per_tensor_affine(x, ...)``
        for float32 ``x``.

    Raises
    ------
    ValueError
        When ``scale`` is not positive and finite or ``quant_min > quant_max``.
    """
    s = float(np.float32(scale))
    if not (np.isfinite(s) and s > 0):
        raise ValueError(f"scale must be positive and finite, got {scale}")
    if int(quant_min) > int(quant_max):
        raise ValueError(f"quant_min ({quant_min}) must be <= quant_max ({quant_max})")
    x32 = np.ascontiguousarray(x, dtype=np.float32)
    out = np.empty(x32.shape, np.int32)
    inv = np.float32(1.0) / np.float32(scale)
    quantize_per_tensor_kernel(
        x32.reshape(-1), inv, int(zero_point), int(quant_min), int(quant_max), out.reshape(-1)
    )
    return out


def quantize_per_channel(
    w: np.ndarray, scale: np.ndarray, zero_point: np.ndarray, quant_min: int, quant_max: int
) -> np.ndarray:
    """Integer codes of ``w`` per output channel (axis 0), PyTorch's per-channel arithmetic.

    Parameters
    ----------
    w : ndarray (C, ...) float
        Weights, output channels on axis 0; computed in float64 for float64 weights (the QAT
        forward's arithmetic at that dtype), else in float32.
    scale : ndarray (C,) float32, > 0
        One scale per output channel.
    zero_point : ndarray (C,) int
        One zero point per output channel (0 for symmetric weights).
    quant_min, quant_max : int
        The code range, e.g. -128 and 127 for qint8.

    Returns
    -------
    ndarray of int32, shape of ``w``
        ``clamp(rint(w[c] * (1/scale[c])) + zero_point[c], quant_min, quant_max)``.

    Raises
    ------
    ValueError
        On a scale/zero-point length other than ``w.shape[0]`` or a non-positive scale.
    """
    c = w.shape[0]
    scale = np.asarray(scale, dtype=np.float32).reshape(-1)
    zp = np.ascontiguousarray(np.asarray(zero_point).reshape(-1), dtype=np.int32)
    if scale.shape != (c,) or zp.shape != (c,):
        raise ValueError(
            f"per-channel scale and zero_point must have shape ({c},), got {scale.shape} and "
            f"{zp.shape}"
        )
    if not np.all(np.isfinite(scale) & (scale > 0)):
        raise ValueError("per-channel scales must be positive and finite")
    # float64 weights stay float64: ``w * inv`` rounded where the float64 QAT forward rounds it
    # (a float32 cast first moves a weight on a .5 tie to the other code)
    wt = np.float64 if np.asarray(w).dtype == np.float64 else np.float32
    wc = np.ascontiguousarray(w, dtype=wt).reshape(c, -1)
    out = np.empty(wc.shape, np.int32)
    inv = (np.float32(1.0) / scale).astype(np.float32)
    quantize_per_row_kernel(wc, inv, zp, int(quant_min), int(quant_max), out)
    return out.reshape(w.shape)


def qlinear(
    x_q: np.ndarray,
    x_scale: float,
    x_zero_point: int,
    w_q: np.ndarray,
    w_scale: np.ndarray,
    w_zero_point: np.ndarray | None = None,
    bias: np.ndarray | None = None,
) -> np.ndarray:
    """Integer linear layer: int32 accumulation of ``(x_q - zp_x) * (w_q - zp_w)``, requantize.

    Parameters
    ----------
    x_q : ndarray (M, K) int
        Activation codes.
    x_scale : float
        Per-tensor scale of the activations.
    x_zero_point : int
        Per-tensor zero point of the activations.
    w_q : ndarray (N, K) int
        Weight codes.
    w_scale : ndarray (N,) float32
        Per-output-channel weight scales.
    w_zero_point : ndarray (N,) int, optional
        Default zeros (symmetric weights).
    bias : ndarray (N,) float, optional
        Float bias added after requantization; default zeros.

    Returns
    -------
    ndarray (M, N) float32
        ``float32(acc * (float64(x_scale) * float64(w_scale[n]))) + bias[n]``.

    Raises
    ------
    ValueError
        On mismatched shapes, or when even an int64 accumulator could overflow
        (:func:`accumulator_dtype`; int64 is used where int32 could wrap).
    """
    x_q = np.asarray(x_q)
    w_q = np.asarray(w_q)
    if x_q.ndim != 2 or w_q.ndim != 2 or x_q.shape[1] != w_q.shape[1]:
        raise ValueError(f"x_q (M, K) and w_q (N, K) do not fit: {x_q.shape}, {w_q.shape}")
    m, k = x_q.shape
    n = w_q.shape[0]
    w_scale = np.asarray(w_scale, dtype=np.float32).reshape(-1)
    if w_scale.shape != (n,):
        raise ValueError(f"w_scale must have shape ({n},), got {w_scale.shape}")
    wz = np.zeros(n, np.int32) if w_zero_point is None else np.asarray(w_zero_point, np.int32)
    if wz.shape != (n,):
        raise ValueError(f"w_zero_point must have shape ({n},), got {wz.shape}")
    b = np.zeros(n, np.float32) if bias is None else np.asarray(bias, dtype=np.float32)
    if b.shape != (n,):
        raise ValueError(f"bias must have shape ({n},), got {b.shape}")
    mult = np.float64(np.float32(x_scale)) * w_scale.astype(np.float64)  # exact products
    wc = np.asarray(w_q, dtype=np.int64) - wz[:, None]
    zx = int(x_zero_point)
    x_span = max(abs(int(x_q.max()) - zx), abs(int(x_q.min()) - zx)) if x_q.size else 0
    w_span = int(np.abs(wc).max(initial=0))
    if max(x_span, w_span, abs(zx)) > _INT32_MAX:
        raise ValueError("x_q, w_q and their zero points must be codes that fit in int32")
    wide = accumulator_dtype(k, x_span, w_span) == np.int64
    out = np.empty((m, n), np.float32)
    qlinear_kernel(
        np.ascontiguousarray(x_q, dtype=np.int32),
        int(x_zero_point),
        np.ascontiguousarray(wc, dtype=np.int32),
        mult,
        np.ascontiguousarray(b),
        wide,
        out,
    )
    return out
