"""Gradient clipping with ``torch.nn.utils``' names and semantics, over many arrays at once.

``get_total_norm``, ``clip_grad_norm_``, ``clip_grads_with_norm_`` and ``clip_grad_value_`` take
one array or a sequence of arrays (all NumPy or all CUDA), of any shapes and strides, float16,
float32 or float64, and run one compiled pass for the norm and one for the scaling, whatever the
number of arrays (see :mod:`nbqat.kernels.norm_cpu`). ``clip_coef`` gives torch's clipping
coefficient so that an optimizer can fold it into its update (``step(grads, grad_scale=...)``).
"""

from __future__ import annotations

import math
import weakref
from collections import OrderedDict
from typing import Any

import numpy as np

from nbqat import _cuda
from nbqat._jit import threads_for
from nbqat._validate import first_shared_pair
from nbqat.kernels import norm_cpu as _k
from nbqat.kernels import segment_table

_RCODE = {
    np.dtype(np.float16): _k.R_F16,
    np.dtype(np.float32): _k.R_F32,
    np.dtype(np.float64): _k.R_F64,
}
_OPMATH: dict[np.dtype, type[np.floating]] = {
    np.dtype(np.float16): np.float32,
    np.dtype(np.float32): np.float32,
    np.dtype(np.float64): np.float64,
}


# --------------------------------------------------------------------------------------------
# argument handling


def _as_list(grads: Any, name: str = "grads") -> list:
    if isinstance(grads, np.ndarray) or _cuda.is_cuda_array(grads):
        return [grads]
    if isinstance(grads, (str, bytes)) or not hasattr(grads, "__iter__"):
        raise TypeError(
            f"{name} must be an array or a sequence of arrays (NumPy or CUDA), "
            f"got {type(grads).__name__}"
        )
    return list(grads)


def _norm_kind(norm_type: Any) -> tuple[int, float]:
    try:
        p = float(norm_type)
    except (TypeError, ValueError):
        raise TypeError(f"norm_type must be a positive float or 'inf', got {norm_type!r}") from None
    if not p > 0:  # also rejects NaN
        raise ValueError(f"norm_type must be > 0 (2.0, 1.0, 'inf', ...), got {norm_type!r}")
    if p == math.inf:
        return _k.KIND_INF, p
    if p == 2.0:
        return _k.KIND_L2, p
    if p == 1.0:
        return _k.KIND_L1, p
    return _k.KIND_P, p


def _nonneg(value: Any, name: str) -> float:
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise TypeError(f"{name} must be a float, got {type(value).__name__}") from None
    if not v >= 0:
        raise ValueError(f"{name} must be >= 0, got {value!r}")
    return v


def _split(grads: list, what: str) -> bool:
    """Validate the kinds of arrays; returns True for CUDA arrays, False for NumPy."""
    n_cuda = 0
    for i, g in enumerate(grads):
        if isinstance(g, np.ndarray):
            continue
        if _cuda.is_cuda_array(g):
            n_cuda += 1
            continue
        raise TypeError(
            f"grads[{i}] is a {type(g).__name__}; {what} expects NumPy or CUDA arrays "
            "(wrap lists with np.asarray)"
        )
    if n_cuda:
        _cuda.require_cuda(what)
    if n_cuda and n_cuda != len(grads):
        raise TypeError(
            f"{what} got a mix of NumPy and CUDA arrays; move them all to one device "
            "(cuda.to_device(...) or .copy_to_host())"
        )
    return n_cuda > 0


# --------------------------------------------------------------------------------------------
# segment tables (CPU)


class _Plan:
    """Per-dtype segment tables (:mod:`nbqat.kernels.segment_table`) for one list of NumPy
    arrays, cached by identity and layout."""

    __slots__ = ("refs", "layouts", "groups", "rdtype", "n", "size", "overlap")

    def __init__(self, refs, layouts, groups, rdtype, n, size, overlap):
        self.refs = refs  # weak references to the arrays, to check identity on a cache hit
        self.layouts = layouts  # each array's segment_table.layout, checked on a cache hit
        self.groups = groups  # [(dtype, proto, table, positions)]
        self.rdtype = rdtype  # torch's result dtype of the stacked norms
        self.n = n  # number of arrays
        self.size = size  # number of elements
        self.overlap = overlap  # (i, j): the first two arrays sharing memory, or None


