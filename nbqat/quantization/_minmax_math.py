"""The min/max observers' float32 NumPy expressions, each written once: the non-finite policy,
the running update, the merge, the qparams and the serialized state's checks.

Pure functions of arrays (no observer object), torch 2.13's expressions operation by operation
(``torch/ao/quantization/observer.py``); :mod:`nbqat.quantization.observers` calls them. The
compiled twins
of the update and the qparams for :class:`nbqat.FakeQuantize`'s fused path are in
:mod:`nbqat.kernels.qat_cpu` (tested bit for bit against these).
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np

from nbqat.quantization._observer_args import DTYPES

__all__ = [
    "apply_policy",
    "check_min_max_shapes",
    "fold_batch",
    "merge_min_max",
    "parse_min_max_state",
    "qparams",
    "symmetric_zero_point",
]

_F32 = np.float32


def apply_policy(policy: str, who: str, fmin, fmax, nnan, npinf, nninf):
    """A batch's (C,) min/max under the non-finite ``policy`` (raises before any state change).

    ``fmin``/``fmax`` are the finite values' float32 min/max, ``nnan``/``npinf``/``nninf`` the
    int64 counts (:mod:`nbqat.quantization._observer_stats`).
    """
    t_nan, t_pinf, t_ninf = int(nnan.sum()), int(npinf.sum()), int(nninf.sum())
    if t_nan + t_pinf + t_ninf == 0:
        return fmin, fmax
    if policy == "raise":
        raise ValueError(
            f"{who}: the batch holds {t_nan} NaN, {t_pinf} +Inf and {t_ninf} -Inf values; "
            "the observer state is unchanged. Fix the input, or construct the observer with "
            "nonfinite='ignore' (skip them) or nonfinite='propagate' (torch's behaviour)"
        )
    if policy == "ignore":
        return fmin, fmax  # finite-only; channels without a finite value are (+inf, -inf)
    # propagate: what torch.aminmax gives on the float32 data
    cur_min = np.where(nninf > 0, _F32(-np.inf), fmin).astype(_F32)
    cur_max = np.where(npinf > 0, _F32(np.inf), fmax).astype(_F32)
    cur_min = np.where(nnan > 0, _F32(np.nan), cur_min).astype(_F32)
    cur_max = np.where(nnan > 0, _F32(np.nan), cur_max).astype(_F32)
    return cur_min, cur_max


def fold_batch(
    old_min: np.ndarray,
    old_max: np.ndarray,
    cur_min: np.ndarray,
    cur_max: np.ndarray,
    averaging_constant: float | None,
) -> tuple[np.ndarray, np.ndarray]:
    """The running (C,) min/max after a batch's (C,) min/max (torch's expressions, float32).

    ``averaging_constant`` None: ``min(old, cur)`` / ``max(old, cur)`` (NaN-propagating, as
    ``torch.min``); otherwise ``old + c * (cur - old)``, the first batch setting the state.
    Entries the batch did not see (``cur_min > cur_max``) keep the old values.
    """
    cur_min = cur_min.astype(_F32, copy=False)
    cur_max = cur_max.astype(_F32, copy=False)
    empty = cur_min > cur_max  # only (+inf, -inf): no finite value seen ("ignore")
    unset = (old_min == np.inf) & (old_max == -np.inf)
    if averaging_constant is not None:
        c = _F32(averaging_constant)
        with np.errstate(invalid="ignore", over="ignore"):
            new_min = old_min + c * (cur_min - old_min)
            new_max = old_max + c * (cur_max - old_max)
        new_min = np.where(unset, cur_min, new_min)
        new_max = np.where(unset, cur_max, new_max)
    else:
        new_min = np.minimum(cur_min, old_min)
        new_max = np.maximum(cur_max, old_max)
    return (
        np.where(empty, old_min, new_min).astype(_F32),
        np.where(empty, old_max, new_max).astype(_F32),
    )


def merge_min_max(
    a_min: np.ndarray, a_max: np.ndarray, b_min: np.ndarray, b_max: np.ndarray, moving: bool
) -> tuple[np.ndarray, np.ndarray]:
    """Two observers' (C,) states combined: min/max (exact), or for moving averages the mean
    ``a + 0.5 * (b - a)`` in float32; an unset side (``(+inf, -inf)``) is ignored."""
    a_unset = (a_min == np.inf) & (a_max == -np.inf)
    b_unset = (b_min == np.inf) & (b_max == -np.inf)
    if moving:
        h = _F32(0.5)
        with np.errstate(invalid="ignore", over="ignore"):
            new_min = a_min + h * (b_min - a_min)
            new_max = a_max + h * (b_max - a_max)
    else:
        new_min = np.minimum(a_min, b_min)
        new_max = np.maximum(a_max, b_max)
    new_min = np.where(b_unset, a_min, np.where(a_unset, b_min, new_min)).astype(_F32)
    new_max = np.where(b_unset, a_max, np.where(a_unset, b_max, new_max)).astype(_F32)
    return new_min, new_max


def symmetric_zero_point(dtype: str, has_customized_qrange: bool, qmin: int, qmax: int) -> int:
    """The zero point of a symmetric qscheme: 0 (signed dtypes), 128 (quint8 with its default
    range), ``(qmin + qmax) // 2`` otherwise (torch's rule)."""
    if DTYPES[dtype][2]:
        return 0
    if has_customized_qrange or dtype != "quint8":
        return (qmin + qmax) // 2
    return 128


