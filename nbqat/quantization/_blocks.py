"""Block geometry of torchao's ``block_size`` (plain Python, before any compiled code).

A ``block_size`` has one entry per dimension of ``x``; elements whose indices agree after
integer division by it share one scale (per tensor: ``x.shape``; per channel: ``(1, K)``; per
group: ``(1, G)``; per token: ``(1, ..., 1, K)``). The block grid is ``x.shape // block_size``,
in C order: the flat order of every accepted scale / zero-point shape.

The kernels see a C-contiguous ``x`` as ``rows`` rows of length ``L`` (its last dimension,
merged with the dimensions before it while the block spans the whole row), each row cut into
``nseg`` segments of ``G`` contiguous elements that share a block; ``rows_map[r]`` is the grid
index of row ``r``'s leading dimensions, so segment ``j`` of row ``r`` is block
``rows_map[r] * nseg + j``. Segments longer than :data:`UNIT` are cut into ``P`` pieces; a
"unit" is a segment or a piece (at most :data:`UNIT` elements, one block), and the parallel
loops run over items of ``m`` consecutive units of a row.
"""

from __future__ import annotations

import math
import operator
from dataclasses import dataclass
from typing import Any

import numpy as np

#: Most elements of one unit (the grain of the parallel loops and of the reduction partials).
UNIT = 1 << 14


@dataclass(frozen=True)
class Blocks:
    """The block geometry of one ``(x.shape, block_size)`` pair (see the module docstring).

    Attributes
    ----------
    shape, block, grid : tuple of int
        ``x.shape``, ``block_size`` and the grid ``x.shape // block_size``.
    reduced : tuple of int
        The shape torchao's ``choose_qparams_affine`` returns (``keepdim=False``).
    geo : tuple of 8 int
        ``(L, G, nseg, P, Cp, m, ni, rows)`` for the kernels.
    rows_map : (rows,) int64
        Grid index of each row's leading dimensions.
    nblocks : int
        Number of blocks (``prod(grid)``).
    """

    shape: tuple[int, ...]
    block: tuple[int, ...]
    grid: tuple[int, ...]
    reduced: tuple[int, ...]
    geo: tuple[int, ...]
    rows_map: np.ndarray
    nblocks: int


def check_block_size(block_size: Any, shape: tuple[int, ...]) -> tuple[int, ...]:
    """Validate ``block_size`` against ``shape``.

    Raises
    ------
    TypeError
        When it is not a sequence of integers.
    ValueError
        When its length differs from ``len(shape)``, an entry is < 1, or an entry does not
        divide the dimension.
    """
    try:
        b = tuple(operator.index(v) for v in block_size)
    except TypeError:
        raise TypeError(
            f"`block_size` must be a tuple of ints (one per dimension of x), got {block_size!r}"
        ) from None
    if len(b) != len(shape):
        raise ValueError(
            f"`block_size` {b} has {len(b)} entries but x has {len(shape)} dimensions "
            f"(shape {tuple(shape)}); give one block extent per dimension"
        )
    for i, (d, k) in enumerate(zip(shape, b)):
        if k < 1 or d % k:
            raise ValueError(
                f"`block_size` {b} does not divide x's shape {tuple(shape)} at dimension {i} "
                f"({d} % {k} != 0); each entry must be >= 1 and divide its dimension"
            )
    return b


def _reduced_shape(shape: tuple[int, ...], block: tuple[int, ...]) -> tuple[int, ...]:
    """torchao's ``_get_reduction_params`` shape with the reduced dimensions removed."""
    out = []
    for d, k in zip(shape, block):
        if k != d and k > 1:
            out.append(d // k)
        elif k == 1:
            out.append(d)
    return tuple(out)


def _units(L: int, G: int, rows: int) -> tuple[int, ...]:
    nseg = L // G
    if G <= UNIT:
        P, Cp, m = 1, G, max(1, UNIT // G)
    else:
        P = -(-G // UNIT)
        Cp, m = -(-G // P), 1
    ni = -(-(nseg * P) // m)
    return (L, G, nseg, P, Cp, m, ni, rows)


def blocks_of(shape: tuple[int, ...], block: tuple[int, ...]) -> Blocks:
    """The :class:`Blocks` of a non-empty ``shape`` and a validated ``block``."""
    shape, block = tuple(shape), tuple(block)
    grid = tuple(d // k for d, k in zip(shape, block))
    lead_d, lead_b = list(shape), list(block)
    L, G = 1, 1
    if lead_d:
        L, G = lead_d.pop(), lead_b.pop()
    while lead_d and G == L:  # the block spans whole rows: merge the dimension before
        d, k = lead_d.pop(), lead_b.pop()
        L, G = d * L, k * L
    rows = math.prod(lead_d)
    rows_map = np.zeros(lead_d, np.int64)
    gl = [d // k for d, k in zip(lead_d, lead_b)]
    stride = 1
    for i in range(len(lead_d) - 1, -1, -1):
        idx = (np.arange(lead_d[i], dtype=np.int64) // lead_b[i]) * stride
        rows_map = rows_map + idx.reshape((-1,) + (1,) * (len(lead_d) - 1 - i))
        stride *= gl[i]
    return Blocks(
        shape,
        block,
        grid,
        _reduced_shape(shape, block),
        _units(L, G, rows),
        np.ascontiguousarray(rows_map.reshape(-1)),
        math.prod(grid),
    )


def check_grid_shape(arr: Any, b: Blocks, name: str) -> None:
    """Check that ``arr`` (a scale or zero point) has one entry per block: its shape, size-1
    dimensions removed, is the grid's, size-1 dimensions removed (so torchao's reduced shape,
    the grid ``x.shape // block_size`` and ``keepdim`` forms are all accepted).

    Raises
    ------
    ValueError
        Naming ``name``, the shape it has and the shapes it may have.
    """
    got = tuple(int(s) for s in arr.shape)
    if tuple(s for s in got if s != 1) != tuple(g for g in b.grid if g != 1):
        raise ValueError(
            f"`{name}` has shape {got} but block_size {b.block} on x of shape {b.shape} "
            f"needs one entry per block: shape {b.reduced} (as choose_qparams_affine returns) "
            f"or {b.grid} (x.shape // block_size)"
        )


def float8_block_of(scale_shape: tuple[int, ...], shape: tuple[int, ...]) -> tuple[int, ...]:
    """The block size a float8 ``scale`` of ``scale_shape`` implies for ``x`` of ``shape``
    (torchao's ``_maybe_expand_scale_to_tensor_shape``): a size-1 scale is per tensor; else
    the scale has x's rank and each of its dimensions divides x's.

    Raises
    ------
    ValueError
        When the scale's rank differs or a dimension does not divide.
    """
    if math.prod(scale_shape) == 1 and len(scale_shape) <= len(shape):
        return tuple(shape)
    if len(scale_shape) != len(shape) or any(s < 1 or d % s for s, d in zip(scale_shape, shape)):
        raise ValueError(
            f"`scale` has shape {tuple(scale_shape)} but x has shape {tuple(shape)}: a float8 "
            "scale must have size 1 or x's rank with each dimension dividing x's (as "
            "choose_scale_float8 returns: x.shape // block_size)"
        )
    return tuple(d // s for s, d in zip(scale_shape, shape))
