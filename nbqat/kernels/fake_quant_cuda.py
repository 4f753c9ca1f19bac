"""CUDA twins of :mod:`nbqat.kernels.fake_quant_cpu` (``@cuda.jit``), and their launchers.

Imported lazily by :mod:`nbqat.quantization.fake_quant` only once a CUDA array is seen (after
:func:`nbqat._cuda.require_cuda`). Kernels are dtype-generic (float32/float64; float16 device
arrays go through float32 temporaries and are rounded once on the way back) and use grid-stride
loops sized by :func:`nbqat._cuda.grid_1d`, read at call time. The arithmetic is the CPU kernels'
scalar functions (:mod:`nbqat.kernels.fake_quant_formula`) compiled for the device, so results
are identical (``rint`` is libdevice ``rintf``/``rint`` on the device: round half to even).

Reductions (LSQ) are two-stage and deterministic: per-thread float64 sums, a per-block
fixed-order sum over shared memory by thread 0, then a fixed-order pass over the block partials;
no float atomics. Device arrays must be C-contiguous.
"""

from __future__ import annotations

import numpy as np

from nbqat import _cuda
from nbqat import _validate as V
from nbqat._cuda import cuda
from nbqat.kernels import fake_quant_formula as _fm

#: Shared-memory slots per block for reductions (THREADS_PER_BLOCK must not exceed it).
_SMEM = 1024

_LSQ_F64 = (
    "deterministic float64 sums of the dS, dZ terms, and the in-range difference "
    "(xq - z) * s - x evaluated exactly in float64 (torch's FMA-contracted value)"
)
#: The float64 instructions of the float32 kernels, by kernel: (at most, in PTX; why). The PTX
#: audit (tests/test_cuda_compile.py) fails on any other float64 op of a float16/float32 path.
FLOAT64_USE = {
    "lsq_tensor_backward_kernel": (56, _LSQ_F64),
    "lsq_channel_backward_kernel": (98, _LSQ_F64),
}


# ----------------------------------------------------------------------------------------------
# device helpers: the CPU kernels' scalar formulas (nbqat.kernels.fake_quant_formula) compiled
# for the device, so each formula is written once
# ----------------------------------------------------------------------------------------------
_quantize_code = _cuda.device_function(_fm.quantize_code)
_gpu_fq = _cuda.device_function(_fm.fake_quant_elem, quantize_code=_quantize_code)
_gpu_ste = _cuda.device_function(_fm.ste_elem)
_gpu_lsq_terms = _cuda.device_function(_fm.lsq_terms, quantize_code=_quantize_code)


@cuda.jit(device=True, inline="always")
def _lsq_step(x, grad_y, grad_x, i, s, iv, z, qmin, qmax, gf, a, b):  # pragma: no cover
    """Write element ``i``'s ``grad_x`` and add its dS, dZ terms to the float64 sums a, b
    (explicit float64: the simulator follows NumPy 2 promotion, 0.0 + f32 = f32)."""
    dx, ds, dz = _gpu_lsq_terms(x, grad_y, i, s, iv, z, qmin, qmax, gf)
    grad_x[i] = dx
    return a + np.float64(ds), b + np.float64(dz)


@cuda.jit(device=True, inline="always")
def _block_sums(sds, sdz, a, b):  # pragma: no cover
    """The block's fixed-order float64 sums of every thread's ``(a, b)``, through the shared
    arrays ``sds``, ``sdz``: exact on thread 0 (which sums in thread order), zeros elsewhere."""
    tid = cuda.threadIdx.x
    sds[tid] = a
    sdz[tid] = b
    cuda.syncthreads()
    ta = np.float64(0.0)
    tb = np.float64(0.0)
    if tid == 0:
        for t in range(cuda.blockDim.x):
            ta += sds[t]
            tb += sdz[t]
    return ta, tb


# ----------------------------------------------------------------------------------------------
# kernels
# ----------------------------------------------------------------------------------------------
@cuda.jit
def cast_kernel(src, dst):  # pragma: no cover
    """``dst[i] = src[i]`` with a dtype conversion (float16 <-> float32), (n,) each."""
    start = cuda.grid(1)
    stride = cuda.gridsize(1)
    for i in range(start, src.size, stride):
        dst[i] = src[i]


