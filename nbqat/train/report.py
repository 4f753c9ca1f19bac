"""Quantization report of a QAT model: per-quantizer statistics, per-layer sensitivity, float
fallback and a table of activation observers.

* :func:`quantizer_report` -- for every quantizer of a
  :class:`~nbqat.nn.qat.QATTemporalFusionTransformer` (its ``fake_quants`` dict): module path,
  kind, observer, representable range, scale, zero point, the fraction of the observed values it
  saturates and the SQNR (dB) of its fake-quantized output against the float input, over a few
  calibration batches (``None`` where the SQNR is infinite: strict JSON).
* :func:`sensitivity` -- test metric with only one module's quantizers enabled and with all but
  it, ranked (AIMET's QuantAnalyzer idea); :func:`float_fallback` keeps the N most sensitive
  modules in float and reports what that recovers.
* :func:`activation_qconfig` -- the main job's ``--observer`` choice as a QConfig.
* :func:`write_report` -- ``quant_report.json`` (``allow_nan=False``) and a figure.

:func:`from_run` is the main job's glue (``nbqat train``).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np

from nbqat.quantization.fake_quant import (
    fake_quantize_per_channel_affine_cachemask,
    fake_quantize_per_tensor_affine_cachemask,
)
from nbqat.quantization.fake_quantize import FakeQuantize
from nbqat.quantization.histogram_observers import HistogramObserver
from nbqat.quantization.qconfig import QConfig, default_qat_qconfig
from nbqat.quantization.range_observers import MSEObserver, PercentileObserver

__all__ = [
    "OBSERVERS",
    "activation_qconfig",
    "float_fallback",
    "from_run",
    "quantizer_report",
    "sensitivity",
    "write_report",
]

#: The activation observers of ``nbqat train --observer``.
OBSERVERS = ("minmax", "histogram", "percentile", "mse")
_OBSERVER_CLASSES = {
    "histogram": HistogramObserver,
    "percentile": PercentileObserver,
    "mse": MSEObserver,
}
_KINDS = {
    "weight_fake_quant": "weight",
    "weight_ih_fake_quant": "weight",
    "weight_hh_fake_quant": "weight",
    "input_fake_quant": "activation",
    "hidden_fake_quant": "activation",
    "attention_fake_quant": "activation",
    "output_fake_quant": "activation",
}


def activation_qconfig(observer: str = "minmax") -> QConfig:
    """The default QAT qconfig with another activation observer.

    Parameters
    ----------
    observer : {"minmax", "histogram", "percentile", "mse"}
        ``"minmax"`` is :data:`nbqat.default_qat_qconfig` (moving-average min/max); the others
        put a :class:`~nbqat.HistogramObserver`, :class:`~nbqat.PercentileObserver` or
        :class:`~nbqat.MSEObserver` (quint8, per tensor affine, [0, 255]) in every activation
        FakeQuantize. Weights keep the per-channel symmetric qint8 min/max observer.

    Returns
    -------
    QConfig

    Raises
    ------
    ValueError
        Unknown observer name.
    """
    if observer == "minmax":
        return default_qat_qconfig
    if observer not in _OBSERVER_CLASSES:
        raise ValueError(f"unknown observer {observer!r}: use one of {', '.join(OBSERVERS)}")
    act = FakeQuantize.with_args(
        observer=_OBSERVER_CLASSES[observer],
        quant_min=0,
        quant_max=255,
        dtype="quint8",
        qscheme="per_tensor_affine",
        reduce_range=False,
    )
    return QConfig(activation=act, weight=default_qat_qconfig.weight)


def _module(name: str) -> str:
    return name.rsplit(".", 1)[0] if "." in name else "<root>"


def _fq_numpy(fq: Any, x: np.ndarray) -> tuple[np.ndarray, int]:
    """``fq``'s own fake quantization of ``x`` with its current qparams, as float64, and the
    count of values outside its range.

    The float32 bits of the quantizer's forward (the same :mod:`nbqat.quantization.fake_quant`
    function,
    per tensor or per channel; the low-bit quantizers' ``report_fake_quant``), so the report
    measures the function the model computes; the saturated count is the number of zeros of
    its STE mask (NaN counts as outside). The caller sums the statistics in float64.
    """
    if hasattr(fq, "report_fake_quant"):  # the low-bit quantizers (grouped, per token, float8)
        return fq.report_fake_quant(x)
    if getattr(fq, "learnable", False):  # LSQ: its forward's rounded, clamped zero point
        scale, zero_point = fq.calculate_qparams()
    else:
        scale, zero_point = fq.scale, fq.zero_point
    if x.size == 0:
        return np.asarray(x, np.float64), 0
    if fq.is_per_channel:
        y, mask = fake_quantize_per_channel_affine_cachemask(
            x, scale, zero_point, fq.ch_axis, fq.quant_min, fq.quant_max
        )
    else:
        y, mask = fake_quantize_per_tensor_affine_cachemask(
            x, scale, zero_point, fq.quant_min, fq.quant_max
        )
    return np.asarray(y, np.float64), int(mask.size - np.count_nonzero(mask))


def _lowbit_fields(fq: Any) -> dict:
    """A grouped weight quantizer's ``group_size``, ``block_size`` and ``per_channel_fallback``."""
    if not hasattr(fq, "group_size"):
        return {}
    return {
        "group_size": int(fq.group_size),
        "block_size": list(fq.block_size or ()),
        "per_channel_fallback": fq.per_channel_fallback,
    }