def _build_plan(grads: list) -> _Plan:
    groups, rdtype = segment_table.tables(grads)
    refs = [weakref.ref(g) for g in grads]
    layouts = [segment_table.layout(g) for g in grads]
    size = sum(int(g.size) for g in grads)
    return _Plan(refs, layouts, groups, rdtype, len(grads), size, first_shared_pair(grads))


_PLANS: OrderedDict[tuple[int, ...], _Plan] = OrderedDict()
_MAX_PLANS = 16


def _plan(grads: list, write: bool) -> _Plan:
    """The segment tables of ``grads`` (NumPy), cached by array identity (weakly referenced)
    and layout."""
    key = tuple(map(id, grads))
    plan = _PLANS.get(key)
    if plan is not None and all(
        r() is g and lay == segment_table.layout(g)
        for r, lay, g in zip(plan.refs, plan.layouts, grads)
    ):
        _PLANS.move_to_end(key)
    else:
        plan = _build_plan(grads)
        _PLANS[key] = plan
        if len(_PLANS) > _MAX_PLANS:
            _PLANS.popitem(last=False)
    if write:
        for i, g in enumerate(grads):
            if not g.flags.writeable:
                raise ValueError(f"grads[{i}] is read-only; clipping writes in place")
        _refuse_overlap(plan.overlap)
    return plan


def _refuse_overlap(pair: tuple[int, int] | None) -> None:
    """ValueError naming ``pair``, two gradients that share memory (torch counts and scales
    the shared elements twice); nothing for None."""
    if pair is not None:
        i, j = pair
        raise ValueError(
            f"grads[{i}] and grads[{j}] share memory (the same array twice, or overlapping "
            "views): clipping would count and scale those elements twice; pass each "
            "gradient once"
        )


def _device_overlap(grads: list) -> tuple[int, int] | None:
    """The first pair ``(i, j)``, ``i < j``, of CUDA arrays whose byte ranges intersect (the
    CUDA path takes C-contiguous arrays only, for which that is sharing an element), or None."""
    spans = sorted((*_cuda.device_span(g), i) for i, g in enumerate(grads))
    hi, owner = None, -1
    for lo, end, i in spans:
        if lo == end:
            continue
        if hi is not None and lo < hi:
            return (min(owner, i), max(owner, i))
        if hi is None or end > hi:
            hi, owner = end, i
    return None


def _writable(grads: list, what: str) -> bool:
    """Validate gradients that ``what`` writes in place: their kinds (True for CUDA arrays),
    NumPy ones writable, none sharing memory with another (NumPy or CUDA); before anything
    runs."""
    if _split(grads, what):
        _refuse_overlap(_device_overlap(grads))
        return True
    _plan(grads, write=True)
    return False


# --------------------------------------------------------------------------------------------
# public API


def clip_coef(total_norm: float, max_norm: float, dtype: Any = np.float32) -> float:
    """torch's clipping coefficient ``min(max_norm / (total_norm + 1e-6), 1)``.

    Computed the way ``torch.nn.utils.clip_grads_with_norm_`` computes it on a ``dtype`` total
    norm tensor: ``total + 1e-6`` rounded to ``dtype``, its reciprocal, times ``max_norm``,
    clamped to at most 1 (NaN stays NaN). Pass it as ``grad_scale`` to an optimizer's ``step`` to
    fold clipping into the update (llm.c style): the result is bit-identical to clipping first.

    Parameters
    ----------
    total_norm : float
        The total gradient norm (e.g. from :func:`get_total_norm`).
    max_norm : float
        Maximum norm, ``>= 0``.
    dtype : float16, float32 (default) or float64
        The dtype of the gradients (torch computes the coefficient in that dtype).

    Returns
    -------
    float
        The coefficient (a value exactly representable in ``dtype``).

    Raises
    ------
    ValueError
        If ``max_norm`` is negative or NaN.
    """
    m = _nonneg(max_norm, "max_norm")
    dt = np.dtype(dtype)
    t = float(total_norm)
    with np.errstate(over="ignore", invalid="ignore"):  # Inf past the dtype, 0 * Inf: torch
        return _coef(t, m, dt)


def _coef(t: float, m: float, dt: np.dtype) -> float:
    """:func:`clip_coef`'s arithmetic in ``dt`` (validated arguments)."""
    if dt == np.float64:
        c = (1.0 / (t + 1e-6)) * m
    elif dt == np.float32:
        c = float((np.float32(1.0) / (np.float32(t) + np.float32(1e-6))) * np.float32(m))
    elif dt == np.float16:
        f16, f32 = np.float16, np.float32
        d = f16(f32(f16(t)) + f32(1e-6))
        r = f16(f32(1.0) / f32(d))
        c = float(f16(f32(r) * f32(m)))
    else:
        raise TypeError(f"dtype must be float16, float32 or float64, got {dt}")
    return 1.0 if c > 1.0 else c


