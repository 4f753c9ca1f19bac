"""CUDA twins of :mod:`nbqat.kernels.norm_cpu`: gradient norms and in-place scaling/clamping.

Fast path: the arrays of one dtype are C-contiguous and tile one contiguous address range (the
layer graph's gradients, views of one flat buffer): one covering 1-D device array is built over
the range and every pass is ONE kernel launch, whatever the number of arrays. Otherwise each
array (C-contiguous) is processed by its own launch into the same partials buffer.

Norm: two stages, no float atomics. Stage 1 (:func:`seg_partials_kernel`): each block reduces
fixed work items of :data:`~nbqat.kernels.norm_cpu.CHUNK` elements (grid-stride over items),
threads accumulate strided terms in float64 and thread 0 merges the block's shared-memory
partials serially in thread order; the item's partial (and its max ``|x|``) goes to global
memory. Stage 2 is the fixed-order final pass
:func:`nbqat.kernels.norm_cpu.merge_items` over the item partials (a few KiB copied to the
host, where the total is needed anyway). Terms are rounded to the compute type exactly as on the
CPU, so results agree with the CPU twin to float64 summation-order rounding.
"""

from __future__ import annotations

import numpy as np

from nbqat import _cuda
from nbqat import _validate as V
from nbqat._cuda import cuda
from nbqat.kernels import norm_cpu as _k

_MAX_TPB = 1024  # shared-memory partials per block (THREADS_PER_BLOCK must not exceed it)

#: The float64 instructions of the float16/float32 kernels: (at most, in PTX; why), see
#: :data:`nbqat.kernels.fake_quant_cuda.FLOAT64_USE`.
FLOAT64_USE = {
    "seg_partials_kernel": (
        220,
        "deterministic float64 accumulators of the norm terms and of max |x|, and the general "
        "p-norm's |x| ** p in float64 rounded to float32 (the CPU twin's terms)",
    )
}


@cuda.jit(device=True)
def _gpu_term(x, kind, p, c32):
    """One element's contribution as float64, rounded to the compute type (as the CPU)."""
    if kind == 0:  # L2
        if c32:
            xf = np.float32(x)
            return np.float64(xf * xf)
        xd = np.float64(x)
        return xd * xd
    a = abs(np.float64(x))
    if kind == 1 or kind == 2:
        return a
    if c32:
        return np.float64(np.float32(a ** np.float64(np.float32(p))))
    return a**p


@cuda.jit(device=True)
def _gpu_combine(acc, t, kind):
    if kind == 2:
        if t > acc or t != t:
            return t
        return acc
    return acc + t


@cuda.jit
def seg_partials_kernel(buf, table, starts, kind, p, c32, red, amax):
    """Stage 1: per-work-item partials.

    buf : (N,) device array (float16/float32/float64), the covering buffer.
    table : (n_seg, 3) int64 [offset into buf, n elements, owner].
    starts : (n_seg + 1,) int64, first work item of each segment.
    red, amax : (n_items,) float64 outputs (this launch writes items starts[0]..starts[-1]).
    """
    sred = cuda.shared.array(_MAX_TPB, np.float64)
    smax = cuda.shared.array(_MAX_TPB, np.float64)
    tid = cuda.threadIdx.x
    nthreads = cuda.blockDim.x
    nseg = table.shape[0]
    w0 = starts[0]
    nitems = starts[nseg] - w0
    for wl in range(cuda.blockIdx.x, nitems, cuda.gridDim.x):
        w = w0 + wl
        lo_s = 0
        hi_s = nseg
        while hi_s - lo_s > 1:  # segment s with starts[s] <= w < starts[s + 1]
            mid = (lo_s + hi_s) // 2
            if starts[mid] <= w:
                lo_s = mid
            else:
                hi_s = mid
        s = lo_s
        off = table[s, 0]
        n = table[s, 1]
        lo = (w - starts[s]) * _k.CHUNK
        hi = min(n, lo + _k.CHUNK)
        acc = 0.0
        mx = 0.0
        for i in range(lo + tid, hi, nthreads):
            x = buf[off + i]
            acc = _gpu_combine(acc, _gpu_term(x, kind, p, c32), kind)
            mx = _gpu_combine(mx, abs(np.float64(x)), 2)
        sred[tid] = acc
        smax[tid] = mx
        cuda.syncthreads()
        if tid == 0:
            a = sred[0]
            m = smax[0]
            for t in range(1, nthreads):  # fixed thread order
                a = _gpu_combine(a, sred[t], kind)
                m = _gpu_combine(m, smax[t], 2)
            red[wl] = a
            amax[wl] = m
        cuda.syncthreads()


