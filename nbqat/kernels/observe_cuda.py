"""CUDA twins of :mod:`nbqat.kernels.observe_cpu` (imported only once a CUDA array is seen).

Compiled code only. Each thread reads any float dtype and converts to float32 (what
``x.to(torch.float32)`` does before torch's observers reduce), accumulates the finite minimum and
maximum and counts NaN, +Inf and -Inf in one grid-stride pass. Reductions have two stages and no
atomics: per-thread partials are combined in shared memory by a fixed-order tree, one partial per
block; a second, single-thread kernel merges the block partials in block order. Results therefore
do not depend on scheduling. ``-0.0`` orders below ``+0.0`` as on the CPU (order-key) kernels.

Launch configuration is read at call time from :mod:`nbqat._cuda` (``THREADS_PER_BLOCK`` at most
:data:`MAX_TPB`).
"""

from __future__ import annotations

import math

import numpy as np

from nbqat._cuda import cuda

#: Size of the shared-memory scratch (the largest supported threads-per-block).
MAX_TPB = 1024

# Typed float32 constants: a bare ``0``, ``1.0`` or ``math.inf`` next to a float32 value makes
# Numba compute in float64 (1/32 - 1/64 rate on consumer GPUs).
_F32 = np.float32
_ZERO = _F32(0.0)
_ONE = _F32(1.0)
_INF = _F32(math.inf)


@cuda.jit(device=True)
def _gpu_lt(a, b):
    """Strict float order with ``-0.0 < +0.0`` (matches the CPU order keys)."""
    if a < b:
        return True
    if a == b and a == _ZERO:
        return math.copysign(_ONE, a) < _ZERO and math.copysign(_ONE, b) > _ZERO
    return False


@cuda.jit(device=True)
def _gpu_accumulate(v, acc_min, acc_max, n_nan, n_pinf, n_ninf):
    """Fold one float32 value into a thread's running (min, max, counts)."""
    if v != v:
        n_nan += 1
    elif v == _INF:
        n_pinf += 1
    elif v == -_INF:
        n_ninf += 1
    else:
        if _gpu_lt(v, acc_min):
            acc_min = v
        if _gpu_lt(acc_max, v):
            acc_max = v
    return acc_min, acc_max, n_nan, n_pinf, n_ninf


@cuda.jit(device=True)
def _gpu_block_reduce(smin, smax, scnt, tid, bd):
    """Fixed-order tree reduction of a block's shared partials into slot 0."""
    s = 1
    while s < bd:
        if tid % (2 * s) == 0 and tid + s < bd:
            o = tid + s
            if _gpu_lt(smin[o], smin[tid]):
                smin[tid] = smin[o]
            if _gpu_lt(smax[tid], smax[o]):
                smax[tid] = smax[o]
            scnt[tid, 0] += scnt[o, 0]
            scnt[tid, 1] += scnt[o, 1]
            scnt[tid, 2] += scnt[o, 2]
        cuda.syncthreads()
        s *= 2


@cuda.jit(device=True)
def _gpu_block_store(smin, smax, scnt, tid, bd, acc, out_min, out_max, out_cnt, slot):
    """Reduce every thread's ``acc`` (min, max, NaN, +Inf, -Inf counts) over the block and let
    thread 0 write the result to ``out_*[slot]``."""
    smin[tid] = acc[0]
    smax[tid] = acc[1]
    scnt[tid, 0] = acc[2]
    scnt[tid, 1] = acc[3]
    scnt[tid, 2] = acc[4]
    cuda.syncthreads()
    _gpu_block_reduce(smin, smax, scnt, tid, bd)
    if tid == 0:
        out_min[slot] = smin[0]
        out_max[slot] = smax[0]
        out_cnt[slot, 0] = scnt[0, 0]
        out_cnt[slot, 1] = scnt[0, 1]
        out_cnt[slot, 2] = scnt[0, 2]


