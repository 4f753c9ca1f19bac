"""Baselines: the ridge regression on the flattened window against independent oracles.

Oracles: ``numpy.linalg.lstsq`` on the augmented least-squares system
``[[X, 1], [sqrt(lam) I, 0]] [beta; b] = [[y], [0]]`` (ridge with an unpenalised intercept,
solved by an SVD, not by the normal equations the code uses: tests/ref_ridge.py); the flattening
written as explicit loops; ``numpy.quantile`` of the oracle's residuals; the seasonal naive by
index arithmetic.
"""

from __future__ import annotations

import numpy as np
import pytest
from ref_ridge import ridge_lstsq, ridge_oracle

from nbqat.data import load_tmy3, make_windows
from nbqat.train.baselines import RidgeBaseline, flatten_window, seasonal_naive_forecast


class _Split:
    """A stand-in for nbqat.data.SplitWindows over fixed arrays (batch/scored/unscale only)."""

    def __init__(self, s, h, f, y, level=0.0, scale=1.0):
        self.s, self.h, self.f, self.y = s, h, f, y
        self.level, self.scale = level, scale

    def __len__(self):
        return len(self.s)

    def batch(self, idx=None):
        i = slice(None) if idx is None else idx
        return self.s[i], self.h[i], self.f[i], self.y[i]

    def scored(self, idx=None):
        return None  # every target observed

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
    import nbqat.train.ridge_solve as ridge_solve

    monkeypatch.setattr(ridge_solve, "CHUNK", 64)  # several chunks: the accumulation is exercised
    s, h, f, y = _data(rng)
    r = RidgeBaseline(lam=lam, quantiles=(0.1, 0.5, 0.9)).fit_split(_Split(s, h, f, y))
    x = flatten_window(s, h, f)
    coef, b = ridge_lstsq(x, y, lam)
    np.testing.assert_allclose(r.coef, coef, rtol=1e-8, atol=1e-10)
    np.testing.assert_allclose(r.intercept, b, rtol=1e-8, atol=1e-10)
    res = y - (x @ coef + b)
    for j, q in enumerate((0.1, 0.5, 0.9)):
        for t in range(y.shape[1]):
            assert r.residual_quantiles[t, j] == pytest.approx(np.quantile(res[:, t], q), abs=1e-8)
    pred = r.predict(s[:5], h[:5], f[:5])
    want = (x[:5] @ coef + b)[..., None] + r.residual_quantiles[None]
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


def test_seasonal_naive_spread_per_seasons_back():
    """A step k seasons after the last observed one (horizon longer than the season) took the
    one-season residual's quantiles: too narrow a band (daily random walk, season 7: P10-P90
    held 60 % of the actuals three weeks back). Oracle: pandas' diff(k * season) on the
    training rows (dates before the validation cut) and its quantiles."""
    import pandas as pd

    from nbqat.data import from_dataframe

    rng = np.random.default_rng(0)
    n = 400
    t = pd.date_range("2000-01-01", periods=n, freq="D")
    df = pd.DataFrame({"t": t, "y": 100 + np.cumsum(rng.normal(size=n))})
    w = make_windows(from_dataframe(df, time_col="t", target_col="y"), history=28, horizon=17,
                     eval_stride=4)  # fmt: skip
    assert w.season == 7
    train = df.y[t < w.cutoffs[0]]
    q, point = seasonal_naive_forecast(w.test)
    for i, row in enumerate(w.test.rows):
        for hh in range(17):
            k = hh // 7 + 1
            assert point[i, hh] == df.y[row + hh - 7 * k]
            want = point[i, hh] + train.diff(7 * k).dropna().quantile([0.1, 0.5, 0.9]).to_numpy()
            np.testing.assert_allclose(q[i, hh], want, rtol=1e-12)


# --------------------------------------------------------------------- the tuned ridge