@cuda.jit
def fq_tensor_kernel(x, out, mask, scale, inv, zp, qmin, qmax, with_mask):  # pragma: no cover
    """Per-tensor fake quantization; x, out (n,) float32|float64, mask (n,) bool or (1,)."""
    start = cuda.grid(1)
    stride = cuda.gridsize(1)
    for i in range(start, x.size, stride):
        y, m = _gpu_fq(x[i], scale, inv, zp, qmin, qmax)
        out[i] = y
        if with_mask:
            mask[i] = m


@cuda.jit
def fq_channel_kernel(
    x, out, mask, scale, inv, zp, channels, inner, qmin, qmax, with_mask
):  # pragma: no cover
    """Per-channel fake quantization over a flat (outer, C, inner) buffer; scale, inv, zp (C,)."""
    start = cuda.grid(1)
    stride = cuda.gridsize(1)
    for i in range(start, x.size, stride):
        c = (i // inner) % channels
        y, m = _gpu_fq(x[i], scale[c], inv[c], zp[c], qmin, qmax)
        out[i] = y
        if with_mask:
            mask[i] = m


@cuda.jit
def ste_backward_kernel(grad_y, mask, out, one, zero):  # pragma: no cover
    """``out = grad_y * mask`` (a multiply: NaN * 0 stays NaN), (n,) each; ``one``/``zero``
    are 1 and 0 of grad_y's dtype."""
    start = cuda.grid(1)
    stride = cuda.gridsize(1)
    for i in range(start, grad_y.size, stride):
        out[i] = _gpu_ste(grad_y[i], mask[i], one, zero)


@cuda.jit
def lsq_tensor_backward_kernel(
    x, grad_y, grad_x, scale, inv, zp, qmin, qmax, gf, partials
):  # pragma: no cover
    """Per-tensor LSQ backward; writes grad_x (n,) and per-block float64 sums partials
    (blocks, 1, 2)."""
    sds = cuda.shared.array(_SMEM, np.float64)
    sdz = cuda.shared.array(_SMEM, np.float64)
    a = np.float64(0.0)
    b = np.float64(0.0)
    for i in range(cuda.grid(1), x.size, cuda.gridsize(1)):
        a, b = _lsq_step(x, grad_y, grad_x, i, scale, inv, zp, qmin, qmax, gf, a, b)
    ta, tb = _block_sums(sds, sdz, a, b)
    if cuda.threadIdx.x == 0:
        partials[cuda.blockIdx.x, 0, 0] = ta
        partials[cuda.blockIdx.x, 0, 1] = tb


@cuda.jit
def sum_partials_kernel(partials, ds_out, dz_out):  # pragma: no cover
    """Fixed-order sum over the block axis of partials (blocks, C, 2) into float32 (C,)."""
    start = cuda.grid(1)
    stride = cuda.gridsize(1)
    for c in range(start, ds_out.size, stride):
        a = np.float64(0.0)
        b = np.float64(0.0)
        for j in range(partials.shape[0]):
            a += partials[j, c, 0]
            b += partials[j, c, 1]
        ds_out[c] = a
        dz_out[c] = b


@cuda.jit
def lsq_channel_backward_kernel(
    x, grad_y, grad_x, scale, inv, zp, outer, channels, inner, qmin, qmax, gf, ds_out, dz_out
):  # pragma: no cover
    """Per-channel LSQ backward: blocks stride over channels, a block's threads stride over the
    channel's (outer, inner) elements; thread 0 sums the block's float64 partials in order and
    stores float32 ``ds_out[c]``, ``dz_out[c]``."""
    sds = cuda.shared.array(_SMEM, np.float64)
    sdz = cuda.shared.array(_SMEM, np.float64)
    tid = cuda.threadIdx.x
    m_total = outer * inner
    for c in range(cuda.blockIdx.x, channels, cuda.gridDim.x):
        s = scale[c]
        iv = inv[c]
        z = zp[c]
        a = np.float64(0.0)
        b = np.float64(0.0)
        for m in range(tid, m_total, cuda.blockDim.x):
            o = m // inner
            i = (o * channels + c) * inner + (m - o * inner)
            a, b = _lsq_step(x, grad_y, grad_x, i, s, iv, z, qmin, qmax, gf, a, b)
        ta, tb = _block_sums(sds, sdz, a, b)
        if tid == 0:
            ds_out[c] = ta
            dz_out[c] = tb
        cuda.syncthreads()


# ----------------------------------------------------------------------------------------------
# launchers (plain Python; arguments already validated by nbqat.quantization.fake_quant)
# ----------------------------------------------------------------------------------------------
def _dev(a, name):
    """A C-contiguous Numba device array view of a CUDA array."""
    d = a if hasattr(a, "copy_to_host") else _cuda.as_device_array(a)
    V.check_device_contiguous(d, name)
    return d


def _flat(d):
    """``d`` as a 1-D view of its ``d.size`` elements (an empty one for an empty array)."""
    return d.reshape(int(d.size)) if d.ndim != 1 else d


def _compute_dtype(dt):
    return np.dtype(np.float64) if np.dtype(dt) == np.float64 else np.dtype(np.float32)


def _launch(kernel, n, *args):
    blocks, tpb = _cuda.grid_1d(n)
    kernel[blocks, tpb](*args)


def _as_t(flat, t):
    """``flat`` in dtype ``t`` (a float32 temporary for float16)."""
    if flat.dtype == t:
        return flat
    tmp = cuda.device_array(flat.size, t)
    _launch(cast_kernel, flat.size, flat, tmp)
    return tmp


def _scalars(t, s32, zp, qmin, qmax):
    T = t.type
    return T(s32), T(np.float32(1.0) / np.float32(s32)), T(zp), T(qmin), T(qmax)


def _forward(x, out, mask, with_mask, launch):
    """Device outputs (allocated unless given), flat ``t`` views (float32 temporaries for
    float16), ``launch(n, xf, of, mf, t)`` when ``x`` is not empty, the cast back; returns
    ``y`` or ``(y, mask)``."""
    x = _dev(x, "x")
    out = cuda.device_array(x.shape, x.dtype) if out is None else _dev(out, "out")
    if with_mask:
        mask = cuda.device_array(x.shape, np.bool_) if mask is None else _dev(mask, "mask")
    n = int(x.size)
    if n:
        t = _compute_dtype(x.dtype)
        of_final = _flat(out)
        of = of_final if of_final.dtype == t else cuda.device_array(n, t)
        mf = _flat(mask) if with_mask else cuda.device_array(1, np.bool_)
        xf = _cuda.unaliased(_as_t(_flat(x), t), of, mf)
        launch(n, xf, of, mf, t)
        if of is not of_final:
            _launch(cast_kernel, n, of, of_final)
    return (out, mask) if with_mask else out


def per_tensor(x, s32, zp, qmin, qmax, out, mask, with_mask):
    """Launch the per-tensor forward; returns ``y`` or ``(y, mask)`` as device arrays."""

    def launch(n, xf, of, mf, t):
        s, inv, z, lo, hi = _scalars(t, s32, zp, qmin, qmax)
        _launch(fq_tensor_kernel, n, xf, of, mf, s, inv, z, lo, hi, with_mask)

    return _forward(x, out, mask, with_mask, launch)


def _channel_arrays(t, s32, zp):
    inv = (np.float32(1.0) / s32).astype(t)
    return (
        cuda.to_device(np.ascontiguousarray(s32, dtype=t)),
        cuda.to_device(np.ascontiguousarray(inv)),
        cuda.to_device(np.ascontiguousarray(zp, dtype=t)),
    )


def per_channel(x, s32, zp, outer, channels, inner, qmin, qmax, out, mask, with_mask):
    """Launch the per-channel forward over the (outer, C, inner) view."""

    def launch(n, xf, of, mf, t):
        s, inv, z = _channel_arrays(t, s32, zp)
        lo, hi = t.type(qmin), t.type(qmax)
        _launch(fq_channel_kernel, n, xf, of, mf, s, inv, z, channels, inner, lo, hi, with_mask)

    return _forward(x, out, mask, with_mask, launch)


def ste_backward(g, mask, out):
    """Launch the STE backward ``grad_y * mask`` (a copy when ``mask`` is None)."""
    g = _dev(g, "grad_y")
    out = cuda.device_array(g.shape, g.dtype) if out is None else _dev(out, "out")
    n = int(g.size)
    if not n:
        return out
    oflat = _flat(out)
    gflat = _cuda.unaliased(_flat(g), oflat)
    if mask is None:
        _launch(cast_kernel, n, gflat, oflat)
        return out
    t = _compute_dtype(g.dtype)
    gt = _as_t(gflat, t)
    ot = oflat if oflat.dtype == t else cuda.device_array(n, t)
    mflat = _cuda.unaliased(_flat(_dev(mask, "mask")), ot)
    _launch(ste_backward_kernel, n, gt, mflat, ot, t.type(1), t.type(0))
    if ot is not oflat:
        _launch(cast_kernel, n, ot, oflat)
    return out


def _grad_x_out(x, t, n):
    gx = cuda.device_array(x.shape, x.dtype)
    gflat = _flat(gx)
    return gx, gflat, (gflat if gflat.dtype == t else cuda.device_array(n, t))


def lsq_tensor_backward(g, x, s32, zp, qmin, qmax, gf):
    """Launch the per-tensor LSQ backward; returns device (grad_x, grad_scale (1,),
    grad_zero_point (1,))."""
    x = _dev(x, "x")
    g = _dev(g, "grad_y")
    n = int(x.size)
    ds = cuda.to_device(np.zeros(1, np.float32))
    dz = cuda.to_device(np.zeros(1, np.float32))
    t = _compute_dtype(x.dtype)
    gx, gflat, gt = _grad_x_out(x, t, n)
    if not n:
        return gx, ds, dz
    blocks, tpb = _cuda.grid_1d(n)
    _cuda.check_reduction_threads(_SMEM)
    partials = cuda.device_array((blocks, 1, 2), np.float64)
    s, inv, z, lo, hi = _scalars(t, s32, zp, qmin, qmax)
    xf = _as_t(_flat(x), t)
    gyf = _as_t(_flat(g), t)
    lsq_tensor_backward_kernel[blocks, tpb](xf, gyf, gt, s, inv, z, lo, hi, t.type(gf), partials)
    sum_partials_kernel[1, 1](partials, ds, dz)
    if gt is not gflat:
        _launch(cast_kernel, n, gt, gflat)
    return gx, ds, dz


def lsq_channel_backward(g, x, s32, zp, outer, channels, inner, qmin, qmax, gf):
    """Launch the per-channel LSQ backward; returns device (grad_x, grad_scale (C,),
    grad_zero_point (C,))."""
    x = _dev(x, "x")
    g = _dev(g, "grad_y")
    n = int(x.size)
    ds = cuda.to_device(np.zeros(channels, np.float32))
    dz = cuda.to_device(np.zeros(channels, np.float32))
    t = _compute_dtype(x.dtype)
    gx, gflat, gt = _grad_x_out(x, t, n)
    if not n:
        return gx, ds, dz
    tpb = _cuda.check_reduction_threads(_SMEM)
    blocks = max(1, min(_cuda.MAX_BLOCKS, channels))
    T = t.type
    s, inv, z = _channel_arrays(t, s32, zp)
    xf = _as_t(_flat(x), t)
    gyf = _as_t(_flat(g), t)
    lsq_channel_backward_kernel[blocks, tpb](
        xf, gyf, gt, s, inv, z, outer, channels, inner, T(qmin), T(qmax), T(gf), ds, dz
    )
    if gt is not gflat:
        _launch(cast_kernel, n, gt, gflat)
    return gx, ds, dz
