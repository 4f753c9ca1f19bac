"""``nbqat predict RUN_DIR``: forecasts of a finished ``nbqat train`` run.

The run folder's ``checkpoint/`` (``state.json``: the run's options; ``qat.npz``: the QAT
model; ``float.npz``: the best float weights) and ``model.onnx`` (its ``nbqat`` metadata: the
run's stored input transform, :class:`nbqat.data.Scaling`) are read. The data (the run's own
by default, or a CSV / DataFrame with the training run's columns) is loaded with rows to
forecast allowed after each series' last target value, and :func:`forecast` forecasts the
``horizon`` steps after that value (or from ``at``, or from rolling origins: a backtest).
Inputs are standardised with the run's stored scaling, never refitted on the data given.
:class:`nbqat.Forecaster` is the Python API over these functions; the CLI's ``predict`` and
``backtest`` are a thin layer over it.
"""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path
from typing import Any

import numpy as np

from nbqat._io import atomic_open
from nbqat.data import DataError, Scaling, SeriesData
from nbqat.data._months import to_month_axis
from nbqat.train.forecast_data import fitted_keys, keys_like, read_data, run_data_path
from nbqat.train.option_table import ENGINES as OPTION_ENGINES

__all__ = ["ENGINES", "check_out", "forecast", "load_run", "own_data", "q_risk_table", "run_info",
           "write_csv"]  # fmt: skip

#: Inference engines of ``nbqat predict --engine``.
ENGINES = OPTION_ENGINES  # the options registry's (nbqat predict --engine)


def load_run(run_dir: str | os.PathLike) -> tuple[Path, dict]:
    """Validate a finished run folder; return it and its resolved options (``state.json``).

    Raises
    ------
    FileNotFoundError
        When ``run_dir`` is not a folder.
    ValueError
        When it holds no finished model (no ``checkpoint/state.json`` with phase ``done``,
        or a missing ``qat.npz`` / ``float.npz``); a :class:`~nbqat.nn.qat.CheckpointError`
        (a ValueError) when ``state.json`` fails its schema
        (:func:`nbqat.train.checkpoint_schema.read_state`).
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
    from nbqat.train.checkpointing import read_run_state

    # the schema-validated state (a tampered or inconsistent file is a CheckpointError)
    meta = read_run_state(state.parent)
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


def own_data(run_dir: str | os.PathLike) -> Path:
    """The file of a finished run's own data, what ``nbqat predict RUN`` reads without
    ``--csv`` (:func:`~nbqat.train.forecast_data.run_data_path`): given as a path, the forecast
    keeps its keys as text (the CLI's CSV), where ``data=None`` gives a Forecaster's fitted
    DataFrame's dtypes.

    Raises
    ------
    FileNotFoundError, ValueError
        As :func:`load_run`; the run's data no longer exists.
    """
    run, cfg = load_run(run_dir)
    return run_data_path(cfg, run)


def run_info(run: Path, cfg: dict) -> dict:
    """The run's ``nbqat`` metadata (``model.onnx``): shapes, columns and the stored
    :class:`~nbqat.data.Scaling` (``"scaling"``). A run without it (an older nbqat's, or a
    damaged file, which only the ONNX engine then refuses) gets it rebuilt from its training
    data, as training computed it."""
    path = run / "model.onnx"
    try:
        props = {p.key: p.value for p in _load_onnx(path).metadata_props}
    except (FileNotFoundError, ValueError):
        props = {}
    if "nbqat" in props:
        return json.loads(props["nbqat"])
    from nbqat.export.job import preprocessing_metadata
    from nbqat.train import TrainConfig, load_data

    c = TrainConfig(**{k: v for k, v in cfg.items() if k in TrainConfig.__dataclass_fields__})
    return preprocessing_metadata(load_data(c), c)


def parse_when(value: Any, sc: Scaling, opt: str = "--at") -> Any:
    """``--at`` / ``--start`` as a time on the data's axis (``datetime64[s]``, aware values
    converted to UTC as the loader does; on a calendar-month axis the month of the date,
    ``datetime64[M]``; or a float)."""
    import pandas as pd

    from nbqat.data._timecol import parse_time_column, quarter_start

    def where(i: int) -> str:
        return opt

    try:
        t = parse_time_column(pd.Series([value]), opt, where)
    except DataError:  # its messages speak of a --time-col and its rows
        date = quarter_start(value) if sc.is_datetime else None
        raise DataError(
            f"{opt} {value!r} is not a time: give "
            + ("an ISO 8601 date time (e.g. 2024-03-20T00:00)" if sc.is_datetime else "a number")
            + " on the run's time axis"
            + ("" if date is None else f" (a quarter: the date it starts, {date})")
        ) from None
    if (t.dtype.kind == "M") != sc.is_datetime:
        raise ValueError(
            f"{opt} {value!r}: the run's time axis holds "
            + ("date times (give an ISO 8601 time)" if sc.is_datetime else "numbers")
        )
    if sc.month_day:  # monthly, quarterly, yearly data: any date names its month
        return t[0].astype("datetime64[M]")
    return t[0]


def _when(at: Any, backtest: Any, sc: Scaling) -> tuple[Any, Any]:
    """``at`` and the backtest's ``(start, stride)`` on the data's axis (:func:`parse_when`)."""
    when = None if at is None else parse_when(at, sc)
    if backtest is None:
        return when, None
    start = None if backtest[0] is None else parse_when(backtest[0], sc, "--start")
    return when, (start, int(backtest[1]), *backtest[2:3])


def _engine(engine: str, run: Path, qat: Any) -> Any:
    """``forward(fw) -> (B, tau, Q)`` float64 in the target's units, of the chosen engine."""
    if engine == "onnx":
        return _onnx_engine(run)
    if engine == "int8":
        fwd = qat.to_int8().forward
    else:
        from nbqat.train.checkpoint_schema import load_float_state

        z = load_float_state(run / "checkpoint" / "float.npz")
        model = type(qat.model)(qat.model.config, dtype=np.float32)  # the run's forecaster
        model.params[...] = z["best_params"] if "best_params" in z else z["params"]
        if callable(getattr(model, "eval", None)):
            model.eval()  # inference mode (dropout, where a model has it, is the identity)
        fwd = model.forward

    def run_features(fw: Any) -> np.ndarray:
        s, h, f, _ = fw.split.batch()
        return fw.split.unscale(np.asarray(fwd(s, h, f), np.float32))

    return run_features


