"""CUDA twins of :mod:`nbqat.kernels.lowbit_cpu` (``@cuda.jit``), and their launchers.

Imported lazily (after :func:`nbqat._cuda.require_cuda`). The element arithmetic is
:mod:`nbqat.kernels.lowbit_formula` compiled for the device by
:func:`nbqat._cuda.device_function`, its per-target helpers (``rint32``, ``f32_bits``,
``bits_f32``) substituted by :func:`nbqat._cuda.device_scalar_helpers`, so every result is the
CPU kernels' bit for bit. Element-wise kernels are grid-stride loops over the flat float32
array (element ``i`` is row ``i // L``, block ``rows_map[row] * nseg + (i % L) // G``).
Reductions: one thread per unit (as the CPU kernels' partials), one thread per segment column
merging the units in (row, piece) order, the CPU merge order, so reductions are identical too.
``rint`` is rebound to the device's by :func:`nbqat._cuda.device_function` (as in
:mod:`nbqat.kernels.fake_quant_cuda`); the bit casts and the unfused product are
:func:`nbqat._cuda.device_scalar_helpers`.
Arguments are validated by :mod:`nbqat.quantization.affine` / :mod:`nbqat.quantization.float8`
before any launch.
"""

from __future__ import annotations

import numpy as np

from nbqat import _cuda
from nbqat import _validate as V
from nbqat._cuda import cuda
from nbqat.kernels import lowbit_formula as _fm
from nbqat.kernels import observer_formula as _of

#: The float64 instructions of the float32 kernels, by kernel: (at most, in PTX; why).
_SUMS = "per-unit LSQ sums accumulated in float64, merged in a fixed order (deterministic)"
FLOAT64_USE = {
    "backward_units_kernel": (96, _SUMS),  # 84 with NVVM 12.9: the sum loop unrolled
    "merge_units_kernel": (8, _SUMS),
    "grad_block_kernel": (8, "the float64 block sums rounded once to float32"),
}

_h = _cuda.device_scalar_helpers()
_df = _cuda.device_function
_min = _df(_fm.min_nan)
_max = _df(_fm.max_nan)
_clamp = _df(_fm.clamp_nan)
_affine = _df(_fm.affine_elem, clamp_nan=_clamp)
_affine_grad = _df(_fm.affine_grad_elem, clamp_nan=_clamp)
_grad_block = _df(_fm.affine_grad_block, mul_rn=_h["mul_rn"])
_scale = _df(_of.affine_scale, min_nan=_min, max_nan=_max)
_qparams = _df(_fm.affine_qparams, affine_scale=_scale, clamp_nan=_clamp)
_zp_int = _df(_fm.zp_to_int32)
_round8 = _df(_fm.round_float8, f32_bits=_h["f32_bits"], bits_f32=_h["bits_f32"])
_float8 = _df(_fm.float8_elem, round_float8=_round8, clamp_nan=_clamp)
_f8scale = _df(_fm.float8_scale, clamp_nan=_clamp)
_unit_span = _df(_fm.unit_span)


@cuda.jit
def affine_forward_kernel(
    x, out, mask, rows_map, s, inv, z, L, G, nseg, qmin, qmax, with_mask
):  # pragma: no cover
    """Block-wise affine fake quantization; x, out (n,) float32, mask (n,) bool or (1,)."""
    for i in range(cuda.grid(1), x.size, cuda.gridsize(1)):
        r = i // L
        k = rows_map[r] * nseg + (i - r * L) // G
        y, m = _affine(x[i], s[k], inv[k], z[k], qmin, qmax)
        out[i] = y
        if with_mask:
            mask[i] = m


@cuda.jit
def float8_forward_kernel(
    x, out, mask, rows_map, s, L, G, nseg, fmt, with_mask
):  # pragma: no cover
    """Block-wise float8 fake quantization; s (nblocks,) float32."""
    for i in range(cuda.grid(1), x.size, cuda.gridsize(1)):
        r = i // L
        k = rows_map[r] * nseg + (i - r * L) // G
        y, m = _float8(x[i], s[k], fmt)
        out[i] = y
        if with_mask:
            mask[i] = m


@cuda.jit
def unit_minmax_kernel(x, L, G, nseg, P, Cp, absmax, part):  # pragma: no cover
    """Per-unit NaN-propagating (min, max) (of |x| when ``absmax``) into part (units, 2)."""
    nunits = nseg * P
    for t in range(cuda.grid(1), part.shape[0], cuda.gridsize(1)):
        r = t // nunits
        j, a, b = _unit_span(t - r * nunits, P, G, Cp)
        mn = np.float32(np.inf)
        mx = np.float32(-np.inf)
        for i in range(r * L + a, r * L + b):
            v = abs(x[i]) if absmax else x[i]
            mn = _min(mn, v)
            mx = _max(mx, v)
        part[t, 0] = mn
        part[t, 1] = mx


