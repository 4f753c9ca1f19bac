"""CPU kernels for gradient norms and in-place scaling/clamping over many arrays at once.

The arrays are described by a *segment table* (``(n_segments, 8)`` int64, one row per 2-D strided
region of one array, see :data:`TABLE_COLUMNS`) that holds raw memory addresses, so one compiled
call walks any number of arrays of one dtype, contiguous or strided, without copies and without a
Python loop: the fast path (all gradients are contiguous views of one flat buffer) and the gather
path (separate allocations, strided views) are the same kernel.

Work is split into fixed work items of :data:`CHUNK` elements per segment (independent of the
thread count); each item produces one float64 partial, and the partials are merged serially in
item order, so the results are bit-identical for every thread count.

float16 arrays are passed as their ``uint16`` bit patterns (Numba has no CPU float16) and decoded
/ re-encoded with round-half-to-even, exactly like NumPy's conversions
(:mod:`nbqat.kernels.half_cpu`, re-exported here).

Norm semantics follow ``torch.nn.utils.get_total_norm`` (torch 2.13, CPU): each element's term
(``x*x``, ``|x|``, ``|x|**p``) is rounded to the *compute type* (float32 for float16/float32
inputs, float64 for float64), so that underflow and overflow of single terms happen exactly where
torch's float32 accumulator sees them; terms are summed in float64 (more accurate than torch's
float32 cascade sum, within ~1e-7 relative of it), the sum is rounded to the compute type
(float32 overflow -> inf, like torch), the root is taken and rounded to the compute type and then
to the array dtype. A one-element reduction returns ``|x|`` (torch does not square a single
element). The total is the same norm taken over the per-array norms.
"""

from __future__ import annotations

import math

import numba
import numpy as np
from numba import prange, types
from numba.extending import intrinsic, overload

from nbqat._jit import cpu_kernel
from nbqat.kernels.half_cpu import f64_to_half_bits, half_bits_to_f64, half_decode, half_roundtrip

#: Elements per work item (fixed: the reduction order never depends on the thread count).
CHUNK = 1 << 14

#: Columns of the segment table. ``addr``: lowest byte address of the region; ``first``: element
#: offset of element [0, 0] from ``addr``; ``rows``, ``cols``: the region's 2-D shape (C order);
#: ``rs``, ``cs``: row / column strides in elements (may be negative); ``span``: number of elements
#: from ``addr`` to the highest element; ``owner``: index of the array the region belongs to.
TABLE_COLUMNS = ("addr", "first", "rows", "cols", "rs", "cs", "span", "owner")

#: Norm kinds.
KIND_L2, KIND_L1, KIND_INF, KIND_P = 0, 1, 2, 3
#: Result/compute type codes: 0 float16 (computes in float32), 1 float32, 2 float64.
R_F16, R_F32, R_F64 = 0, 1, 2
#: In-place operations.
OP_SCALE, OP_CLAMP = 0, 1

# --------------------------------------------------------------------------------------------
# raw pointers


@intrinsic
def _as_ptr(typingctx, addr, proto):
    """``addr`` (int64 byte address) -> ``CPointer(proto.dtype)``."""
    if not isinstance(proto, types.Array):
        return None
    sig = types.CPointer(proto.dtype)(addr, proto)

    def codegen(context, builder, signature, args):
        ptrty = context.get_value_type(signature.return_type)
        return builder.inttoptr(args[0], ptrty)

    return sig, codegen


@numba.njit
def _view(proto, addr, span):  # -> (span,) array of proto.dtype over raw memory
    return numba.carray(_as_ptr(addr, proto), span)


# --------------------------------------------------------------------------------------------
# element loads / stores of every dtype (float16 through nbqat.kernels.half_cpu)


def _ld(x):  # pragma: no cover - typing stub, replaced by the overload
    raise NotImplementedError


@overload(_ld)
def _ld_ol(x):
    """Element -> float64 (uint16 elements are float16 bit patterns)."""
    if isinstance(x, types.Integer):
        return lambda x: half_bits_to_f64(x)
    return lambda x: np.float64(x)


