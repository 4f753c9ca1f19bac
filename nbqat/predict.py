"""``nbqat predict RUN_DIR``: forecasts of a finished ``nbqat train`` run.

The run folder's ``checkpoint/`` (``state.json``: the run's options; ``qat.npz``: the QAT
model; ``float.npz``: the best float weights) and ``model.onnx`` are read; the data (the shipped
dataset by default, or a CSV with the training run's columns) goes through the run's own
windowing (:func:`nbqat.data.make_windows` with the run's history, horizon, calendar and
quantiles), and the latest full window of every series -- the one whose ``horizon`` forecast
steps are the series' last rows -- is forecast.
"""

from __future__ import annotations

import csv
import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from nbqat._io import atomic_open
from nbqat.data import DataError

__all__ = ["ENGINES", "load_run", "predict"]

#: Inference engines of ``nbqat predict --engine``.
ENGINES = ("onnx", "int8", "float")


def load_run(run_dir: str | os.PathLike) -> tuple[Path, dict]:
    """Validate a finished run folder; return it and its resolved options (``state.json``).

    Raises
    ------
    FileNotFoundError
        When ``run_dir`` is not a folder.
    ValueError
        When it holds no finished model (no ``checkpoint/state.json`` with phase ``done``,
        or a missing ``qat.npz`` / ``float.npz``); a :class:`~nbqat.nn.qat.CheckpointError`
        (a ValueError) when ``state.json`` fails its schema (:func:`nbqat.checkpoint.read_state`).
    """
    run = Path(run_dir)
    if not run.is_dir():
        raise FileNotFoundError(f"RUN_DIR {str(run)!r} is not a folder (the --out of nbqat train)")
    state = run / "checkpoint" / "state.json"
    if not state.is_file():
        raise ValueError(
            f"RUN_DIR {str(run)!r} has no finished model (no checkpoint/state.json): run "
            f"`nbqat train --out {run}` to the end first"
        )
    from dataclasses import fields

    from nbqat.checkpoint import read_state
    from nbqat.train import TrainConfig

    # the schema-validated state (a tampered or inconsistent file is a CheckpointError)
    meta = read_state(state.parent, {f.name: f.default for f in fields(TrainConfig)})
    if meta.get("state", {}).get("phase") != "done":
        raise ValueError(
            f"RUN_DIR {str(run)!r} holds an unfinished run (phase "
            f"{meta.get('state', {}).get('phase')!r}): finish it with `nbqat train --resume "
            f"{run / 'checkpoint'}`"
        )
    for f in ("qat.npz", "float.npz"):
        if not (run / "checkpoint" / f).is_file():
            raise ValueError(f"RUN_DIR {str(run)!r}: checkpoint/{f} is missing")
    return run, dict(meta["config"])


def _windows(cfg: dict, csv_path: str | None) -> tuple[Any, list[int]]:
    """The run's windows over the data, and each entity's series length."""
    from nbqat.data import TMY3_COLUMNS, load_csv, load_tmy3, make_windows
    from nbqat.train import QUANTILES

    if csv_path is None and cfg.get("csv") is None:
        data = load_tmy3()
    else:
        path = csv_path if csv_path is not None else cfg["csv"]
        # a run on the shipped data reads a CSV with the shipped file's columns
        cols: dict[str, Any] = dict(TMY3_COLUMNS)
        if cfg.get("csv") is not None:
            names = ("time_col", "target_col", "entity_col", "known_cols", "static_cols")
            cols = {k: cfg.get(k) for k in (*names, "observed_cols")}
        data = load_csv(path, fill_gaps=bool(cfg.get("fill_gaps")), **cols)
    short = [
        (n, ln)
        for n, ln in zip(data.entity_names, data.lengths)
        if ln < cfg["history"] + cfg["horizon"]
    ]
    if short:
        raise DataError(
            f"series {short[0][0]!r} has {short[0][1]} rows; a forecast window needs history + "
            f"horizon = {cfg['history'] + cfg['horizon']} consecutive steps"
        )
    w = make_windows(
        data,
        history=cfg["history"],
        horizon=cfg["horizon"],
        eval_stride=cfg["eval_stride"],
        quantiles=QUANTILES,
        calendar=[c.strip() for c in cfg["calendar"].split(",") if c.strip()],
    )
    return w, list(data.lengths)