@cuda.jit
def apply_kernel(buf, op, a, b, c32):
    """In place over the whole buffer: ``x *= a`` (op 0, in float32 op-math when ``c32``) or
    ``x = clamp(x, a, b)`` (op 1; NaN stays NaN). ``a``, ``b`` are float32 when ``c32`` (float16
    and float32 buffers), float64 otherwise."""
    start, stride = cuda.grid(1), cuda.gridsize(1)
    for i in range(start, buf.shape[0], stride):
        x = buf[i]
        if op == 0:
            if c32:
                buf[i] = np.float32(x) * np.float32(a)
            else:
                buf[i] = x * a
        else:
            if x < a:
                buf[i] = a
            elif x > b:
                buf[i] = b


# --------------------------------------------------------------------------------------------
# host side


def _is_sim(x) -> bool:
    return type(x).__name__ == "FakeCUDAArray"


def _addr(x) -> int:
    return _cuda.device_span(x)[0]


def _contiguous(x) -> bool:
    if _is_sim(x):
        return bool(x._ary.flags.c_contiguous)
    return bool(x.is_c_contiguous())


def _cover(x0, lo: int, n: int, dtype: np.dtype):
    """A (n,) device array over the n elements at address ``lo`` (inside the buffers of the
    tiling arrays, which keep the memory alive through ``x0``)."""
    if _is_sim(x0):
        import ctypes

        raw = (ctypes.c_char * (n * dtype.itemsize)).from_address(lo)
        host = np.frombuffer(raw, dtype=dtype, count=n)
        return type(x0)(host)
    desc = {"shape": (n,), "strides": None, "typestr": dtype.str, "data": (lo, False),
            "version": 3}  # fmt: skip
    return cuda.from_cuda_array_interface(desc, owner=x0, sync=False)


class _Group:
    __slots__ = ("dtype", "bufs", "tables", "starts", "seg_n", "seg_owner", "positions")


