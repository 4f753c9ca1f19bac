"""``--skip-history`` (issue 31): the linear skip reads a longer history than the TFT body.

Oracles: the windows cut by ``make_windows`` itself at the skip's history, the tuned ridge's
choice from ``tune_ridge`` on the body's windows, the ridge start checked against a ridge fitted
by ``tests/ref_ridge.py``'s lstsq on the skip's windows (validation P50 q-risk written out), and
the ONNX graph's input read back with ``onnx``. The model-level contract (the body reads the last
k steps, the skip the last k_s) is checked against PyTorch in ``tests/test_tft_torch.py`` and
through onnxruntime in ``tests/test_export.py``.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from ref_ridge import ridge_oracle

from nbqat.cli import build_parser, main
from nbqat.data import load_csv, make_windows
from nbqat.train import TrainConfig
from nbqat.train.baselines import tune_ridge

LAG = 21  # days: a body history of one week cannot see it, the ridge's grid can


@pytest.fixture(scope="module")
def lag_csv(tmp_path_factory):
    import pandas as pd

    rng = np.random.default_rng(5)
    n = 700
    y = np.zeros(n)
    for t in range(LAG, n):
        y[t] = 0.9 * y[t - LAG] + rng.normal()
    times = pd.date_range("2020-01-01", periods=n, freq="D").strftime("%Y-%m-%d")
    p = tmp_path_factory.mktemp("skip") / "lag.csv"
    pd.DataFrame({"t": times, "y": y + 10.0}).to_csv(p, index=False)
    return p


def _cfg(p, **kw):
    base = dict(csv=str(p), time_col="t", target_col="y", history=7, horizon=4, eval_stride=2,
                calendar="time_index")  # fmt: skip
    return TrainConfig(**{**base, **kw}).resolved()


def test_the_parser_takes_auto_or_a_positive_integer(capsys):
    p = build_parser()
    assert p.parse_args(["train", "--skip-history", "auto"]).skip_history == "auto"
    assert p.parse_args(["train", "--skip-history", "336"]).skip_history == 336
    assert p.parse_args(["train"]).skip_history is None
    for bad in ("0", "-3", "week"):
        with pytest.raises(SystemExit):
            p.parse_args(["train", "--skip-history", bad])
        assert "--skip-history: expected a positive integer or 'auto'" in capsys.readouterr().err


def test_load_data_cuts_the_skip_history(lag_csv):
    from nbqat.train.model import build_model, load_data

    cfg = _cfg(lag_csv, skip_history="auto")
    w = load_data(cfg)
    data = load_csv(str(lag_csv), time_col="t", target_col="y")
    kw = dict(horizon=4, eval_stride=2, calendar=["time_index"])
    body = make_windows(data, history=7, **kw)
    tuned = tune_ridge(body)
    assert tuned.history >= LAG  # the lag is seen
    assert cfg.history == 7 and cfg.skip_history == w.history == tuned.history
    assert w.skip_history_choice == {
        "option": "auto", "skip_history": tuned.history, "history": 7,
        "ridge_history": tuned.history, "ridge_lambda": tuned.lam, "criterion": tuned.criterion,
    }  # fmt: skip
    cut = make_windows(data, history=tuned.history, **kw)
    for name in ("train", "val", "test"):
        np.testing.assert_array_equal(getattr(w, name).rows, getattr(cut, name).rows)
    model = build_model(cfg, w)
    c = model.config
    assert (c.sequence_length, c.skip_sequence_length, c.input_length) == (7, w.history, w.history)
    n_in = w.history * c.num_unknown_features + 4 * c.num_known_features + c.num_static_features
    assert model.linear_skip.in_features == n_in


def test_a_skip_history_shorter_than_the_history_is_refused(lag_csv):
    from nbqat.train.model import load_data

    with pytest.raises(ValueError, match="--skip-history 5 is shorter than --history 7"):
        load_data(_cfg(lag_csv, skip_history=5))
    assert load_data(_cfg(lag_csv, skip_history=7)).history == 7  # equal: the plain windows
    with pytest.raises(ValueError, match=r"^--skip-history 100000: history must be an integer"):
        load_data(_cfg(lag_csv, skip_history=100000))  # longer than the data: named


def test_a_run_starts_at_the_skip_history_ridge_and_exports_it(lag_csv, tmp_path):
    import onnx

    out = tmp_path / "run"
    tiny = ["--csv", str(lag_csv), "--time-col", "t", "--target-col", "y", "--history", "7",
            "--horizon", "4", "--eval-stride", "2", "--calendar", "time_index", "--epochs", "1",
            "--qat-epochs", "1", "--batch-size", "16", "--hidden-dim", "4", "--heads", "1",
            "--windows-per-epoch", "32", "--calibration-batches", "2", "--no-progress",
            "--no-plots", "--seed", "3"]  # fmt: skip
    assert main(["train", *tiny, "--skip-history", "auto", "--out", str(out)]) == 0
    m = json.loads((out / "metrics.json").read_text())
    k_s = m["skip_history_choice"]["skip_history"]
    assert k_s >= LAG and m["config"]["skip_history"] == k_s and m["config"]["history"] == 7
    assert m["data"]["history"] == k_s
    # the start: output layer zero, the skip = ridge (lambda 1) on the skip's windows
    data = load_csv(str(lag_csv), time_col="t", target_col="y")
    w = make_windows(data, history=k_s, horizon=4, eval_stride=2, calendar=["time_index"])
    mean, res = ridge_oracle(w.train, 1.0)
    r50 = np.array([np.quantile(res[:, t], 0.5) for t in range(res.shape[1])])
    p50 = w.val.unscale((mean(w.val) + r50)[..., None])[..., 0]
    yv = w.val.target_raw()
    want = np.abs(yv - p50).sum() / np.abs(yv).sum()
    assert m["float"]["curves"]["start_val_q_risk_P50"][0] == pytest.approx(want, rel=1e-4)
    g = onnx.load(str(out / "model.onnx")).graph
    hist = next(i for i in g.input if i.name == "history")  # the raw columns' input
    assert hist.type.tensor_type.shape.dim[1].dim_value == k_s
    assert main(["predict", str(out), "--out", str(tmp_path / "f.csv")]) == 0
    assert (tmp_path / "f.csv").stat().st_size > 0
