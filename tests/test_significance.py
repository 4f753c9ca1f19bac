"""The Diebold-Mariano test of the main job's summary (``nbqat.train.metrics.diebold_mariano``).

Oracles: a slow, obvious re-implementation (explicit autocovariance loops, the kernel's
weights written out, the normal CDF from ``math.erf``), the test's size under the null
hypothesis (independent and overlapping windows) and its power under an alternative, by
simulation with fixed seeds.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from nbqat.train.metrics import diebold_mariano


def _slow_dm(a, b, overlap):
    d = [float(x) - float(y) for x, y in zip(a, b)]
    n = len(d)
    mean = sum(d) / n
    m = int(math.floor(4 * (n / 100) ** (2 / 9)))  # Newey-West's lag rule
    lags = min(n - 1, overlap - 1 + m)

    def gamma(k):
        return sum((d[t] - mean) * (d[t - k] - mean) for t in range(k, n)) / n

    def weight(k):  # 1 over the overlap's lags, then a linear taper over m more
        return 1.0 if k <= overlap - 1 else 1 - (k - (overlap - 1)) / (m + 1)

    var = gamma(0) + 2 * sum(weight(k) * gamma(k) for k in range(1, lags + 1))
    dm = mean / math.sqrt(var / n)
    return dm, 2 * (1 - 0.5 * (1 + math.erf(abs(dm) / math.sqrt(2)))), lags


@pytest.mark.parametrize("n, overlap", [(30, 1), (216, 4), (500, 12)])
def test_matches_the_slow_formula(n, overlap):
    rng = np.random.default_rng(n)
    e = rng.standard_normal(n + 1)
    d = e[1:] + 0.6 * e[:-1] + 0.1  # MA(1): autocorrelated, as overlapping windows are
    b = rng.random(n)
    r = diebold_mariano(b + d, b, overlap)
    dm, p, lags = _slow_dm(b + d, b, overlap)
    assert r["lags"] == lags and r["n"] == n
    assert r["dm"] == pytest.approx(dm, rel=1e-9)
    assert r["p_value"] == pytest.approx(p, rel=1e-7, abs=1e-12)
    assert r["mean_diff"] == pytest.approx(np.mean(d), rel=1e-12)


def test_size_under_the_null_and_power_under_an_alternative():
    rng = np.random.default_rng(0)
    null = [
        diebold_mariano(rng.standard_normal(200), np.zeros(200))["p_value"] for _ in range(2000)
    ]
    rate = np.mean(np.array(null) < 0.05)
    assert 0.03 <= rate <= 0.08, rate  # nominal 5 % (Newey-West is slightly liberal)
    alt = diebold_mariano(rng.standard_normal(200) - 0.5, np.zeros(200))
    assert alt["dm"] < 0 and alt["p_value"] < 1e-3  # a has the smaller loss


def test_size_with_overlapping_windows():
    # The job's windows: horizon 24 at stride 6 (the defaults), so 4 consecutive windows share
    # forecast steps. Each window's loss differential is the mean of its 24 steps' (iid, equal
    # in mean) differentials; under this null the test must reject about 5 % at p < 0.05.
    rng = np.random.default_rng(1)
    horizon, stride, n = 24, 6, 432
    rates = []
    for persistence in (0.0, 0.5):  # and with step differentials that persist (AR(1))
        p = []
        for _ in range(1500):
            s = rng.standard_normal(n * stride + horizon + 40)
            s = np.convolve(s, persistence ** np.arange(40), "valid")  # AR(1), truncated
            c = np.concatenate([[0.0], np.cumsum(s)])
            starts = np.arange(n) * stride
            d = (c[starts + horizon] - c[starts]) / horizon  # each window's mean
            p.append(diebold_mariano(d, np.zeros(n), -(-horizon // stride))["p_value"])
        rates.append(np.mean(np.array(p) < 0.05))
    assert all(0.03 <= r <= 0.075 for r in rates), rates


def _t_two_sided(t, df, steps=20_000):
    """P(|T| >= |t|) for Student's t with ``df`` degrees of freedom: 1 - 2 * the integral of
    the density over [0, |t|] (Simpson's rule; the density from math.lgamma)."""
    c = math.exp(math.lgamma((df + 1) / 2) - math.lgamma(df / 2)) / math.sqrt(df * math.pi)
    x = np.linspace(0.0, abs(t), steps + 1)
    f = c * (1 + x * x / df) ** (-(df + 1) / 2)
    w = np.ones(steps + 1)
    w[1:-1:2], w[2:-1:2] = 4, 2
    return 1.0 - 2.0 * float(w @ f) * (abs(t) / steps) / 3


@pytest.mark.parametrize("n, overlap", [(30, 4), (100, 24), (432, 4)])
def test_hln_statistic_and_t_p_value_match_the_slow_formula(n, overlap):
    # Harvey, Leybourne & Newbold (1997): dm * sqrt((n + 1 - 2h + h (h - 1) / n) / n) with h
    # the lags the variance estimated + 1, against Student's t with n - 1 degrees of freedom;
    # the uncorrected dm and its normal p-value stay under their names
    rng = np.random.default_rng(n + overlap)
    e = rng.standard_normal(n + 1)
    d = e[1:] + 0.6 * e[:-1] + 0.3
    r = diebold_mariano(d, np.zeros(n), overlap)
    dm, p, lags = _slow_dm(d, np.zeros(n), overlap)
    assert r["dm"] == pytest.approx(dm, rel=1e-9) and r["p_value"] == pytest.approx(p, rel=1e-7)
    h = lags + 1
    hln = dm * math.sqrt((n + 1 - 2 * h + h * (h - 1) / n) / n)
    assert r["dm_hln"] == pytest.approx(hln, rel=1e-9)
    assert r["p_value_hln"] == pytest.approx(_t_two_sided(hln, n - 1), rel=1e-6, abs=1e-9)
    assert r["p_value_hln"] > r["p_value"]  # the correction is conservative
    assert r["small_sample"] == (n < 20 * h)


def test_hln_needs_enough_windows_for_the_lags():
    d = np.random.default_rng(3).standard_normal(12)
    r = diebold_mariano(d, np.zeros(12), 10)  # 11 lags for 12 windows: the factor is < 0
    assert r["dm"] is not None and r["dm_hln"] is None and r["p_value_hln"] is None
    assert r["small_sample"]


def _metrics(sig):
    """The least metrics.json that summary_table reads."""
    qr = {k: {"P10": 0.1, "P50": 0.2, "P90": 0.1} for k in (
        "seasonal_naive", "ridge", "float", "float_finetuned", "ptq_int8", "qat_fake_quant",
        "int8")}  # fmt: skip
    names = ["float_vs_naive_P50_improvement", "float_vs_ridge_P50_improvement",
             "int8_vs_naive_P50_improvement", "int8_vs_ridge_P50_improvement",
             "qat_int8_vs_float_finetuned_P50_relative_diff",
             "ptq_int8_vs_float_finetuned_P50_relative_diff",
             "int8_vs_float_P50_relative_diff"]  # fmt: skip
    c = dict.fromkeys(names, 0.1)
    fl = {"epochs_run": 1, "best_epoch": 1}
    return {"q_risk_test": qr, "comparisons": c, "float": fl, "significance": sig,
            "grad_norm": {"float": {}, "qat": {}}, "data": {}}  # fmt: skip


@pytest.mark.parametrize("n", [100, 432])
def test_summary_reports_the_hln_p_value_and_says_when_n_is_too_small(n):
    from nbqat.train.summary import summary_table

    rng = np.random.default_rng(n)
    sig = {}
    for m in ("float", "int8"):
        for b in ("naive", "ridge"):
            sig[f"{m}_vs_{b}_P50"] = diebold_mariano(rng.standard_normal(n) + 0.2, np.zeros(n), 4)
    text = summary_table(_metrics(sig), {"phases_s": {"total": 1.0}})
    f = [sig["float_vs_naive_P50"], sig["float_vs_ridge_P50"]]
    line = next(ln for ln in text.splitlines() if ln.startswith("float P50"))
    assert f"p {f[0]['p_value_hln']:.2g} and {f[1]['p_value_hln']:.2g}" in line
    assert ("too few for a reliable test" in line) == (n < 20 * (f[0]["lags"] + 1)) == (n == 100)


@pytest.mark.parametrize("lags", [1, 3])
def test_summary_counts_in_the_singular_for_one(lags):
    """The summary said 'a reliable test with 1 lags' and 'float training: 1 epochs'."""
    from nbqat.train.summary import summary_table

    rng = np.random.default_rng(lags)
    sig = {f"{m}_vs_{b}_P50": {**diebold_mariano(rng.standard_normal(30) + 0.2, np.zeros(30), 1),
                               "lags": lags, "small_sample": True}
           for m in ("float", "int8") for b in ("naive", "ridge")}  # fmt: skip
    text = summary_table(_metrics(sig), {"phases_s": {"total": 1.0}})
    word = "lag" if lags == 1 else "lags"
    assert f"a reliable test with {lags} {word} (p-values" in text
    assert "float training: 1 epoch, best" in text


def test_a_negative_flat_top_variance_falls_back_to_bartlett():
    # A short, strongly alternating differential: the flat-top weights give a negative
    # variance; the test then uses the Bartlett weights 1 - k / (L + 1) (written out here).
    d = np.array([0.619, -0.223, 1.432, -0.333, 0.508, 0.004, 1.292, 0.045, 0.414, -0.616,
                  1.163, 0.478])  # fmt: skip
    n, overlap = d.size, 2
    e = d - d.mean()
    g = [sum(e[t] * e[t - k] for t in range(k, n)) / n for k in range(n)]
    m = int(math.floor(4 * (n / 100) ** (2 / 9)))
    lags = overlap - 1 + m
    flat = g[0] + 2 * sum((1 if k < overlap else 1 - (k - overlap + 1) / (m + 1)) * g[k]
                          for k in range(1, lags + 1))  # fmt: skip
    assert flat < 0  # the case under test
    bartlett = g[0] + 2 * sum((1 - k / (lags + 1)) * g[k] for k in range(1, lags + 1))
    r = diebold_mariano(d, np.zeros(n), overlap)
    assert r["lags"] == lags
    assert r["dm"] == pytest.approx(d.mean() / math.sqrt(bartlett / n), rel=1e-9)


def test_constant_differentials():
    x = np.arange(10.0)  # exact differences
    assert diebold_mariano(x, x) == {
        "dm": 0.0,
        "p_value": 1.0,
        "dm_hln": 0.0,
        "p_value_hln": 1.0,
        "mean_diff": 0.0,
        "lags": 2,
        "n": 10,
        "small_sample": True,
    }
    r = diebold_mariano(x + 1, x)
    assert r["dm"] is None and r["p_value"] == 0.0 and r["mean_diff"] == pytest.approx(1.0)


@pytest.mark.parametrize(
    "a, b, needle",
    [(np.ones(3), np.ones(4), "same length"), (np.ones(1), np.ones(1), ">= 2"),
     (np.ones((2, 2)), np.ones((2, 2)), "1-D"), (np.array([1.0, np.nan]), np.ones(2), "finite")],
)  # fmt: skip
def test_bad_input_is_refused(a, b, needle):
    with pytest.raises(ValueError, match="loss_a and loss_b") as e:
        diebold_mariano(a, b)
    assert needle in str(e.value)


def test_a_run_with_one_test_window_finishes_without_a_test(tmp_path):
    # One series and an --eval-stride longer than the test split: one test window, too few
    # for the test (n >= 2); the run still finishes (as before the test existed), and the
    # summary says nothing about significance. Oracle: the window count in metrics.json.
    import pandas as pd

    from nbqat.cli import main
    from nbqat.data import tmy3_path

    d = pd.read_csv(tmy3_path())
    d[d["station"] == d["station"].iloc[0]].to_csv(tmp_path / "one.csv", index=False)
    argv = ["train", "--epochs", "1", "--qat-epochs", "1", "--batch-size", "16", "--hidden-dim",
            "4", "--heads", "1", "--history", "24", "--horizon", "6", "--windows-per-epoch",
            "32", "--calibration-batches", "1", "--eval-stride", "50000", "--no-progress",
            "--no-plots", "--csv", str(tmp_path / "one.csv"), "--time-col", "time",
            "--target-col", "temp_air", "--entity-col", "station",
            "--out", str(tmp_path / "o")]  # fmt: skip
    assert main(argv) == 0
    m = json.loads((tmp_path / "o" / "metrics.json").read_text())
    assert m["data"]["windows"]["test"] == 1
    qr, c, tuning = m["q_risk_test"], m["comparisons"], m["ridge_tuning"]  # the tuned ridge row
    assert set(qr["ridge_fixed"]) == {"P10", "P50", "P90"} and "ridge_fixed" in m
    assert c["float_vs_ridge_P50_improvement"] == 1 - qr["float"]["P50"] / qr["ridge"]["P50"]
    chosen = [g for g in tuning["grid"] if (g["history"], g["lambda"]) == (tuning["history"],
              tuning["lambda"])]  # fmt: skip
    assert len(chosen) == 1 and chosen[0]["val_P50"] == min(g["val_P50"] for g in tuning["grid"])
    tested = ("float_vs_naive_P50", "float_vs_ridge_P50", "int8_vs_naive_P50", "int8_vs_ridge_P50")
    assert set(m["significance"]) == {"note", *tested}  # README: the float and int8 models only
    for k in tested:
        r = m["significance"][k]
        assert (r["dm"], r["p_value"], r["n"]) == (None, None, 1), (k, r)
    summary = (tmp_path / "o" / "summary.txt").read_text()
    assert "better than the ridge baseline" in summary or "worse than the ridge" in summary
    assert "Diebold-Mariano" not in summary


def test_non_finite_forecasts_keep_the_clear_metrics_error(tmp_path, monkeypatch, capsys):
    # A non-finite test forecast is reported by the metrics check (the path and its cause),
    # not by the significance test's argument check ("loss_a and loss_b must be finite").
    from nbqat.cli import main
    from nbqat.train import evaluate as ev

    orig = ev._predictions

    def predictions(r):
        p = orig(r)
        p["float"] = p["float"].copy()
        p["float"][0, 0, :] = np.inf
        return p

    monkeypatch.setattr(ev, "_predictions", predictions)
    argv = ["train", "--epochs", "1", "--qat-epochs", "1", "--batch-size", "16", "--hidden-dim",
            "4", "--heads", "1", "--history", "24", "--horizon", "6", "--windows-per-epoch",
            "32", "--calibration-batches", "1", "--eval-stride", "96", "--no-progress",
            "--no-plots", "--out", str(tmp_path / "o")]  # fmt: skip
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "metrics.json: q_risk_test.float." in err and "predictions are not finite" in err, err


@pytest.mark.parametrize("offset, overlap", [(0, 4), (3, 8)])
def test_entities_are_averaged_per_forecast_origin_in_time_order(offset, overlap):
    # Two entities' test windows (horizon 24, stride 6), stored one entity after the other:
    # the test runs on the loss differentials averaged per origin in time order (pandas'
    # groupby the oracle), never across the join of two entities' windows. An entity whose
    # origins sit `offset` steps off the other's grid halves the gap: 8 origins share a step.
    from types import SimpleNamespace

    import pandas as pd

    from nbqat.train import evaluate as ev

    rng = np.random.default_rng(3)
    n, horizon, stride = 60, 24, 6
    t0 = np.concatenate([np.arange(n) * stride, np.arange(10, n) * stride + offset])
    y = rng.normal(size=(len(t0), horizon))
    p = {k: y[..., None] + rng.normal(size=(*y.shape, 3)) for k in ("float", "naive")}
    p["int8"] = p["float"] + 0.1
    p["ridge"] = y[..., None] + 1.3 * rng.normal(size=(*y.shape, 3))
    times = np.datetime64("2020-01-01T00", "h") + (t0[:, None] + np.arange(horizon))
    test = SimpleNamespace(times=lambda: times, scored=lambda: None)
    w = SimpleNamespace(quantiles=(0.1, 0.5, 0.9), horizon=horizon, eval_stride=stride,
                        step=np.timedelta64(1, "h"), test=test)  # fmt: skip
    sig = ev._significance(p, y, w)["float_vs_ridge_P50"]
    loss = {k: np.mean(np.abs(y - p[k][..., 1]), axis=1) / 2 for k in ("float", "ridge")}
    by_origin = pd.DataFrame({"t": t0, **loss}).groupby("t").mean().sort_index()
    dm, pv, lags = _slow_dm(by_origin["float"], by_origin["ridge"], overlap)
    assert sig["n"] == len(by_origin) and sig["lags"] == lags
    assert sig["dm"] == pytest.approx(dm, rel=1e-9)
    assert sig["p_value"] == pytest.approx(pv, rel=1e-7, abs=1e-12)
