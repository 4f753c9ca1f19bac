"""CUDA twins of :mod:`nbqat.kernels.optim_cpu`: fused SGD / Adam / AdamW updates.

Grid-stride elementwise kernels with the same operation order and the same fused multiply-adds
(``cuda.fma``) as the CPU kernels; without fastmath, CUDA's float32 ``/`` and ``sqrt`` are
correctly rounded, so a real GPU gives the CPU twin's bits. (The simulator evaluates ``cuda.fma``
as two roundings and ``math.sqrt`` in float64, so simulated results agree to a few ulp only.)
"""

from __future__ import annotations

import math

import numpy as np

from nbqat import _cuda
from nbqat._cuda import cuda


@cuda.jit
def sgd_step_kernel(p, g, buf, gs, lr_neg, momentum, one_minus_damp, wd, nesterov, first, scale):
    """See :func:`nbqat.kernels.optim_cpu.sgd_step` (same arguments, device arrays)."""
    start, stride = cuda.grid(1), cuda.gridsize(1)
    for i in range(start, p.shape[0], stride):
        gi = g[i]
        if scale:
            gi = gi * gs
        if wd != 0:
            gi = cuda.fma(wd, p[i], gi)
        if momentum != 0:
            if first:
                b = gi
            else:
                b = cuda.fma(one_minus_damp, gi, buf[i] * momentum)
            buf[i] = b
            if nesterov:
                gi = cuda.fma(momentum, b, gi)
            else:
                gi = b
        p[i] = cuda.fma(lr_neg, gi, p[i])


@cuda.jit
def adam_step_kernel(p, g, m, v, gs, w1, one_minus_w1, beta2, one_minus_beta2, wd, decay,
                     bc2_sqrt, eps, step_neg, decoupled, scale):  # fmt: skip
    """See :func:`nbqat.kernels.optim_cpu.adam_step` (same arguments, device arrays)."""
    start, stride = cuda.grid(1), cuda.gridsize(1)
    for i in range(start, p.shape[0], stride):
        gi = g[i]
        if scale:
            gi = gi * gs
        pi = p[i]
        if decoupled:
            pi = pi * decay
        elif wd != 0:
            gi = cuda.fma(wd, pi, gi)
        mi = m[i]
        d = gi - mi
        if abs(w1) < 0.5:
            mi = cuda.fma(w1, d, mi)
        else:
            mi = cuda.fma(-d, one_minus_w1, gi)
        vi = cuda.fma(one_minus_beta2 * gi, gi, v[i] * beta2)
        m[i] = mi
        v[i] = vi
        denom = math.sqrt(vi) / bc2_sqrt + eps
        p[i] = pi + (step_neg * mi) / denom


def sgd_step(p, *args) -> None:
    """Launch :func:`sgd_step_kernel` over the flat buffer."""
    blocks, tpb = _cuda.grid_1d(int(p.shape[0]))
    sgd_step_kernel[blocks, tpb](p, *args)


def adam_step(p, *args) -> None:
    """Launch :func:`adam_step_kernel` over the flat buffer."""
    blocks, tpb = _cuda.grid_1d(int(p.shape[0]))
    adam_step_kernel[blocks, tpb](p, *args)


def zeros(n: int, dtype) -> object:
    """A zero-filled (n,) device array."""
    return cuda.to_device(np.zeros(n, dtype))


def to_device(a: np.ndarray) -> object:
    """Copy a host array to the device."""
    return cuda.to_device(a)
