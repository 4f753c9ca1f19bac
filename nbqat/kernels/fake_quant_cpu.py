"""CPU kernels for fake quantization (Numba, ``parallel=True``, no fastmath).

All kernels work on flat 1-D C-contiguous buffers of one float dtype ``T`` (float32 or float64),
so each compiles to at most two specialisations; :mod:`nbqat.quantization.fake_quant` makes the
views
(contiguous copies for strided input, float32 for float16) and validates every argument.
Per-channel kernels see a C-contiguous array as ``(outer, C, inner)`` (``C = shape[axis]``), so
any axis works without a transpose.

Scalars (``scale``, ``inv``, ``zp``, ``qmin``, ``qmax``, ``gf``) arrive already typed as ``T``
(``inv`` is the float32 reciprocal of the float32 scale, as PyTorch computes it), so nothing
widens: arithmetic order follows ``aten/src/ATen/native/quantized/cpu/kernels/
QuantizedOpKernels.cpp`` (reciprocal then multiply, ``rint`` then add the zero point, mask on
the unclamped rounded value, clamp in float, ``(q - zp) * scale``). That arithmetic is written
once, in :mod:`nbqat.kernels.fake_quant_formula`; the kernels here only loop and store.

Reductions (LSQ ``grad_scale`` / ``grad_zero_point``) use fixed chunks by index with float64
partials merged serially in a fixed order, so results do not depend on the thread count.
"""

from __future__ import annotations

import numpy as np
from numba import prange

from nbqat._jit import cpu_kernel
from nbqat.kernels.fake_quant_formula import fake_quant_elem, lsq_terms, scale_ok, ste_elem

#: Elements per partial sum of the per-tensor LSQ reduction (fixed: results are independent of
#: the number of threads).
LSQ_CHUNK = 1 << 14


@cpu_kernel(parallel=False)
def scales_ok_kernel(s, ok):  # pragma: no cover
    """:func:`~nbqat.kernels.fake_quant_formula.scale_ok` of every (n,) float32 entry of ``s``
    into the bool ``ok`` (:mod:`nbqat.quantization._validate_qparams`'s check of a scale)."""
    for i in range(s.shape[0]):
        ok[i] = scale_ok(s[i])


@cpu_kernel(parallel=True)
def fq_tensor_kernel(x, out, mask, scale, inv, zp, qmin, qmax, with_mask):  # pragma: no cover
    """Per-tensor fake quantization (and its STE mask).

    Parameters
    ----------
    x : (n,) float32 | float64, C-contiguous
    out : (n,) same dtype as ``x`` (may be ``x`` itself)
    mask : (n,) bool, or (1,) dummy when ``with_mask`` is False
    scale, inv, zp, qmin, qmax : scalars of ``x``'s dtype
        ``inv = float32(1) / float32(scale)``.
    with_mask : bool
    """
    if with_mask:
        for i in prange(x.size):
            out[i], mask[i] = fake_quant_elem(x[i], scale, inv, zp, qmin, qmax)
    else:
        for i in prange(x.size):
            out[i] = fake_quant_elem(x[i], scale, inv, zp, qmin, qmax)[0]


@cpu_kernel(parallel=False, inline="always")
def fq_span(x, y, m, s, iv, z, qmin, qmax, with_mask):  # pragma: no cover
    """Fake-quantize the 1-D span ``x`` with one scale / zero point into ``y`` and (when
    ``with_mask``) the mask ``m`` (bool, or its uint8 view: byte stores vectorise best). The
    loop runs over an unsigned index (no wraparound check, so it vectorises)."""
    if with_mask:
        for k in range(np.uint64(0), np.uint64(x.size)):
            y[k], m[k] = fake_quant_elem(x[k], s, iv, z, qmin, qmax)
    else:
        for k in range(np.uint64(0), np.uint64(x.size)):
            y[k] = fake_quant_elem(x[k], s, iv, z, qmin, qmax)[0]