def _load_onnx(path: Path) -> Any:
    """``onnx.load`` of a run's ``model.onnx``; a file that does not parse into a graph
    (truncated, empty, overwritten) is a ValueError naming it, not a protobuf traceback."""
    import onnx

    if not path.is_file():
        raise FileNotFoundError(f"{str(path)!r} does not exist")
    why = ""
    try:
        proto = onnx.load(str(path))
        if not (proto.ir_version > 0 and len(proto.graph.node)):
            why = "no graph in it"
    except Exception as e:  # protobuf's DecodeError and its kin: a damaged file
        why = f"{type(e).__name__}: {e}"
    if why:
        raise ValueError(
            f"{str(path)!r} is not a readable ONNX model ({why[:200]}): the run folder is "
            "damaged; forecast with --engine int8 (the run's checkpoint) or train again"
        )
    return proto


def _onnx_engine(run: Path) -> Any:
    """onnxruntime on the self-contained ``model.onnx`` (raw rows in, target units out)."""
    from nbqat.export.parity import ort_session

    path = run / "model.onnx"
    if not path.is_file():
        raise ValueError(
            f"RUN_DIR {str(run)!r} has no model.onnx (a run of an older nbqat?): use "
            "--engine int8, or export it with nbqat.Forecaster.load(RUN).to_onnx(PATH)"
        )
    proto = _load_onnx(path)
    names = [i.name for i in proto.graph.input]
    sess = ort_session(proto, optimize=True)
    if names[:2] != ["entity", "time"]:  # an older nbqat's graph: standardised inputs
        return lambda fw: fw.split.unscale(
            sess.run(None, dict(zip(("static", "historical", "future"), fw.split.batch()[:3])))[0]
        )
    exact = proto.graph.input[1].type.tensor_type.elem_type == 11  # TensorProto.DOUBLE
    return lambda fw: np.asarray(sess.run(None, onnx_inputs(fw, exact))[0], np.float64)


def onnx_inputs(fw: Any, exact: bool = False) -> dict:
    """The self-contained graph's inputs of forecast windows ``fw`` (raw values; times as
    numbers on the run's stored axis, :meth:`Scaling.seconds`: float64 with ``exact`` (a
    numeric axis' graph, :func:`nbqat.export.preprocess.time_type`), else rounded to int64)."""
    secs = fw.split.parent.scaling.seconds(fw.time)
    return {
        "entity": fw.run_entity.astype(np.int64),
        "time": np.asarray(secs, np.float64) if exact else np.asarray(np.round(secs), np.int64),
        "history": fw.history_raw.astype(np.float32),
        "future": fw.future_raw.astype(np.float32),
    }