def qparams(
    min_val: Any,
    max_val: Any,
    qmin: int,
    qmax: int,
    eps: np.float32,
    symmetric_zp: int | None,
    per_channel: bool,
) -> tuple[np.ndarray, np.ndarray]:
    """``(scale, zero_point)`` of running min/max: torch's ``_calculate_qparams`` in float32.

    ``symmetric_zp`` is :func:`symmetric_zero_point` for a symmetric qscheme, None for affine.
    The formula and the warnings are those documented in
    :meth:`nbqat.MinMaxObserver.calculate_qparams`.
    """
    mn = np.asarray(min_val, _F32).reshape(-1)
    mx = np.asarray(max_val, _F32).reshape(-1)
    unset = (mn == np.inf) & (mx == -np.inf)
    if mn.size == 0 or (not per_channel and bool(unset[0])):
        warnings.warn(
            "must run observer before calling calculate_qparams. Returning default values.",
            UserWarning,
            stacklevel=4,
        )
        return np.array([1.0], _F32), np.array([0], np.int32)
    if unset.any():
        warnings.warn(
            f"{int(unset.sum())} channel(s) never saw a finite value: their scale is 1.0 and "
            "zero point 0",
            UserWarning,
            stacklevel=4,
        )
        mn = np.where(unset, _F32(0), mn)
        mx = np.where(unset, _F32(0), mx)
    if np.isnan(mn).any() or np.isnan(mx).any():
        warnings.warn(
            "the observer state holds NaN (nonfinite='propagate'): the scale is NaN, as in "
            "torch. Use nonfinite='raise' or 'ignore' to keep the statistics usable.",
            RuntimeWarning,
            stacklevel=4,
        )
    from nbqat.kernels.qat_cpu import qparams_rows  # the formula, written once

    scale, r = np.empty_like(mn), np.empty_like(mn)
    qparams_rows(mn, mx, int(qmin), int(qmax), _F32(eps), symmetric_zp is not None, scale, r)
    if symmetric_zp is None:
        _rescale_wide(mn, mx, int(qmin), int(qmax), _F32(eps), scale, r)
    with np.errstate(invalid="ignore"):
        if symmetric_zp is not None:
            zp = np.full(mn.shape, symmetric_zp, np.int64)
        else:
            ok = np.isfinite(r) & (r >= -(2.0**31)) & (r < 2.0**31)
            ri = np.where(ok, r, _F32(-(2.0**31))).astype(np.int64)  # x86 cvt: INT32_MIN
            z = np.int64(qmin) - ri
            z = (z + 2**31) % 2**32 - 2**31  # int32 wrap-around, as torch's int32 tensor op
            zp = np.clip(z, qmin, qmax)
    if unset.any():
        scale = np.where(unset, _F32(1.0), scale)
        zp = np.where(unset, 0, zp)
    return scale.astype(_F32), zp.astype(np.int32)