@cpu_kernel(parallel=True)
def fq_channel_kernel(
    x, out, mask, scale, inv, zp, outer, channels, inner, qmin, qmax, with_mask, by_outer
):  # pragma: no cover
    """Per-channel fake quantization over a flat ``(outer, C, inner)`` buffer.

    Parameters
    ----------
    x : (outer*C*inner,) float32 | float64, C-contiguous
    out : same shape and dtype (may be ``x``)
    mask : same shape, bool; (1,) dummy when ``with_mask`` is False
    scale, inv, zp : (C,) arrays of ``x``'s dtype (float32 scale, its float32 reciprocal, zp)
    outer, channels, inner : int
    qmin, qmax : scalars of ``x``'s dtype
    with_mask : bool
    by_outer : bool
        Parallel over ``outer`` rows with the channel loop innermost (used when ``inner == 1``,
        e.g. the last axis) instead of parallel over ``(outer, C)`` rows of length ``inner``.
    """
    # Row slices indexed by plain range variables let LLVM drop the negative-index checks and
    # vectorize the inner loops.
    if by_outer:  # inner == 1
        for o in prange(outer):
            base = o * channels
            xr = x[base : base + channels]
            yr = out[base : base + channels]
            if with_mask:
                mr = mask[base : base + channels]
                for c in range(channels):
                    yr[c], mr[c] = fake_quant_elem(xr[c], scale[c], inv[c], zp[c], qmin, qmax)
            else:
                for c in range(channels):
                    yr[c] = fake_quant_elem(xr[c], scale[c], inv[c], zp[c], qmin, qmax)[0]
    else:
        # the mask test outside the span, with a constant flag: a mask view chosen per row
        # keeps short rows from vectorising (nbqat.kernels.lowbit_cpu.affine_forward_kernel)
        if with_mask:
            for row in prange(outer * channels):
                c = row % channels
                sl = slice(row * inner, row * inner + inner)
                fq_span(x[sl], out[sl], mask[sl], scale[c], inv[c], zp[c], qmin, qmax, True)
        else:
            for row in prange(outer * channels):
                c = row % channels
                sl = slice(row * inner, row * inner + inner)
                fq_span(x[sl], out[sl], mask, scale[c], inv[c], zp[c], qmin, qmax, False)


@cpu_kernel(parallel=True)
def ste_backward_kernel(grad_y, mask, out):  # pragma: no cover
    """Straight-through estimator: ``out = grad_y * mask`` (a multiply, so NaN stays NaN).

    Parameters
    ----------
    grad_y : (n,) float32 | float64, C-contiguous
    mask : (n,) bool
    out : (n,) same dtype as ``grad_y`` (may be ``grad_y``)
    """
    one = grad_y.dtype.type(1)
    zero = grad_y.dtype.type(0)
    for i in prange(grad_y.size):
        out[i] = ste_elem(grad_y[i], mask[i], one, zero)


@cpu_kernel(parallel=True)
def ste_backward_inplace_kernel(grad, mask):  # pragma: no cover
    """In-place straight-through estimator ``grad *= mask`` (a multiply, so NaN stays NaN).

    A kernel of its own: :func:`ste_backward_kernel` with ``out`` the same array as ``grad_y``
    is correct, but LLVM's runtime overlap check then sends its loop to the scalar version
    (measured 6-7x slower on 98k float32 elements).

    Parameters
    ----------
    grad : (n,) float32 | float64, C-contiguous, written in place
    mask : (n,) bool
    """
    one = grad.dtype.type(1)
    zero = grad.dtype.type(0)
    for i in prange(grad.size):
        grad[i] = ste_elem(grad[i], mask[i], one, zero)


@cpu_kernel(parallel=False, inline="always")
def lsq_span(x, grad_y, grad_x, lo, hi, s, iv, z, qmin, qmax, gf, a, b):  # pragma: no cover
    """:func:`~nbqat.kernels.fake_quant_formula.lsq_terms` of the elements ``[lo, hi)``: writes
    their ``grad_x`` and returns ``(a, b)`` with their dS and dZ terms added one by one (float64,
    in index order)."""
    for i in range(lo, hi):
        dx, ds, dz = lsq_terms(x, grad_y, i, s, iv, z, qmin, qmax, gf)
        grad_x[i] = dx
        a += ds
        b += dz
    return a, b