#: quant_report.json's statement of the --weight-bits 4 fallback rule.
FALLBACK_RULE = (
    "a layer whose weight's input width is smaller than the group size or not a multiple of it "
    "is quantized per output channel at 8 bits (the int8 run's weights; "
    "QConfig.weight_fallback) instead of in int4 groups"
)


def fallback_layers(rows: list) -> dict:
    """The modules of ``rows`` (:func:`quantizer_report`) whose weights are not grouped.

    Returns
    -------
    dict
        ``per_channel_fallback``: the modules, in order; ``fallback_bits``: their weights' bits
        by module (8 under the rule, 4 for a grouped quantizer's own per-channel fallback);
        ``fallback_rule``: :data:`FALLBACK_RULE`.
    """
    bits: dict[str, int] = {}
    for q in rows:
        if q["kind"] != "weight" or q.get("per_channel_fallback") is False:
            continue
        b = 4 if q.get("per_channel_fallback") else 8  # a grouped quantizer's own, or int8's
        bits[q["module"]] = max(bits.get(q["module"], 0), b)
    return {"per_channel_fallback": list(bits), "fallback_bits": bits,
            "fallback_rule": FALLBACK_RULE}  # fmt: skip


def _finite(v: float) -> float | None:
    return float(v) if math.isfinite(v) else None


def _predictor(qat: Any) -> Callable:
    """``qat.predict`` (the TFT), or a forward with every observer off (any QAT model with
    ``fake_quants``, e.g. :func:`nbqat.nn.prepare_qat`'s, in the QAT phase)."""
    from nbqat.nn.quantize import QATModel

    if hasattr(qat, "predict"):
        return qat.predict
    # a QATModel's own forward counts calibration batches and may end the phase (turning its
    # observers back on): run its network directly
    forward = qat.model.forward if isinstance(qat, QATModel) else qat.forward

    def predict(*inputs: Any) -> Any:
        saved = [(fq, bool(fq.observer_enabled)) for fq in qat.fake_quants.values()]
        try:
            for fq, _ in saved:
                fq.enable_observer(False)
            return forward(*inputs)
        finally:
            for fq, flag in saved:
                fq.enable_observer(flag)

    return predict