@cuda.jit
def merge_units_kernel(part, rows_map, nseg, P, res, sums):  # pragma: no cover
    """One thread per segment column: merge its units' partials ``part`` (units, c) into
    ``res`` (nblocks, c) in row order (the CPU merge order): sums when ``sums``, else
    NaN-propagating (min, max) (c = 2)."""
    nunits = nseg * P
    rows = part.shape[0] // nunits
    for j in range(cuda.grid(1), nseg, cuda.gridsize(1)):
        for r in range(rows):
            k = rows_map[r] * nseg + j
            for p in range(P):
                t = r * nunits + j * P + p
                if sums:
                    for c in range(part.shape[1]):
                        res[k, c] += part[t, c]
                else:
                    res[k, 0] = _min(res[k, 0], part[t, 0])
                    res[k, 1] = _max(res[k, 1], part[t, 1])


@cuda.jit
def qparams_kernel(mm, scale, zp, qmin, qmax, eps, symmetric, div, zp_sym):  # pragma: no cover
    """Per block: scale (nblocks,) float32, zp (nblocks,) int32 from mm (nblocks, 2)."""
    for k in range(cuda.grid(1), mm.shape[0], cuda.gridsize(1)):
        sc, zf = _qparams(mm[k, 0], mm[k, 1], qmin, qmax, eps, symmetric, div, zp_sym)
        scale[k] = sc
        zp[k] = _zp_int(zf)


@cuda.jit
def float8_scale_kernel(mm, scale, lo, hi, fmt):  # pragma: no cover
    """Per block: the float8 scale from max |x| (mm[:, 1])."""
    for k in range(cuda.grid(1), mm.shape[0], cuda.gridsize(1)):
        scale[k] = _f8scale(mm[k, 1], lo, hi, fmt)


@cuda.jit
def backward_units_kernel(
    x, grad_y, grad_x, rows_map, s, inv, z, L, G, nseg, P, Cp, qmin, qmax, part
):  # pragma: no cover
    """Per unit: grad_x of its elements and the float64 sums (a, b, c) into part (units, 3)."""
    nunits = nseg * P
    for t in range(cuda.grid(1), part.shape[0], cuda.gridsize(1)):
        r = t // nunits
        j, a, b = _unit_span(t - r * nunits, P, G, Cp)
        k = rows_map[r] * nseg + j
        sa = np.float64(0.0)
        sb = np.float64(0.0)
        sc = np.float64(0.0)
        for i in range(r * L + a, r * L + b):
            dx, ta, tb, tc = _affine_grad(x[i], grad_y[i], s[k], inv[k], z[k], qmin, qmax)
            grad_x[i] = dx
            sa += np.float64(ta)
            sb += np.float64(tb)
            sc += np.float64(tc)
        part[t, 0] = sa
        part[t, 1] = sb
        part[t, 2] = sc


@cuda.jit
def grad_block_kernel(acc, inv, ds, dz):  # pragma: no cover
    """Per block: (dscale, dzero_point) float32 from the sums acc (nblocks, 3)."""
    for k in range(cuda.grid(1), acc.shape[0], cuda.gridsize(1)):
        ds[k], dz[k] = _grad_block(acc[k, 0], acc[k, 1], acc[k, 2], inv[k])


# ----------------------------------------------------------------------------------------------
# launchers (plain Python; arguments already validated)
# ----------------------------------------------------------------------------------------------
def _dev(a, name):
    """A flat C-contiguous device view of a CUDA array."""
    d = a if hasattr(a, "copy_to_host") else _cuda.as_device_array(a)
    V.check_device_contiguous(d, name)
    return d.reshape(max(int(d.size), 1)) if d.ndim != 1 else d


def _launch(kernel, n, *args):
    blocks, tpb = _cuda.grid_1d(max(int(n), 1))
    kernel[blocks, tpb](*args)


def _vec(a, dtype):
    """A 1-D device array of ``a`` (host arrays copied, device arrays viewed)."""
    if hasattr(a, "copy_to_host") or hasattr(a, "__cuda_array_interface__"):
        return _dev(a, "scale")
    return cuda.to_device(np.ascontiguousarray(np.asarray(a, dtype).reshape(-1)))


def _outputs(x, out, mask, with_mask):
    out = cuda.device_array(x.shape, np.float32) if out is None else out
    if with_mask and mask is None:
        mask = cuda.device_array(x.shape, np.bool_)
    return out, mask