def _model(run: Path, cfg: dict) -> Any:
    from nbqat.nn.forecasters import load_qat_forecaster
    from nbqat.train import TrainConfig

    # the run's own qconfig, as nbqat.train builds it: another observer or weight format would
    # not take the checkpoint's quantizer state
    c = TrainConfig(**{k: v for k, v in cfg.items() if k in TrainConfig.__dataclass_fields__})
    return load_qat_forecaster(run / "checkpoint" / "qat.npz", qconfig=c.qconfig())


def forecast(
    run_dir: str | os.PathLike,
    data: Any = None,
    *,
    at: Any = None,
    backtest: tuple[Any, int] | tuple[Any, int, bool] | None = None,
    engine: str = "onnx",
    fill_gaps: bool | None = None,
) -> Any:
    """Forecasts of a finished run as a DataFrame (what ``nbqat predict`` writes).

    Parameters
    ----------
    run_dir : str or os.PathLike
        The ``--out`` folder of a finished ``nbqat train``.
    data : str, os.PathLike, pandas.DataFrame or SeriesData, optional
        The data (the run's columns; rows after a series' last target value, with the target
        empty and the known columns filled, are the steps to forecast); default the run's own.
    at : str, numpy.datetime64 or float, optional
        The origin (first forecast step) of every series; adds the column ``actual``.
    backtest : (start, stride) or (start, stride, True), optional
        Rolling origins (see :func:`nbqat.data._forecast.forecast_windows`); adds the columns
        ``origin`` and ``actual``.
    engine : {"onnx", "int8", "float"}, default "onnx"
        onnxruntime on the self-contained ``model.onnx``, the nbqat int8 reference, or the
        best float weights.
    fill_gaps : bool, optional
        Repair gaps before the last target value (default: as the run was trained).

    Returns
    -------
    pandas.DataFrame
        Columns ``entity, [origin,] time, step, p10, p50, p90 [, actual]`` (one per trained
        quantile), one row per window and forecast step; times spelled as the data spells them
        (a DataFrame's datetime64 times and non-text entities in its dtypes, so the forecasts
        merge with it; ``data=None``: a Forecaster's fitted DataFrame's, :func:`fitted_keys`);
        forecasts in the target's units (float64). ``attrs["skipped"]``: the entities too
        short to forecast, left out with a UserWarning (none left: an error).

    Raises
    ------
    ValueError
        An unknown engine, a backtest stride that is not a positive integer (``int``; a float
        or bool is refused, not truncated), a folder without a finished model, an ``at`` that
        does not parse.
    DataError
        (a ValueError) see :func:`read_data` and :func:`~nbqat.data._forecast.forecast_windows`.
    FileNotFoundError
        ``run_dir`` or a data path that does not exist.
    """
    from nbqat.data._forecast import forecast_windows

    if engine not in ENGINES:
        raise ValueError(f"--engine must be one of {ENGINES}, got {engine!r}")
    if backtest is not None:
        from nbqat.train.options import check_option

        check_option("stride", backtest[1], "backtest")  # 1.5, 0.5, True: refused as given
    run, cfg = load_run(run_dir)
    info = run_info(run, cfg)
    sc = Scaling.from_json(info["scaling"])
    series = read_data(cfg, data, fill_gaps, run)
    if sc.month_day:  # a few calendar-month dates the loader kept on a step in seconds
        series = to_month_axis(series)
    when, bt = _when(at, backtest, sc)
    fw = forecast_windows(
        series, sc, history=info["history"], horizon=info["horizon"],
        quantiles=info["quantiles"], at=when, backtest=bt,
    )  # fmt: skip
    if fw.skipped:  # the other entities are forecast
        warnings.warn(
            f"{len(fw.skipped)} entities are too short to forecast and are left out: "
            + "; ".join(fw.skipped.values()), UserWarning, stacklevel=2,
        )  # fmt: skip
    qat = _model(run, cfg) if engine != "onnx" else None
    pred = _batched(_engine(engine, run, qat), fw)
    df = _frame(fw, series, pred, info["quantiles"], at is not None or bt is not None, bt)
    df.attrs["skipped"] = fw.skipped
    return keys_like(df, data if data is not None else fitted_keys(run, cfg), cfg)


def _batched(fwd: Any, fw: Any, size: int = 512) -> np.ndarray:
    """``fwd`` over the windows in batches (a backtest has many)."""
    from nbqat.data import SplitWindows
    from nbqat.data._forecast import ForecastWindows

    out = []
    for i in range(0, len(fw.split), size):
        j = slice(i, i + size)
        sub = SplitWindows("forecast", fw.split.rows[j], fw.split.entity[j], fw.split.parent)
        part = ForecastWindows(sub, fw.run_entity[j], fw.origin[j], fw.time[j],
                               fw.history_raw[j], fw.future_raw[j], fw.actual[j])  # fmt: skip
        out.append(np.asarray(fwd(part), np.float64))
    return np.concatenate(out)


