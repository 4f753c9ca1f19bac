"""CPU kernels of block-wise affine and float8 fake quantization (Numba, ``parallel=True``, no
fastmath).

Every kernel works on a flat C-contiguous float32 ``x`` seen through the block geometry of
:mod:`nbqat.quantization._blocks` (``geo = (L, G, nseg, P, Cp, m, ni, rows)`` and ``rows_map``): the
parallel loop runs over ``rows * ni`` items of ``m`` units, a unit being a contiguous span of at
most :data:`nbqat.quantization._blocks.UNIT` elements with one block ``rows_map[r] * nseg + j``. The
element
arithmetic is :mod:`nbqat.kernels.lowbit_formula`; the kernels only loop, reduce and store.

Reductions are deterministic: one partial per unit, merged serially in (row, segment, piece)
order, so results do not depend on the thread count (and the CUDA twins merge in the same
order). Min / max reductions are exact whatever the order.
"""

from __future__ import annotations

import numpy as np
from numba import prange

from nbqat._jit import cpu_kernel
from nbqat.kernels.lowbit_formula import (
    affine_elem,
    affine_grad_block,
    affine_grad_elem,
    affine_qparams,
    float8_elem,
    float8_scale,
    max_nan,
    min_nan,
    unit_span,
    zp_to_int32,
)

_inline = cpu_kernel(parallel=False, inline="always")


@_inline
def item_units(it, geo):  # pragma: no cover
    """``(r, u0, u1)``: item ``it`` of a kernel's ``prange(rows * ni)`` is the units ``u0`` to
    ``u1 - 1`` of row ``r`` (``m`` units an item)."""
    L, G, nseg, P, Cp, m, ni, rows = geo
    r = it // ni
    u0 = (it - r * ni) * m
    return r, u0, min(nseg * P, u0 + m)


@_inline
def unit_of(r, u, geo):  # pragma: no cover
    """``(j, a, b)``: unit ``u`` of row ``r`` is segment ``j``'s elements ``[a, b)`` of the
    flat ``x`` (:func:`~nbqat.kernels.lowbit_formula.unit_span` offset by the row)."""
    L, G, nseg, P, Cp, m, ni, rows = geo
    j, a, b = unit_span(u, P, G, Cp)
    return j, r * L + a, r * L + b


@_inline
def unit_block(r, u, geo, rows_map):  # pragma: no cover
    """``(k, a, b)``: :func:`unit_of` with the segment's block ``k = rows_map[r] * nseg + j``."""
    j, a, b = unit_of(r, u, geo)
    return rows_map[r] * geo[2] + j, a, b


@_inline
def affine_span(x, y, mk, s, inv, z, qmin, qmax, with_mask):  # pragma: no cover
    """:func:`affine_elem` over one unit (1-D views; ``mk`` ignored without a mask)."""
    if with_mask:
        for k in range(np.uint64(0), np.uint64(x.size)):
            y[k], mk[k] = affine_elem(x[k], s, inv, z, qmin, qmax)
    else:
        for k in range(np.uint64(0), np.uint64(x.size)):
            y[k] = affine_elem(x[k], s, inv, z, qmin, qmax)[0]


@_inline
def float8_span(x, y, mk, s, fmt, with_mask):  # pragma: no cover
    """:func:`float8_elem` over one unit."""
    if with_mask:
        for k in range(np.uint64(0), np.uint64(x.size)):
            y[k], mk[k] = float8_elem(x[k], s, fmt)
    else:
        for k in range(np.uint64(0), np.uint64(x.size)):
            y[k] = float8_elem(x[k], s, fmt)[0]


@cpu_kernel(parallel=True)
def affine_forward_kernel(
    x, out, mask, rows_map, s, inv, z, geo, qmin, qmax, with_mask
):  # pragma: no cover
    """Block-wise affine fake quantization.

    Parameters
    ----------
    x, out : (n,) float32 (``out`` may be ``x``)
    mask : (n,) bool, or (1,) dummy when ``with_mask`` is False
    rows_map : (rows,) int64
    s, inv, z : (nblocks,) float32: scale, ``1 / scale``, zero point
    geo : UniTuple(int64, 8)
    qmin, qmax : float32
    with_mask : bool
    """
    # The mask test sits outside the unit loop, with a constant flag for the span: a mask view
    # chosen per unit (``mask[a:b] if with_mask else mask``) kept the 16- and 32-element loops
    # from vectorising (measured: 2.7x / 1.9x the time at G = 16 / 32, one thread).
    for it in prange(geo[7] * geo[6]):
        r, u0, u1 = item_units(it, geo)
        if with_mask:
            for u in range(u0, u1):
                k, a, b = unit_block(r, u, geo, rows_map)
                affine_span(x[a:b], out[a:b], mask[a:b], s[k], inv[k], z[k], qmin, qmax, True)
        else:
            for u in range(u0, u1):
                k, a, b = unit_block(r, u, geo, rows_map)
                affine_span(x[a:b], out[a:b], mask, s[k], inv[k], z[k], qmin, qmax, False)


