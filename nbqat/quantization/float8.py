"""Float8 (e4m3fn, e5m2) fake quantization with block-wise scales: torchao 0.18's primitives.

The arithmetic, in float32, is torchao's (``torchao/quantization/quant_primitives.py``:
``_choose_scale_float8``, ``_quantize_affine_float8``, ``_dequantize_affine_float8``)::

    scale = clamp(max |x| over the block, hp_value_lb, hp_value_ub) / finfo(dtype).max
    t     = x / scale                          # a true division
    q     = clamp(t, -max, max).to(dtype)      # round to nearest even on the float8 grid
    y     = q.to(float32) * scale
    mask  = -max <= t <= max                   # torch.clamp's gradient mask, False for NaN

``max`` is 448 (e4m3fn) or 57344 (e5m2). The cast is torch 2.13's CPU cast, reproduced with
integer arithmetic on the float32 bits (:func:`nbqat.kernels.lowbit_formula.round_float8`):
subnormals on the fixed subnormal grid, ties to even, +-0 kept, NaN stays NaN.

torchao's results that are NaN, reproduced (bit for bit up to the NaN payload):

* a block containing +-Inf: ``scale = inf``, so ``x / inf`` is 0 (or NaN) and ``0 * inf`` NaN:
  the whole block is NaN;
* an all-zero block: ``scale = 0``, ``0 / 0`` is NaN: the whole block is NaN (unless
  ``hp_value_lb > 0`` keeps the scale positive);
* NaN anywhere in a block: the scale and so the whole block is NaN.

Inputs: float32 ``x`` (NumPy, host array-likes, or C-contiguous CUDA device arrays); every
argument is validated before any compiled code runs.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from nbqat._docs import fill_doc
from nbqat._jit import threads_for
from nbqat.kernels import lowbit_cpu as _k
from nbqat.kernels.lowbit_formula import E4M3FN, E5M2
from nbqat.quantization import _fake_quant_core as core
from nbqat.quantization._blocks import blocks_of, check_block_size, float8_block_of
from nbqat.quantization.affine import MASK_IO_F32, _gpu, _host_param, _reduce_blocks, check_x32

__all__ = ["choose_scale_float8", "fake_quantize_float8", "fake_quantize_float8_cachemask"]

_FORMATS = {"float8_e4m3fn": E4M3FN, "float8_e5m2": E5M2}


def _fmt(dtype: Any) -> int:
    """The format id of ``dtype`` ("float8_e4m3fn" / "float8_e5m2"; ``torch.float8_*`` dtypes
    are recognised by name)."""
    name = str(dtype).removeprefix("torch.")
    if name not in _FORMATS:
        raise ValueError(f"`dtype` must be 'float8_e4m3fn' or 'float8_e5m2', got {dtype!r}")
    return _FORMATS[name]


def _bound(v: Any, name: str, default: float) -> np.float32:
    if v is None:
        return np.float32(default)
    f = float(v)
    if f != f:
        raise ValueError(f"`{name}` must not be NaN")
    return np.float32(f)


def choose_scale_float8(
    x: Any,
    block_size: Any,
    dtype: Any = "float8_e4m3fn",
    *,
    hp_value_lb: float | None = None,
    hp_value_ub: float | None = None,
) -> Any:
    """Per-block float8 scale ``clamp(max |x|, hp_value_lb, hp_value_ub) / finfo(dtype).max``.

    Parameters
    ----------
    x : float32 array, not empty (NumPy, host array-like or C-contiguous CUDA array)
    block_size : tuple of int, ``len(block_size) == x.ndim``, each entry dividing its dimension
        Per tensor: ``x.shape``; per row: ``(1, K)``; 128x128 tiles: ``(128, 128)`` ...
    dtype : {"float8_e4m3fn", "float8_e5m2"}
    hp_value_lb, hp_value_ub : float, optional
        Bounds on ``max |x|`` before the division (torchao's arguments of the same names).

    Returns
    -------
    scale : float32 array of shape ``x.shape // block_size``
        Dimensions kept, as torchao's. 0 for an all-zero block, Inf for a block with +-Inf,
        NaN for a block with NaN (see the module docstring for what these give downstream).

    Raises
    ------
    TypeError
        ``x`` not float32.
    ValueError
        Unknown ``dtype``; bad ``block_size``; empty ``x``; a NaN bound.

    Notes
    -----
    Bit for bit torchao 0.18's ``_choose_scale_float8(x, block_size, dtype,
    torch.float32, hp_value_lb, hp_value_ub)``.
    """
    fmt = _fmt(dtype)
    lo = _bound(hp_value_lb, "hp_value_lb", -np.inf)
    hi = _bound(hp_value_ub, "hp_value_ub", np.inf)
    x, b = _reduce_blocks(x, block_size, "choose_scale_float8")
    if core._is_gpu(x=x):
        return _gpu().choose_scale_float8(x, b, lo, hi, fmt).reshape(b.grid)
    xf = core._flat_in(x, core._F32)
    scale = np.empty(b.nblocks, np.float32)
    with threads_for(x.size):
        mm = _k.merge_minmax(_k.unit_minmax_kernel(xf, b.geo, True), b.rows_map, b.geo, b.nblocks)
        _k.float8_scale_kernel(mm, scale, lo, hi, fmt)
    return scale.reshape(b.grid)


def _forward(x, scale, dtype, out, mask, with_mask):
    fmt = _fmt(dtype)
    x = check_x32(x)
    s_arr = _host_param(scale, "scale", False)
    block = float8_block_of(tuple(int(v) for v in s_arr.shape), tuple(x.shape))
    b = blocks_of(tuple(x.shape), check_block_size(block, tuple(x.shape)))
    s = core._param_copy(s_arr, np.float32)
    if core._outputs_on_gpu(x, out, mask, with_mask):
        return _gpu().float8_forward(x, b, s, fmt, out, mask, with_mask)

    def launch(xf, of, mf, t):
        _k.float8_forward_kernel(xf, of, mf, b.rows_map, s, b.geo, fmt, with_mask)

    return core._run_forward(x, out, mask, with_mask, launch)


def fake_quantize_float8(x: Any, scale: Any, dtype: Any = "float8_e4m3fn", *, out: Any = None):
    """Float8 fake quantization: ``(clamp(x / scale, -max, max).to(dtype)).to(float32) * scale``.

    Parameters
    ----------
    x : float32 array (NumPy, host array-like or C-contiguous CUDA array)
    scale : float array
        Size 1 (per tensor) or of ``x``'s rank with each dimension dividing ``x``'s: the
        shape :func:`choose_scale_float8` returns (``x.shape // block_size``). Narrowed to
        float32; values are not checked (torchao's IEEE results, see the module docstring).
    dtype : {"float8_e4m3fn", "float8_e5m2"}
    out : float32 array of ``x``'s shape, optional
        Preallocated result (``out=x`` works in place).

    Returns
    -------
    y : float32 array of ``x``'s shape

    Raises
    ------
    TypeError
        ``x`` not float32; non-float ``scale``; a bad ``out``.
    ValueError
        Unknown ``dtype``; ``scale`` of a shape that does not tile ``x``; ``out`` of the
        wrong shape.

    Notes
    -----
    Bit for bit torchao 0.18's ``_dequantize_affine_float8(_quantize_affine_float8(x, scale,
    dtype), scale, torch.float32)`` (NaN results equal as NaN).
    """
    return _forward(x, scale, dtype, out, None, False)


@fill_doc(cachemask_io=MASK_IO_F32)
def fake_quantize_float8_cachemask(
    x: Any, scale: Any, dtype: Any = "float8_e4m3fn", *, out: Any = None, mask: Any = None
) -> tuple[Any, Any]:
    """:func:`fake_quantize_float8` that also returns the straight-through-estimator mask.

    Parameters
    ----------
    x, scale, dtype, out
        As :func:`fake_quantize_float8`.
    {cachemask_io}
        True where ``-max <= x / scale <= max`` (False for NaN): ``torch.clamp``'s gradient
        mask in torchao's formula (``_RoundToFloat8`` is an STE). Autograd's ``grad_x`` is
        ``where(mask, grad_y * scale, 0) / scale``; :func:`nbqat.fake_quantize_backward`
        gives ``grad_y * mask``, equal up to that rounding.

    Raises
    ------
    TypeError, ValueError
        As :func:`fake_quantize_float8`; also for a bad ``mask``.
    """
    return _forward(x, scale, dtype, out, mask, True)