def get_total_norm(
    grads: Any, norm_type: float | str = 2.0, error_if_nonfinite: bool = False
) -> float:
    """Norm of all gradients together, as if concatenated into one vector.

    Matches ``torch.nn.utils.get_total_norm``: the norm of the per-array norms.

    Parameters
    ----------
    grads : array or sequence of arrays
        NumPy or CUDA arrays (not mixed), float16 / float32 / float64, any shapes and strides.
    norm_type : float or 'inf', default 2.0
        The p of the p-norm, ``> 0``; ``inf`` (or ``'inf'``) for the max-norm.
    error_if_nonfinite : bool, default False
        Raise if the total norm is NaN or infinite.

    Returns
    -------
    float
        The total norm (a value of the gradients' result dtype: float32 for float32 grads);
        ``0.0`` for no arrays.

    Raises
    ------
    TypeError
        Non-array entries, non-float dtypes, NumPy and CUDA arrays mixed.
    ValueError
        ``norm_type <= 0``.
    RuntimeError
        ``error_if_nonfinite`` and the total norm is NaN or infinite (message names the order).

    Notes
    -----
    Each array's norm is accumulated in float64 over terms rounded to the compute type (float32
    for float16/float32), so it is within ~1e-7 relative of torch's float32 cascade sum and
    overflows/underflows exactly where torch's does (e.g. float32 values of 1e20 give ``inf``).
    The reduction order is fixed (chunks of :data:`nbqat.kernels.norm_cpu.CHUNK` elements merged
    in order): the same input gives the same bits for every thread count.

    References
    ----------
    ``torch.nn.utils.get_total_norm`` (torch 2.13).
    """
    return _total_norm(_as_list(grads), norm_type, error_if_nonfinite)[0]


def _total_norm(grads: list, norm_type: Any, error_if_nonfinite: bool) -> tuple[float, Any, Any]:
    kind, p = _norm_kind(norm_type)
    if not grads:
        return 0.0, None, np.dtype(np.float32)
    if _split(grads, "get_total_norm"):
        from nbqat.kernels import norm_cuda

        total, ctx, rdtype = norm_cuda.total_norm(grads, kind, p)
    else:
        plan = _plan(grads, write=False)
        with threads_for(plan.size):
            total = _cpu_total(plan, kind, p)
        ctx, rdtype = plan, plan.rdtype
    if error_if_nonfinite and not math.isfinite(total):
        raise RuntimeError(
            f"The total norm of order {float(norm_type)} for gradients from `parameters` is "
            "non-finite, so it cannot be clipped. To disable this error and scale the gradients "
            "by the non-finite norm anyway, set `error_if_nonfinite=False`"
        )
    return total, ctx, rdtype


def _cpu_total(plan: _Plan, kind: int, p: float) -> float:
    if len(plan.groups) == 1:
        dt, proto, table, _ = plan.groups[0]
        norms = np.empty(plan.n, np.float64)
        return float(_k.seg_norms(proto, table, plan.n, kind, p, _RCODE[dt], norms))
    # mixed dtypes: torch stacks the per-array norms (group by group) in the result dtype
    parts = []
    for dt, proto, table, positions in plan.groups:
        norms = np.empty(positions.size, np.float64)
        _k.seg_norms(proto, table, positions.size, kind, p, _RCODE[dt], norms)
        parts.append(norms)
    return float(_k.norm_of_values(np.concatenate(parts), kind, p, _RCODE[plan.rdtype]))


def _scale(grads: list, ctx: Any, coef: float) -> None:
    """Multiply every gradient by ``coef`` (a value of the result dtype), in place."""
    if coef == 1.0:
        return  # x * 1 == x for every x: torch's multiply changes nothing
    if grads and _cuda.is_cuda_array(grads[0]):
        from nbqat.kernels import norm_cuda

        norm_cuda.apply(grads, ctx, _k.OP_SCALE, coef, 0.0)
        return
    with threads_for(ctx.size):
        for dt, proto, table, _ in ctx.groups:
            a = float(_OPMATH[dt](coef))
            _k.seg_apply(proto, table, _k.OP_SCALE, a, 0.0)