def _check_columns(w: Any, run: Path, qat: Any) -> None:
    """The data's inputs must be the trained model's (names from model.onnx's metadata when
    there, sizes from the checkpoint's network config)."""
    mc = qat.model.config
    got = {
        "static": list(w.static_names),
        "historical": list(w.historical_names),
        "future": list(w.future_names),
    }
    sizes = {
        "static": mc.num_static_features,
        "historical": mc.num_unknown_features,
        "future": mc.num_known_features,
    }
    want: dict[str, Any] = {}
    onnx_path = run / "model.onnx"
    if onnx_path.is_file():
        import onnx

        props = {p.key: p.value for p in onnx.load(str(onnx_path)).metadata_props}
        for k in got:
            if f"{k}_features" in props:
                want[k] = json.loads(props[f"{k}_features"])
    for k in got:
        if (k in want and got[k] != want[k]) or len(got[k]) != sizes[k]:
            raise DataError(
                f"the data's {k} inputs {got[k]} do not match the trained model's "
                f"{want.get(k, f'{sizes[k]} columns')}: give a CSV with the training run's columns"
            )


def _check_scaling(w: Any, run: Path) -> None:
    """Warn when the data's per-entity target level/scale (fitted on its first 70 % of time, as
    training does) differ from the run's (``model.onnx``'s ``target_scaling``): the inputs are
    then not standardised as in training (the input statistics are not stored in a run)."""
    import warnings

    path = run / "model.onnx"
    if not path.is_file():
        return
    import onnx

    props = {p.key: p.value for p in onnx.load(str(path)).metadata_props}
    saved = json.loads(props.get("target_scaling", "{}"))
    for e, lv, sc in zip(w.entity_names, w.level, w.scale):
        ref = saved.get(str(e))
        if ref is not None and not np.allclose([lv, sc], [ref["level"], ref["scale"]], rtol=1e-9):
            warnings.warn(
                f"entity {e!r}: the data's target level/scale ({lv:.6g}, {sc:.6g}) differ from "
                f"the training run's ({ref['level']:.6g}, {ref['scale']:.6g}); the windows are "
                "standardised with the data's own statistics",
                stacklevel=3,
            )


def _engine(engine: str, run: Path, qat: Any) -> Any:
    """``forward(static, historical, future) -> (B, tau, Q)`` of the chosen engine."""
    if engine == "onnx":
        from nbqat.export.parity import ort_session

        path = run / "model.onnx"
        if not path.is_file():
            raise ValueError(
                f"RUN_DIR {str(run)!r} has no model.onnx (a run of an older nbqat?): use "
                "--engine int8, or export it with nbqat.export.to_onnx"
            )
        import onnx

        sess = ort_session(onnx.load(str(path)), optimize=True)
        return lambda s, h, f: sess.run(None, {"static": s, "historical": h, "future": f})[0]
    if engine == "int8":
        return qat.to_int8().forward
    z = np.load(run / "checkpoint" / "float.npz")
    model = type(qat.model)(qat.model.config, dtype=np.float32)  # the run's forecaster class
    model.params[...] = z["best_params"] if "best_params" in z.files else z["params"]
    if callable(getattr(model, "eval", None)):
        model.eval()  # inference mode (dropout, where a model has it, is the identity)
    return model.forward


