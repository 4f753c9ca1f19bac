"""``--window-norm`` (issue 31, nbqat.train.window_norm): each window's target relative to its
last history value. Oracles: the plain windows' arrays with the shift written out in NumPy, and
the rule's condition read off the plain batches' targets."""

from __future__ import annotations

import numpy as np
import pytest

from nbqat.data import Scaling, from_dataframe, make_windows
from nbqat.train.window_norm import choose_window_norm, drift_bounds


def _windows(trend: float, n: int = 400):
    import pandas as pd

    rng = np.random.default_rng(5)
    t = np.arange(n)
    y = 10.0 + trend * t + np.sin(2 * np.pi * t / 4) + 0.1 * rng.normal(size=n)
    data = from_dataframe(pd.DataFrame({"t": t, "y": y}), time_col="t", target_col="y")
    return make_windows(data, history=8, horizon=4, calendar=("time_index",), eval_stride=2)


def test_drift_bounds_against_the_batches():
    for trend, side in ((0.05, "hi"), (-0.05, "lo")):
        w = _windows(trend)
        yt, yv = w.train.batch()[3], w.val.batch()[3]
        rec = drift_bounds(w)
        assert rec["train"] == pytest.approx([yt.min(), yt.max()])
        assert rec["val"] == pytest.approx([yv.min(), yv.max()])
        lo, hi = rec["bounds"]
        if side == "hi":
            assert lo is None and hi == pytest.approx(2 * yv.max() - yt.max())
        else:
            assert hi is None and lo == pytest.approx(2 * yv.min() - yt.min())
    flat = _windows(0.0)
    assert drift_bounds(flat)["bounds"] == [None, None]  # a stationary series: no change


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_last_shifts_history_target_and_forecasts(dtype):
    w = _windows(0.05)
    idx = np.array([3, 0, 7])
    plain = w.val.batch(idx)
    pred = np.random.default_rng(1).normal(size=(3, 4, 3)).astype(dtype)
    raw = w.val.unscale(pred, idx)
    assert w.val.offset(idx) is None
    assert choose_window_norm("last", w) == {"option": "last", "choice": "last"}
    s, h, f, y = w.val.batch(idx)
    off = plain[1][:, -1, 0]  # the scaled target at each window's last history step
    np.testing.assert_array_equal(w.val.offset(idx), off)
    np.testing.assert_array_equal(h[..., 0], plain[1][..., 0] - off[:, None])
    np.testing.assert_array_equal(h[..., 1:], plain[1][..., 1:])
    np.testing.assert_array_equal(h[:, -1, 0], 0)
    np.testing.assert_array_equal(s, plain[0])
    np.testing.assert_array_equal(f, plain[2])
    np.testing.assert_array_equal(y, plain[3] - off[:, None])
    np.testing.assert_array_equal(w.val.target(idx), y)
    # forecasts: the offset added back in pred's dtype, then the per-entity unscaling
    lvl, scl = w.level[w.val.entity[idx]], w.scale[w.val.entity[idx]]
    want = (pred + off[:, None, None].astype(dtype)).astype(np.float64) * scl[:, None, None]
    np.testing.assert_array_equal(w.val.unscale(pred, idx), want + lvl[:, None, None])
    np.testing.assert_allclose(w.val.unscale(pred - off[:, None, None], idx), raw, rtol=1e-5)
    assert Scaling.from_json(w.scaling.to_json()).window_norm == "last"


def test_auto_takes_last_exactly_where_validation_leaves_the_training_range():
    for trend, want in ((0.05, "last"), (-0.05, "last"), (0.0, "none")):
        w = _windows(trend)
        yt, yv = w.train.batch()[3], w.val.batch()[3]
        drifts = yv.max() > yt.max() or yv.min() < yt.min()
        rec = choose_window_norm("auto", w)
        assert rec["choice"] == want == ("last" if drifts else "none")
        assert rec["train"] == pytest.approx([yt.min(), yt.max()])
        assert rec["val"] == pytest.approx([yv.min(), yv.max()])
        assert w.scaling.window_norm == want
    w = _windows(0.05)
    assert choose_window_norm("none", w)["choice"] == "none"
    assert w.val.offset() is None


def test_bad_option_and_twice():
    w = _windows(0.05)
    with pytest.raises(ValueError, match="one of \\('auto', 'none', 'last'\\)"):
        choose_window_norm("mean", w)
    choose_window_norm("last", w)
    with pytest.raises(ValueError, match="not normalised"):
        choose_window_norm("last", w)  # normalising twice would shift twice
    d = w.scaling.to_json()
    del d["window_norm"]  # a run written before the option: plain windows
    assert Scaling.from_json(d).window_norm == "none"


def test_the_summary_says_where_the_windows_are_normalised():
    from nbqat.train.summary import _data_and_report_lines

    rec = {"option": "auto", "choice": "last", "train": [0, 1], "val": [0, 2]}
    (line,) = _data_and_report_lines({"data": {}, "window_norm": rec})
    assert "relative to its last history value" in line and "left the training range" in line
    assert _data_and_report_lines({"data": {}, "window_norm": {**rec, "choice": "none"}}) == []