@cpu_kernel(parallel=True)
def lsq_tensor_backward_kernel(
    x, grad_y, grad_x, scale, inv, zp, qmin, qmax, gf
):  # pragma: no cover
    """Per-tensor LSQ backward.

    Parameters
    ----------
    x, grad_y : (n,) float32 | float64, C-contiguous
    grad_x : (n,) same dtype (output; may alias ``grad_y``)
    scale, inv, zp, qmin, qmax, gf : scalars of the same dtype

    Returns
    -------
    (float, float)
        ``(sum of dS terms, sum of dZ terms)`` accumulated in float64 over fixed chunks of
        :data:`LSQ_CHUNK` elements, merged in chunk order.
    """
    n = x.size
    nch = (n + LSQ_CHUNK - 1) // LSQ_CHUNK
    part = np.zeros((nch, 2), np.float64)
    for j in prange(nch):
        lo, hi = j * LSQ_CHUNK, min(n, (j + 1) * LSQ_CHUNK)
        a, b = lsq_span(x, grad_y, grad_x, lo, hi, scale, inv, zp, qmin, qmax, gf, 0.0, 0.0)
        part[j, 0] = a
        part[j, 1] = b
    ts = 0.0
    tz = 0.0
    for j in range(nch):
        ts += part[j, 0]
        tz += part[j, 1]
    return ts, tz


@cpu_kernel(parallel=True)
def lsq_channel_backward_kernel(
    x, grad_y, grad_x, scale, inv, zp, outer, channels, inner, qmin, qmax, gf, rows_per_chunk
):  # pragma: no cover
    """The LSQ backward of :func:`fq_channel_kernel`'s forward (same flat layout).

    Parameters
    ----------
    x, grad_y, grad_x (output), scale, inv, zp, outer, channels, inner, qmin, qmax
        As :func:`fq_channel_kernel`'s ``x``, ``out`` and scalars.
    gf : scalar of ``x``'s dtype
        The LSQ gradient factor.
    rows_per_chunk : int
        0: parallel over channels (each channel summed serially over ``(outer, inner)``).
        > 0: parallel over fixed chunks of ``rows_per_chunk`` outer rows with (chunks, C)
        float64 partials merged in chunk order (for ``inner`` small, ``outer`` large).

    Returns
    -------
    (C, 2) float64
        Column 0: grad_scale sums; column 1: grad_zero_point sums.
    """
    res = np.zeros((channels, 2), np.float64)
    if rows_per_chunk == 0:
        for c in prange(channels):
            s = scale[c]
            iv = inv[c]
            z = zp[c]
            a = 0.0
            b = 0.0
            for o in range(outer):
                lo = (o * channels + c) * inner
                a, b = lsq_span(x, grad_y, grad_x, lo, lo + inner, s, iv, z, qmin, qmax, gf, a, b)
            res[c, 0] = a
            res[c, 1] = b
    else:
        nch = (outer + rows_per_chunk - 1) // rows_per_chunk
        part = np.zeros((nch, channels, 2), np.float64)
        for j in prange(nch):
            for o in range(j * rows_per_chunk, min(outer, (j + 1) * rows_per_chunk)):
                for c in range(channels):
                    base = (o * channels + c) * inner
                    for k in range(inner):  # short rows: the sums stay in the partials
                        i = base + k
                        dx, ds, dz = lsq_terms(
                            x, grad_y, i, scale[c], inv[c], zp[c], qmin, qmax, gf
                        )
                        grad_x[i] = dx
                        part[j, c, 0] += ds
                        part[j, c, 1] += dz
        for j in range(nch):
            for c in range(channels):
                res[c, 0] += part[j, c, 0]
                res[c, 1] += part[j, c, 1]
    return res