def _scale_elem(x, a):  # pragma: no cover - typing stub
    raise NotImplementedError


@overload(_scale_elem)
def _scale_elem_ol(x, a):
    """``x * a`` rounded to x's type, computed in x's op-math type (float32 for float16)."""
    if isinstance(x, types.Integer):

        def impl(x, a):
            y = np.float32(half_bits_to_f64(x)) * np.float32(a)
            return f64_to_half_bits(np.float64(y))

        return impl
    if x == types.float32:
        return lambda x, a: x * np.float32(a)
    return lambda x, a: x * a


def _clamp_elem(x, lo, hi):  # pragma: no cover - typing stub
    raise NotImplementedError


@overload(_clamp_elem)
def _clamp_elem_ol(x, lo, hi):
    """Clamp to [lo, hi] (bounds already representable in x's type); NaN stays NaN."""
    if isinstance(x, types.Integer):

        def impl(x, lo, hi):
            v = half_bits_to_f64(x)
            if v < lo:
                return f64_to_half_bits(lo)
            if v > hi:
                return f64_to_half_bits(hi)
            return x

        return impl

    if x == types.float32:

        def impl32(x, lo, hi):
            if x < lo:
                return np.float32(lo)
            if x > hi:
                return np.float32(hi)
            return x

        return impl32

    def impl64(x, lo, hi):
        if x < lo:
            return lo
        if x > hi:
            return hi
        return x

    return impl64


# --------------------------------------------------------------------------------------------
# scalar helpers shared by the kernels


@numba.njit
def round_to(x, rcode):
    """Round a float64 value to float16 / float32 / float64 (``rcode``), returned as float64."""
    if rcode == R_F64:
        return x
    if rcode == R_F32:
        return np.float64(np.float32(x))
    return half_bits_to_f64(f64_to_half_bits(np.float64(np.float32(x))))


@numba.njit
def term(x, kind, p, c32):
    """One element's contribution (``x`` float64), rounded to the compute type."""
    if kind == KIND_L2:
        if c32:
            xf = np.float32(x)
            return np.float64(xf * xf)
        return x * x
    a = abs(x)
    if kind == KIND_L1 or kind == KIND_INF:
        return a
    if c32:
        return np.float64(np.float32(a ** np.float64(np.float32(p))))
    return a**p


@numba.njit
def combine(acc, t, kind):
    """Fold one term or partial into an accumulator (sum, or NaN-propagating max)."""
    if kind == KIND_INF:
        if t > acc or t != t:
            return t
        return acc
    return acc + t


@numba.njit
def finish(acc, kind, p, rcode):
    """Accumulated terms -> the norm, rounded like torch (compute type, then ``rcode``)."""
    if kind == KIND_INF:
        return round_to(acc, rcode)
    c = R_F64 if rcode == R_F64 else R_F32
    s = round_to(acc, c)  # float32 accumulator overflow -> inf
    if kind == KIND_L2:
        r = math.sqrt(s)
    elif kind == KIND_L1:
        r = s
    else:
        inv = 1.0 / p if c == R_F64 else np.float64(np.float32(1.0) / np.float32(p))
        r = s**inv
    return round_to(round_to(r, c), rcode)


@numba.njit
def norm_of_values(vals, kind, p, rcode):
    """The ``kind``/``p`` norm of a (n,) float64 vector of values representable in ``rcode``
    (torch's norm of the stacked per-array norms). ``0.0`` for n == 0, ``|v|`` for n == 1."""
    n = vals.size
    if n == 0:
        return 0.0
    if n == 1:
        return abs(vals[0])
    c32 = rcode != R_F64
    acc = 0.0
    for i in range(n):
        acc = combine(acc, term(vals[i], kind, p, c32), kind)
    return finish(acc, kind, p, rcode)


@numba.njit
def _n_items(table, s):
    n = table[s, 2] * table[s, 3]
    return (n + CHUNK - 1) // CHUNK


@numba.njit
def _item_starts(table):  # (nseg, 8) int64 -> (nseg + 1,) int64 first work item of each segment
    nseg = table.shape[0]
    starts = np.empty(nseg + 1, np.int64)
    starts[0] = 0
    for s in range(nseg):
        starts[s + 1] = starts[s] + _n_items(table, s)
    return starts


