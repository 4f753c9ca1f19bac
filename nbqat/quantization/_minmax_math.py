"""The min/max observers' float32 NumPy expressions, each written once: the non-finite policy,
the running update, the merge, the qparams and the serialized state's checks.

Pure functions of arrays (no observer object), torch 2.13's expressions operation by operation
(``torch/ao/quantization/observer.py``); :mod:`nbqat.quantization.observers` calls them. The
arithmetic of
the update and of the qparams is :mod:`nbqat.kernels.observer_formula`, written once and called
here through row kernels and by :class:`nbqat.FakeQuantize`'s fused path; this module adds the
policies and the warnings.
"""

from __future__ import annotations

import math
import warnings
from typing import Any

import numpy as np

from nbqat.kernels.qat_cpu import fold_rows, qparams_rows  # the formulas, written once
from nbqat.quantization._observer_args import DTYPES
from nbqat.quantization._observer_stats import INF_NOTE

__all__ = [
    "apply_policy",
    "check_min_max_shapes",
    "check_min_max_values",
    "fold_batch",
    "merge_min_max",
    "parse_min_max_state",
    "qparams",
    "refuse_set_min_max",
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
            f"{who}: the batch holds {t_nan} NaN, {t_pinf} +Inf and {t_ninf} -Inf values"
            f"{INF_NOTE if t_pinf + t_ninf else ''}; the observer state is unchanged. Fix "
            "the input, or construct the observer with "
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
    cur_min, cur_max = _row(cur_min), _row(cur_max)
    new_min, new_max = np.empty_like(cur_min), np.empty_like(cur_max)
    moving = averaging_constant is not None
    c = _F32(averaging_constant) if moving else _F32(1.0)
    fold_rows(_row(old_min), _row(old_max), cur_min, cur_max, moving, c, new_min, new_max)
    return new_min, new_max


def _row(a: Any) -> np.ndarray:
    """``a`` as a contiguous 1-D float32 array (the row kernels' argument)."""
    return np.ascontiguousarray(a, _F32).reshape(-1)


def merge_min_max(
    a_min: np.ndarray,
    a_max: np.ndarray,
    b_min: np.ndarray,
    b_max: np.ndarray,
    moving: bool,
    nonfinite: str = "propagate",
) -> tuple[np.ndarray, np.ndarray]:
    """Two observers' (C,) states combined: min/max (exact), or for moving averages the mean
    ``a + 0.5 * (b - a)`` in float32; an unset side (``(+inf, -inf)``) is ignored. ``b``'s
    state is checked against ``a``'s policy ``nonfinite`` first (ValueError: a NaN state of a
    ``"propagate"`` observer must not enter one that keeps NaN out)."""
    check_min_max_values(b_min, b_max, nonfinite, "merge", "merge such a state")
    a_unset = (a_min == np.inf) & (a_max == -np.inf)
    b_unset = (b_min == np.inf) & (b_max == -np.inf)
    if moving:
        h = _F32(0.5)
        with np.errstate(invalid="ignore", over="ignore"):
            new_min = a_min + h * (b_min - a_min)
            new_max = a_max + h * (b_max - a_max)
            # b - a overflows float32 for far-apart huge values (-3e38, 2e38: inf, not -5e37):
            # there the mean as h * a + h * b (each half exact, the sum within range)
            for new, a, b in ((new_min, a_min, b_min), (new_max, a_max, b_max)):
                over = ~np.isfinite(new) & np.isfinite(a) & np.isfinite(b)
                new[over] = (h * a + h * b)[over]
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
    mn, mx = _row(mn), _row(mx)
    scale, zp = np.empty_like(mn), np.empty(mn.shape, np.int64)
    symmetric, zp_sym = symmetric_zp is not None, int(symmetric_zp or 0)
    qparams_rows(mn, mx, int(qmin), int(qmax), _F32(eps), symmetric, zp_sym, scale, zp)
    if unset.any():
        scale = np.where(unset, _F32(1.0), scale)
        zp = np.where(unset, 0, zp)
    return scale.astype(_F32), zp.astype(np.int32)


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


def check_min_max_values(mn: np.ndarray, mx: np.ndarray, nonfinite: str, who: str, to: str):
    """ValueError unless ``(mn, mx)`` is a state the observer's own updates can reach: finite
    values or the unset pair ``(+inf, -inf)`` (any, under ``"propagate"``), and no entry with
    ``min > max``; ``to`` ends the hint on the policy."""
    # The common state first, in a few microseconds (the fused forward sets it every step):
    # every entry finite with min <= max is exactly max - min (in float64) finite and >= 0.
    if mn.ndim == 0:
        a, b = float(mn), float(mx)
        if a == math.inf and b == -math.inf:
            return
        if (nonfinite == "propagate" or (math.isfinite(a) and math.isfinite(b))) and not a > b:
            return
    elif mn.size:
        d = np.subtract(mx, mn, dtype=np.float64)
        if d.min() >= 0.0 and d.max() < math.inf:
            return
    unset = (mn == np.inf) & (mx == -np.inf)
    if nonfinite != "propagate" and not np.all(unset | (np.isfinite(mn) & np.isfinite(mx))):
        raise ValueError(
            f"{who}: min_val/max_val hold NaN or Inf, which an observer with "
            f"nonfinite={nonfinite!r} never stores; construct it with nonfinite='propagate' "
            f"(torch's behaviour) to {to}"
        )
    if np.any((mn > mx) & ~unset):
        raise ValueError(f"{who}: min_val > max_val for some entries")


def refuse_set_min_max(self: Any, min_val: Any, max_val: Any) -> None:
    """``set_min_max`` of an observer whose state is more than its min/max (a histogram, key
    counts): new bounds would reinterpret those counts over another range.

    Parameters
    ----------
    min_val, max_val : array_like of float
        Ignored.

    Raises
    ------
    TypeError
        Always; the state is unchanged.
    """
    raise TypeError(
        f"{type(self).__name__}.set_min_max: the state holds counts of the data seen as well; "
        "other bounds would leave them describing another range (silently wrong qparams). Use "
        "load_state_dict (a whole state) or reset_min_max_vals() and observe again"
    )


def parse_min_max_state(
    state: Any, strict: bool, per_channel: bool, eps: np.float32, nonfinite: str
) -> tuple[np.ndarray, np.ndarray, np.float32]:
    """``(min_val, max_val, eps)`` of a min/max observer's ``state_dict`` (checked, float32).

    ``nonfinite`` is the observer's policy: except under ``"propagate"`` (torch's), a state
    holds finite values or the unset pair ``(+inf, -inf)``, as the observer's own updates keep it.

    Raises
    ------
    TypeError
        ``state`` is not a mapping.
    KeyError
        ``min_val`` or ``max_val`` is missing.
    ValueError
        Unexpected keys (``strict``), wrong shapes, ``min_val > max_val``, NaN or Inf that the
        policy does not keep, a bad ``eps``.
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
    check_min_max_values(mn, mx, nonfinite, "load_state_dict", "load such a state")
    if "eps" in state:
        e = np.asarray(state["eps"], dtype=_F32).reshape(-1)
        if e.size != 1 or not (np.isfinite(e[0]) and e[0] > 0):
            raise ValueError(f"load_state_dict: eps must be one positive float, got {e}")
        eps = e[0]
    return mn, mx, _F32(eps)
