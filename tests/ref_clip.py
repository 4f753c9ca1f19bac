"""Slow, obvious NumPy references for gradient clipping and the optimizers (test oracles).

Norms are computed exactly in float64 (no rounding emulation): nbqat must be within 1e-6
relative of them. The optimizer references apply torch's single-tensor update one NumPy
operation at a time in float32, with torch's fused multiply-adds written as one float64
multiply-add rounded once to float32 (``fma32``; exact for the product, a double rounding of the
sum is possible but needs a float64 sum that lands exactly on a float32 tie).
"""

from __future__ import annotations

import numpy as np


def exact_total_norm(arrays, p: float) -> float:
    """p-norm of all elements of all arrays, in float64."""
    if not arrays:
        return 0.0
    flat = np.concatenate([np.asarray(a, np.float64).ravel() for a in arrays])
    if flat.size == 0:
        return 0.0
    if p == np.inf:
        return float(np.max(np.abs(flat)))
    return float(np.sum(np.abs(flat) ** p) ** (1.0 / p))


def clip_coef32(total: float, max_norm: float) -> np.float32:
    """torch's float32 coefficient: reciprocal(total + 1e-6) * max_norm, clamped to 1."""
    f = np.float32
    c = (f(1.0) / (f(total) + f(1e-6))) * f(max_norm)
    return c if not c > 1 else f(1.0)


def fma32(a, b, c):
    """float32 fused multiply-add via float64 (the product of two float32 is exact)."""
    r = np.asarray(a, np.float64) * np.asarray(b, np.float64) + np.asarray(c, np.float64)
    return r.astype(np.float32)


def sgd_ref(p, g, buf, *, lr, momentum=0.0, dampening=0.0, weight_decay=0.0, nesterov=False,
            grad_scale=1.0):  # fmt: skip
    """One float32 SGD step (torch _single_tensor_sgd). Returns (p, buf)."""
    f = np.float32
    g = g * f(grad_scale) if grad_scale != 1.0 else g.copy()
    if weight_decay:
        g = fma32(f(weight_decay), p, g)
    if momentum:
        buf = g.copy() if buf is None else fma32(f(1 - dampening), g, buf * f(momentum))
        g = fma32(f(momentum), buf, g) if nesterov else buf
    return fma32(f(-lr), g, p), buf


def adam_ref(p, g, m, v, step, *, lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0,
             decoupled=False, grad_scale=1.0):  # fmt: skip
    """One float32 Adam/AdamW step (torch _single_tensor_adam) with exact sqrt.
    ``step`` is the new step count. Returns (p, m, v)."""
    f = np.float32
    b1, b2 = betas
    g = g * f(grad_scale) if grad_scale != 1.0 else g.copy()
    if weight_decay:
        if decoupled:
            p = p * f(1 - lr * weight_decay)
        else:
            g = fma32(f(weight_decay), p, g)
    w = f(1 - b1)
    d = g - m
    m = fma32(w, d, m) if abs(w) < 0.5 else fma32(-d, f(1) - w, g)
    v = fma32(f(1 - b2) * g, g, v * f(b2))
    bc1 = 1 - b1**step
    bc2 = 1 - b2**step
    denom = np.sqrt(v) / f(bc2**0.5) + f(eps)
    p = p + (f(-(lr / bc1)) * m) / denom
    return p, m, v