@cuda.jit
def minmax_partials_kernel(x, pmin, pmax, pcnt):  # pragma: no cover
    """Stage 1 per tensor: one (min, max, counts) partial per block.

    Parameters
    ----------
    x : (n,) float16/float32/float64 device array, C-contiguous
    pmin, pmax : (blocks,) float32
        Finite minimum / maximum of the block's elements (+Inf / -Inf when none is finite).
    pcnt : (blocks, 3) int64
        Counts of NaN, +Inf and -Inf.
    """
    smin = cuda.shared.array(MAX_TPB, np.float32)
    smax = cuda.shared.array(MAX_TPB, np.float32)
    scnt = cuda.shared.array((MAX_TPB, 3), np.int64)
    tid = cuda.threadIdx.x
    bd = cuda.blockDim.x
    acc_min = _INF
    acc_max = -_INF
    n_nan = 0
    n_pinf = 0
    n_ninf = 0
    start = cuda.blockIdx.x * bd + tid
    stride = cuda.gridDim.x * bd
    for i in range(start, x.size, stride):
        acc_min, acc_max, n_nan, n_pinf, n_ninf = _gpu_accumulate(
            np.float32(x[i]), acc_min, acc_max, n_nan, n_pinf, n_ninf
        )
    acc = (acc_min, acc_max, n_nan, n_pinf, n_ninf)
    _gpu_block_store(smin, smax, scnt, tid, bd, acc, pmin, pmax, pcnt, cuda.blockIdx.x)


@cuda.jit
def minmax_final_kernel(pmin, pmax, pcnt, out_min, out_max, out_cnt):  # pragma: no cover
    """Stage 2 per tensor: merge the block partials in block order (one thread).

    Parameters
    ----------
    pmin, pmax : (blocks,) float32; pcnt : (blocks, 3) int64 (from stage 1)
    out_min, out_max : (1,) float32; out_cnt : (1, 3) int64
    """
    if cuda.threadIdx.x == 0 and cuda.blockIdx.x == 0:
        mn = pmin[0]
        mx = pmax[0]
        c0 = pcnt[0, 0]
        c1 = pcnt[0, 1]
        c2 = pcnt[0, 2]
        for b in range(1, pmin.size):
            if _gpu_lt(pmin[b], mn):
                mn = pmin[b]
            if _gpu_lt(mx, pmax[b]):
                mx = pmax[b]
            c0 += pcnt[b, 0]
            c1 += pcnt[b, 1]
            c2 += pcnt[b, 2]
        out_min[0] = mn
        out_max[0] = mx
        out_cnt[0, 0] = c0
        out_cnt[0, 1] = c1
        out_cnt[0, 2] = c2


@cuda.jit
def minmax_channel_kernel(x, outer, nchan, inner, out_min, out_max, out_cnt):  # pragma: no cover
    """Per channel over an (outer, C, inner) view: blocks stride over channels, the threads
    of a block stride over the channel's ``outer * inner`` elements and reduce in shared memory.

    Parameters
    ----------
    x : (outer * C * inner,) float device array, C-contiguous
    outer, nchan, inner : int
    out_min, out_max : (C,) float32
        Finite minimum / maximum per channel (+Inf / -Inf when none is finite).
    out_cnt : (C, 3) int64
        NaN, +Inf, -Inf counts per channel.
    """
    smin = cuda.shared.array(MAX_TPB, np.float32)
    smax = cuda.shared.array(MAX_TPB, np.float32)
    scnt = cuda.shared.array((MAX_TPB, 3), np.int64)
    tid = cuda.threadIdx.x
    bd = cuda.blockDim.x
    m = outer * inner
    for c in range(cuda.blockIdx.x, nchan, cuda.gridDim.x):
        acc_min = _INF
        acc_max = -_INF
        n_nan = 0
        n_pinf = 0
        n_ninf = 0
        for t in range(tid, m, bd):
            o = t // inner
            j = t - o * inner
            acc_min, acc_max, n_nan, n_pinf, n_ninf = _gpu_accumulate(
                np.float32(x[(o * nchan + c) * inner + j]), acc_min, acc_max, n_nan, n_pinf, n_ninf
            )
        acc = (acc_min, acc_max, n_nan, n_pinf, n_ninf)
        _gpu_block_store(smin, smax, scnt, tid, bd, acc, out_min, out_max, out_cnt, c)
        cuda.syncthreads()
