"""``--history auto`` (issue 31): the parser, TrainConfig's check, the validation choice.

Oracle: every candidate history's windows cut by ``make_windows`` itself, ridge by lstsq on
the augmented system, the validation P50 q-risk written out (sum |y - P50| / sum |y|), the
cap and the tie rule applied in plain Python; the end-to-end run's record is compared with
that choice.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from ref_ridge import ridge_oracle

from nbqat.cli import build_parser, main
from nbqat.data import make_windows
from nbqat.train import TrainConfig
from nbqat.train.history_auto import MAX_WINDOW_STEPS, choose_history


def test_the_parser_takes_auto_or_a_positive_integer(capsys):
    p = build_parser()
    assert p.parse_args(["train", "--history", "auto"]).history == "auto"
    assert p.parse_args(["train", "--history", "36"]).history == 36
    assert p.parse_args(["train"]).history is None
    for bad in ("0", "-3", "week", "Auto"):
        with pytest.raises(SystemExit):
            p.parse_args(["train", "--history", bad])
        assert "--history: expected a positive integer or 'auto'" in capsys.readouterr().err


def test_train_config_checks_the_history():
    assert TrainConfig(history="auto").resolved().history == "auto"
    assert TrainConfig(history=12).resolved().history == 12
    for bad in ("week", 0, -1, True, 2.5):
        with pytest.raises(ValueError, match="--history must be a positive integer or 'auto'"):
            TrainConfig(history=bad).resolved()


def _lag_data(n=600, lag=12):
    """One series (season = horizon = 4, numeric time) that follows its value ``lag`` steps
    earlier: a history shorter than the lag cannot see it."""
    import pandas as pd

    from nbqat.data import from_dataframe

    rng = np.random.default_rng(11)
    y = np.zeros(n)
    for t in range(lag, n):
        y[t] = 0.9 * y[t - lag] + rng.normal()
    df = pd.DataFrame({"t": np.arange(n), "y": y + 10.0})
    data = from_dataframe(df, time_col="t", target_col="y")
    return data, dict(horizon=4, calendar=("time_index",), eval_stride=2)


def _oracle_val_p50(wh, lam):
    mean, res = ridge_oracle(wh.train, lam)  # tests/ref_ridge.py
    r50 = np.array([np.quantile(res[:, t], 0.5) for t in range(res.shape[1])])
    p50 = wh.val.unscale((mean(wh.val) + r50)[..., None])[..., 0]
    yv = wh.val.target_raw()
    return np.abs(yv - p50).sum() / np.abs(yv).sum()


@pytest.mark.parametrize("max_window", [MAX_WINDOW_STEPS, 20, 8])
def test_choose_history_matches_a_plain_search_under_the_cap(max_window):
    from nbqat.train.baselines import HISTORY_SEASONS, LAMBDAS

    data, kw = _lag_data()
    w = make_windows(data, history=4, **kw)
    hist, rec = choose_history(w, max_window)
    best = {}
    for s in sorted(set(HISTORY_SEASONS)):
        h = s * 4
        wh = make_windows(data, history=h, **kw)
        np.testing.assert_array_equal(wh.val.rows, w.val.rows)
        best[h] = min(_oracle_val_p50(wh, lam) for lam in LAMBDAS)
    ok = {h: v for h, v in best.items() if h + 4 <= max_window or h == 4}
    want = min(sorted(ok), key=lambda h: ok[h])
    assert hist == want and rec["history"] == want
    assert rec["ridge_history"] == min(sorted(best), key=lambda h: best[h])
    assert [r["history"] for r in rec["scores"]] == sorted(best)
    np.testing.assert_allclose([r["score"] for r in rec["scores"]],
                               [best[h] for h in sorted(best)], rtol=1e-7)  # fmt: skip
    assert rec["capped"] == sorted(set(best) - set(ok))
    assert (rec["option"], rec["default_history"], rec["max_window"]) == ("auto", 4, max_window)
    if max_window == MAX_WINDOW_STEPS:
        assert hist >= 12  # the lag is seen: the choice is not the default
    if max_window == 8:
        assert hist == 4  # only the default fits
    with pytest.raises(ValueError, match="max_window must be a positive integer"):
        choose_history(w, 0)


def test_load_data_with_auto_cuts_the_chosen_history(tmp_path):
    import pandas as pd

    from nbqat.data import load_csv
    from nbqat.train.model import load_data

    rng = np.random.default_rng(11)
    y = np.zeros(600)
    for t in range(12, 600):
        y[t] = 0.9 * y[t - 12] + rng.normal()
    times = pd.date_range("2020-01-01", periods=600, freq="D").strftime("%Y-%m-%d")
    p = tmp_path / "lag.csv"
    pd.DataFrame({"t": times, "y": y + 10.0}).to_csv(p, index=False)
    cfg = TrainConfig(csv=str(p), time_col="t", target_col="y", history="auto", horizon=4,
                      eval_stride=2, calendar="time_index").resolved()  # fmt: skip
    w = load_data(cfg)
    data = load_csv(str(p), time_col="t", target_col="y")
    kw = dict(horizon=4, eval_stride=2, calendar=["time_index"])
    default = make_windows(data, history=w.history_choice["default_history"], **kw)
    want, rec = choose_history(default)
    assert cfg.history == w.history == want == w.history_choice["history"]
    assert want != default.history  # the lag of 12 days is seen
    assert w.history_choice == rec
    cut = make_windows(data, history=want, **kw)
    for name in ("train", "val", "test"):
        np.testing.assert_array_equal(getattr(w, name).rows, getattr(cut, name).rows)


def test_auto_chooses_on_the_normalised_windows_the_run_uses(tmp_path):
    """--window-norm was resolved after the auto choices: on a drifting series (normalised
    windows) the history was chosen by a ridge on the plain windows, not the run's."""
    import pandas as pd

    from nbqat.data import load_csv
    from nbqat.train.model import load_data
    from nbqat.train.window_norm import choose_window_norm

    rng = np.random.default_rng(3)
    n = 700
    y = np.zeros(n)
    for t in range(12, n):
        y[t] = 0.9 * y[t - 12] + rng.normal()
    y += 0.05 * np.arange(n)  # a trend: validation leaves the training range
    times = pd.date_range("2020-01-01", periods=n, freq="D").strftime("%Y-%m-%d")
    p = tmp_path / "trend.csv"
    pd.DataFrame({"t": times, "y": y + 10.0}).to_csv(p, index=False)
    cfg = TrainConfig(csv=str(p), time_col="t", target_col="y", history="auto", horizon=4,
                      eval_stride=2, calendar="time_index").resolved()  # fmt: skip
    w = load_data(cfg)
    assert w.window_norm["choice"] == "last"
    data = load_csv(str(p), time_col="t", target_col="y")
    kw = dict(horizon=4, eval_stride=2, calendar=["time_index"])
    plain = make_windows(data, history=w.history_choice["default_history"], **kw)
    normed = make_windows(data, history=w.history_choice["default_history"], **kw)
    choose_window_norm("last", normed)
    assert w.history_choice == choose_history(normed)[1]
    assert w.history_choice != choose_history(plain)[1]  # the order matters on this series


def test_a_run_with_auto_records_its_choice(tmp_path):
    from nbqat.data import load_tmy3

    tiny = ["--epochs", "1", "--qat-epochs", "1", "--batch-size", "16", "--hidden-dim", "4",
            "--heads", "1", "--horizon", "6", "--windows-per-epoch", "32",
            "--calibration-batches", "2", "--eval-stride", "96", "--no-progress", "--no-plots",
            "--seed", "3"]  # fmt: skip
    assert main(["train", *tiny, "--history", "auto", "--out", str(tmp_path)]) == 0
    m = json.loads((tmp_path / "metrics.json").read_text())
    w = make_windows(load_tmy3(), history=24, horizon=6, eval_stride=96,
                     calendar=["hour", "dow"])  # fmt: skip
    want, rec = choose_history(w)
    got = m["history_choice"]
    # the scores to BLAS rounding (the run's thread count may differ from this process's)
    assert [r["score"] for r in got.pop("scores")] == pytest.approx(
        [r["score"] for r in rec.pop("scores")], rel=1e-9
    )
    assert got == json.loads(json.dumps(rec))
    assert m["config"]["history"] == m["data"]["history"] == want
