"""The self-contained ``model.onnx``: raw rows in, forecasts in the target's units out.

:func:`self_contained` wraps the QDQ graph of :func:`nbqat.export.build_model` (inputs
``static``, ``historical``, ``future``: standardised features) with the run's input transform
(:class:`nbqat.data.Scaling`) and the output's unscaling, all inside the graph:

* inputs ``entity`` int64 (B,) (index into the run's entity list; a negative one is out of
  range, not counted from the end), ``time`` int64 (B, k + tau) (seconds since the Unix
  epoch of every history and forecast step; naive timestamps read as UTC, as the loader does;
  on a calendar-month axis, ``Scaling.month_day`` non-zero: months since 1970-01; on a
  numeric time axis: double, the times themselves, :func:`time_type`), ``history`` float32
  (B, k, n_h) (the raw CSV columns ``history_columns``: target, observed, known), ``future``
  float32 (B, tau, n_f) (the raw known CSV columns ``future_columns``);
* output ``quantiles`` float32 (B, tau, Q) in the target's units.

With ``Scaling.window_norm = "last"`` the graph also takes the standardised target relative
to its value at the last history step (float32, as :meth:`nbqat.data.SplitWindows.batch`) and
adds that value back to the network's output before the unscaling.

The transform is computed in float64, with the formulas of
:meth:`Scaling.observed_features` / :meth:`Scaling.known_features` /
:func:`nbqat.data._calendar.calendar_features` in the same operation order, then cast to
float32 where the QDQ graph starts; so the graph's inputs equal nbqat's up to the float32
rounding of the raw values. The QDQ part is the one :func:`nbqat.export.to_onnx` writes (its
parity report is measured on it).
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np

__all__ = ["self_contained", "time_type"]

#: The ``entity`` input with negative indices made out of range (``_model_inputs``).
_ENTITY = "pre.entity"


class _G:
    """A tiny node/initializer collector (names prefixed ``pre.``)."""

    def __init__(self) -> None:
        from onnx import helper, numpy_helper

        self.h, self.nh = helper, numpy_helper
        self.nodes: list[Any] = []
        self.inits: list[Any] = []
        self.n = 0

    def name(self, hint: str) -> str:
        self.n += 1
        return f"pre.{hint}.{self.n}"

    def c(self, value: Any, dtype: Any = np.float64) -> str:
        arr = np.asarray(value, dtype=dtype)
        name = self.name("c")
        self.inits.append(self.nh.from_array(np.array(arr, order="C"), name))
        return name

    def op(self, op: str, inputs: list[str], hint: str = "", out: str | None = None, **kw) -> str:
        o = out or self.name(hint or op)
        self.nodes.append(self.h.make_node(op, inputs, [o], name=self.name("n." + op), **kw))
        return o

    def slice(self, x: str, lo: int, hi: int, axis: int) -> str:
        i64 = np.int64
        return self.op("Slice", [x, self.c([lo], i64), self.c([hi], i64), self.c([axis], i64)])

    def per_entity(self, table: Any, entity: str, rank: int, dtype: Any = np.float64) -> str:
        """Row ``entity`` of ``table`` (E, m), shaped (B, 1, m) for rank 3 or (B, 1, 1)."""
        g = self.op("Gather", [self.c(table, dtype), entity], axis=0)
        return self.op("Unsqueeze", [g, self.c([1] if rank == 3 else [1, 2], np.int64)])


def _floor_div(g: _G, a: str, b: int) -> str:
    """``a // b`` of int64 ``a`` and a positive constant ``b`` (floor, as numpy's; ONNX's
    integer ``Div`` truncates toward zero)."""
    i64 = np.int64
    return g.op("Div", [g.op("Sub", [a, g.op("Mod", [a, g.c(b, i64)], fmod=0)]), g.c(b, i64)])


def _year_start(g: _G, year: str) -> str:
    """Days since the epoch of 1 January of the int64 (proleptic Gregorian) ``year``."""
    i64 = np.int64
    y1 = g.op("Sub", [year, g.c(1, i64)])
    d = g.op("Mul", [y1, g.c(365, i64)])
    for div, sign in ((4, "Add"), (100, "Sub"), (400, "Add")):
        d = g.op(sign, [d, _floor_div(g, y1, div)])
    return g.op("Sub", [d, g.c(719162, i64)])  # 1970-01-01 is day 719162 from 0001-01-01


def _calendar(g: _G, secs: str, names: list[str]) -> dict[str, str]:
    """The calendar features (B, n) float64 of int64 seconds ``secs``."""
    i64 = np.int64
    sod = g.op("Mod", [secs, g.c(86400, i64)], fmod=0)  # floor semantics, as numpy's
    out: dict[str, str] = {}
    # only what the features use: onnxruntime warns of every unused initializer at load
    if {"doy_sin", "doy_cos", "day_of_week"} & set(names):
        day = g.op("Div", [g.op("Sub", [secs, sod]), g.c(86400, i64)])
    if {"hour_sin", "hour_cos"} & set(names):
        frac = g.op("Div", [g.op("Cast", [sod], to=11), g.c(86400.0)])
        ang = g.op("Mul", [g.c(2 * np.pi), frac])
        out["hour_sin"], out["hour_cos"] = g.op("Sin", [ang]), g.op("Cos", [ang])
    if {"doy_sin", "doy_cos"} & set(names):
        # the year: an estimate from the mean Gregorian year (146097 days per 400 years), off
        # by at most one, corrected against the exact start of the year (any year)
        y = g.op("Add", [_floor_div(g, g.op("Mul", [day, g.c(400, i64)]), 146097), g.c(1970, i64)])
        below = g.op("Cast", [g.op("Less", [day, _year_start(g, y)])], to=7)
        y = g.op("Sub", [y, below])
        above = g.op("GreaterOrEqual", [day, _year_start(g, g.op("Add", [y, g.c(1, i64)]))])
        y = g.op("Add", [y, g.op("Cast", [above], to=7)])
        start = g.op("Mul", [_year_start(g, y), g.c(86400, i64)])
        end = g.op("Mul", [_year_start(g, g.op("Add", [y, g.c(1, i64)])), g.c(86400, i64)])
        frac = g.op("Div", [g.op("Cast", [g.op("Sub", [secs, start])], to=11),
                            g.op("Cast", [g.op("Sub", [end, start])], to=11)])  # fmt: skip
        ang = g.op("Mul", [g.c(2 * np.pi), frac])
        out["doy_sin"], out["doy_cos"] = g.op("Sin", [ang]), g.op("Cos", [ang])
    if "day_of_week" in names:
        dow = g.op("Cast", [g.op("Mod", [g.op("Add", [day, g.c(3, i64)]), g.c(7, i64)], fmod=0)],
                   to=11)  # fmt: skip
        out["day_of_week"] = g.op("Sub", [g.op("Div", [dow, g.c(3.0)]), g.c(1.0)])
    return out


def _month_calendar(g: _G, months: str) -> dict[str, str]:
    """The month-of-year features (B, n) float64 of int64 months since 1970-01 (a
    calendar-month axis), as :func:`nbqat.data._calendar.month_features`."""
    i64 = np.int64
    m = g.op("Cast", [g.op("Mod", [months, g.c(12, i64)], fmod=0)], to=11)
    ang = g.op("Mul", [g.c(2 * np.pi), g.op("Div", [m, g.c(12.0)])])
    return {"doy_sin": g.op("Sin", [ang]), "doy_cos": g.op("Cos", [ang])}


def _known(g: _G, sc: Any, entity: str, secs: str, raw: str) -> str:
    """The known inputs (B, n, m_x) float64 at int64 times ``secs`` (B, n) with the raw known
    columns ``raw`` (B, n, m_known) float64, in :attr:`Scaling.future_names` order."""
    parts = []
    if not sc.calendar_names:
        cal = {}
    elif getattr(sc, "month_day", 0):  # calendar months: ``secs`` holds months since 1970-01
        cal = _month_calendar(g, secs)
    else:
        cal = _calendar(g, secs, list(sc.calendar_names))
    for c in sc.calendar_names:
        parts.append(g.op("Unsqueeze", [cal[c], g.c([2], np.int64)]))
    if "time_index" in sc.calendar:
        tnum = g.op("Sub", [g.op("Cast", [secs], to=11), g.c(sc.t0)])
        ti = g.op("Sub", [g.op("Div", [g.op("Mul", [g.c(2.0), tnum]),
                                       g.c(max(float(sc.t_span), 1e-300))]), g.c(1.0)])  # fmt: skip
        parts.append(g.op("Unsqueeze", [ti, g.c([2], np.int64)]))
    if sc.known:
        mu = g.per_entity(np.asarray(sc.known_mu), entity, 3)
        sd = g.per_entity(np.asarray(sc.known_sd), entity, 3)
        parts.append(g.op("Div", [g.op("Sub", [raw, mu]), sd]))
    return parts[0] if len(parts) == 1 else g.op("Concat", parts, axis=2)


def _model_inputs(g: _G, sc: Any, k: int, tau: int, n_h: int) -> str | None:
    """The QDQ graph's inputs ``static``, ``historical`` and ``future_features`` from the raw
    ``entity``, ``time``, ``history`` and ``future``; returns the (B, 1, 1) float32 value that
    ``Scaling.window_norm = "last"`` subtracted from the target's history (None without)."""
    n_obs = 1 + len(sc.observed)
    # a negative entity index is out of range, as one >= E (Gather would read -1 as the last
    # entity: pandas' get_indexer gives -1 for a name it does not know)
    neg = g.op("Less", ["entity", g.c(0, np.int64)])
    g.op("Where", [neg, g.c(len(sc.entities), np.int64), "entity"], out=_ENTITY)
    hist = g.op("Cast", ["history"], to=11)
    fut = g.op("Cast", ["future"], to=11)
    obs = g.slice(hist, 0, n_obs, 2)
    mu = g.per_entity(np.asarray(sc.obs_mu), _ENTITY, 3)
    sd = g.per_entity(np.asarray(sc.obs_sd), _ENTITY, 3)
    obs_std = g.op("Div", [g.op("Sub", [obs, mu]), sd])
    t_hist, t_fut = g.slice("time", 0, k, 1), g.slice("time", k, k + tau, 1)
    kh = _known(g, sc, _ENTITY, t_hist, g.slice(hist, n_obs, n_h, 2))
    kf = _known(g, sc, _ENTITY, t_fut, fut)
    last = sc.window_norm == "last"
    hist32 = g.op("Cast", [g.op("Concat", [obs_std, kh], axis=2)], to=1,
                  out=None if last else "historical")  # fmt: skip
    off = None
    if last:  # the target relative to its last history step, in float32
        off = g.slice(g.slice(hist32, k - 1, k, 1), 0, 1, 2)  # (B, 1, 1)
        tgt = g.op("Sub", [g.slice(hist32, 0, 1, 2), off])
        g.op("Concat", [tgt, g.slice(hist32, 1, 2**62, 2)], out="historical", axis=2)
    g.op("Cast", [kf], out="future_features", to=1)
    static = np.asarray(sc.static, np.float64).astype(np.float32)
    g.op("Gather", [g.c(static, np.float32), _ENTITY], out="static", axis=0)
    return off


