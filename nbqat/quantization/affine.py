"""Block-wise affine (integer-grid) fake quantization: torchao 0.18's primitives.

``block_size`` has one entry per dimension of ``x`` (per tensor: ``x.shape``; per channel:
``(1, K)``; per group: ``(1, G)``; per token: ``(1, ..., 1, K)``; see
:mod:`nbqat.quantization._blocks`).
The arithmetic, in float32, is torchao's (``torchao/quantization/quant_primitives.py``:
``choose_qparams_affine``, ``_fake_quantize_affine`` with ``quant_dtype=torch.int32`` and
``ZeroPointDomain.INT``)::

    inv  = 1 / scale                       # float32 reciprocal, then multiply
    r    = round_half_even(x * inv) + zero_point
    q    = clamp(r, quant_min, quant_max)  # NaN stays NaN (torch.clamp)
    y    = (q - zero_point) * scale
    mask = quant_min <= r <= quant_max     # torch.clamp's gradient mask, False for NaN

Unlike :func:`nbqat.fake_quantize_per_tensor_affine` (PyTorch's ATen op, NaN -> quant_min),
NaN input gives NaN output here, as torchao's ``torch.clamp`` does.

Inputs: float32 ``x`` (NumPy, host array-likes, or C-contiguous CUDA device arrays: the
``@cuda.jit`` twins run and device arrays come back). Every argument is validated in plain
Python before any compiled code runs; nothing is written into ``out`` / ``mask`` on an error.
The element formulas are :mod:`nbqat.kernels.lowbit_formula`.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from nbqat import _validate as V
from nbqat._docs import CACHEMASK_IO, fill_doc
from nbqat._jit import threads_for
from nbqat.kernels import lowbit_cpu as _k
from nbqat.quantization import _validate_qparams as VQ
from nbqat.quantization._blocks import Blocks, blocks_of, check_block_size, check_grid_shape
from nbqat.quantization._fake_quant_core import (
    _F32,
    _flat_in,
    _is_gpu,
    _outputs_on_gpu,
    _param_copy,
    _run_forward,
)

__all__ = [
    "choose_qparams_affine",
    "fake_quantize_affine",
    "fake_quantize_affine_backward",
    "fake_quantize_affine_cachemask",
]

#: torch.finfo(torch.float32).smallest_normal: torchao's default ``eps`` for float32 input.
EPS_F32 = np.float32(2.0**-126)

#: The ``*_cachemask`` parameter and results of the float32 block-wise functions (float8's too).
MASK_IO_F32 = CACHEMASK_IO.format(y="float32 array of ``x``'s shape")


def _gpu():
    from nbqat import _cuda

    _cuda.require_cuda("nbqat block-wise fake quantization")
    from nbqat.kernels import lowbit_cuda

    return lowbit_cuda


def check_x32(x: Any, name: str = "x") -> Any:
    """``x`` as a float32 array (TypeError for other dtypes, with an ``astype`` hint)."""
    return V.check_float_array(x, name, (_F32,))


def _host_param(v: Any, name: str, allow_int: bool) -> np.ndarray:
    """A scale (float) or zero point (integer or float) as a host array (device arrays are
    copied: they hold one value per block)."""
    if V.is_cuda_array(v):
        from nbqat import _cuda

        a = _cuda.as_device_array(v).copy_to_host()
    else:
        a = V.as_array(v, name)
    kind = np.dtype(a.dtype).kind
    if kind != "f" and not (allow_int and kind in "iu"):
        what = "an integer or float" if allow_int else "a float"
        raise TypeError(f"`{name}` must be {what} array, got dtype {np.dtype(a.dtype)}")
    return np.asarray(a)


def _qparams(x: Any, block_size: Any, scale: Any, zero_point: Any) -> tuple:
    """Validated ``(x, Blocks, s, inv, z)``: flat float32 scale, its reciprocal, zero point."""
    x = check_x32(x)
    b = blocks_of(tuple(x.shape), check_block_size(block_size, tuple(x.shape)))
    s_arr = _host_param(scale, "scale", False)
    check_grid_shape(s_arr, b, "scale")
    s = _param_copy(s_arr, np.float32)
    if zero_point is None:
        z = np.zeros(b.nblocks, np.float32)
    else:
        z_arr = _host_param(zero_point, "zero_point", True)
        check_grid_shape(z_arr, b, "zero_point")
        z = _param_copy(z_arr, np.float32)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        inv = np.float32(1.0) / s
    return x, b, s, inv, z


def _forward(x, block_size, scale, zero_point, quant_min, quant_max, out, mask, with_mask):
    qmin, qmax = VQ.check_quant_range(quant_min, quant_max)
    x, b, s, inv, z = _qparams(x, block_size, scale, zero_point)
    if _outputs_on_gpu(x, out, mask, with_mask):
        return _gpu().affine_forward(x, b, s, inv, z, qmin, qmax, out, mask, with_mask)

    def launch(xf, of, mf, t):
        T = np.float32
        _k.affine_forward_kernel(
            xf, of, mf, b.rows_map, s, inv, z, b.geo, T(qmin), T(qmax), with_mask
        )

    return _run_forward(x, out, mask, with_mask, launch)


def fake_quantize_affine(
    x: Any,
    block_size: Any,
    scale: Any,
    zero_point: Any,
    quant_min: int,
    quant_max: int,
    *,
    out: Any = None,
) -> Any:
    """Block-wise affine fake quantization (quantize to the integer grid, then dequantize).

    Parameters
    ----------
    x : float32 array, any shape (NumPy, host array-like or C-contiguous CUDA array)
    block_size : tuple of int, ``len(block_size) == x.ndim``
        Each entry >= 1 and dividing its dimension; one scale per block.
    scale : float array with one entry per block
        The shape :func:`choose_qparams_affine` returns (torchao's, size-1 dimensions
        dropped: ``()`` per tensor, ``(128,)`` for block ``(1, 64)`` on ``(128, 64)``) or
        ``x.shape // block_size`` (any shape whose non-1 dimensions are the grid's). Narrowed
        to float32; values are not checked (torchao's IEEE results for 0, Inf or NaN scales).
    zero_point : integer or float array shaped like ``scale``, or None (zeros)
        Added in float32 (as torchao's ``round(...) + zero_point``); not range-checked.
    quant_min, quant_max : int
        The integer grid, ``quant_min < quant_max`` (int4: -8, 7 or 0, 15; int8: -128, 127).
    out : float32 array of ``x``'s shape, optional
        Preallocated result (``out=x`` works in place).

    Returns
    -------
    y : float32 array of ``x``'s shape
        ``(clamp(round(x * (1/scale)) + zp, quant_min, quant_max) - zp) * scale`` per block
        (module docstring); NaN for NaN input.

    Raises
    ------
    TypeError
        ``x`` not float32; non-float ``scale``; non-numeric ``zero_point``; a bad ``out``.
    ValueError
        ``block_size`` of the wrong length or not dividing ``x.shape``; ``scale`` or
        ``zero_point`` not one entry per block; ``quant_min >= quant_max`` or a bound past
        2**24; ``out`` of the wrong shape.

    Notes
    -----
    Bit for bit torchao 0.18's ``_fake_quantize_affine(x, block_size, scale, zero_point,
    torch.int32, quant_min, quant_max)`` on float32 (``quant_primitives.py``).
    """
    return _forward(x, block_size, scale, zero_point, quant_min, quant_max, out, None, False)


@fill_doc(cachemask_io=MASK_IO_F32)
def fake_quantize_affine_cachemask(
    x: Any,
    block_size: Any,
    scale: Any,
    zero_point: Any,
    quant_min: int,
    quant_max: int,
    *,
    out: Any = None,
    mask: Any = None,
) -> tuple[Any, Any]:
    """:func:`fake_quantize_affine` that also returns the straight-through-estimator mask.

    Parameters
    ----------
    x, block_size, scale, zero_point, quant_min, quant_max, out
        As :func:`fake_quantize_affine`.
    {cachemask_io}
        True where ``quant_min <= round(x * inv) + zp <= quant_max`` (unclamped; False for NaN):
        the gradient torch autograd gives through torchao's ``_fake_quantize_affine`` (its
        ``_Round`` is an STE, its ``torch.clamp`` passes the gradient on ``[min, max]``). Feed
        it to :func:`nbqat.fake_quantize_backward`.

    Raises
    ------
    TypeError, ValueError
        As :func:`fake_quantize_affine`; also for a bad ``mask``.

    Notes
    -----
    ``y`` is torchao's bit for bit. torchao's own ``_fake_quantize_affine_cachemask`` takes its
    mask on the already clamped ``q``, so it is True everywhere except at NaN; nbqat returns the
    autograd mask instead (the one torchao's QAT training actually applies).
    """
    return _forward(x, block_size, scale, zero_point, quant_min, quant_max, out, mask, True)


def fake_quantize_affine_backward(
    grad_y: Any,
    x: Any,
    block_size: Any,
    scale: Any,
    zero_point: Any,
    quant_min: int,
    quant_max: int,
) -> tuple[Any, Any, Any]:
    """LSQ backward of :func:`fake_quantize_affine`: gradients for ``x``, ``scale`` and
    ``zero_point`` per block.

    Parameters
    ----------
    grad_y : float32 array of ``x``'s shape
        Gradient of the loss with respect to the fake-quantized output.
    x, block_size, scale, zero_point, quant_min, quant_max
        The forward's arguments.

    Returns
    -------
    grad_x : float32 array of ``x``'s shape
        ``where(mask, grad_y * scale, 0) * (1 / scale)`` (mask of
        :func:`fake_quantize_affine_cachemask`).
    grad_scale : float32 array of ``scale``'s shape
        Per block ``sum(grad_y * (q - zp)) - sum(where(mask, grad_y * scale, 0) * x) / scale**2``
        (the latter as ``* -(inv * inv)``).
    grad_zero_point : float32 array of ``zero_point``'s shape (``scale``'s when None)
        Per block ``-sum(grad_y * scale)`` over the elements outside the grid.

    Raises
    ------
    TypeError, ValueError
        As :func:`fake_quantize_affine`; ``grad_y`` of another shape or dtype than ``x``.

    Notes
    -----
    What torch autograd computes through torchao's ``_fake_quantize_affine`` with a float
    ``zero_point`` that requires grad (``_Round`` is the STE): ``grad_x`` bit for bit, the
    per-block sums accumulated in float64 in a fixed order (torch sums in float32, so they
    agree to float32 rounding). Multiply by an LSQ gradient factor (Esser et al., ICLR 2020)
    as needed.
    """
    qmin, qmax = VQ.check_quant_range(quant_min, quant_max)
    x, b, s, inv, z = _qparams(x, block_size, scale, zero_point)
    g = check_x32(grad_y, "grad_y")
    V.check_same_shape(g, x, "grad_y", "x")
    s_shape = tuple(np.shape(scale)) if not hasattr(scale, "shape") else tuple(scale.shape)
    z_shape = s_shape if zero_point is None else tuple(np.shape(zero_point))
    T = np.float32
    if _is_gpu(x=x, grad_y=g):
        gx, ds, dz = _gpu().affine_backward(g, x, b, s, inv, z, qmin, qmax)
        return gx, ds.reshape(s_shape), dz.reshape(z_shape)
    gx = np.empty(x.shape, np.float32)
    res = np.zeros((b.nblocks, 2), np.float32)
    if x.size:
        xf, gf = _flat_in(x, _F32), _flat_in(g, _F32)
        with threads_for(x.size):
            res = _k.affine_backward_kernel(
                xf, gf, gx.reshape(-1), b.rows_map, s, inv, z, b.geo, T(qmin), T(qmax)
            )
    return gx, res[:, 0].reshape(s_shape), res[:, 1].copy().reshape(z_shape)


def _mapping(mapping_type: Any) -> bool:
    name = str(getattr(mapping_type, "name", mapping_type)).lower()
    if name not in ("symmetric", "asymmetric"):
        raise ValueError(
            f"`mapping_type` must be 'symmetric' or 'asymmetric', got {mapping_type!r}"
        )
    return name == "symmetric"


def _reduce_blocks(x: Any, block_size: Any, what: str) -> tuple[Any, Blocks]:
    x = check_x32(x)
    b = blocks_of(tuple(x.shape), check_block_size(block_size, tuple(x.shape)))
    if x.size == 0:
        raise ValueError(f"`x` is empty: {what} needs at least one element per block")
    return x, b


def choose_qparams_affine(
    x: Any,
    mapping_type: Any,
    block_size: Any,
    quant_min: int,
    quant_max: int,
    *,
    eps: float | None = None,
) -> tuple[Any, Any]:
    """Per-block scale and zero point from each block's min and max (torchao's formula).

    Parameters
    ----------
    x : float32 array, not empty (NumPy, host array-like or C-contiguous CUDA array)
    mapping_type : {"symmetric", "asymmetric"}
        (torchao's ``MappingType.SYMMETRIC`` / ``ASYMMETRIC`` are accepted too.)
    block_size : tuple of int
        As :func:`fake_quantize_affine`.
    quant_min, quant_max : int
        The integer grid, ``quant_min < quant_max``.
    eps : float, optional
        Smallest scale; default ``torch.finfo(torch.float32).smallest_normal`` (2**-126).

    Returns
    -------
    scale : float32 array
        torchao's shape (``keepdim=False``): ``x``'s shape with the reduced dimensions dropped
        (``()`` per tensor, ``(K,)`` per channel ``(1, N)`` on ``(K, N)``, ``(K, N // G)`` per
        group). symmetric: ``max(-min(mn, 0), max(mx, 0)) / ((qmax - qmin) / 2)``;
        asymmetric: ``(max(mx, 0) - min(mn, 0)) / (qmax - qmin)``; then ``max(scale, eps)``.
    zero_point : int32 array of the same shape
        symmetric: ``int((qmax + qmin + 1) / 2)`` (0 for signed ranges, 8 for 0..15);
        asymmetric: ``clamp(qmin - round(min(mn, 0) / scale), qmin, qmax)``.

    Raises
    ------
    TypeError
        ``x`` not float32; non-integer bounds.
    ValueError
        Unknown ``mapping_type``; bad ``block_size``; empty ``x``; bad bounds; a non-finite
        or negative ``eps``.

    Notes
    -----
    Bit for bit torchao 0.18's ``choose_qparams_affine(x, mapping_type, block_size,
    torch.int32, quant_min, quant_max, eps)``. NaN in a block gives a NaN scale and, for
    asymmetric, the zero point ``-2**31`` (torch's x86 cast of NaN to int32, reproduced on
    every target); an infinite value gives an infinite scale.
    """
    symmetric = _mapping(mapping_type)
    qmin, qmax = VQ.check_quant_range(quant_min, quant_max)
    e = EPS_F32 if eps is None else np.float32(V.check_finite_real(eps, "eps"))
    if e < 0:
        raise ValueError(f"`eps` must be >= 0, got {eps!r}")
    x, b = _reduce_blocks(x, block_size, "choose_qparams_affine")
    div = float(qmax - qmin) / 2 if symmetric else float(qmax - qmin)
    zp_sym = int((qmax + qmin + 1) / 2)
    T = np.float32
    if _is_gpu(x=x):
        s, z = _gpu().choose_qparams(x, b, qmin, qmax, e, symmetric, div, zp_sym)
        return s.reshape(b.reduced), z.reshape(b.reduced)
    xf = _flat_in(x, _F32)
    scale = np.empty(b.nblocks, np.float32)
    zp = np.empty(b.nblocks, np.int32)
    with threads_for(x.size):
        mm = _k.merge_minmax(_k.unit_minmax_kernel(xf, b.geo, False), b.rows_map, b.geo, b.nblocks)
        _k.qparams_kernel(mm, scale, zp, T(qmin), T(qmax), e, symmetric, T(div), T(zp_sym))
    return scale.reshape(b.reduced), zp.reshape(b.reduced)
