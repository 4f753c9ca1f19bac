"""Slow, obviously-correct NumPy references for the observers (the oracle besides PyTorch).

Everything works element by element on NumPy float32 scalars, with no compiled code and no code
shared with :mod:`nbqat.quantization.observers`.
"""

from __future__ import annotations

import numpy as np

F32 = np.float32


def ref_channel_values(x: np.ndarray, axis: int | None) -> list[np.ndarray]:
    """The float32 values of each channel (one list entry per tensor when axis is None)."""
    x32 = np.asarray(x).astype(np.float32)
    if axis is None:
        return [x32.reshape(-1)]
    moved = np.moveaxis(x32, axis, 0)
    return [moved[c].reshape(-1) for c in range(moved.shape[0])]


def ref_batch_minmax(values: np.ndarray, policy: str) -> tuple[float, float, int, int, int]:
    """(min, max, n_nan, n_pinf, n_ninf) of one channel's values under a non-finite policy,
    with a plain Python loop. "ignore"/"raise" give the finite min/max (inf, -inf if none);
    "propagate" gives what torch.aminmax gives (NaN if any NaN)."""
    mn, mx = F32(np.inf), F32(-np.inf)
    n_nan = n_pinf = n_ninf = 0
    for v in values:
        if np.isnan(v):
            n_nan += 1
        elif v == np.inf:
            n_pinf += 1
        elif v == -np.inf:
            n_ninf += 1
        else:
            mn = v if v < mn else mn
            mx = v if v > mx else mx
    if policy == "propagate":
        if n_nan:
            return F32(np.nan), F32(np.nan), n_nan, n_pinf, n_ninf
        if n_ninf:
            mn = F32(-np.inf)
        if n_pinf:
            mx = F32(np.inf)
    return mn, mx, n_nan, n_pinf, n_ninf


class RefObserver:
    """Running statistics of a stream of batches (per tensor when ``axis is None``)."""

    def __init__(self, axis: int | None = None, moving: float | None = None, policy="raise"):
        self.axis = axis
        self.c = None if moving is None else F32(moving)
        self.policy = policy
        self.min: list | None = None
        self.max: list | None = None

    def observe(self, x: np.ndarray) -> None:
        if np.asarray(x).size == 0:
            return
        chans = ref_channel_values(x, self.axis)
        cur = [ref_batch_minmax(v, self.policy) for v in chans]
        if self.policy == "raise" and any(sum(c[2:]) for c in cur):
            raise ValueError("non-finite")
        if self.min is None:
            self.min = [F32(np.inf)] * len(cur)
            self.max = [F32(-np.inf)] * len(cur)
        for i, (cmn, cmx, *_rest) in enumerate(cur):
            if cmn > cmx:  # no finite value ("ignore")
                continue
            smn, smx = self.min[i], self.max[i]
            if smn == np.inf and smx == -np.inf:
                self.min[i], self.max[i] = cmn, cmx
            elif self.c is None:
                self.min[i] = F32(np.nan) if np.isnan(cmn) or np.isnan(smn) else min(smn, cmn)
                self.max[i] = F32(np.nan) if np.isnan(cmx) or np.isnan(smx) else max(smx, cmx)
            else:
                self.min[i] = F32(smn + self.c * F32(cmn - smn))
                self.max[i] = F32(smx + self.c * F32(cmx - smx))


def ref_qparams(
    min_val: float,
    max_val: float,
    qmin: int,
    qmax: int,
    symmetric: bool,
    sym_zero_point: int = 0,
    eps: float = float(np.finfo(np.float32).eps),
) -> tuple[np.float32, int]:
    """One channel's (scale, zero_point) from torch's formula, on float32 scalars
    (finite min/max only)."""
    mn, mx = F32(min_val), F32(max_val)
    e = F32(eps)
    min_neg = mn if mn < 0 else F32(0)
    max_pos = mx if mx > 0 else F32(0)
    if symmetric:
        m = max(F32(-min_neg), max_pos)
        scale = F32(m / F32((qmax - qmin) / 2))
        return max(scale, e), sym_zero_point
    scale = F32(F32(max_pos - min_neg) / F32(qmax - qmin))
    scale = max(scale, e)
    zp = qmin - int(np.rint(F32(min_neg / scale)))
    return scale, min(max(zp, qmin), qmax)