def clip_grad_norm_(
    grads: Any,
    max_norm: float,
    norm_type: float | str = 2.0,
    error_if_nonfinite: bool = False,
) -> float:
    """Scale gradients in place so that their total norm is at most ``max_norm``.

    ``total = get_total_norm(grads, norm_type)``, then every gradient is multiplied by
    ``min(max_norm / (total + 1e-6), 1)`` (:func:`clip_coef`): a NaN total makes every gradient
    NaN, an infinite total makes them 0 (NaN where a gradient is itself infinite), exactly like
    torch.

    Parameters
    ----------
    grads : array or sequence of arrays
        Writable NumPy or CUDA arrays (not mixed, not overlapping), float16 / float32 / float64.
    max_norm : float
        Maximum total norm, ``>= 0`` (0 zeroes the gradients).
    norm_type : float or 'inf', default 2.0
        The p of the p-norm, ``> 0``.
    error_if_nonfinite : bool, default False
        Raise (leaving the gradients untouched) if the total norm is NaN or infinite.

    Returns
    -------
    float
        The total norm before clipping.

    Raises
    ------
    TypeError, ValueError, RuntimeError
        As :func:`get_total_norm`; ValueError also for a negative ``max_norm``, a read-only
        array, or two arrays (NumPy or CUDA) sharing memory (torch would count and scale the shared
        elements twice). Nothing is written before the checks pass.

    References
    ----------
    ``torch.nn.utils.clip_grad_norm_`` (torch 2.13).
    """
    grads = _as_list(grads)
    m = _nonneg(max_norm, "max_norm")
    _norm_kind(norm_type)
    if grads:
        _writable(grads, "clip_grad_norm_")
    total, ctx, rdtype = _total_norm(grads, norm_type, error_if_nonfinite)
    if grads:
        _scale(grads, ctx, clip_coef(total, m, rdtype))
    return total


def clip_grads_with_norm_(grads: Any, max_norm: float, total_norm: float) -> None:
    """Scale gradients in place by ``min(max_norm / (total_norm + 1e-6), 1)``.

    Parameters
    ----------
    grads : array or sequence of arrays
        Writable NumPy or CUDA arrays (not mixed), float16 / float32 / float64.
    max_norm : float
        ``>= 0``.
    total_norm : float
        A precomputed total norm (e.g. :func:`get_total_norm`).

    Raises
    ------
    TypeError, ValueError
        Bad arrays, negative ``max_norm``, read-only arrays.

    References
    ----------
    ``torch.nn.utils.clip_grads_with_norm_`` (torch 2.13).
    """
    grads = _as_list(grads)
    m = _nonneg(max_norm, "max_norm")
    try:
        t = float(total_norm)
    except (TypeError, ValueError):
        raise TypeError(f"total_norm must be a float, got {type(total_norm).__name__}") from None
    if not grads:
        return
    if _writable(grads, "clip_grads_with_norm_"):
        from nbqat.kernels import norm_cuda

        ctx, rdtype = norm_cuda.plan(grads)
    else:
        ctx = _plan(grads, write=False)
        rdtype = ctx.rdtype
    _scale(grads, ctx, clip_coef(t, m, rdtype))


def clip_grad_value_(grads: Any, clip_value: float) -> None:
    """Clamp every gradient element to ``[-clip_value, clip_value]`` in place (NaN stays NaN).

    Parameters
    ----------
    grads : array or sequence of arrays
        Writable NumPy or CUDA arrays (not mixed), float16 / float32 / float64.
    clip_value : float
        ``>= 0``; the bounds are rounded to each array's dtype.

    Raises
    ------
    TypeError, ValueError
        Bad arrays, negative or NaN ``clip_value``, read-only arrays.

    References
    ----------
    ``torch.nn.utils.clip_grad_value_`` (torch 2.13).
    """
    grads = _as_list(grads)
    c = _nonneg(clip_value, "clip_value")
    if not grads:
        return
    if _writable(grads, "clip_grad_value_"):
        from nbqat.kernels import norm_cuda

        ctx, _ = norm_cuda.plan(grads)
        norm_cuda.apply(grads, ctx, _k.OP_CLAMP, -c, c)
        return
    plan = _plan(grads, write=False)
    with threads_for(plan.size), np.errstate(over="ignore"):  # c past the dtype: Inf, no clip
        for dt, proto, table, _ in plan.groups:
            hi = float(dt.type(c))
            _k.seg_apply(proto, table, _k.OP_CLAMP, -hi, hi)


__all__ = [
    "clip_coef",
    "clip_grad_norm_",
    "clip_grad_value_",
    "clip_grads_with_norm_",
    "get_total_norm",
]