def _ar_windows(n=400, history=4, horizon=4):
    """One series on a numeric time axis (season = horizon = 4) whose target follows its own
    value 8 steps (two seasons) earlier: the model's history of 4 cannot see that lag."""
    import pandas as pd

    from nbqat.data import from_dataframe

    rng = np.random.default_rng(7)
    y = np.zeros(n)
    for t in range(8, n):
        y[t] = 0.9 * y[t - 8] + rng.normal()
    df = pd.DataFrame({"t": np.arange(n), "y": y + 10.0})
    data = from_dataframe(df, time_col="t", target_col="y")
    kw = dict(horizon=horizon, calendar=("time_index",), eval_stride=2)
    return data, kw, make_windows(data, history=history, **kw)


def _oracle_ridge(train, lam, q):
    """Ridge by lstsq (tests/ref_ridge.py), residual quantiles by numpy.quantile."""
    mean, res = ridge_oracle(train, lam)
    rq = np.array([[np.quantile(res[:, t], qq) for qq in q] for t in range(res.shape[1])])

    def predict(split):
        return split.unscale(mean(split)[..., None] + rq[None])

    return predict


def test_tuned_ridge_matches_a_plain_grid_search():
    # Oracle: every history's windows from make_windows itself (not Windows.with_history),
    # ridge by lstsq, the validation P50 q-risk written out (sum |y - P50| / sum |y|), and
    # the grid searched in plain Python.
    from nbqat.train.baselines import tune_ridge

    data, kw, w = _ar_windows()
    seasons, lambdas = (1, 2, 4), (0.01, 1.0, 300.0)
    tuned = tune_ridge(w, seasons=seasons, lambdas=lambdas)
    want, best = [], None
    for hist in (4, 8, 16):
        wh = make_windows(data, history=hist, **kw)
        for name in ("val", "test"):  # the same forecast starts as the model's
            np.testing.assert_array_equal(getattr(wh, name).rows, getattr(w, name).rows)
        for lam in lambdas:
            pred = _oracle_ridge(wh.train, lam, w.quantiles)
            yv = wh.val.target_raw()
            score = np.abs(yv - pred(wh.val)[..., 1]).sum() / np.abs(yv).sum()
            want.append((hist, lam, len(wh.train), score))
            if best is None or score < best[0]:
                best = (score, hist, lam, pred(wh.test))
    got = [(g["history"], g["lambda"], g["train_windows"], g["val_P50"]) for g in tuned.grid]
    assert [g[:3] for g in got] == [g[:3] for g in want]
    np.testing.assert_allclose([g[3] for g in got], [g[3] for g in want], rtol=1e-7)
    assert (tuned.history, tuned.lam) == (best[1], best[2])
    assert tuned.history >= 8 and (tuned.history, tuned.lam) != (w.history, 1.0)  # not fixed
    np.testing.assert_allclose(tuned.predict_split(w.test), best[3], rtol=1e-7, atol=1e-7)
    s = tuned.summary()
    assert (s["history"], s["lambda"], s["season"], s["criterion"]) == (
        tuned.history, tuned.lam, 4, "val_P50")  # fmt: skip
    assert len(s["grid"]) == 9 and s["excluded_histories"] == {}


def test_tuned_ridge_keeps_to_the_histories_the_data_allows():
    from nbqat.train.baselines import ridge_histories, tune_ridge

    _, _, w = _ar_windows()
    # 400 rows, the validation split starts at row 280: a history of 300 would move the
    # model's validation starts, one of 400 is longer than the data
    allowed, excluded = ridge_histories(w, (1, 75, 100))
    assert list(allowed) == [4] and allowed[4] is w
    assert set(excluded) == {300, 400} and "validation or test" in excluded[300]
    assert excluded[400] == "longer than the data"
    t = tune_ridge(w, seasons=(1, 75), lambdas=(1.0,))
    assert t.summary()["excluded_histories"] == {"300": excluded[300]}
    with pytest.raises(ValueError, match="seasons"):
        ridge_histories(w, (0,))
    with pytest.raises(ValueError, match="lambdas"):
        tune_ridge(w, lambdas=())
    with pytest.raises(ValueError, match="history must be"):
        w.with_history(2)  # shorter than the season
    other = _ar_windows(n=300)[2]
    with pytest.raises(ValueError, match="not one of the windows"):
        t.predict_split(other.test)


