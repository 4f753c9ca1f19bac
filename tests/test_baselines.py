"""Baselines: the ridge regression on the flattened window against independent oracles.

Oracles: ``numpy.linalg.lstsq`` on the augmented least-squares system
``[[X, 1], [sqrt(lam) I, 0]] [beta; b] = [[y], [0]]`` (ridge with an unpenalised intercept,
solved by an SVD, not by the normal equations the code uses); the flattening written as explicit
loops; ``numpy.quantile`` of the oracle's residuals; the seasonal naive by index arithmetic.
"""

from __future__ import annotations

import numpy as np
import pytest

from nbqat.baselines import RidgeBaseline, flatten_window, seasonal_naive_forecast
from nbqat.data import load_tmy3, make_windows


class _Split:
    """A stand-in for nbqat.data.SplitWindows over fixed arrays (batch/unscale only)."""

    def __init__(self, s, h, f, y, level=0.0, scale=1.0):
        self.s, self.h, self.f, self.y = s, h, f, y
        self.level, self.scale = level, scale

    def __len__(self):
        return len(self.s)

    def batch(self, idx=None):
        i = slice(None) if idx is None else idx
        return self.s[i], self.h[i], self.f[i], self.y[i]

    def unscale(self, pred):
        return pred.astype(np.float64) * self.scale + self.level


def _data(rng, n=300, k=4, mz=3, tau=2, mx=2, ms=2):
    s = rng.normal(size=(n, ms)).astype(np.float32)
    h = rng.normal(size=(n, k, mz)).astype(np.float32)
    f = rng.normal(size=(n, tau, mx)).astype(np.float32)
    x = flatten_window(s, h, f)
    w = rng.normal(size=(x.shape[1], tau))
    y = (x @ w + 0.3 + rng.standard_t(3, size=(n, tau))).astype(np.float32)
    return s, h, f, y


def test_flatten_window_order(rng):
    s, h, f, _ = _data(rng, n=3)
    x = flatten_window(s, h, f)
    for b in range(3):
        want = [h[b, t, j] for t in range(h.shape[1]) for j in range(h.shape[2])]
        want += [f[b, t, j] for t in range(f.shape[1]) for j in range(f.shape[2])]
        want += list(s[b])
        np.testing.assert_array_equal(x[b], np.asarray(want, dtype=np.float64))
    with pytest.raises(ValueError, match="batch size"):
        flatten_window(s[:2], h, f)
    with pytest.raises(ValueError, match="dimensional"):
        flatten_window(s[:, 0], h, f)


@pytest.mark.parametrize("lam", [0.0, 1.0, 50.0])
def test_ridge_matches_lstsq_oracle(rng, lam, monkeypatch):
    import nbqat.baselines as bl

    monkeypatch.setattr(bl, "_CHUNK", 64)  # several chunks: the accumulation is exercised
    s, h, f, y = _data(rng)
    r = RidgeBaseline(lam=lam, quantiles=(0.1, 0.5, 0.9)).fit_split(_Split(s, h, f, y))
    x = flatten_window(s, h, f)
    n, nf = x.shape
    a = np.block([[x, np.ones((n, 1))], [np.sqrt(lam) * np.eye(nf), np.zeros((nf, 1))]])
    rhs = np.vstack([y.astype(np.float64), np.zeros((nf, y.shape[1]))])
    sol = np.linalg.lstsq(a, rhs, rcond=None)[0]
    np.testing.assert_allclose(r.coef, sol[:nf], rtol=1e-8, atol=1e-10)
    np.testing.assert_allclose(r.intercept, sol[nf], rtol=1e-8, atol=1e-10)
    res = y - (x @ sol[:nf] + sol[nf])
    for j, q in enumerate((0.1, 0.5, 0.9)):
        for t in range(y.shape[1]):
            assert r.residual_quantiles[t, j] == pytest.approx(np.quantile(res[:, t], q), abs=1e-8)
    pred = r.predict(s[:5], h[:5], f[:5])
    want = (x[:5] @ sol[:nf] + sol[nf])[..., None] + r.residual_quantiles[None]
    np.testing.assert_allclose(pred, want, rtol=1e-8, atol=1e-9)
    sp = _Split(s, h, f, y, level=2.0, scale=3.0)
    np.testing.assert_allclose(r.predict_split(sp, bs=7), 3.0 * r.predict(s, h, f) + 2.0)


def test_ridge_errors(rng):
    with pytest.raises(ValueError, match="lam"):
        RidgeBaseline(lam=-1.0)
    with pytest.raises(ValueError, match="quantiles"):
        RidgeBaseline(quantiles=(0.5, 0.1))
    s, h, f, y = _data(rng, n=20)
    with pytest.raises(RuntimeError, match="fit_split"):
        RidgeBaseline().predict(s, h, f)
    r = RidgeBaseline().fit_split(_Split(s, h, f, y))
    with pytest.raises(ValueError, match="features"):
        r.predict(s, h[:, :2], f)
    with pytest.raises(ValueError, match="at least 2"):
        RidgeBaseline().fit_split(_Split(s[:1], h[:1], f[:1], y[:1]))
    s[:, 0] = 1.5  # a constant static input: collinear with the intercept
    with pytest.raises(ValueError, match="lam=0 .* collinear"):
        RidgeBaseline(lam=0.0).fit_split(_Split(s, h, f, y))
    RidgeBaseline(lam=1e-3).fit_split(_Split(s, h, f, y))  # any penalty makes it solvable


def test_seasonal_naive_forecast_by_index():
    w = make_windows(load_tmy3(), history=24, horizon=6, eval_stride=500)
    q, point = seasonal_naive_forecast(w.test)
    t = w.test
    for i in range(len(t)):
        for hh in range(6):
            row = t.rows[i] + hh - w.season * (hh // w.season + 1)
            assert point[i, hh] == w.target_raw[row]
            np.testing.assert_allclose(
                q[i, hh], w.target_raw[row] + w.naive_residual_quantiles[t.entity[i]]
            )
