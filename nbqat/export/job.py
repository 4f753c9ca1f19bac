"""The main job's export step (``nbqat train`` -> ``OUT/model.onnx`` and ``onnx_parity``)."""

from __future__ import annotations

import pathlib
from collections.abc import Mapping
from typing import Any

from nbqat.export.parity import check_parity, division_study


def preprocessing_metadata(windows: Any, cfg: Any) -> dict:
    """The ``nbqat`` metadata of a run's self-contained ``model.onnx``.

    Parameters
    ----------
    windows : nbqat.data.Windows
        The run's windows (their :class:`~nbqat.data.Scaling`, names, shapes).
    cfg : TrainConfig
        The resolved run options (the time and entity columns).

    Returns
    -------
    dict
        ``history``, ``horizon``, ``step_seconds`` (``None`` on a calendar-month axis),
        ``step_months`` (the step in months there, else ``None``), ``quantiles``, ``entities``,
        ``history_columns`` (target, observed, known CSV columns: the graph input
        ``history``'s last axis), ``future_columns`` (the known CSV columns: ``future``'s),
        ``target``, ``time_col``, ``entity_col``, ``calendar``, ``test_start`` and
        ``scaling`` (:meth:`Scaling.to_json`).
    """
    from nbqat.data import TMY3_COLUMNS

    w, sc = windows, windows.scaling
    csv = getattr(cfg, "csv", None)
    time_col = cfg.time_col if csv is not None else TMY3_COLUMNS["time_col"]
    entity_col = cfg.entity_col if csv is not None else TMY3_COLUMNS["entity_col"]
    return {
        "history": int(w.history),
        "horizon": int(w.horizon),
        "step_seconds": None if sc.month_day else float(sc.step),
        "step_months": int(sc.step) if sc.month_day else None,
        "quantiles": [float(q) for q in w.quantiles],
        "entities": list(sc.entities),
        "history_columns": [sc.target, *sc.observed, *sc.known],
        "future_columns": list(sc.known),
        "target": sc.target,
        "time_col": time_col,
        "entity_col": entity_col,
        "calendar": list(sc.calendar),
        "test_start": str(w.cutoffs[1]),
        "scaling": sc.to_json(),
    }


def run_metadata(windows: Any, q_risk: Mapping[str, Any], cfg: Any = None) -> dict:
    """ONNX metadata props of a training run: input feature names, the target's per-entity
    scaling (``pred * scale + level`` gives the target's units) and the run's q-risk.

    Parameters
    ----------
    windows : nbqat.data.Windows
        The run's windows (names, per-entity ``level`` / ``scale``).
    q_risk : Mapping
        The run's test q-risk by model (``metrics["q_risk_test"]``).
    cfg : TrainConfig, optional
        With it, the ``nbqat`` key of :func:`preprocessing_metadata` is added.

    Returns
    -------
    dict
        JSON-able values keyed by prop name.
    """
    w = windows
    return {
        "target": w.target_name,
        "static_features": list(w.static_names),
        "historical_features": list(w.historical_names),
        "future_features": list(w.future_names),
        "target_scaling": {
            str(e): {"level": float(lv), "scale": float(sc)}
            for e, lv, sc in zip(w.entity_names, w.level, w.scale)
        },
        "q_risk_test": dict(q_risk),
        **({"nbqat": preprocessing_metadata(w, cfg)} if cfg is not None else {}),
    }


def export_run(
    qat: Any,
    int8: Any,
    split: Any,
    out_dir: str | pathlib.Path,
    *,
    metadata: Mapping[str, Any] | None = None,
    reference_rows: int = 16,
) -> dict:
    """The main job's export step: write ``out_dir/model.onnx`` and measure parity on ``split``.

    With the ``nbqat`` metadata (:func:`preprocessing_metadata`, as :func:`run_metadata`
    gives with a config) the file is the self-contained graph
    (:func:`nbqat.export.preprocess.self_contained`: raw rows in, target units out); the
    parity report is measured on its QDQ part, the graph :func:`nbqat.export.to_onnx` writes.

    Parameters
    ----------
    qat : QATTemporalFusionTransformer
        The trained QAT model (engine ``fake_quant``).
    int8 : Int8TemporalFusionTransformer
        ``qat.to_int8()``: the model exported (its qparams are the QAT model's current ones).
    split : nbqat.data.SplitWindows
        The windows to compare on (the test split): ``batch()``, ``actual()``,
        ``unscale()``.
    out_dir : str or pathlib.Path
        Existing run folder.
    metadata : Mapping, optional
        Extra ONNX metadata props (feature names, target scaling, q-risk).
    reference_rows : int, default 16
        Windows run by the pure-Python reference evaluator.

    Returns
    -------
    dict
        The ``onnx_parity`` block of metrics.json: the file name and size, the opset, the
        parity report of :func:`check_parity` (without predictions) and the
        :func:`division_study`.
    """
    from nbqat._io import atomic_open
    from nbqat.export.onnx_export import DEFAULT_OPSET, build_model
    from nbqat.export.preprocess import self_contained

    path = pathlib.Path(out_dir) / "model.onnx"
    proto, _ = build_model(int8, metadata=metadata)  # the QDQ graph: parity is measured on it
    rep = check_parity(  # the split read batch by batch: memory flat in the windows
        qat,
        proto,
        split,
        int8=int8,
        target=split.actual(),  # NaN at fill_gaps' repaired steps: not scored
        unscale=split.unscale,
        reference_rows=reference_rows,
    )
    rep.pop("_predictions")
    rep["division_vs_reciprocal"] = division_study(proto, split)
    info = (metadata or {}).get("nbqat")
    final = self_contained(proto, info) if info is not None else proto
    with atomic_open(path, "wb", prefix=".nbqat-onnx-") as f:
        f.write(final.SerializeToString())
    return {"file": path.name, "bytes": path.stat().st_size, "opset": DEFAULT_OPSET, **rep}


def summary_lines(parity: Mapping[str, Any]) -> list[str]:
    """The summary.txt lines of an :func:`export_run` block.

    Parameters
    ----------
    parity : Mapping
        ``metrics["onnx_parity"]``.

    Returns
    -------
    list of str
        One line per ONNX runtime against the int8 reference, and the division study.
    """
    pr = parity["pairs"]
    lines = []
    for key, label in (
        ("int8_vs_ort_disable_all", "ORT no-opt"),
        ("int8_vs_ort_default", "ORT default"),
    ):
        if key in pr:
            v = pr[key]
            steps = v["max_diff_output_steps"]  # None: no output quantizer (a generic model)
            diff = f"{v['max_abs_diff']:.3g}" if steps is None else f"{steps:.3f} output steps"
            lines.append(
                f"ONNX ({label}) vs int8 on {v['rows']} windows: max {diff}, "
                f"{100 * v['bit_identical_fraction']:.1f}% bit-identical"
            )
    d = parity.get("division_vs_reciprocal")
    if d:
        lines.append(
            f"x/scale vs x*(1/scale): {d['runtime_vs_reciprocal']} of {d['codes']} codes differ"
        )
    return lines