def _accumulate(a: list) -> Callable:
    """A forward pre-hook adding an input's count, saturated count, signal and float64
    fake-quantization noise energy to ``a`` (``[n, saturated, sum x^2, sum (fq(x) - x)^2]``)."""

    def hook(fq: Any, args: tuple) -> None:
        x = args[0]
        xh = x.copy_to_host() if hasattr(x, "copy_to_host") else np.asarray(x)
        y, sat = _fq_numpy(fq, xh)
        x64 = xh.astype(np.float64)
        a[0] += x64.size
        a[1] += sat
        a[2] += float(np.sum(x64 * x64))
        a[3] += float(np.sum((y - x64) ** 2))

    return hook


def quantizer_report(qat: Any, batches: Iterable[tuple], n_inputs: int = 3) -> list[dict]:
    """Per-quantizer statistics of ``qat`` over ``batches`` (no observer is updated).

    Parameters
    ----------
    qat : QATTemporalFusionTransformer, or any QAT model with ``fake_quants`` and ``forward``
        Calibrated (its quantizers hold scales and zero points).
    batches : iterable of tuples
        Typically a few calibration batches; the first ``n_inputs`` items of each are the
        model's inputs (the TFT's ``(static, historical, future, ...)``), the rest is ignored.
    n_inputs : int, default 3

    Returns
    -------
    list of dict
        One per quantizer, in ``qat.fake_quants`` order: ``name``, ``module``, ``kind``
        ("weight" / "activation"), ``observer``, ``per_channel``, ``fake_quant_enabled``,
        ``range`` ([lowest, highest] representable value; per channel the widest),
        ``scale`` and ``zero_point`` (lists), ``values`` (count), ``saturated_fraction``
        (values outside the range), ``sqnr_db`` = ``10 log10(sum x^2 / sum (fq(x) - x)^2)``
        (``None`` when infinite or undefined).

    Notes
    -----
    A forward pre-hook on each quantizer (``register_forward_pre_hook``, removed afterwards)
    sees every input it fake-quantizes during the call; the statistics use the quantizer's own
    float32 fake quantization with its current qparams, whether or not fake quantization is
    enabled for it, summed in float64.
    """
    acc = {name: [0, 0, 0.0, 0.0] for name in qat.fake_quants}
    handles = [
        fq.register_forward_pre_hook(_accumulate(acc[name])) for name, fq in qat.fake_quants.items()
    ]
    predict = _predictor(qat)
    try:
        for b in batches:
            predict(*b[:n_inputs])
    finally:
        for h in handles:
            h.remove()
    rows = []
    for name, fq in qat.fake_quants.items():
        n, sat, sig, noise = acc[name]
        s = np.asarray(fq.scale, np.float64).reshape(-1)
        z = np.asarray(fq.zero_point, np.float64).reshape(-1)
        lo, hi = (fq.quant_min - z) * s, (fq.quant_max - z) * s
        sqnr = 10.0 * math.log10(sig / noise) if noise > 0 and sig > 0 else math.inf
        rows.append(
            {
                "name": name,
                "module": _module(name),
                "kind": _KINDS.get(name.rsplit(".", 1)[-1], "activation"),
                "observer": type(getattr(fq, "activation_post_process", fq)).__name__,
                "per_channel": bool(s.size > 1),
                "fake_quant_enabled": bool(fq.fake_quant_enabled),
                "range": [float(lo.min()), float(hi.max())],
                "scale": [float(v) for v in s],
                "zero_point": [int(v) for v in z],
                "values": int(n),
                "saturated_fraction": sat / n if n else None,
                "sqnr_db": _finite(sqnr) if n else None,
                **_lowbit_fields(fq),
            }
        )
    return rows


def _set_modules(qat: Any, enabled: set[str], saved: dict[str, bool]) -> None:
    for name, fq in qat.fake_quants.items():
        fq.enable_fake_quant(saved[name] and _module(name) in enabled)


