"""Test helpers for nbqat.nn: finite differences and test-only quantization hooks.

The finite-difference oracle is the 4-point (Richardson) central stencil
``(8 (f(x+h) - f(x-h)) - (f(x+2h) - f(x-2h))) / 12h`` in float64, with truncation error
O(h^4); ``h = 1e-4`` keeps rounding noise near 1e-12 of the loss scale.
"""

from __future__ import annotations

import numpy as np

from nbqat.nn import TFTConfig

#: The small TFT of the tests: 2 static, 3 known, 4 unknown features, hidden size 8, history 5,
#: horizon 3, 2 heads (variants: ``dataclasses.replace(SMALL_TFT, linear_skip=True)``).
SMALL_TFT = TFTConfig(2, 3, 4, 8, 5, 3, num_heads=2)  # m_s, m_x, m_z, d, k, tau


def fd_grad(loss, x: np.ndarray, eps: float = 1e-4, indices=None) -> np.ndarray:
    """Finite-difference gradient of ``loss()`` w.r.t. the array ``x`` (perturbed in place).

    ``indices``: flat indices to differentiate (default all); other entries are NaN.
    """
    g = np.full(x.shape, np.nan)
    idx = range(x.size) if indices is None else indices
    flat = x.reshape(-1)  # a view: x must be contiguous
    assert np.shares_memory(flat, x)
    for i in idx:
        old = flat[i]
        v = []
        for h in (eps, -eps, 2 * eps, -2 * eps):
            flat[i] = old + h
            v.append(loss())
        flat[i] = old
        g.reshape(-1)[i] = (8.0 * (v[0] - v[1]) - (v[2] - v[3])) / (12.0 * eps)
    return g


def fd_directional(loss, x: np.ndarray, u: np.ndarray, eps: float = 1e-4) -> float:
    """Finite-difference directional derivative of ``loss()`` along ``u`` (x perturbed in place)."""
    old = x.copy()
    v = []
    for h in (eps, -eps, 2 * eps, -2 * eps):
        x[...] = old + h * u
        v.append(loss())
    x[...] = old
    return (8.0 * (v[0] - v[1]) - (v[2] - v[3])) / (12.0 * eps)


def rel_err(a: np.ndarray, b: np.ndarray, floor: float = 0.0) -> float:
    """``max|a - b| / max(max|b|, floor)`` (b is the oracle)."""
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    den = max(float(np.max(np.abs(b))) if b.size else 0.0, floor)
    num = float(np.max(np.abs(a - b))) if a.size else 0.0
    return num / den if den > 0 else num


class SquareHook:
    """A smooth, nonlinear test hook ``y = x + a x^2`` with ``ctx = x``; backward
    ``g * (1 + 2 a ctx)``. Finite differences catch a wrong or stale ctx."""

    def __init__(self, a: float = 0.05) -> None:
        self.a = a
        self.ctx = None
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        self.ctx = np.array(x, copy=True)
        return (x + x.dtype.type(self.a) * x * x).astype(x.dtype)

    __call__ = forward

    def backward(self, grad, ctx=None):
        c = self.ctx if ctx is None else ctx
        return (grad * (1 + 2 * grad.dtype.type(self.a) * c)).astype(grad.dtype)


class IdentityHook:
    """``y = x`` (a copy), ctx None, backward returns ``grad`` (copied)."""

    def __init__(self) -> None:
        self.ctx = None

    def forward(self, x):
        self.ctx = None
        return x.copy()

    def backward(self, grad, ctx=None):
        return grad.copy()


class NumpyFakeQuant:
    """Per-tensor affine fake quantization in NumPy with an STE mask (test oracle hook):
    ``y = (clip(rint(x / s) + zp, qmin, qmax) - zp) * s``,
    ``ctx = (qmin <= rint(x / s) + zp <= qmax)``."""

    def __init__(self, scale: float, zero_point: int = 0, qmin: int = -128, qmax: int = 127):
        self.scale, self.zp, self.qmin, self.qmax = scale, zero_point, qmin, qmax
        self.ctx = None

    def forward(self, x):
        s = x.dtype.type(self.scale)
        q = np.rint(x / s) + self.zp
        self.ctx = (q >= self.qmin) & (q <= self.qmax)
        return ((np.clip(q, self.qmin, self.qmax) - self.zp) * s).astype(x.dtype)

    def backward(self, grad, ctx=None):
        m = self.ctx if ctx is None else ctx
        return np.where(m, grad, 0).astype(grad.dtype)


def forecast_batch(rng, cfg, nb: int, dtype=np.float32, target: bool = True, target_scale=None):
    """A random forecaster batch for ``cfg`` (TFTConfig / LSTMForecasterConfig): standard
    normal static (nb, m_s), historical (nb, input_length, m_z), future (nb, tau, m_x) and, with
    ``target``, target (nb, tau) (times ``target_scale`` before the cast), drawn in that order."""
    shapes = [
        (nb, cfg.num_static_features),
        (nb, cfg.input_length, cfg.num_unknown_features),
        (nb, cfg.prediction_horizon, cfg.num_known_features),
    ]
    out = [rng.standard_normal(s).astype(dtype) for s in shapes]
    if target:
        y = rng.standard_normal((nb, cfg.prediction_horizon))
        out.append((y if target_scale is None else target_scale * y).astype(dtype))
    return tuple(out)


def observed_lstm(rng, input_size: int, hidden_size: int, batch: int, steps: int, seed: int):
    """An ``LSTM(input_size, hidden_size)`` (float32 buffer, ``seed``) with
    ``default_qat_qconfig`` fake-quant hooks whose observers have seen one forward of a random
    batch: standard normal ``xs`` (batch, steps, input_size), ``h0`` and ``c0`` (batch,
    hidden_size) times 0.5, drawn in that order. Returns ``(lstm, xs, h0, c0)``."""
    from nbqat.nn import LSTM, ParameterBuffer
    from nbqat.quantization.qconfig import default_qat_qconfig as qc

    lstm = LSTM(input_size, hidden_size)
    ParameterBuffer(lstm, np.float32, seed=seed)
    lstm.weight_ih_fake_quant, lstm.weight_hh_fake_quant = qc.weight(), qc.weight()
    lstm.input_fake_quant, lstm.hidden_fake_quant = qc.activation(), qc.activation()
    xs = rng.standard_normal((batch, steps, input_size)).astype(np.float32)
    h0 = rng.standard_normal((batch, hidden_size)).astype(np.float32) * 0.5
    c0 = rng.standard_normal((batch, hidden_size)).astype(np.float32) * 0.5
    lstm.forward(xs, h0, c0)
    return lstm, xs, h0, c0