def qname(q: float) -> str:
    """The column of quantile ``q`` (``p10`` for 0.1)."""
    v = 100 * q
    return f"p{int(round(v))}" if abs(v - round(v)) < 1e-9 else f"p{v:g}"


def _frame(fw: Any, data: SeriesData, pred: np.ndarray, quantiles, actual: bool, bt) -> Any:
    import pandas as pd

    from nbqat.data._timecol import format_times

    b, tau, _ = pred.shape
    k = fw.time.shape[1] - tau
    cols: dict[str, Any] = {"entity": np.repeat([fw.split.parent.entity_names[e]
                                                 for e in fw.split.entity], tau)}  # fmt: skip
    if bt is not None:
        cols["origin"] = np.repeat(format_times(fw.time[:, k], data.time_format, data.month_day),
                                   tau)  # fmt: skip
    cols["time"] = format_times(fw.time[:, k:].reshape(-1), data.time_format, data.month_day)
    cols["step"] = np.tile(np.arange(1, tau + 1), b)
    for j, q in enumerate(quantiles):
        cols[qname(q)] = pred[:, :, j].reshape(-1)
    if actual:
        cols["actual"] = fw.actual.reshape(-1)
    return pd.DataFrame(cols)


def q_risk_table(df: Any, quantiles) -> dict:
    """The q-risk per quantile of a backtest frame: ``2 sum pinball_q / sum |actual|``
    (:func:`nbqat.nn.loss.q_risk` over the rows with an actual value), keyed ``P10``, ...;
    NaN for every quantile where those actuals are all 0 (the q-risk is undefined there: a
    floor on the denominator made it 0 or about 1e300)."""
    from nbqat.nn.loss import q_risk

    y = df["actual"].to_numpy(np.float64)
    ok = np.isfinite(y)
    keys = [qname(q).upper() for q in quantiles]
    if not np.abs(y[ok]).sum() > 0:
        return dict.fromkeys(keys, float("nan"))
    pred = np.stack([df[qname(q)].to_numpy(np.float64)[ok] for q in quantiles], axis=-1)
    return dict(zip(keys, (float(v) for v in q_risk(pred, y[ok], quantiles))))


def check_out(out: str | os.PathLike, overwrite: bool) -> Path:
    """Refuse an ``--out`` that exists (unless ``overwrite``), is a folder, has no folder or is
    one of a run folder's own files (``model.onnx``, ``checkpoint/...``, a Forecaster's
    ``data.parquet``: even with ``overwrite``, a forecast must not replace the model it came
    from or the data it was fitted on); called before anything is computed or written."""
    from nbqat.train.preflight import OUTPUT_NAMES

    p = Path(out)
    if not (p.parent if str(p.parent) else Path(".")).is_dir():
        raise ValueError(f"--out {str(p)!r}: the folder {str(p.parent)!r} does not exist")
    full = p.resolve()
    for run in full.parents:
        if (run / "checkpoint" / "state.json").is_file():
            own = full.relative_to(run).parts[0]
            if own in OUTPUT_NAMES or own == "data.parquet":
                raise ValueError(
                    f"--out {str(p)!r} is the run's own {own}: name another file (e.g. "
                    f"{str(run / 'forecasts.csv')!r})"
                )
            break
    if p.is_dir():
        raise ValueError(
            f"--out {str(p)!r} is a folder: name the CSV file to write "
            f"(--out {p / 'forecasts.csv'})"
        )
    if p.exists() and not overwrite and not _is_device(p):
        raise ValueError(f"--out {str(p)!r} exists; pass --overwrite to replace it")
    return p


def _is_device(p: Path) -> bool:
    """A device or pipe (``/dev/null``, a FIFO): written into, never replaced by a file."""
    return p.exists() and not p.is_file() and not p.is_dir()


def write_csv(df: Any, out: str | os.PathLike, overwrite: bool = False) -> Path:
    """Write a forecast frame atomically (mode as the umask gives; a device or pipe such as
    ``/dev/null`` is written into, with or without ``overwrite``); see :func:`check_out`.
    Numbers are written in full (the shortest text that reads back as the same float64): a
    fixed 6 significant digits wrote a series at 1e7 +- 8 as 1e+07 throughout."""
    p = check_out(out, overwrite)
    if _is_device(p):  # an atomic rename would replace /dev/null with a regular file
        with open(p, "w", newline="") as fh:
            df.to_csv(fh, index=False, lineterminator="\n")
        return p
    with atomic_open(p, "w", prefix=".nbqat-forecasts-", newline="") as fh:
        df.to_csv(fh, index=False, lineterminator="\n")
    return p