def sensitivity(qat: Any, evaluate: Callable[[Callable], float]) -> dict:
    """Per-module sensitivity: the metric with only that module quantized, and with all but it.

    Parameters
    ----------
    qat : QATTemporalFusionTransformer, or any QAT model with ``fake_quants``
        In the QAT phase (fake quantization on); its flags are restored on return.
    evaluate : callable
        ``evaluate(predict) -> float``, e.g. the test P50 q-risk of ``predict`` (lower is
        better); called ``2 + 2 * modules`` times.

    Returns
    -------
    dict
        ``float`` (nothing quantized), ``all`` (everything), and ``modules``: a list ranked
        most sensitive first by ``only - float``, each with ``module``, ``only`` and
        ``all_but``.
    """
    saved = {name: bool(fq.fake_quant_enabled) for name, fq in qat.fake_quants.items()}
    modules = list(dict.fromkeys(_module(n) for n, on in saved.items() if on))
    predict = _predictor(qat)
    try:
        _set_modules(qat, set(), saved)
        base_float = float(evaluate(predict))
        _set_modules(qat, set(modules), saved)
        base_all = float(evaluate(predict))
        rows: list[dict[str, Any]] = []
        for m in modules:
            _set_modules(qat, {m}, saved)
            only = float(evaluate(predict))
            _set_modules(qat, set(modules) - {m}, saved)
            rows.append({"module": m, "only": only, "all_but": float(evaluate(predict))})
    finally:
        for name, fq in qat.fake_quants.items():
            fq.enable_fake_quant(saved[name])
    rows.sort(key=lambda r: r["only"] - base_float, reverse=True)
    return {"float": base_float, "all": base_all, "modules": rows}


def float_fallback(qat: Any, sens: dict, n: int, evaluate: Callable[[Callable], float]) -> dict:
    """Keep the ``n`` most sensitive modules (of :func:`sensitivity`) in float; evaluate.

    Parameters
    ----------
    qat : QATTemporalFusionTransformer
    sens : dict, the output of :func:`sensitivity`
    n : int >= 0
    evaluate : callable, as for :func:`sensitivity`

    Returns
    -------
    dict
        ``modules`` kept in float, ``metric`` with them in float, ``all`` and ``float`` (from
        ``sens``), ``recovered_fraction`` = ``(all - metric) / (all - float)`` (``None``
        when quantization cost nothing), ``requested`` (``n``) and ``capped`` (True when ``n``
        exceeded the number of quantized modules, so every module stayed in float).
    """
    keep = [r["module"] for r in sens["modules"][: max(0, int(n))]]
    capped = int(n) > len(sens["modules"])
    saved = {name: bool(fq.fake_quant_enabled) for name, fq in qat.fake_quants.items()}
    enabled = {_module(nm) for nm, on in saved.items() if on} - set(keep)
    try:
        _set_modules(qat, enabled, saved)
        metric = float(evaluate(_predictor(qat)))
    finally:
        for name, fq in qat.fake_quants.items():
            fq.enable_fake_quant(saved[name])
    gap = sens["all"] - sens["float"]
    return {
        "modules": keep,
        "metric": metric,
        "all": sens["all"],
        "float": sens["float"],
        "recovered_fraction": (sens["all"] - metric) / gap if gap > 0 else None,
        "requested": int(n),
        "capped": capped,
    }