def _rescale_wide(mn, mx, qmin: int, qmax: int, eps: np.float32, scale, r) -> None:
    """Affine entries whose width ``max_pos - min_neg`` overflows float32 (a finite range of
    width > 3.4e38): torch's formula on the range halved, the scale doubled back, in place.

    Halving and doubling are exact in float32 there (the range's ends are far from the
    subnormals), so the scale is the float32 rounding of the true ``width / (qmax - qmin)``
    and ``r = rint(min_neg / scale)`` is unchanged; torch itself returns ``inf`` (and then
    rejects that scale when fake-quantizing).
    """
    from nbqat.kernels.qat_cpu import qparams_rows

    with np.errstate(invalid="ignore"):
        wide = np.isinf(scale) & np.isfinite(mn) & np.isfinite(mx)
    if not wide.any():
        return
    half = _F32(0.5)
    s2, r2 = np.empty(int(wide.sum()), _F32), np.empty(int(wide.sum()), _F32)
    qparams_rows(mn[wide] * half, mx[wide] * half, qmin, qmax, eps, False, s2, r2)
    scale[wide] = s2 * _F32(2.0)  # inf again only where the true scale exceeds float32
    r[wide] = r2


def check_min_max_shapes(
    mn: np.ndarray, mx: np.ndarray, per_channel: bool, who: str
) -> tuple[np.ndarray, np.ndarray]:
    """``(mn, mx)`` shaped as the state: (C,) each per channel, () per tensor (ValueError for
    other shapes)."""
    if per_channel:
        if mn.ndim != 1 or mx.shape != mn.shape:
            raise ValueError(
                f"{who}: per-channel min_val/max_val must be 1-D of equal length, "
                f"got shapes {mn.shape} and {mx.shape}"
            )
        return mn, mx
    if mn.size != 1 or mx.size != 1 or mn.ndim > 1 or mx.ndim > 1:
        raise ValueError(
            f"{who}: per-tensor min_val/max_val must have shape () or (1,), "
            f"got {mn.shape} and {mx.shape}"
        )
    return mn.reshape(()), mx.reshape(())


def parse_min_max_state(
    state: Any, strict: bool, per_channel: bool, eps: np.float32
) -> tuple[np.ndarray, np.ndarray, np.float32]:
    """``(min_val, max_val, eps)`` of a min/max observer's ``state_dict`` (checked, float32).

    Raises
    ------
    TypeError
        ``state`` is not a mapping.
    KeyError
        ``min_val`` or ``max_val`` is missing.
    ValueError
        Unexpected keys (``strict``), wrong shapes, ``min_val > max_val``, a bad ``eps``.
    """
    if not hasattr(state, "keys"):
        raise TypeError(f"state must be a mapping (a state_dict()), got {type(state).__name__}")
    missing = [k for k in ("min_val", "max_val") if k not in state]
    if missing:
        raise KeyError(f"load_state_dict: missing key(s) {missing} (expected min_val, max_val)")
    extra = sorted(set(state) - {"eps", "min_val", "max_val"})
    if strict and extra:
        raise ValueError(f"load_state_dict: unexpected key(s) {extra} (pass strict=False)")
    try:
        mn = np.array(state["min_val"], dtype=_F32)
        mx = np.array(state["max_val"], dtype=_F32)
    except (TypeError, ValueError):
        raise ValueError("load_state_dict: min_val/max_val must be float arrays") from None
    mn, mx = check_min_max_shapes(mn, mx, per_channel, "load_state_dict")
    unset = (mn == np.inf) & (mx == -np.inf)
    if np.any((mn > mx) & ~unset):
        raise ValueError("load_state_dict: min_val > max_val for some entries")
    if "eps" in state:
        e = np.asarray(state["eps"], dtype=_F32).reshape(-1)
        if e.size != 1 or not (np.isfinite(e[0]) and e[0] > 0):
            raise ValueError(f"load_state_dict: eps must be one positive float, got {e}")
        eps = e[0]
    return mn, mx, _F32(eps)
