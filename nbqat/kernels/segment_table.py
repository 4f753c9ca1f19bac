"""The host side of :mod:`nbqat.kernels.norm_cpu`: segment tables built from NumPy arrays.

A table (``(n_segments, 8)`` int64, columns :data:`~nbqat.kernels.norm_cpu.TABLE_COLUMNS`)
holds one row per 2-D strided region of an array, with its raw address, so one compiled call
walks any number of arrays of one dtype without copies. :func:`tables` groups a list of arrays
by dtype and builds one table per group; :func:`layout` is what a table depends on besides the
addresses, for callers that cache tables by array identity (``nbqat.clip``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

FLOAT_DTYPES = (np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64))
#: The array each group's kernels take as their dtype prototype.
PROTO = {
    np.dtype(np.float16): np.empty(0, np.uint16),  # float16 travels as its bit pattern
    np.dtype(np.float32): np.empty(0, np.float32),
    np.dtype(np.float64): np.empty(0, np.float64),
}


def check_dtype(g: Any, i: int) -> np.dtype:
    """``g``'s dtype, or a TypeError naming ``grads[i]`` when it is not float16/32/64."""
    dt = np.dtype(g.dtype)
    if dt not in FLOAT_DTYPES:
        raise TypeError(
            f"grads[{i}] has dtype {dt}; clipping supports float16, float32 and float64 "
            f"(convert with .astype(np.float32))"
        )
    return dt


def layout(g: np.ndarray) -> tuple:
    """``(dtype, shape, strides)``: what a table depends on besides the data address (NumPy
    lets ``dtype`` and ``shape`` be set in place; the address cannot move under a live weak
    reference, as ``ndarray.resize`` then refuses)."""
    return g.dtype, g.shape, g.strides


def segments(g: np.ndarray, owner: int) -> list[list[int]]:
    """Rows of the segment table for one array (empty list for an empty array).

    Raises
    ------
    ValueError
        Strides that are not multiples of the item size (naming ``grads[owner]``).
    """
    if g.size == 0:
        return []
    itemsize = g.itemsize
    addr = g.__array_interface__["data"][0]
    if g.flags.c_contiguous:
        return [[addr, 0, 1, g.size, g.size, 1, g.size, owner]]
    shape: list[int] = []
    strides: list[int] = []
    for n, s in zip(g.shape, g.strides):
        if n == 1:
            continue
        if s % itemsize:
            raise ValueError(
                f"grads[{owner}] has strides {g.strides} that are not multiples of its item "
                "size; pass np.ascontiguousarray(...) of it"
            )
        s //= itemsize
        if shape and strides[-1] == s * n:  # merge with the previous (outer) dim
            shape[-1] *= n
            strides[-1] = s
        else:
            shape.append(n)
            strides.append(s)
    if not shape:
        shape, strides = [1], [1]
    if len(shape) == 1:
        shape, strides = [1, shape[0]], [0, strides[0]]
    outer_shape, (rows, cols), (rs, cs) = shape[:-2], shape[-2:], strides[-2:]
    low = min(0, (rows - 1) * rs) + min(0, (cols - 1) * cs)
    span = abs((rows - 1) * rs) + abs((cols - 1) * cs) + 1
    out = []
    for idx in np.ndindex(*outer_shape):
        off = sum(i * s for i, s in zip(idx, strides[:-2]))
        a = addr + (off + low) * itemsize
        out.append([a, -low, rows, cols, rs, cs, span, owner])
    return out


def tables(grads: list) -> tuple[list[tuple], np.dtype]:
    """One segment table per dtype of ``grads``.

    Parameters
    ----------
    grads : list of NumPy float16/float32/float64 arrays

    Returns
    -------
    groups : list of (dtype, proto, table, positions)
        In order of each dtype's first array; ``positions`` (int64) the group's indices into
        ``grads``, whose rows' ``owner`` column counts within the group.
    rdtype : numpy dtype
        torch's result dtype of the stacked per-array norms (float32 for an empty list).

    Raises
    ------
    TypeError, ValueError
        As :func:`check_dtype` and :func:`segments`.
    """
    by_dtype: dict[np.dtype, list[int]] = {}
    for i, g in enumerate(grads):
        by_dtype.setdefault(check_dtype(g, i), []).append(i)
    groups = []
    for dt, positions in by_dtype.items():
        rows: list[list[int]] = []
        for local, i in enumerate(positions):
            rows.extend(segments(grads[i], local))
        table = np.array(rows, np.int64).reshape(-1, 8)
        groups.append((dt, PROTO[dt], table, np.array(positions, np.int64)))
    rdtype = np.result_type(*by_dtype) if by_dtype else np.dtype(np.float32)
    return groups, rdtype
