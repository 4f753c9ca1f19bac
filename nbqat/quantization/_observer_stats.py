"""One pass over an observed batch: its float32 min/max and NaN/+Inf/-Inf counts.

The statistics every observer folds into its state, from :mod:`nbqat.kernels.observe_cpu`
(compiled, no temporary copy of float32 C- or F-contiguous input, no transpose for any channel
axis) or the ``@cuda.jit`` twins in :mod:`nbqat.kernels.observe_cuda` for CUDA arrays. Each
function returns ``(fmin, fmax, n_nan, n_pinf, n_ninf)``: float32 min/max of the finite values
(``+inf``/``-inf`` where there is none) and int64 counts, shape (1,) per tensor or (C,) per
channel.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import numpy as np

from nbqat import _cuda, _jit
from nbqat._validate import as_array, split_axis
from nbqat.kernels import observe_cpu as _k

__all__ = [
    "as_f32_host",
    "check_input",
    "decode",
    "device",
    "stats_cpu_channel",
    "stats_cpu_tensor",
    "stats_cuda",
]


#: What the non-finite errors add: infinities are counted on the float32 values (torch's
#: ``x.to(float32)``), so a finite float64 past the float32 range counts as one.
INF_NOTE = " (counted in float32: a float64 past +-3.4e38 is +-Inf there)"


def decode(keys: Any) -> np.ndarray:
    """float32 values of order keys (the key map is its own inverse)."""
    k = np.asarray(keys, dtype=np.int64).astype(np.int32)
    return (k ^ ((k >> 31) & np.int32(0x7FFFFFFF))).view(np.float32)


def decode_half(keys: Any) -> np.ndarray:
    """float32 values of float16 order keys (see :mod:`nbqat.kernels.observe_cpu`); the
    float32 "none seen" keys decode to +-inf."""
    k = np.asarray(keys, dtype=np.int64).astype(np.int32)
    w = k ^ ((k >> 31) & np.int32(0x7FFFFFFF))
    out = (w >> 16).astype(np.int16).view(np.float16).astype(np.float32)  # exact
    out[k == _k.KEY_POS_INF] = np.inf
    out[k == _k.KEY_NEG_INF] = -np.inf
    return out


def _bits(x: np.ndarray) -> tuple[np.ndarray, Any, np.int32, np.int32]:
    """The integer view of float16/float32 data (float64 is converted to float32 first, as
    torch's ``x.to(float32)``), its key decoder and the keys of +Inf and -Inf."""
    if x.dtype == np.float16:
        return x.view(np.int16), decode_half, _k.KEY_POS_INF_H, _k.KEY_NEG_INF_H
    return as_f32_host(x).view(np.int32), decode, _k.KEY_POS_INF, _k.KEY_NEG_INF


def as_f32_host(x: np.ndarray) -> np.ndarray:
    """float32 view of ``x`` (copy only for float16/float64, as torch's ``x.to(float32)``;
    float64 values past the float32 range become +-Inf, counted as such, without NumPy's
    overflow warning)."""
    if x.dtype == np.float32:
        return x
    with np.errstate(over="ignore"):
        return x.astype(np.float32)


def stats_cpu_tensor(x: np.ndarray) -> tuple[np.ndarray, ...]:
    """(fmin, fmax, n_nan, n_pinf, n_ninf), each shape (1,), of a non-empty NumPy array.

    float16 data is reduced on its own bits (no float32 copy); the results are those of
    ``x.astype(float32)`` bit for bit (the conversion is exact and keeps NaN, Inf and -0)."""
    flat = np.ravel(x, order="K")  # a view for any contiguous memory order
    if not flat.flags.c_contiguous:  # pragma: no cover - ravel always returns contiguous
        flat = np.ascontiguousarray(flat)
    b, dec, pinf, ninf = _bits(flat)
    if b.size < _jit.PARALLEL_MIN:
        kmin, kmax = _k.row_keys(b, 0, b.size, _k.KEY_POS_INF, _k.KEY_NEG_INF)
    else:
        kmin, kmax = _k.minmax_keys_1d(b)
    if kmin > ninf and kmax < pinf:
        z = np.zeros(1, np.int64)
        return dec([kmin]), dec([kmax]), z, z, z
    r = _k.minmax_finite_3d(b, 1, 1, b.size)[0]
    return (dec(r[0:1]), dec(r[1:2]), r[2:3].copy(), r[3:4].copy(), r[4:5].copy())


def stats_cpu_channel(x: np.ndarray, axis: int) -> tuple[np.ndarray, ...]:
    """Per-channel (fmin, fmax, n_nan, n_pinf, n_ninf), each (C,), over a (outer, C, inner) view
    (float16 reduced on its own bits, as in :func:`stats_cpu_tensor`)."""
    x32 = x if x.dtype == np.float16 else as_f32_host(x)
    if x32.flags.c_contiguous:
        v, ax = x32, axis
    elif x32.flags.f_contiguous:  # the transpose is C-contiguous: no copy
        v, ax = x32.T, x32.ndim - 1 - axis
    else:  # arbitrary strides: one contiguous copy
        v, ax = np.ascontiguousarray(x32), axis
    outer, c, inner = split_axis(v.shape, ax)
    b, dec, pinf, ninf = _bits(v.reshape(-1))
    kern = _k.minmax_keys_3d if b.size >= _jit.PARALLEL_MIN else _k.minmax_keys_3d_serial
    kmin, kmax = kern(b, outer, c, inner)
    if kmin.min() > ninf and kmax.max() < pinf:
        z = np.zeros(c, np.int64)
        return dec(kmin), dec(kmax), z, z, z
    r = _k.minmax_finite_3d(b, outer, c, inner)
    return (dec(r[:, 0]), dec(r[:, 1]), r[:, 2].copy(), r[:, 3].copy(), r[:, 4].copy())


def device(x: Any) -> Any:
    """A Numba device array for ``x`` (numba's own, and the simulator's, pass through)."""
    return x if hasattr(x, "copy_to_host") else _cuda.as_device_array(x)


def stats_cuda(x: Any, axis: int | None) -> tuple[np.ndarray, ...]:
    """The CUDA twin of the two functions above (results copied to the host: 5 * C numbers)."""
    from nbqat.kernels import observe_cuda as _kc

    cuda = _cuda.cuda
    d = device(x)
    tpb = _cuda.THREADS_PER_BLOCK
    if tpb > _kc.MAX_TPB:  # pragma: no cover - configuration error
        raise RuntimeError(f"nbqat._cuda.THREADS_PER_BLOCK must be <= {_kc.MAX_TPB}")
    flat = d.reshape(d.size)
    if axis is None:
        blocks, tpb = _cuda.grid_1d(d.size)
        pmin = cuda.device_array(blocks, np.float32)
        pmax = cuda.device_array(blocks, np.float32)
        pcnt = cuda.device_array((blocks, 3), np.int64)
        _kc.minmax_partials_kernel[blocks, tpb](flat, pmin, pmax, pcnt)
        omin = cuda.device_array(1, np.float32)
        omax = cuda.device_array(1, np.float32)
        ocnt = cuda.device_array((1, 3), np.int64)
        _kc.minmax_final_kernel[1, 1](pmin, pmax, pcnt, omin, omax, ocnt)
    else:
        outer, c, inner = split_axis(tuple(d.shape), axis)
        blocks = max(1, min(_cuda.MAX_BLOCKS, c))
        omin = cuda.device_array(c, np.float32)
        omax = cuda.device_array(c, np.float32)
        ocnt = cuda.device_array((c, 3), np.int64)
        _kc.minmax_channel_kernel[blocks, tpb](flat, outer, c, inner, omin, omax, ocnt)
    cnt = ocnt.copy_to_host()
    return (
        omin.copy_to_host(),
        omax.copy_to_host(),
        cnt[:, 0].copy(),
        cnt[:, 1].copy(),
        cnt[:, 2].copy(),
    )


def check_input(x: Any, who: str) -> tuple[Any, bool]:
    """Validate an observed batch: ``(array, is_cuda)``.

    ``array`` is ``x`` itself for NumPy and CUDA arrays, else ``x`` as a NumPy array
    (:func:`nbqat._validate.as_array`: anything with ``__array__`` or ``__dlpack__``, such as a
    torch CPU tensor, the way every public function takes array-likes).

    Raises
    ------
    TypeError
        Not an array-like, or not a float16/float32/float64 one.
    ValueError
        A CUDA array that is not C-contiguous.
    """
    if _cuda.is_cuda_array(x):  # the simulator's arrays included
        _cuda.require_cuda(who)
        d = device(x)
        if np.dtype(d.dtype) not in (np.float16, np.float32, np.float64):
            raise TypeError(
                f"{who}: x must be a float16/float32/float64 array, got dtype {d.dtype}: "
                "convert it first (x.astype(np.float32))"
            )
        if not d.is_c_contiguous():
            raise ValueError(
                f"{who}: CUDA input must be C-contiguous; make a contiguous copy first "
                "(numba.cuda.device_array + copy, or cupy.ascontiguousarray)"
            )
        return x, True
    try:
        a = as_array(x, "x")
    except TypeError as err:
        raise TypeError(f"{who}: {err}") from None
    if a.dtype not in (np.float16, np.float32, np.float64):
        raise TypeError(
            f"{who}: x must be a float16/float32/float64 array, got dtype {a.dtype}: "
            "convert it first (x.astype(np.float32))"
        )
    return a, False


def channel_axis(shape: tuple[int, ...], ch_axis: int, seen: int, who: str) -> int:
    """The non-negative channel axis of a batch of ``shape`` (``seen``: the channel count the
    observer holds, 0 for none yet).

    Raises
    ------
    ValueError
        A 0-d batch, ``ch_axis`` out of range, or another channel count than ``seen``.
    """
    nd = len(shape)
    if nd == 0:
        raise ValueError(f"{who}: per-channel observation needs x.ndim >= 1, got a 0-d array")
    if not -nd <= ch_axis < nd:
        raise ValueError(
            f"{who}: ch_axis={ch_axis} is out of range for x of shape {shape} "
            f"(valid: {-nd}..{nd - 1})"
        )
    axis = ch_axis % nd
    if seen and seen != shape[axis]:
        raise ValueError(
            f"{who}: x has {shape[axis]} channels along ch_axis={ch_axis} but the observer "
            f"has seen {seen}; call reset_min_max_vals() to start over"
        )
    return axis


def batch_stats(x: Any, is_cuda: bool, axis: int | None) -> tuple[np.ndarray, ...]:
    """The statistics of a batch, per tensor (``axis`` None) or per channel; an empty batch
    gives "nothing seen" (``+inf``, ``-inf``, zero counts), as a data-parallel rank needs."""
    shape = tuple(x.shape)
    if math.prod(shape) == 0:
        c = 1 if axis is None else shape[axis]
        z = np.zeros(c, np.int64)
        return (np.full(c, np.inf, np.float32), np.full(c, -np.inf, np.float32), z, z, z)
    if is_cuda:
        return stats_cuda(x, axis)
    return stats_cpu_tensor(x) if axis is None else stats_cpu_channel(x, axis)


def global_sample(x: np.ndarray, group: Any, who: str) -> np.ndarray:
    """``x`` itself, or under a data-parallel ``group`` (``distributed``) a small float32
    array whose ``max |.|`` is the global batch's: every rank's finite minimum and maximum,
    and NaN / +-Inf where any rank saw one (empty when no rank saw anything), shaped
    ``(1, ..., 1, n)`` like ``x``'s dimensions. A dynamic per-tensor scale computed from it is
    that of the whole global batch, identical on every rank (every rank must call it).

    Parameters
    ----------
    x : float32 ndarray
        This rank's slice (may be empty).
    group : ProcessGroup or None
    who : str
        The quantizer, for error messages.

    Returns
    -------
    ndarray
    """
    if group is None or not group.distributed:
        return x
    fmin, fmax, nnan, npinf, nninf = group.combine_minmax_stats(batch_stats(x, False, None), who)
    vals = [v for v in (fmin[0], fmax[0]) if np.isfinite(v)]
    vals += [np.nan] * bool(nnan[0]) + [np.inf] * bool(npinf[0]) + [-np.inf] * bool(nninf[0])
    return np.array(vals, np.float32).reshape((1,) * (max(x.ndim, 1) - 1) + (-1,))


@functools.lru_cache(maxsize=4)
def grid_edges(shift: int) -> tuple[np.ndarray, np.ndarray]:
    """float64 (lowest, highest) float32 value of every bin of the order-key grid (read-only;
    0 for the NaN/Inf bins, which never hold counts)."""
    nb = 1 << (32 - shift)
    k = (np.arange(nb, dtype=np.int64) - (1 << (31 - shift))) << shift
    with np.errstate(invalid="ignore"):
        lo = decode(k).astype(np.float64)
        hi = decode(k | ((1 << shift) - 1)).astype(np.float64)
        ok = np.isfinite(lo) & np.isfinite(hi)
    lo, hi = np.where(ok, lo, 0.0), np.where(ok, hi, 0.0)
    lo.flags.writeable = hi.flags.writeable = False
    return lo, hi
