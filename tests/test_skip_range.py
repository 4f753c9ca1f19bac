"""The linear skip's int8 input range on trending data (issue 31, nbqat.train.skip_range).

Oracles: the split targets from ``SplitWindows.batch`` (not ``target``) and the rule's
arithmetic written out; the new qparams against torch's ``MinMaxObserver`` (quint8, per
tensor affine) observing the widened range.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from nbqat.data import make_windows
from nbqat.train.skip_range import SKIP_INPUT, drift_bounds, widen_skip_input


def _windows(trend: float, n=400):
    import pandas as pd

    from nbqat.data import from_dataframe

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


def _fake_quant(lo, hi):
    """The QAT runs' activation quantizer (default qconfig), calibrated on [lo, hi]."""
    from nbqat.quantization.qconfig import default_qat_qconfig

    fq = default_qat_qconfig.activation()
    fq.forward(np.array([lo, hi], np.float32))
    fq.scale[...], fq.zero_point[...] = fq.calculate_qparams()
    return fq


class _Model:
    def __init__(self, fq):
        self.fake_quants = {SKIP_INPUT: fq}


def test_widen_skip_input_against_torch_minmax():
    w = _windows(0.05)
    want_hi = drift_bounds(w)["bounds"][1]
    fq = _fake_quant(-1.5, 1.0)
    rec = widen_skip_input(_Model(fq), w)
    assert rec["calibrated"] == [-1.5, 1.0]
    assert rec["range"] == pytest.approx([-1.5, want_hi], rel=1e-6)
    ob = torch.ao.quantization.MinMaxObserver(dtype=torch.quint8)
    ob(torch.tensor([-1.5, np.float32(want_hi)], dtype=torch.float32))
    s, z = ob.calculate_qparams()
    assert fq.scale[0] == np.float32(s.item()) and fq.zero_point[0] == int(z.item())
    assert (rec["scale"], rec["zero_point"]) == (fq.scale[0], fq.zero_point[0])
    again = widen_skip_input(_Model(fq), w)  # idempotent
    assert again["range"] == rec["range"] and fq.scale[0] == np.float32(s.item())
    wide = _fake_quant(-1.5, 2 * want_hi)  # already wider: never narrowed
    assert widen_skip_input(_Model(wide), w)["range"][1] == pytest.approx(2 * want_hi)
    assert widen_skip_input(_Model(_fake_quant(-1.5, 1.0)), _windows(0.0)) is None
    assert widen_skip_input(object(), w) is None  # no linear skip
