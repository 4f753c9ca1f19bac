"""CUDA twins of the counting kernels of :mod:`nbqat.kernels.histogram_cpu`.

Imported only once a CUDA array is seen. Each thread of a grid-stride loop converts an element
to float32 (any float dtype in), computes its bin with the CPU kernel's arithmetic (torch's
float32 ``histc`` formula, or float64 when ``wide``; the order-key grid) and adds 1 to a global
int64 counter with an atomic add. Integer addition is associative, so the counts do not depend
on scheduling: they equal the CPU kernel's exactly. The small L2 / percentile / MSE searches run
on the host from these counts.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from nbqat import _cuda
from nbqat._cuda import cuda
from nbqat.kernels import histogram_cpu as _hk
from nbqat.kernels import observe_cpu as _ok

_F32 = np.float32

#: The float64 instructions of the float16/float32 kernels: (at most, in PTX; why), see
#: :data:`nbqat.kernels.fake_quant_cuda.FLOAT64_USE`.
FLOAT64_USE = {
    "histc_kernel": (
        29,
        "torch.histc's bin formula as the CPU twin: float64 when `wide` (ranges whose float32 "
        "arithmetic overflows), and the float32 position truncated through float64",
    )
}


#: ``torch.histc``'s bin of one value (-1: outside or NaN): the CPU twin's scalar function
#: (:func:`nbqat.kernels.histogram_cpu.bin_f32`) compiled for the device, so the formula is
#: written once.
_bin = cuda.jit(device=True)(_hk.bin_f32.py_func)

#: The order key of float32 bits (:func:`nbqat.kernels.observe_cpu.order_key`, compiled for the
#: device: written once).
_order_key = _cuda.device_function(_ok.order_key)


@cuda.jit
def histc_kernel(x, lo, hi, bins, wide, counts):  # pragma: no cover
    """Add the ``torch.histc`` bin counts of ``x`` (any float dtype) into ``counts`` (int64)."""
    start = cuda.grid(1)
    stride = cuda.gridsize(1)
    for i in range(start, x.size, stride):
        p = _bin(np.float32(x[i]), lo, hi, bins, wide)
        if p >= 0:
            cuda.atomic.add(counts, p, 1)


@cuda.jit
def key_kernel(b, shift, counts):  # pragma: no cover
    """Add the order-key grid counts (``(key >> shift) + 2**(31-shift)``) of the finite values
    of float32 data given by its int32 bits ``b`` (NaN and +-Inf are not counted)."""
    start = cuda.grid(1)
    stride = cuda.gridsize(1)
    off = np.int64(1) << np.int64(31 - shift)
    for i in range(start, b.size, stride):
        w = b[i]
        if (w & np.int32(0x7F800000)) != np.int32(0x7F800000):
            k = _order_key(w)
            cuda.atomic.add(counts, np.int64(k >> np.int32(shift)) + off, 1)


def histc_counts(d: Any, lo: np.float32, hi: np.float32, bins: int, wide: bool) -> np.ndarray:
    """(bins,) int64 counts of the flat device array ``d`` (the CPU kernel's, exactly)."""
    counts = cuda.to_device(np.zeros(bins, np.int64))
    blocks, tpb = _cuda.grid_1d(d.size)
    histc_kernel[blocks, tpb](d, _F32(lo), _F32(hi), bins, bool(wide), counts)
    return counts.copy_to_host()


def key_counts(b: Any, shift: int) -> np.ndarray:
    """(2 ** (32 - shift),) int64 order-key grid counts of the flat int32 device view ``b``."""
    counts = cuda.to_device(np.zeros(1 << (32 - shift), np.int64))
    blocks, tpb = _cuda.grid_1d(b.size)
    key_kernel[blocks, tpb](b, shift, counts)
    return counts.copy_to_host()