def predict(
    run_dir: str | os.PathLike,
    *,
    csv_path: str | None = None,
    engine: str = "onnx",
    out: str | os.PathLike = "forecasts.csv",
) -> Path:
    """Forecast the latest full window of every series with a finished run's model.

    Parameters
    ----------
    run_dir : str or os.PathLike
        The ``--out`` folder of a finished ``nbqat train``.
    csv_path : str, optional
        A CSV with the training run's columns (for a run on the shipped data: the shipped
        file's columns); default the run's own data. It is windowed like the training data
        (standardisation fitted on its first 70 % of time, as in training).
    engine : {"onnx", "int8", "float"}, default "onnx"
        onnxruntime on ``model.onnx``, the nbqat int8 reference, or the best float weights.
    out : str or os.PathLike, default "forecasts.csv"
        Written atomically; columns ``entity, time, step, p10, p50, p90`` (one column per
        trained quantile), one row per entity and forecast step, in the target's units.

    Returns
    -------
    pathlib.Path
        ``out``.

    Raises
    ------
    ValueError
        For an unknown engine, a folder without a finished model, a missing ``model.onnx``
        (engine onnx), an ``out`` whose folder does not exist or that is a folder.
    DataError
        (a ValueError) for columns that do not match the trained model or a series shorter
        than history + horizon. Nothing is written on any error.
    FileNotFoundError
        When ``run_dir`` or ``csv_path`` does not exist.
    """
    from nbqat.data import SplitWindows
    from nbqat.nn.forecasters import load_qat_forecaster

    if engine not in ENGINES:
        raise ValueError(f"--engine must be one of {ENGINES}, got {engine!r}")
    out = Path(out)
    if not (out.parent if str(out.parent) else Path(".")).is_dir():
        raise ValueError(f"--out {str(out)!r}: the folder {str(out.parent)!r} does not exist")
    if out.is_dir():
        raise ValueError(
            f"--out {str(out)!r} is a folder: name the CSV file to write "
            f"(--out {out / 'forecasts.csv'})"
        )
    if csv_path is not None and not Path(csv_path).is_file():
        raise FileNotFoundError(f"--csv {csv_path!r} does not exist")
    run, cfg = load_run(run_dir)
    from nbqat.report import activation_qconfig

    # the run's activation observer (--observer; "all" trains with min/max), as nbqat.train builds
    # it: another observer type would not take the checkpoint's observer state
    obs = cfg.get("observer", "minmax")
    qconfig = activation_qconfig("minmax" if obs == "all" else obs)
    qat = load_qat_forecaster(run / "checkpoint" / "qat.npz", qconfig=qconfig)  # tft | lstm
    w, lengths = _windows(cfg, csv_path)
    _check_columns(w, run, qat)
    _check_scaling(w, run)
    ends = np.cumsum(lengths)
    rows = (ends - w.horizon).astype(np.int64)
    split = SplitWindows(
        name="latest", rows=rows, entity=np.arange(len(lengths), dtype=np.int64), parent=w
    )
    s, h, f, _ = split.batch()
    fwd = _engine(engine, run, qat)
    pred = split.unscale(np.asarray(fwd(s, h, f), np.float32))  # (E, tau, Q)
    _write_csv(out, w, split, pred)
    return out


def _qname(q: float) -> str:
    v = 100 * q
    return f"p{int(round(v))}" if abs(v - round(v)) < 1e-9 else f"p{v:g}"


def _write_csv(out: Path, w: Any, split: Any, pred: np.ndarray) -> None:
    times = split.times()
    with atomic_open(out, "w", prefix=".nbqat-forecasts-", newline="") as fh:
        wr = csv.writer(fh)
        wr.writerow(["entity", "time", "step"] + [_qname(q) for q in w.quantiles])
        for i, e in enumerate(split.entity):
            for t in range(w.horizon):
                tv = times[i, t]
                ts = (
                    np.datetime_as_string(tv)
                    if isinstance(tv, np.datetime64)
                    else str(np.asarray(tv).item())
                )
                vals = [f"{float(v):.6g}" for v in pred[i, t]]
                wr.writerow([w.entity_names[e], ts, t + 1] + vals)