def test_tuned_ridge_with_the_fixed_point_in_its_grid_is_not_worse_on_validation():
    from nbqat.train.baselines import tune_ridge

    w = make_windows(load_tmy3(), history=24, horizon=6, eval_stride=24, train_stride=8)
    t = tune_ridge(w, seasons=(1, 2), lambdas=(1.0, 100.0))
    fixed = next(g for g in t.grid if g["history"] == 24 and g["lambda"] == 1.0)
    assert min(g["val_P50"] for g in t.grid) == pytest.approx(
        next(g["val_P50"] for g in t.grid if (g["history"], g["lambda"]) == (t.history, t.lam))
    )
    assert fixed["val_P50"] >= min(g["val_P50"] for g in t.grid)
    r = RidgeBaseline(1.0, w.quantiles).fit_split(w.train)  # the fixed row, fitted directly
    from nbqat.nn.loss import q_risk_table

    assert q_risk_table(r.predict_split(w.val), w.val.target_raw(), w.quantiles)["P50"] == (
        pytest.approx(fixed["val_P50"], rel=1e-9)
    )


def test_the_metrics_compare_with_the_tuned_ridge():
    # The comparisons, targets and Diebold-Mariano tests read the "ridge" row (the tuned one),
    # never ridge_fixed: two baselines far apart, the oracle written from the definitions.
    from types import SimpleNamespace

    from nbqat.train import evaluate as ev

    p50 = {"seasonal_naive": 0.5, "ridge": 0.4, "ridge_fixed": 0.3, "float": 0.39,
           "float_finetuned": 0.39, "ptq_int8": 0.4, "qat_fake_quant": 0.39,
           "int8": 0.39}  # fmt: skip
    c = ev._comparisons(p50, np.zeros(3), np.zeros(3))
    assert c["float_vs_ridge_P50_improvement"] == pytest.approx(1 - 0.39 / 0.4)
    assert c["int8_vs_ridge_P50_improvement"] == pytest.approx(1 - 0.39 / 0.4)
    assert c["float_vs_ridge_fixed_P50_improvement"] == pytest.approx(1 - 0.39 / 0.3)
    assert not ev._targets(p50)["float_P50_at_least_5pct_better_than_ridge"]
    assert ev._targets({**p50, "ridge": 0.42})["float_P50_at_least_5pct_better_than_ridge"]
    rng = np.random.default_rng(0)
    y = rng.normal(size=(40, 6))
    p = {k: y[..., None] + rng.normal(size=(40, 6, 3)) for k in ("float", "int8", "naive")}
    p["ridge"] = y[..., None] + 3.0 * rng.normal(size=(40, 6, 3))
    p["ridge_fixed"] = y[..., None] + 0.0  # perfect: a test against it would differ wildly
    times = SimpleNamespace(times=lambda: np.arange(40)[:, None] * 6 + np.arange(6),
                            scored=lambda: None)  # fmt: skip
    w = SimpleNamespace(quantiles=(0.1, 0.5, 0.9), horizon=6, eval_stride=6, step=1, test=times)
    sig = ev._significance(p, y, w)
    for m in ("float", "int8"):
        d = np.mean(np.abs(y - p[m][..., 1]), axis=1) / 2 - np.mean(
            np.abs(y - p["ridge"][..., 1]), axis=1) / 2  # fmt: skip
        assert sig[f"{m}_vs_ridge_P50"]["mean_diff"] == pytest.approx(d.mean())