@numba.njit
def _sq32(x):  # float64 holding a float32/float16 value -> its float32 square (no contraction)
    xf = np.float32(x)
    return np.float64(xf * xf)


@cpu_kernel(parallel=False, fastmath=True)
def _chunk_reduce(v, first, rows, cols, rs, cs, lo, hi, kind, p, c32):
    """Reduce flat (C-order) elements [lo, hi) of one segment viewed by ``v`` (float64 result).

    Only the accumulating additions carry fastmath flags (``reassoc`` lets LLVM vectorise the
    sum in an order fixed at compile time); every term is computed in a helper compiled without
    fastmath, so terms are rounded exactly as documented and never fused into the sum.
    """
    acc = 0.0
    if rows == 1 and cs == 1:
        w = v[first + lo : first + hi]  # contiguous run
        if kind == KIND_INF:
            for i in range(w.size):
                acc = combine(acc, abs(_ld(w[i])), kind)
        elif kind == KIND_L2 and c32:
            for i in range(w.size):
                acc += _sq32(_ld(w[i]))
        else:
            for i in range(w.size):
                acc += term(_ld(w[i]), kind, p, c32)
        return acc
    r = lo // cols
    c = lo - r * cols
    for _ in range(lo, hi):
        acc = combine(acc, term(_ld(v[first + r * rs + c * cs]), kind, p, c32), kind)
        c += 1
        if c == cols:
            c = 0
            r += 1
    return acc


@cpu_kernel(parallel=False)
def _merge(proto, table, starts, part, n_arrays, kind, p, rcode, norms):
    """Fixed-order serial merge of the work-item partials into per-array norms and the total
    (kept out of the parallel kernel so that its allocations do not become parallel regions)."""
    acc = np.zeros(n_arrays, np.float64)
    count = np.zeros(n_arrays, np.int64)
    single = np.zeros(n_arrays, np.float64)
    for s in range(table.shape[0]):
        o = table[s, 7]
        n = table[s, 2] * table[s, 3]
        for w in range(starts[s], starts[s + 1]):
            acc[o] = combine(acc[o], part[w], kind)
        if n == 1:
            v = _view(proto, table[s, 0], table[s, 6])
            single[o] = abs(_ld(v[table[s, 1]]))
        count[o] += n
    for a in range(n_arrays):
        if count[a] == 0:
            norms[a] = 0.0
        elif count[a] == 1:
            norms[a] = single[a]  # torch: a one-element norm is |x|
        else:
            norms[a] = finish(acc[a], kind, p, rcode)
    return norm_of_values(norms, kind, p, rcode)


@cpu_kernel(parallel=True)
def seg_norms(proto, table, n_arrays, kind, p, rcode, norms):
    """Per-array norms and their total over a segment table, in one parallel pass.

    Parameters
    ----------
    proto : (0,) array of the arrays' element type (float32, float64, or uint16 = float16 bits)
    table : (n_segments, 8) int64, see :data:`TABLE_COLUMNS`; the segments of one array are
        consecutive and in C order.
    n_arrays : int, number of arrays (``owner`` values are in ``[0, n_arrays)``).
    kind, p : the norm (:data:`KIND_L2`, :data:`KIND_L1`, :data:`KIND_INF`, :data:`KIND_P` with
        exponent ``p``).
    rcode : the arrays' dtype (:data:`R_F16`, :data:`R_F32`, :data:`R_F64`).
    norms : (n_arrays,) float64, output: each array's norm (a value of the arrays' dtype).

    Returns
    -------
    float
        The norm of ``norms`` (torch's total norm when all arrays have this dtype).
    """
    c32 = rcode != R_F64
    nseg = table.shape[0]
    starts = _item_starts(table)
    nitems = starts[nseg]
    part = np.empty(nitems, np.float64)  # (nitems,) one partial per fixed work item
    for w in prange(nitems):
        s = np.searchsorted(starts, w, side="right") - 1
        n = table[s, 2] * table[s, 3]
        lo = (w - starts[s]) * CHUNK
        hi = min(n, lo + CHUNK)
        v = _view(proto, table[s, 0], table[s, 6])
        part[w] = _chunk_reduce(
            v, table[s, 1], table[s, 2], table[s, 3], table[s, 4], table[s, 5], lo, hi, kind, p, c32
        )
    return _merge(proto, table, starts, part, n_arrays, kind, p, rcode, norms)


