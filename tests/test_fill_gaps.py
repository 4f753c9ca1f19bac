"""``--fill-gaps`` (``fill_gaps=True``): a repaired step never reads a later value, and the
repaired target steps are inputs only, never scored (validation, test, backtest)."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from nbqat.cli import main
from nbqat.data import from_dataframe, make_windows
from nbqat.data._forecast import forecast_windows

N, GAP = 400, list(range(360, 366))  # a 6-hour gap in the test split
QS = (0.1, 0.5, 0.9)


def _frame(seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    t = pd.date_range("2020-01-01", periods=N, freq="h")
    h = np.arange(N)
    return pd.DataFrame({
        "t": t, "y": 10 + 5 * np.sin(2 * np.pi * h / 24) + rng.normal(0, 1, N),
        "x": rng.normal(0, 1, N), "k": np.cos(2 * np.pi * h / 24) + 0.01 * h,
    })  # fmt: skip


def _gappy(df: pd.DataFrame) -> pd.DataFrame:
    out = df.drop(index=GAP).reset_index(drop=True)
    out.loc[100, "x"] = np.nan  # and one missing observed cell
    return out


def _load(df: pd.DataFrame, **kw):
    return from_dataframe(df, time_col="t", target_col="y", observed_cols="x", known_cols="k",
                          fill_gaps=True, **kw)  # fmt: skip


def test_repaired_steps_read_no_later_value():
    """Linear interpolation across a gap read the value after it: at an origin inside or just
    after the gap the history held a value derived from the forecast steps. The target and the
    observed columns now carry their last value (pandas' ffill); the known columns (known in
    advance) are still interpolated."""
    df = _frame()
    gap = _gappy(df)
    d = _load(gap)
    full = gap.set_index("t").reindex(df.t)
    np.testing.assert_array_equal(d.target[0], full.y.ffill().to_numpy())
    np.testing.assert_array_equal(d.observed[0][:, 0], full.x.ffill().to_numpy())
    want_k = full.k.interpolate(method="index").to_numpy()
    np.testing.assert_allclose(d.known[0][:, 0], want_k, rtol=1e-12)
    later = gap.copy()  # another value after the gap: nothing before it changes
    later.loc[GAP[0], ["y", "x"]] += 100.0
    d2 = _load(later)
    np.testing.assert_array_equal(d2.target[0][: GAP[-1] + 1], d.target[0][: GAP[-1] + 1])
    np.testing.assert_array_equal(d2.observed[0][: GAP[-1] + 1], d.observed[0][: GAP[-1] + 1])


def test_repaired_target_steps_are_marked_and_not_scored():
    """The windows mark the repaired target steps (scored False) and q_risk_table with the
    mask is the q-risk of the observed steps alone (a NumPy reference)."""
    from nbqat.train import q_risk

    df = _frame()
    d = _load(_gappy(df))
    w = make_windows(d, history=24, horizon=12, eval_stride=6)
    assert w.val.scored() is not None and w.val.scored().all()
    keep = w.test.scored()
    missing = np.isin(w.test.times(), df.t.to_numpy()[GAP].astype(w.test.times().dtype))
    np.testing.assert_array_equal(keep, ~missing)
    assert missing.any()
    np.testing.assert_array_equal(np.isnan(w.test.actual()), missing)
    rng = np.random.default_rng(1)
    y = w.test.target_raw()
    pred = y[..., None] + rng.normal(0, 1, y.shape + (3,))
    got = q_risk(pred, y, QS, keep)
    for j, q in enumerate(QS):
        e = y[keep] - pred[..., j][keep]
        want = 2 * np.sum(np.maximum(q * e, (q - 1) * e)) / np.sum(np.abs(y[keep]))
        assert got[f"P{round(100 * q)}"] == pytest.approx(want, rel=1e-12)
    plain = make_windows(from_dataframe(df, time_col="t", target_col="y", observed_cols="x",
                                        known_cols="k"), history=24, horizon=12)  # fmt: skip
    assert plain.test.scored() is None  # no repair: nothing masked (the default run)
    with pytest.raises(ValueError, match="scored must be a bool array"):
        q_risk(pred, y, QS, keep[:1])


def test_backtest_actuals_of_repaired_steps_are_empty():
    """A backtest over gap data compared its forecasts with the repaired (invented) target."""
    df = _frame()
    sc = make_windows(_load(df), history=24, horizon=12).scaling
    fw = forecast_windows(_load(_gappy(df), future_rows=True), sc, history=24, horizon=12,
                          quantiles=QS, backtest=(None, 6))  # fmt: skip
    t = fw.time[:, 24:]
    missing = np.isin(t, df.t.to_numpy()[GAP].astype(t.dtype))
    assert missing.any()
    np.testing.assert_array_equal(np.isnan(fw.actual), missing)


def test_run_scores_the_observed_test_steps_only(tmp_path):
    """metrics.json's test q-risk of the seasonal naive is the q-risk over the observed test
    steps: the repaired steps of a gap in the test split were
    scored too (P50 0.0940 against 0.0989 over the observed steps)."""
    from nbqat.train.baselines import seasonal_naive_forecast

    df = _frame()
    p = tmp_path / "gap.csv"
    _gappy(df).to_csv(p, index=False)
    out = tmp_path / "run"
    args = ["--csv", str(p), "--time-col", "t", "--target-col", "y", "--observed-cols", "x",
            "--known-cols", "k", "--fill-gaps", "--history", "24", "--horizon", "12"]  # fmt: skip
    tiny = ["--epochs", "1", "--qat-epochs", "1", "--batch-size", "16", "--hidden-dim", "4",
            "--heads", "1", "--windows-per-epoch", "32", "--calibration-batches", "2",
            "--eval-stride", "6", "--no-progress", "--no-plots", "--threads", "1"]  # fmt: skip
    assert main(["train", *args, *tiny, "--out", str(out)]) == 0
    got = json.loads((out / "metrics.json").read_text())["q_risk_test"]["seasonal_naive"]
    w = make_windows(_load(_gappy(df)), history=24, horizon=12, eval_stride=6)
    naive = seasonal_naive_forecast(w.test)[0]
    y = w.test.target_raw()
    keep = ~np.isin(w.test.times(), df.t.to_numpy()[GAP].astype(w.test.times().dtype))
    e = y[keep] - naive[..., 1][keep]
    want = np.sum(np.abs(e)) / np.sum(np.abs(y[keep]))
    assert got["P50"] == pytest.approx(want, rel=1e-12)