@cpu_kernel(parallel=True)
def float8_forward_kernel(x, out, mask, rows_map, s, geo, fmt, with_mask):  # pragma: no cover
    """Block-wise float8 fake quantization; ``s`` (nblocks,) float32, ``fmt`` the format id
    (:data:`nbqat.kernels.lowbit_formula.E4M3FN` / ``E5M2``); the rest as
    :func:`affine_forward_kernel`."""
    for it in prange(geo[7] * geo[6]):  # the mask test outside the unit loop, as above
        r, u0, u1 = item_units(it, geo)
        if with_mask:
            for u in range(u0, u1):
                k, a, b = unit_block(r, u, geo, rows_map)
                float8_span(x[a:b], out[a:b], mask[a:b], s[k], fmt, True)
        else:
            for u in range(u0, u1):
                k, a, b = unit_block(r, u, geo, rows_map)
                float8_span(x[a:b], out[a:b], mask, s[k], fmt, False)


@cpu_kernel(parallel=True)
def unit_minmax_kernel(x, geo, absmax):  # pragma: no cover
    """Per-unit NaN-propagating ``(min, max)`` of ``x`` (or ``(-, max |x|)`` when ``absmax``).

    Returns
    -------
    (rows * nseg * P, 2) float32
    """
    nunits, ni, rows = geo[2] * geo[3], geo[6], geo[7]
    part = np.empty((rows * nunits, 2), np.float32)
    for it in prange(rows * ni):
        r, u0, u1 = item_units(it, geo)
        for u in range(u0, u1):
            _, a, b = unit_of(r, u, geo)
            mn = np.float32(np.inf)
            mx = np.float32(-np.inf)
            for i in range(a, b):
                v = abs(x[i]) if absmax else x[i]
                mn = min_nan(mn, v)
                mx = max_nan(mx, v)
            part[r * nunits + u, 0] = mn
            part[r * nunits + u, 1] = mx
    return part


@cpu_kernel(parallel=False)
def merge_units(part, rows_map, geo, nblocks, sums):  # pragma: no cover
    """Merge the per-unit partials ``part`` (rows * nseg * P, c) into (nblocks, c) of
    ``part``'s dtype, serially in unit order: sums when ``sums``, else NaN-propagating
    ``(min, max)`` (c = 2)."""
    L, G, nseg, P, Cp, m, ni, rows = geo
    nunits = nseg * P
    c = part.shape[1]
    res = np.zeros((nblocks, c), part.dtype)
    if not sums:
        res[:, 0] = np.inf
        res[:, 1] = -np.inf
    for r in range(rows):
        fb = rows_map[r] * nseg
        for u in range(nunits):
            k = fb + (u if P == 1 else u // P)
            t = r * nunits + u
            if sums:
                for i in range(c):
                    res[k, i] += part[t, i]
            else:
                res[k, 0] = min_nan(res[k, 0], part[t, 0])
                res[k, 1] = max_nan(res[k, 1], part[t, 1])
    return res


def merge_minmax(part, rows_map, geo, nblocks):
    """Merge per-unit ``(min, max)`` partials into (nblocks, 2) float32, in unit order
    (:func:`merge_units`)."""
    return merge_units(part, rows_map, geo, nblocks, False)


@cpu_kernel(parallel=True)
def qparams_kernel(mm, scale, zp, qmin, qmax, eps, symmetric, div, zp_sym):  # pragma: no cover
    """``scale`` (nblocks,) float32 and ``zp`` (nblocks,) int32 from the block min/max
    ``mm`` (nblocks, 2) (:func:`nbqat.kernels.lowbit_formula.affine_qparams`)."""
    for k in prange(mm.shape[0]):
        sc, z = affine_qparams(mm[k, 0], mm[k, 1], qmin, qmax, eps, symmetric, div, zp_sym)
        scale[k] = sc
        zp[k] = zp_to_int32(z)


@cpu_kernel(parallel=True)
def float8_scale_kernel(mm, scale, lo, hi, fmt):  # pragma: no cover
    """``scale[k] = float8_scale(max |x| of block k)`` from ``mm`` (nblocks, 2)."""
    for k in prange(mm.shape[0]):
        scale[k] = float8_scale(mm[k, 1], lo, hi, fmt)


@cpu_kernel(parallel=True)
def affine_backward_kernel(
    x, grad_y, grad_x, rows_map, s, inv, z, geo, qmin, qmax
):  # pragma: no cover
    """LSQ backward of :func:`affine_forward_kernel`: writes ``grad_x`` (n,) float32.

    Returns
    -------
    (nblocks, 2) float32
        Per block ``(dscale, dzero_point)``: float64 sums per unit merged in unit order, then
        :func:`nbqat.kernels.lowbit_formula.affine_grad_block`.
    """
    nunits, ni, rows = geo[2] * geo[3], geo[6], geo[7]
    part = np.empty((rows * nunits, 3), np.float64)
    for it in prange(rows * ni):
        r, u0, u1 = item_units(it, geo)
        for u in range(u0, u1):
            k, a, b = unit_block(r, u, geo, rows_map)
            sk, ik, zk = s[k], inv[k], z[k]
            sa = 0.0
            sb = 0.0
            sc = 0.0
            for i in range(a, b):
                dx, ta, tb, tc = affine_grad_elem(x[i], grad_y[i], sk, ik, zk, qmin, qmax)
                grad_x[i] = dx
                sa += np.float64(ta)
                sb += np.float64(tb)
                sc += np.float64(tc)
            part[r * nunits + u, 0] = sa
            part[r * nunits + u, 1] = sb
            part[r * nunits + u, 2] = sc
    acc = merge_units(part, rows_map, geo, s.size, True)
    res = np.empty((s.size, 2), np.float32)
    for k in range(s.size):
        res[k, 0], res[k, 1] = affine_grad_block(acc[k, 0], acc[k, 1], acc[k, 2], inv[k])
    return res
