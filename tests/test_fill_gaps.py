"""``--fill-gaps`` (``fill_gaps=True``): a repaired step never reads a later value, and the
repaired target steps are inputs only, never scored (validation, test, backtest)."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from nbqat.cli import main
from nbqat.data import DataError, from_dataframe, make_windows
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


def test_masked_quantile_loss_is_torchs_masked_mean(torch, rng):
    """The training loss with a mask is torch's ``(ql * mask).sum() / (mask.sum() * Q)`` and
    its autograd gradient (0 at the masked entries); no mask: the plain mean, unchanged."""
    from nbqat.nn import quantile_loss, quantile_loss_grad

    pred = rng.normal(size=(5, 6, 3)).astype(np.float32)
    y = rng.normal(size=(5, 6)).astype(np.float32)
    keep = rng.random((5, 6)) > 0.3
    tp = torch.tensor(pred, requires_grad=True)
    e = torch.tensor(y)[..., None] - tp
    q = torch.tensor(QS, dtype=torch.float32)
    ql = torch.maximum(q * e, (q - 1) * e) * torch.tensor(keep)[..., None]
    want = ql.sum() / (int(keep.sum()) * len(QS))
    want.backward()
    assert quantile_loss(pred, y, QS, keep) == pytest.approx(want.item(), rel=1e-6)
    np.testing.assert_allclose(quantile_loss_grad(pred, y, QS, keep), tp.grad.numpy(), atol=1e-9)
    assert quantile_loss_grad(pred, y, QS, keep)[~keep].max() == 0.0
    with pytest.raises(ValueError, match="mask must be a bool array"):
        quantile_loss(pred, y, QS, keep[:1])


def test_train_step_gives_masked_targets_no_weight(rng):
    """A batch's fifth item (bool, the target's shape) takes the masked targets out of the
    loss and the update: any values there give the same step, bit for bit."""
    from ref_nn import forecast_batch

    import nbqat
    from nbqat.nn import LSTMForecaster, LSTMForecasterConfig, train_step

    cfg = LSTMForecasterConfig(2, 3, 4, 8, 6, 3)
    s, h, f, y = forecast_batch(rng, cfg, 4)
    keep = np.ones(y.shape, bool)
    keep[1, 2:5] = keep[3, 0] = False
    out = []
    for shift in (0.0, 100.0):
        model = LSTMForecaster(cfg, seed=0)
        opt = nbqat.Adam(model.params, lr=1e-2)
        yy = np.where(keep, y, y + np.float32(shift))
        out.append((train_step(model, (s, h, f, yy, keep), opt), model.params.copy()))
    assert out[0][0] == out[1][0]
    np.testing.assert_array_equal(out[0][1], out[1][1])
    with pytest.raises(ValueError, match="batch mask must be a bool NumPy array"):
        train_step(LSTMForecaster(cfg, seed=0), (s, h, f, y, keep[:2]), opt)


def test_training_gives_invented_targets_no_weight(tmp_path, monkeypatch):
    """A 10-step gap in the training split: the float and QAT phases trained on the 10
    carried-forward targets as if observed. Every training batch now carries the mask of its
    observed steps (pandas: the target times present in the file), and moving the invented
    targets by 100 changes no training step (metrics.json identical)."""
    from nbqat.train.parallel import Parallel

    df = _frame()
    gap = df.drop(index=range(100, 110)).reset_index(drop=True)  # 10 hours in the training split
    p = tmp_path / "gap.csv"
    gap.to_csv(p, index=False)
    present = set(gap.t.to_numpy().astype("datetime64[s]").astype(np.int64))
    step = Parallel.step
    seen = []

    def checked(self, model, drop, batch, opt, max_norm, shift=0.0):
        assert len(batch) == 5, "a training batch with invented targets has no mask"
        seen.append(int((~batch[4]).sum()))
        y = np.where(batch[4], batch[3], batch[3] + np.float32(shift))
        return step(self, model, drop, (*batch[:3], y, batch[4]), opt, max_norm)

    args = ["--csv", str(p), "--time-col", "t", "--target-col", "y", "--observed-cols", "x",
            "--known-cols", "k", "--fill-gaps", "--history", "24", "--horizon", "12",
            "--epochs", "1", "--qat-epochs", "1", "--batch-size", "16", "--hidden-dim", "4",
            "--heads", "1", "--windows-per-epoch", "32", "--calibration-batches", "2",
            "--eval-stride", "6", "--no-progress", "--no-plots", "--threads", "1"]  # fmt: skip
    runs = []
    for shift in (0.0, 100.0):
        monkeypatch.setattr(Parallel, "step", lambda *a, s=shift: checked(*a, shift=s))
        assert main(["train", *args, "--out", str(tmp_path / f"run{shift}")]) == 0
        m = json.loads((tmp_path / f"run{shift}" / "metrics.json").read_text())
        runs.append({k: v for k, v in m.items() if k not in ("environment", "timings")})
    assert sum(seen) > 0  # some batches held invented targets
    assert runs[0] == runs[1]
    w = make_windows(_load(gap), history=24, horizon=12, eval_stride=6)
    t = w.train.times().astype("datetime64[s]").astype(np.int64)
    np.testing.assert_array_equal(w.train.scored(), np.isin(t, list(present)))


def test_observed_column_before_its_first_value_reads_its_training_mean():
    """An observed column starting late had its first value copied back over the rows before
    it (a history there read a later value). Those rows now stay empty in the data (counted
    in ``filled``) and read 0 after standardisation, the column's training mean (pandas
    over the observed training rows); a later value changes nothing before it."""
    df = _frame()
    late = df.copy()
    late.loc[:19, "x"] = np.nan  # x starts at row 20
    d = _load(late)
    assert np.isnan(d.observed[0][:20, 0]).all() and d.filled[d.entity_names[0]]["x"] == 20
    w = make_windows(d, history=24, horizon=12)
    i_val = int(w.split_bounds["train"][0, 1])
    x = late.x.iloc[:i_val]
    j = w.historical_names.index("x")
    np.testing.assert_array_equal(w.hist_features[:20, j], 0.0)
    want = (late.x.iloc[20:i_val] - x.mean()) / x.std(ddof=0)
    np.testing.assert_allclose(w.hist_features[20:i_val, j], want.to_numpy(), atol=1e-6)
    moved = late.copy()
    moved.loc[20, "x"] += 100.0  # another first value: the rows before it do not move
    w2 = make_windows(_load(moved), history=24, horizon=12)
    np.testing.assert_array_equal(w2.hist_features[:20, j], 0.0)
    fw = forecast_windows(_load(late, future_rows=True), w.scaling, history=24, horizon=12,
                          quantiles=QS, backtest=(None, 6))  # fmt: skip
    first = fw.history_raw[0, :, j]  # model.onnx's raw rows: the mean, as the model reads
    np.testing.assert_allclose(first[:20], x.mean(), rtol=1e-12)
    np.testing.assert_array_equal(first[20:], late.x.iloc[20:24].to_numpy())


def test_ridge_gives_invented_targets_no_weight(monkeypatch):
    """A 10-step gap in the training split: the ridge baselines (fixed, tuned, and so the TFT's
    linear-skip start) fitted the carried-forward targets as observations. Each step's fit now
    leaves them out: the oracle is lstsq on the windows that observed the step, and moving the
    invented targets by 100 changes no coefficient, intercept, residual quantile or score."""
    from ref_ridge import ridge_lstsq

    from nbqat.data import SplitWindows
    from nbqat.train.baselines import RidgeBaseline, tune_ridge

    gap = _frame().drop(index=range(100, 110)).reset_index(drop=True)
    w = make_windows(_load(gap), history=24, horizon=12, eval_stride=6)
    keep = w.train.scored()
    assert not keep.all()
    s, h, f, y = w.train.batch()
    x = np.concatenate([h.reshape(len(h), -1), f.reshape(len(f), -1), s], axis=1).astype(float)
    r = RidgeBaseline(1.0, QS).fit_split(w.train)
    for j in range(y.shape[1]):
        k = keep[:, j]
        coef, b = ridge_lstsq(x[k], y[k, j : j + 1], 1.0)
        np.testing.assert_allclose(r.coef[:, j], coef[:, 0], rtol=1e-6, atol=1e-8)
        np.testing.assert_allclose(r.intercept[j], b[0], rtol=1e-6, atol=1e-8)
        res = y[k, j] - (x[k] @ coef[:, 0] + b[0])
        np.testing.assert_allclose(r.residual_quantiles[j], np.quantile(res, QS), atol=1e-6)
    tuned = tune_ridge(w)
    batch = SplitWindows.batch

    def moved(self, idx=None):
        out = batch(self, idx)
        k = self.scored(idx)
        return out if k is None else (*out[:3], np.where(k, out[3], out[3] + np.float32(100)))

    monkeypatch.setattr(SplitWindows, "batch", moved)
    r2 = RidgeBaseline(1.0, QS).fit_split(w.train)
    tuned2 = tune_ridge(w)
    for a, b2 in ((r, r2), (tuned.ridge, tuned2.ridge)):
        np.testing.assert_array_equal(a.coef, b2.coef)
        np.testing.assert_array_equal(a.intercept, b2.intercept)
        np.testing.assert_array_equal(a.residual_quantiles, b2.residual_quantiles)
    assert tuned.grid == tuned2.grid


@pytest.mark.parametrize("fill", [True, False])
def test_predict_refuses_rows_before_the_first_target_value(fill):
    """predict / backtest data (future_rows) with --fill-gaps copied an entity's first target
    value back over the rows before it, so a history there read a value observed later (the
    history of the first origin held row 5's value at rows 0-4). Those rows are now refused,
    as in training, naming the entity, the rows and the fix; without --fill-gaps too."""
    df = _frame()
    late = df.copy()
    late.loc[:4, "y"] = np.nan  # y starts at row 5
    want = (
        r"entity '.*' has 5 row\(s\) before its first 'y' value, from 2020-01-01T00:00:00 "
        r"to 2020-01-01T04:00:00: a history there would read that later value.*start the "
        r"entity at 2020-01-01T05:00:00 \(drop the rows before it"
    )
    with pytest.raises(DataError, match=want):
        from_dataframe(late, time_col="t", target_col="y", observed_cols="x", known_cols="k",
                       fill_gaps=fill, future_rows=True)  # fmt: skip
    d = from_dataframe(late.iloc[5:], time_col="t", target_col="y", observed_cols="x",
                       known_cols="k", fill_gaps=fill, future_rows=True)  # fmt: skip
    np.testing.assert_array_equal(d.target[0], df.y.iloc[5:].to_numpy())  # the fix loads