@cpu_kernel(parallel=False)
def merge_items(red, amax, seg_n, seg_owner, starts, n_arrays, kind, p, rcode, norms):
    """Fixed-order final pass over per-item partials computed elsewhere (the CUDA twin).

    Parameters
    ----------
    red, amax : (n_items,) float64: each work item's reduction and its max ``|x|``.
    seg_n, seg_owner : (n_segments,) int64: elements and owning array of each segment.
    starts : (n_segments + 1,) int64: first work item of each segment.
    n_arrays, kind, p, rcode : as :func:`seg_norms`.
    norms : (n_arrays,) float64, output.

    Returns
    -------
    float
        The total norm.
    """
    acc = np.zeros(n_arrays, np.float64)
    count = np.zeros(n_arrays, np.int64)
    single = np.zeros(n_arrays, np.float64)
    for s in range(seg_n.size):
        o = seg_owner[s]
        for w in range(starts[s], starts[s + 1]):
            acc[o] = combine(acc[o], red[w], kind)
        if seg_n[s] == 1:
            single[o] = amax[starts[s]]
        count[o] += seg_n[s]
    for a in range(n_arrays):
        if count[a] == 0:
            norms[a] = 0.0
        elif count[a] == 1:
            norms[a] = single[a]
        else:
            norms[a] = finish(acc[a], kind, p, rcode)
    return norm_of_values(norms, kind, p, rcode)


@cpu_kernel(parallel=True)
def seg_apply(proto, table, op, a, b):
    """In place over every segment: ``x *= a`` (:data:`OP_SCALE`, ``a`` in the op-math type) or
    ``x = clamp(x, a, b)`` (:data:`OP_CLAMP`, bounds representable in the arrays' dtype).

    Parameters
    ----------
    proto : (0,) array of the element type (float32, float64, uint16 = float16 bits)
    table : (n_segments, 8) int64, see :data:`TABLE_COLUMNS`; segments must not overlap.
    op : int, :data:`OP_SCALE` or :data:`OP_CLAMP`.
    a, b : float
    """
    nseg = table.shape[0]
    starts = _item_starts(table)
    nitems = starts[nseg]
    for w in prange(nitems):
        s = np.searchsorted(starts, w, side="right") - 1
        rows = table[s, 2]
        cols = table[s, 3]
        rs = table[s, 4]
        cs = table[s, 5]
        first = table[s, 1]
        lo = (w - starts[s]) * CHUNK
        hi = min(rows * cols, lo + CHUNK)
        v = _view(proto, table[s, 0], table[s, 6])
        if rows == 1 and cs == 1:
            u = v[first + lo : first + hi]  # contiguous run
            if op == OP_SCALE:
                for i in range(u.size):
                    u[i] = _scale_elem(u[i], a)
            else:
                for i in range(u.size):
                    u[i] = _clamp_elem(u[i], a, b)
        else:
            r = lo // cols
            c = lo - r * cols
            for _ in range(lo, hi):
                k = first + r * rs + c * cs
                if op == OP_SCALE:
                    v[k] = _scale_elem(v[k], a)
                else:
                    v[k] = _clamp_elem(v[k], a, b)
                c += 1
                if c == cols:
                    c = 0
                    r += 1


__all__ = [
    "CHUNK",
    "KIND_INF",
    "KIND_L1",
    "KIND_L2",
    "KIND_P",
    "OP_CLAMP",
    "OP_SCALE",
    "R_F16",
    "R_F32",
    "R_F64",
    "f64_to_half_bits",
    "half_bits_to_f64",
    "TABLE_COLUMNS",
    "half_decode",
    "half_roundtrip",
    "merge_items",
    "norm_of_values",
    "seg_apply",
    "seg_norms",
]