def time_type(sc: Any) -> int:
    """The ``time`` input's ONNX element type for :class:`~nbqat.data.Scaling` ``sc``: int64
    (seconds, or months on a calendar-month axis), or double on a numeric time axis, whose
    times need not be whole numbers (a step of 0.25: ``time_index`` of the exact times).

    Parameters
    ----------
    sc : nbqat.data.Scaling
    """
    from onnx import TensorProto

    numeric = not sc.is_datetime and not getattr(sc, "month_day", 0)
    return int(TensorProto.DOUBLE if numeric else TensorProto.INT64)


def self_contained(inner: Any, info: dict) -> Any:
    """The QDQ model ``inner`` (inputs static / historical / future) wrapped with the run's
    transform: raw rows in, target units out (see the module docstring).

    Parameters
    ----------
    inner : onnx.ModelProto
        :func:`nbqat.export.build_model`'s model (its metadata is kept).
    info : dict
        :func:`nbqat.export.job.preprocessing_metadata` (stored as the metadata key ``nbqat``).

    Returns
    -------
    onnx.ModelProto
        Checked (``onnx.checker.check_model(full_check=True)``).
    """
    import onnx
    from onnx import TensorProto, helper

    from nbqat.data import Scaling

    sc = Scaling.from_json(info["scaling"])
    k, tau = int(info["history"]), int(info["horizon"])
    n_h, n_f = len(info["history_columns"]), len(sc.known)
    g = _G()
    off = _model_inputs(g, sc, k, tau, n_h)
    body = onnx.ModelProto()
    body.CopyFrom(inner)
    for node in body.graph.node:  # the QDQ graph's future input is the known features
        node.input[:] = ["future_features" if i == "future" else i for i in node.input]
        node.output[:] = ["pre.quantiles_std" if o == "quantiles" else o for o in node.output]
    post = _G()
    post.n = g.n
    y32 = "pre.quantiles_std" if off is None else post.op("Add", ["pre.quantiles_std", off])
    y = post.op("Cast", [y32], to=11)
    scl = post.per_entity(np.asarray(sc.scale), _ENTITY, 2)
    lvl = post.per_entity(np.asarray(sc.level), _ENTITY, 2)
    post.op("Cast", [post.op("Add", [post.op("Mul", [y, scl]), lvl])], out="quantiles", to=1)
    nq = len(info["quantiles"])
    inputs = [
        helper.make_tensor_value_info("entity", TensorProto.INT64, ["batch"]),
        helper.make_tensor_value_info("time", time_type(sc), ["batch", k + tau]),
        helper.make_tensor_value_info("history", TensorProto.FLOAT, ["batch", k, n_h]),
        helper.make_tensor_value_info("future", TensorProto.FLOAT, ["batch", tau, n_f]),
    ]
    graph = helper.make_graph(
        g.nodes + list(body.graph.node) + post.nodes,
        "nbqat_forecaster",
        inputs,
        [helper.make_tensor_value_info("quantiles", TensorProto.FLOAT, ["batch", tau, nq])],
        initializer=list(body.graph.initializer) + g.inits + post.inits,
    )
    model = helper.make_model(graph, producer_name=inner.producer_name,
                              producer_version=inner.producer_version,
                              opset_imports=list(inner.opset_import))  # fmt: skip
    model.ir_version = inner.ir_version
    props = {p.key: p.value for p in inner.metadata_props}
    props["nbqat"] = json.dumps(info)
    props["inputs"] = json.dumps({"entity": [], "time": [k + tau], "history": [k, n_h],
                                  "future": [tau, n_f]})  # fmt: skip
    helper.set_model_props(model, props)
    onnx.checker.check_model(model, full_check=True)
    return model
