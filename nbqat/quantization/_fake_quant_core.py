"""The host side of the fake-quantize forwards shared by :mod:`nbqat.quantization.fake_quant` and
:mod:`nbqat.quantization.lsq`: validation, dtypes, flat views, outputs written in place or
through temporaries, host/device dispatch (plain Python; the arithmetic is the kernels')."""

from __future__ import annotations

from typing import Any

import numba
import numpy as np

from nbqat import _validate as V
from nbqat._jit import threads_for
from nbqat.kernels import fake_quant_cpu as _k
from nbqat.quantization import _validate_qparams as VQ

_NO_MASK = np.zeros(1, np.bool_)  # dummy mask argument when no mask is wanted
_F16 = np.dtype(np.float16)
_F32 = np.dtype(np.float32)
_F64 = np.dtype(np.float64)
_BOOL = np.dtype(np.bool_)


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


def _is_gpu(**arrays: Any) -> bool:
    """True when the named arrays (None skipped) are CUDA arrays (TypeError when mixed)."""
    return V.check_same_device(arrays)


def _outputs_on_gpu(x: Any, out: Any, mask: Any, with_mask: bool) -> bool:
    """Check a forward's ``out`` (and ``mask`` when it returns one) against the checked input
    ``x``; True when the arrays are CUDA arrays (TypeError when host and device are mixed)."""
    if out is not None:
        V.check_out(out, x.shape, x.dtype, "out")
    if with_mask and mask is not None:
        V.check_mask(mask, x.shape, "mask")
    on_gpu = _is_gpu(x=x, out=out, mask=mask if with_mask else None)
    if with_mask and out is not None and mask is not None:
        if on_gpu:
            from nbqat import _cuda

            shared = _cuda.shares_bytes(out, mask)
        else:
            shared = np.may_share_memory(out, mask) and np.shares_memory(out, mask)
        if shared:
            raise ValueError(
                "out and mask share memory: both are written (the one written last "
                "would overwrite the other's bytes); pass separate buffers"
            )
    return on_gpu


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


def _param_copy(a: Any, t: Any) -> np.ndarray:
    """A private flat C-contiguous ``t`` copy of a per-channel / per-block parameter (scale,
    zero point: one value per channel or block, so cheap): the kernels read it while they write
    ``out`` and ``mask``, which may be the caller's array it views (``scale=out[0]``)."""
    return np.array(a, dtype=t, order="C").reshape(-1)


def _channel_arrays(t: np.dtype, s32: np.ndarray, zp: np.ndarray) -> tuple:
    inv32 = np.float32(1.0) / s32
    return _param_copy(s32, t), np.ascontiguousarray(inv32, dtype=t), _param_copy(zp, t)


def _by_outer(outer: int, inner: int) -> bool:
    return inner == 1 and outer >= 2 * numba.get_num_threads()


def _run_forward(x: np.ndarray, out: Any, mask: Any, with_mask: bool, launch: Any) -> Any:
    """The host side of a fake-quantize forward: flat ``t`` views of ``x``, ``out`` and
    ``mask`` (temporaries where they cannot be written directly), ``launch(xf, of, mf, t)``
    run on the kernel threads when ``x`` is not empty, then the results in ``x``'s shape and
    dtype: ``y`` or ``(y, mask)``."""
    t = _compute_dtype(x.dtype)
    n = x.size
    xf = _flat_in(x, t)
    of = _flat_out(out, t, n, (xf,))
    mf = _flat_out(mask, _BOOL, n, (xf, of)) if with_mask else _NO_MASK
    if n:
        with threads_for(n):
            launch(xf, of, mf, t)
    y = _finish(out, of, x.shape, x.dtype)
    if not with_mask:
        return y
    return y, _finish(mask, mf, x.shape, _BOOL)


def _per_tensor(x, scale, zero_point, quant_min, quant_max, out, mask, with_mask, zp_float=False):
    qmin, qmax = VQ.check_quant_range(quant_min, quant_max)
    s32 = VQ.check_scale(scale)
    if zp_float:
        zp = float(min(max(np.rint(VQ.check_float_zero_point(zero_point)), qmin), qmax))
    else:
        zp = VQ.check_zero_point(zero_point, qmin, qmax)
    x = V.check_float_array(x, "x")
    if _outputs_on_gpu(x, out, mask, with_mask):
        return _gpu().per_tensor(x, s32, zp, qmin, qmax, out, mask, with_mask)

    def launch(xf, of, mf, t):
        s, inv, z, lo, hi = _tensor_scalars(t, s32, zp, qmin, qmax)
        _k.fq_tensor_kernel(xf, of, mf, s, inv, z, lo, hi, with_mask)

    return _run_forward(x, out, mask, with_mask, launch)


def _per_channel(
    x, scale, zero_point, axis, quant_min, quant_max, out, mask, with_mask, zp_float=False
):
    qmin, qmax = VQ.check_quant_range(quant_min, quant_max)
    x = V.check_float_array(x, "x")
    ax = V.normalize_axis(axis, x.ndim)
    outer, C, inner = V.split_axis(tuple(x.shape), ax)
    s32, zp = VQ.check_channel_qparams(scale, zero_point, C, qmin, qmax, float_zero_point=zp_float)
    if zp_float:  # learnable zero point: round half to even, clamp (torch's round().clamp_())
        zp = np.clip(np.rint(zp), qmin, qmax).astype(np.int32)
    if _outputs_on_gpu(x, out, mask, with_mask):
        G = _gpu()
        return G.per_channel(x, s32, zp, outer, C, inner, qmin, qmax, out, mask, with_mask)
    by_outer = _by_outer(outer, inner)

    def launch(xf, of, mf, t):
        s, inv, z = _channel_arrays(t, s32, zp)
        lo, hi = t.type(qmin), t.type(qmax)
        _k.fq_channel_kernel(xf, of, mf, s, inv, z, outer, C, inner, lo, hi, with_mask, by_outer)

    return _run_forward(x, out, mask, with_mask, launch)