def _buffers(x, out, mask, with_mask):
    """Flat device ``x``, ``out`` and mask (a dummy without one); ``x`` copied when ``out`` or
    the mask overlaps it (:func:`nbqat._cuda.unaliased`): a thread must not overwrite an
    element another thread has yet to read."""
    mf = _dev(mask, "mask") if with_mask else cuda.device_array(1, np.bool_)
    od = _dev(out, "out")
    return _cuda.unaliased(_dev(x, "x"), od, mf), od, mf


def affine_forward(x, b, s, inv, z, qmin, qmax, out, mask, with_mask):
    """Launch the block-wise affine forward; s, inv, z host or device (nblocks,) float32."""
    out, mask = _outputs(x, out, mask, with_mask)
    n = int(x.size)
    if n:
        L, G, nseg = b.geo[:3]
        xd, od, mf = _buffers(x, out, mask, with_mask)
        args = (_vec(s, np.float32), _vec(inv, np.float32), _vec(z, np.float32))
        rm = cuda.to_device(b.rows_map)
        T = np.float32
        _launch(
            affine_forward_kernel, n, xd, od, mf, rm, *args,
            L, G, nseg, T(qmin), T(qmax), with_mask,
        )  # fmt: skip
    return (out, mask) if with_mask else out


def float8_forward(x, b, s, fmt, out, mask, with_mask):
    """Launch the block-wise float8 forward; s (nblocks,) float32 host or device."""
    out, mask = _outputs(x, out, mask, with_mask)
    n = int(x.size)
    if n:
        L, G, nseg = b.geo[:3]
        xd, od, mf = _buffers(x, out, mask, with_mask)
        sd = _vec(s, np.float32)
        rm = cuda.to_device(b.rows_map)
        _launch(
            float8_forward_kernel, n, xd, od, mf, rm, sd,
            L, G, nseg, fmt, with_mask,
        )  # fmt: skip
    return (out, mask) if with_mask else out


def _block_minmax(x, b, absmax):
    L, G, nseg, P, Cp = b.geo[:5]
    rows = b.geo[7]
    part = cuda.device_array((rows * nseg * P, 2), np.float32)
    _launch(unit_minmax_kernel, part.shape[0], _dev(x, "x"), L, G, nseg, P, Cp, absmax, part)
    init = np.empty((b.nblocks, 2), np.float32)
    init[:, 0], init[:, 1] = np.inf, -np.inf
    res = cuda.to_device(init)
    _launch(merge_units_kernel, nseg, part, cuda.to_device(b.rows_map), nseg, P, res, False)
    return res


def choose_qparams(x, b, qmin, qmax, eps, symmetric, div, zp_sym):
    """Launch the affine qparams reduction; returns device (scale, zero_point) (nblocks,)."""
    mm = _block_minmax(x, b, False)
    scale = cuda.device_array(b.nblocks, np.float32)
    zp = cuda.device_array(b.nblocks, np.int32)
    T = np.float32
    _launch(
        qparams_kernel, b.nblocks, mm, scale, zp, T(qmin), T(qmax), T(eps), symmetric,
        T(div), T(zp_sym),
    )  # fmt: skip
    return scale, zp


def choose_scale_float8(x, b, lo, hi, fmt):
    """Launch the float8 scale reduction; returns the device scale (nblocks,)."""
    mm = _block_minmax(x, b, True)
    scale = cuda.device_array(b.nblocks, np.float32)
    _launch(float8_scale_kernel, b.nblocks, mm, scale, np.float32(lo), np.float32(hi), fmt)
    return scale


def affine_backward(g, x, b, s, inv, z, qmin, qmax):
    """Launch the LSQ backward; returns device (grad_x (x.shape), dscale, dzp (nblocks,))."""
    gx = cuda.device_array(x.shape, np.float32)
    ds = cuda.device_array(b.nblocks, np.float32)
    dz = cuda.device_array(b.nblocks, np.float32)
    if not int(x.size):
        return gx, ds, dz
    L, G, nseg, P, Cp = b.geo[:5]
    rows = b.geo[7]
    rm = cuda.to_device(b.rows_map)
    sd, ivd, zd = _vec(s, np.float32), _vec(inv, np.float32), _vec(z, np.float32)
    part = cuda.device_array((rows * nseg * P, 3), np.float64)
    T = np.float32
    _launch(
        backward_units_kernel, part.shape[0], _dev(x, "x"), _dev(g, "grad_y"), _dev(gx, "gx"),
        rm, sd, ivd, zd, L, G, nseg, P, Cp, T(qmin), T(qmax), part,
    )  # fmt: skip
    acc = cuda.to_device(np.zeros((b.nblocks, 3), np.float64))
    _launch(merge_units_kernel, nseg, part, rm, nseg, P, acc, True)
    _launch(grad_block_kernel, b.nblocks, acc, ivd, ds, dz)
    return gx, ds, dz