def _strict(obj: Any) -> Any:
    """Non-finite floats -> None, NumPy scalars -> Python (for ``json.dumps(allow_nan=False)``)."""
    if isinstance(obj, dict):
        return {k: _strict(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_strict(v) for v in obj]
    if isinstance(obj, (float, np.floating)):
        return float(obj) if math.isfinite(obj) else None
    if isinstance(obj, np.integer):
        return int(obj)
    return obj


#: Quantizers drawn in quant_report.png (the worst by SQNR; the JSON has them all).
PLOT_TOP = 25


def write_report(report: dict, out: str | Path, figure: bool = True) -> list[Path]:
    """Write ``quant_report.json`` (strict JSON) and ``quant_report.png`` into ``out``.

    Parameters
    ----------
    report : dict with a ``quantizers`` list (rows of :func:`quantizer_report`)
    out : directory (must exist)
    figure : bool, default True
        Also draw SQNR and saturation per quantizer (matplotlib, Agg canvas).

    Returns
    -------
    list of Path
        The files written.
    """
    out = Path(out)
    path = out / "quant_report.json"
    path.write_text(json.dumps(_strict(report), indent=2, allow_nan=False) + "\n")
    files = [path]
    if figure and report.get("quantizers"):
        from nbqat.train.plots import plot_quantizers

        files.append(plot_quantizers(report["quantizers"], out / "quant_report.png", PLOT_TOP))
    return files


def from_run(r: Any, test: Any) -> dict:
    """The main job's report (``nbqat train``): quantizer statistics on the calibration batches,
    and, as configured, sensitivity, float fallback and the observer table; writes the files.

    Parameters
    ----------
    r : nbqat.train.loop.Run (after QAT)
    test : SplitWindows, the test split

    Returns
    -------
    dict
        A summary for metrics.json (the full report is in ``quant_report.json``).
    """
    cfg, w = r.cfg, r.w
    order = r.epoch_order(2, 0)[: max(1, min(cfg.calibration_batches, 8))]
    batches = [w.train.batch(i) for i in order]

    def evaluate(predict: Callable) -> float:
        return r.q_risk(predict, test)["P50"]

    report: dict[str, Any] = {
        "observer": cfg.observer,
        "quantizers": quantizer_report(r.qat, batches),
    }
    fmt = cfg.weight_format() if hasattr(cfg, "weight_format") else None
    if fmt is not None and fmt["weight_bits"] == 4:  # the layers too narrow for the group size
        report["weight_format"] = fmt
        report.update(fallback_layers(report["quantizers"]))
    if cfg.sensitivity or cfg.float_fallback:
        report["sensitivity"] = sensitivity(r.qat, evaluate)
        if cfg.float_fallback:
            report["float_fallback"] = float_fallback(
                r.qat, report["sensitivity"], cfg.float_fallback, evaluate
            )
    if cfg.observer == "all":
        report["observers_ptq"] = _observer_table(r, batches, evaluate)
    files = write_report(report, r.out, figure=cfg.plots)
    sq = [q["sqnr_db"] for q in report["quantizers"] if q["sqnr_db"] is not None]
    summary = {
        "file": files[0].name,  # (and quant_report.png unless --no-plots)
        "quantizers": len(report["quantizers"]),
        "median_sqnr_db": float(np.median(sq)) if sq else None,
        "worst": min(report["quantizers"], key=lambda q: q["sqnr_db"] or math.inf)["name"],
    }
    for key in ("float_fallback", "observers_ptq", "per_channel_fallback", "fallback_rule"):
        if key in report:
            summary[key] = report[key]
    if "sensitivity" in report:  # the ranking (most sensitive first), for summary.txt
        sens = report["sensitivity"]
        summary["sensitivity_top"] = [
            {"module": m["module"], "only_P50": m["only"], "float_P50": sens["float"]}
            for m in sens["modules"][:5]
        ]
    return summary


def _observer_table(r: Any, batches: list, evaluate: Callable) -> dict:
    """Post-training fake-quant P50 q-risk for each activation observer (same calibration
    batches, the best float weights, no QAT)."""
    from nbqat.nn.forecasters import prepare_forecaster
    from nbqat.quantization.qconfig import QATConfig

    table = {}
    for name in OBSERVERS:
        qcfg = QATConfig(calibration_batches=len(batches), qconfig=activation_qconfig(name))
        qat = prepare_forecaster(r.model, qcfg)
        qat.calibrate(batches)
        rows = quantizer_report(qat, batches[:2])
        sq = [q["sqnr_db"] for q in rows if q["sqnr_db"] is not None and q["kind"] == "activation"]
        table[name] = {
            "ptq_fake_quant_P50": float(evaluate(qat.predict)),
            "median_activation_sqnr_db": float(np.median(sq)) if sq else None,
        }
    return table
