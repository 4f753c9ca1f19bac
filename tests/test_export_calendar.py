"""The self-contained model.onnx's time features (calendar features computed inside the graph
from int64 seconds, the time index) against nbqat's (:func:`nbqat.data._calendar.calendar_features`,
:meth:`nbqat.data.Scaling.known_features`), the int8 and float engines' features."""

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


@pytest.mark.parametrize(
    "names", [["day_of_week"], ["hour_sin", "hour_cos"], ["doy_sin", "doy_cos"], NAMES]
)
def test_calendar_builds_only_what_its_features_use(names):
    """A daily run (calendar: day of week only) wrote 2 pi and the seconds-of-day chain for
    hour and day-of-year features it did not have, and onnxruntime printed "Removing
    initializer 'pre.c.54'. It is not used by any node" at every InferenceSession of its
    model.onnx. Every constant and node output of the calendar now feeds a feature."""
    from nbqat.export.preprocess import _G, _calendar

    g = _G()
    out = _calendar(g, "secs", names)
    assert sorted(out) == sorted(names)
    used = {i for n in g.nodes for i in n.input} | set(out.values())
    assert [t.name for t in g.inits if t.name not in used] == []
    assert [o for n in g.nodes for o in n.output if o not in used] == []


def _numeric_scaling():
    """A one-entity :class:`Scaling` of a numeric time axis with a time index only."""
    from nbqat.data import Scaling

    return Scaling(
        entities=["a"], target="y", observed=[], known=[], static_columns=[], level=[2.0],
        scale=[3.0], obs_mu=[[0.0]], obs_sd=[[1.0]], known_mu=[[]], known_sd=[[]],
        static=[[0.0]], calendar=["time_index"], calendar_names=[], is_datetime=False,
        t0=0.0, t_span=69.75, step=0.25,
    )  # fmt: skip


def _wrapped_identity(sc, k: int, tau: int):
    """An onnxruntime session of :func:`self_contained` around an inner graph that returns its
    ``future`` input (the known features: the time index) as its one quantile."""
    import onnxruntime as ort
    from onnx import TensorProto, helper

    from nbqat.export.preprocess import self_contained

    vi = helper.make_tensor_value_info
    inner = helper.make_graph(
        [helper.make_node("Identity", ["future"], ["quantiles"])],
        "inner",
        [vi("static", TensorProto.FLOAT, ["batch", 1]),
         vi("historical", TensorProto.FLOAT, ["batch", k, 1]),
         vi("future", TensorProto.FLOAT, ["batch", tau, 1])],
        [vi("quantiles", TensorProto.FLOAT, ["batch", tau, 1])],
    )  # fmt: skip
    info = {"history": k, "horizon": tau, "history_columns": ["y"], "quantiles": [0.5],
            "scaling": sc.to_json()}  # fmt: skip
    opset = [helper.make_opsetid("", 21)]
    model = self_contained(helper.make_model(inner, opset_imports=opset), info)
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


def _inputs(t: np.ndarray, k: int, tau: int, entity: int = 0) -> dict:
    zeros = np.zeros((1, k, 1), np.float32), np.zeros((1, tau, 0), np.float32)
    e = np.full(1, entity, np.int64)
    return {"entity": e, "time": t[None], "history": zeros[0], "future": zeros[1]}


def test_numeric_time_axis_keeps_fractional_times():
    """On a numeric time axis with a step of 0.25 the graph's time index is nbqat's: the
    ``time`` input was int64 and ``predict --engine onnx`` rounded the times to whole numbers,
    so 100.25 read as 100 (time index off by 0.014, steps repeated)."""
    sc, k, tau = _numeric_scaling(), 3, 4
    t = 100.0 + 0.25 * np.arange(k + tau)
    got = _wrapped_identity(sc, k, tau).run(None, _inputs(t, k, tau))[0][0, :, 0]
    want = sc.known_features(0, t[k:], np.zeros((tau, 0)))[:, 0].astype(np.float32) * 3.0 + 2.0
    np.testing.assert_allclose(got, want, rtol=1e-6)


@pytest.mark.parametrize("entity", [-1, 1])
def test_entity_index_out_of_range_is_an_error(entity):
    """An entity index outside [0, E) fails in onnxruntime; -1 (what pandas' ``get_indexer``
    gives a name it does not know) was read by Gather as the last entity, whose scaling and
    static features then forecast silently."""
    from onnxruntime.capi.onnxruntime_pybind11_state import InvalidArgument

    sc, k, tau = _numeric_scaling(), 3, 4
    sess = _wrapped_identity(sc, k, tau)
    t = 100.0 + 0.25 * np.arange(k + tau)
    with pytest.raises(InvalidArgument, match="out of data bounds"):
        sess.run(None, _inputs(t, k, tau, entity))
