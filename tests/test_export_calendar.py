"""The self-contained model.onnx's calendar features (computed inside the graph from int64
seconds) against nbqat's :func:`nbqat.data._calendar.calendar_features`, the int8 and float
engines' features."""

import numpy as np
import pytest

pytest.importorskip("onnxruntime")

NAMES = ["hour_sin", "hour_cos", "doy_sin", "doy_cos", "day_of_week"]


def _onnx_calendar(secs: np.ndarray) -> np.ndarray:
    """The graph's calendar features (n, 5) of int64 seconds, run in onnxruntime."""
    import onnxruntime as ort
    from onnx import TensorProto, helper

    from nbqat.export.preprocess import _G, _calendar

    g = _G()
    out = _calendar(g, "secs", NAMES)
    for n in NAMES:
        g.op("Identity", [out[n]], out=n)
    graph = helper.make_graph(
        g.nodes,
        "calendar",
        [helper.make_tensor_value_info("secs", TensorProto.INT64, ["n"])],
        [helper.make_tensor_value_info(n, TensorProto.DOUBLE, ["n"]) for n in NAMES],
        initializer=g.inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return np.stack(sess.run(None, {"secs": secs}), axis=1)


@pytest.mark.parametrize(
    "lo, hi",
    [
        ("1969-12-20", "1970-01-10"),  # negative seconds
        ("1850-01-01", "1852-03-01"),  # historical series (the graph once read 1900 on)
        ("1899-11-01", "1901-03-01"),
        ("1999-12-01", "2001-03-01"),
        ("2399-11-01", "2401-03-01"),  # 2400 (a leap year) and after
        ("0001-01-01", "0001-02-01"),
    ],
)
def test_calendar_matches_nbqat_in_any_year(lo, hi):
    """Day of year (and hour, day of week) from the graph equal nbqat's for dates before 1900
    and after 2399 too: a daily series of the 1850s forecast with ``--engine onnx`` (the
    default) read its day of year from a wrong year's start (|doy_cos| off by up to 2)."""
    from nbqat.data._calendar import calendar_features

    t = np.arange(np.datetime64(lo, "s"), np.datetime64(hi, "s"), np.timedelta64(7, "h"))
    want, names = calendar_features(t)
    assert names == NAMES
    got = _onnx_calendar(t.astype(np.int64))
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-12)