def plan(grads: list):
    """Group the CUDA arrays by dtype and find the one-launch (tiling) layout where possible.

    Returns
    -------
    (list of _Group, numpy dtype)
        The groups and torch's result dtype of the stacked norms.

    Raises
    ------
    TypeError, ValueError
        Unsupported dtype, non-contiguous CUDA arrays.
    """
    grads = [g if hasattr(g, "copy_to_host") else cuda.as_cuda_array(g) for g in grads]
    by_dtype: dict[np.dtype, list[int]] = {}
    for i, g in enumerate(grads):
        V.check_float_array(g, f"grads[{i}]")
        dt = np.dtype(g.dtype)
        if g.size and not _contiguous(g):
            raise ValueError(
                f"grads[{i}] is a non-contiguous CUDA array; pass a contiguous copy "
                "(the CUDA path supports C-contiguous arrays only)"
            )
        by_dtype.setdefault(dt, []).append(i)
    groups = []
    for dt, positions in by_dtype.items():
        grp = _Group()
        grp.dtype, grp.positions = dt, positions
        sizes = [int(grads[i].size) for i in positions]
        addrs = [_addr(grads[i]) for i in positions]
        order = sorted((a, k) for k, a in enumerate(addrs) if sizes[k])
        tiles = all(
            order[j + 1][0] == order[j][0] + sizes[order[j][1]] * dt.itemsize
            for j in range(len(order) - 1)
        )
        grp.seg_n = np.array([sizes[k] for _, k in order], np.int64)
        grp.seg_owner = np.array([k for _, k in order], np.int64)
        n_items = (grp.seg_n + _k.CHUNK - 1) // _k.CHUNK
        grp.starts = np.concatenate([[0], np.cumsum(n_items)]).astype(np.int64)
        if tiles and order:
            lo = order[0][0]
            total = int(grp.seg_n.sum())
            cover = _cover(grads[positions[order[0][1]]], lo, total, dt)
            offs = np.array([(a - lo) // dt.itemsize for a, _ in order], np.int64)
            table = np.stack([offs, grp.seg_n, grp.seg_owner], axis=1)
            grp.bufs = [cover]
            grp.tables = [(cuda.to_device(table), cuda.to_device(grp.starts), 0)]
        else:
            grp.bufs, grp.tables = [], []
            for j, (_, k) in enumerate(order):
                g = grads[positions[k]]
                grp.bufs.append(g.reshape(g.size) if len(g.shape) != 1 else g)
                table = np.array([[0, sizes[k], k]], np.int64)
                st = grp.starts[j : j + 2].copy()
                grp.tables.append((cuda.to_device(table), cuda.to_device(st), int(st[0])))
        groups.append(grp)
    rdtype = np.result_type(*by_dtype) if by_dtype else np.dtype(np.float32)
    return groups, rdtype


def total_norm(grads: list, kind: int, p: float):
    """Total norm of CUDA arrays: ``(total, plan, result dtype)``."""
    groups, rdtype = plan(grads)
    rcode = {np.dtype(np.float16): 0, np.dtype(np.float32): 1, np.dtype(np.float64): 2}
    blocks_max = _cuda.MAX_BLOCKS
    tpb = _cuda.THREADS_PER_BLOCK
    all_norms = []
    total = 0.0
    for grp in groups:
        n_items = int(grp.starts[-1])
        red = cuda.device_array(max(n_items, 1), np.float64)
        amax = cuda.device_array(max(n_items, 1), np.float64)
        c32 = grp.dtype != np.float64
        for buf, (d_table, d_starts, w0) in zip(grp.bufs, grp.tables):
            blocks = max(1, min(blocks_max, n_items))
            seg_partials_kernel[blocks, tpb](
                buf, d_table, d_starts, kind, p, c32, red[w0:], amax[w0:]
            )
        norms = np.empty(len(grp.positions), np.float64)
        total = _k.merge_items(
            red.copy_to_host()[:n_items], amax.copy_to_host()[:n_items], grp.seg_n,
            grp.seg_owner, grp.starts, len(grp.positions), kind, p, rcode[grp.dtype], norms,
        )  # fmt: skip
        all_norms.append(norms)
    if len(groups) > 1:
        total = _k.norm_of_values(np.concatenate(all_norms), kind, p, rcode[rdtype])
    return float(total), groups, rdtype


def apply(grads: list, groups, op: int, a: float, b: float) -> None:
    """In place on every array: scale by ``a`` (op 0; ``a`` cast to each dtype's op-math type)
    or clamp to ``[a, b]`` (op 1; bounds rounded to each dtype)."""
    for grp in groups:
        c32 = grp.dtype != np.float64
        t = np.float32 if c32 else np.float64  # typed bounds: no float64 on a float32 path
        if op == 0:
            aa, bb = t(a), t(0.0)
        else:  # bounds rounded to the array's dtype (exact in t)
            aa, bb = t(grp.dtype.type(a)), t(grp.dtype.type(b))
        for buf in grp.bufs:
            blocks, tpb = _cuda.grid_1d(int(buf.size))
            apply_kernel[blocks, tpb](buf, op, aa, bb, c32)
