"""``nbqat.Forecaster``: the main job (``nbqat train`` / ``nbqat predict``) as a Python API.

::

    from nbqat import Forecaster

    fc = Forecaster(quick=True, history=48, horizon=24, plots=False)
    fc.fit(df, time_col="time", target_col="demand", entity_col="site", known_cols=["holiday"])
    past = fc.predict(at="2024-03-20")  # from an origin inside the data, with actuals
    fc.save("demand-run")            # a run folder, as nbqat train writes
    Forecaster.load("demand-run").predict(df_with_future_rows)

The CLI's ``train``, ``predict`` and ``backtest`` are a thin layer over this class, so both
give the same numbers.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import weakref
from pathlib import Path
from typing import Any

__all__ = ["Forecaster"]

#: TrainConfig fields the Forecaster sets from ``fit``'s arguments (not options).
_DATA_FIELDS = ("csv", "time_col", "target_col", "entity_col", "known_cols", "static_cols",
                "observed_cols")  # fmt: skip


def _names(cols: Any) -> str | None:
    if cols is None:
        return None
    if isinstance(cols, str):
        return cols
    return ",".join(str(c) for c in cols)


def _option_names() -> list[str]:
    from nbqat.train.options import config_options

    return [k for k, o in config_options().items() if k not in _DATA_FIELDS and o.cli != "hidden"]


class Forecaster:
    """Train, load and run a quantile forecaster (``nbqat train`` with its long options).

    Parameters
    ----------
    **options
        The ``nbqat train`` long options with underscores: ``history=``, ``horizon=``,
        ``calendar="hour,dow"``, ``quick=True``, ``plots=False``, ``progress=False`` (a
        ``--no-X`` flag is ``X=False``),
        ``model="lstm"``, ``epochs=``, ``seed=``, ``fill_gaps=True``, ``overwrite=True`` ...;
        ``out=None`` (default) trains into a temporary run folder (keep it with :meth:`save`);
        each :meth:`fit` then trains into a new one (the previous run is removed when the new
        fit succeeds).

    Raises
    ------
    TypeError
        For an option ``nbqat train`` does not have (the message lists them).
    ValueError
        For a value out of the option's range, or an option that the run does not read
        (``Forecaster(model="lstm", heads=2)``, ``Forecaster(qat_epochs=0, qat_lr=1e-4)``); the
        message names the option (the checks of :mod:`nbqat.train.options`, the same as
        ``nbqat train``'s).
    """

    def __init__(self, **options: Any) -> None:
        from nbqat.train.options import check_options

        names = _option_names()
        bad = sorted(set(options) - set(names))
        if bad:  # --no-progress, --no-plots ...: the option is the positive name
            no = "".join(f"; {b}=True is {b[3:]}=False" for b in bad if b[3:] in names)
            raise TypeError(
                f"Forecaster got unknown option(s) {bad}{no}; the options are nbqat train's: "
                f"{', '.join(names)}"
            )
        # explicit keywords: ranges, and options the model ignores; out=None is the default
        check_options({k: v for k, v in options.items() if k != "out" or v is not None})
        self.options = dict(options)
        self._config()  # and the rules between options, as nbqat train's
        self.run_dir: Path | None = None
        self._tmp: tempfile.TemporaryDirectory | None = None
        self._result: dict | None = None

    # ------------------------------------------------------------------------------ training
    def fit(
        self,
        data: Any,
        time_col: str | None = None,
        target_col: str | None = None,
        entity_col: str | None = None,
        observed_cols: Any = None,
        known_cols: Any = (),
        static_cols: Any = (),
    ) -> Forecaster:
        """Train on ``data`` (float training, calibration, QAT, int8, ONNX export, metrics).

        Parameters
        ----------
        data : pandas.DataFrame, str, os.PathLike or SeriesData
            A long-format table (one row per entity and time step), a ``.csv`` /
            ``.csv.gz`` / ``.parquet`` path, or loaded :class:`~nbqat.data.SeriesData` (then
            the column arguments come from it). A DataFrame or SeriesData is stored in the
            run folder as ``data.parquet`` (``predict()`` without data reads it). A
            DataFrame's time and entity columns may be index levels (a ``DatetimeIndex``
            named ``time_col``, an ``(entity, time)`` MultiIndex).
        time_col, target_col : str
            The time column (ISO 8601 date times, naive ones read as UTC, or numbers) and the
            column to forecast.
        entity_col : str, optional
            The series id column.
        observed_cols : sequence of str, optional
            Past-only inputs; default every column not named otherwise (as the CLI).
        known_cols, static_cols : sequence of str
            Inputs known in advance; per-entity constants.

        Returns
        -------
        Forecaster
            ``self``.

        Raises
        ------
        DataError, ValueError
            Bad data or options, before anything is written or trained (the message names the
            fix). A DataFrame's errors name ``DataFrame, row N``, N its 0-based position in
            ``data`` (``data.iloc[N]``), as :meth:`predict`'s do; a file's name the file and
            its line (CSV, header = 1) or 0-based row (Parquet). A name in ``observed_cols``,
            ``known_cols`` or ``static_cols`` with a comma or surrounding spaces is refused
            (rename the column).
        TypeError
            ``data`` of another type, or a column argument that is not a string (column names
            must be strings: ``df.columns = df.columns.map(str)``).
        """

        prev = self._tmp  # a refit of a temporary run: a new temporary folder, the
        if prev is not None:  # previous run kept until this fit succeeds
            self.options["out"], self._tmp = None, None
        created = self.options.get("out") is None or not Path(self.options["out"]).exists()
        try:
            self._fit(data, time_col, target_col, entity_col, observed_cols, known_cols,
                      static_cols)  # fmt: skip
        except BaseException:
            out = Path(self.options["out"]) if self.options.get("out") is not None else None
            if created and out is not None and out.is_dir() and not (out / "checkpoint").exists():
                shutil.rmtree(out, ignore_errors=True)  # a failed fit leaves no folder behind
            if prev is not None:
                self.options["out"], self._tmp = str(Path(prev.name) / "run"), prev
            raise
        if prev is not None:
            prev.cleanup()
        return self

    def _fit(self, data, time_col, target_col, entity_col, observed_cols, known_cols,
             static_cols) -> Forecaster:  # fmt: skip
        from nbqat.data import SeriesData
        from nbqat.train.fit_data import check_columns, put_back, store_frame

        if isinstance(data, SeriesData):
            time_col, target_col = "time", data.target_name
            entity_col, observed_cols = "entity", list(data.observed_names)
            known_cols, static_cols = list(data.known_names), list(data.static_names)
            data = _series_frame(data)
        if time_col is None or target_col is None:
            raise ValueError(
                "fit needs time_col= and target_col= (the --time-col and --target-col)"
                + _index_hint(data)
            )
        frame = None
        if not isinstance(data, (str, os.PathLike)):
            import pandas as pd

            from nbqat.data._reader import index_columns

            if not isinstance(data, pd.DataFrame):
                raise TypeError(
                    f"data must be a pandas DataFrame, a path or a SeriesData, got "
                    f"{type(data).__name__}"
                )
            data = index_columns(data, time_col, entity_col)  # a DatetimeIndex named time_col
            check_columns(data, time_col=time_col, target_col=target_col,
                          entity_col=entity_col, observed_cols=observed_cols,
                          known_cols=known_cols, static_cols=static_cols)  # fmt: skip
            frame = data
        out = self._out()
        path = out / "data.parquet" if frame is not None else data
        cfg = self._config(
            csv=str(path), time_col=time_col, target_col=target_col, entity_col=entity_col,
            observed_cols=_names(observed_cols), known_cols=_names(known_cols) or None,
            static_cols=_names(static_cols) or None,
        )  # fmt: skip
        if frame is None:
            return self.train(cfg)
        prev = store_frame(frame, cfg, out, bool(self.options.get("overwrite")))
        try:
            self.train(cfg)
        except Exception as e:
            from nbqat.train import TrainingInterrupted

            if not isinstance(e, TrainingInterrupted):  # the previous run is put back, and
                put_back(Path(cfg.csv), prev)  # its data with it
            elif prev is not None:  # the new run's checkpoint resumes on the new data
                prev.unlink()
            raise
        if prev is not None:
            prev.unlink()
        return self

    def _out(self) -> Path:
        if self.options.get("out") is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="nbqat-run-")
            weakref.finalize(self, self._tmp.cleanup)  # with self, not as a ResourceWarning
            self.options["out"] = str(Path(self._tmp.name) / "run")
        return Path(self.options["out"])

    def _config(self, **data_fields: Any) -> Any:
        from nbqat.train import TrainConfig
        from nbqat.train.options import config_options

        opts = config_options()  # None: the mode's default, unless None is a value (--max-norm)
        kw = {k: v for k, v in self.options.items() if v is not None or opts[k].nullable}
        return TrainConfig(**kw, **data_fields)

    def train(self, cfg: Any, resume: Any = None, check: bool = False) -> Forecaster:
        """Run ``nbqat train`` with a :class:`~nbqat.train.TrainConfig` (what the CLI calls;
        :meth:`fit` builds ``cfg`` from its arguments).

        Parameters
        ----------
        cfg : TrainConfig
        resume : str or Path, optional
            A checkpoint folder to continue (``--resume``).
        check : bool, default False
            Only validate (``--check``): nothing is written, :attr:`result` holds the data
            summary.

        Returns
        -------
        Forecaster
            ``self`` (:attr:`run_dir` is the run folder unless ``check``).
        """
        from nbqat.train import run

        self._result = run(cfg, resume=resume, check_only=check)
        if not check:
            out = Path(cfg.out) if resume is None else Path(resume).parent
            self.run_dir = out
        return self

    @property
    def result(self) -> dict | None:
        """What the last :meth:`train` returned (metrics, or ``--check``'s data summary)."""
        return self._result

    # ------------------------------------------------------------------------------ loading
    @classmethod
    def load(cls, run_dir: str | os.PathLike) -> Forecaster:
        """The forecaster of any folder ``nbqat train`` wrote (finished).

        Parameters
        ----------
        run_dir : str or os.PathLike
            The ``--out`` folder of a finished run (of the CLI or of :meth:`fit`).

        Returns
        -------
        Forecaster
            With the run's options, less ``overwrite`` (a choice of the command that wrote the
            run: a :meth:`fit` of the loaded forecaster replaces its run only when asked).

        Raises
        ------
        FileNotFoundError, ValueError
            No such folder, or no finished run in it (:func:`nbqat.train.predict.load_run`).
        """
        from nbqat.train.options import unused_options
        from nbqat.train.predict import load_run

        run, cfg = load_run(run_dir)
        # the options its run reads only (an LSTM run's config holds the TFT's --heads at its
        # default, a --qat-epochs 0 run's the --qat-lr it resolved: refused as keywords)
        names = set(_option_names()) - {"overwrite"} - unused_options(cfg)
        fc = cls(**{k: v for k, v in cfg.items() if k in names})
        fc.run_dir = run
        return fc

    def _run(self) -> Path:
        if self.run_dir is None:
            raise ValueError("this Forecaster is not trained: call fit() or Forecaster.load(RUN)")
        return self.run_dir

    @property
    def metrics(self) -> dict:
        """The run's ``metrics.json`` (q-risk of every model, data, training, ONNX parity)."""
        return json.loads((self._run() / "metrics.json").read_text())

    # ------------------------------------------------------------------------------ forecasts
    def predict(self, data: Any = None, at: Any = None, engine: str = "onnx",
                fill_gaps: bool | None = None) -> Any:  # fmt: skip
        """Forecast the ``horizon`` steps after each series' last target value (or from
        ``at``); the same numbers as ``nbqat predict`` with the same engine.

        Parameters
        ----------
        data : DataFrame, path or SeriesData, optional
            The run's columns; rows after the last target value (target empty, known columns
            filled) are the steps to forecast. Default: the data it was fitted on (with a
            fitted DataFrame's dtypes).
        at : str, numpy.datetime64 or float, optional
            The origin: the first forecast step (adds ``actual``).
        engine : {"onnx", "int8", "float"}, default "onnx"
        fill_gaps : bool, optional
            Default: as trained.

        Returns
        -------
        pandas.DataFrame
            ``entity, time, step, p10, p50, p90 [, actual]`` (:func:`nbqat.train.predict.forecast`).

        Raises
        ------
        DataError
            Data without the run's columns, at another time step than the run was trained on
            (naming both steps), or with bad values: a DataFrame's errors name ``DataFrame, row
            N``, N its 0-based position in ``data``, as :meth:`fit`'s do.
        """
        from nbqat.train.predict import forecast

        return forecast(self._run(), data, at=at, engine=engine, fill_gaps=fill_gaps)

    def backtest(self, data: Any = None, start: Any = None, stride: int | None = None,
                 engine: str = "onnx", fill_gaps: bool | None = None) -> Any:  # fmt: skip
        """Rolling-origin forecasts with actuals (every ``stride`` steps from ``start``).

        Parameters
        ----------
        data : DataFrame, path or SeriesData, optional
        start : str, numpy.datetime64 or float, optional
            The first origin; default the run's test split start.
        stride : int, optional
            Steps between origins (a positive integer); default the horizon.
        engine, fill_gaps
            As in :meth:`predict`.

        Returns
        -------
        pandas.DataFrame
            ``entity, origin, time, step, p10, p50, p90, actual``; ``.attrs["q_risk"]``: the
            q-risk per quantile (:func:`nbqat.train.predict.q_risk_table`).
        """
        from nbqat.train.predict import forecast, load_run, q_risk_table, run_info

        run, cfg = load_run(self._run())
        info = run_info(run, cfg)
        stride = stride if stride is not None else int(info["horizon"])  # checked by forecast
        # the default start, the test split's: each entity from its first row on or after it
        bt = (start, stride) if start is not None else (info.get("test_start"), stride, True)
        df = forecast(run, data, backtest=bt, engine=engine, fill_gaps=fill_gaps)
        df.attrs["q_risk"] = q_risk_table(df, info["quantiles"])
        return df

    # ------------------------------------------------------------------------------ files
    def save(self, path: str | os.PathLike) -> Path:
        """Copy the run folder to ``path``; the copy is a run folder like any
        (``Forecaster.load(path)``, ``nbqat predict path``).

        Parameters
        ----------
        path : str or os.PathLike
            A folder that does not exist yet.

        Returns
        -------
        pathlib.Path

        Raises
        ------
        ValueError
            When ``path`` exists.
        """
        dst = Path(path)
        if dst.exists():
            raise ValueError(f"save: {str(dst)!r} exists; choose a new folder")
        shutil.copytree(self._run(), dst)
        return dst

    def to_onnx(self, path: str | os.PathLike) -> Path:
        """Write the self-contained ONNX model (raw rows in, target units out; see
        docs/export.md) to ``path``, atomically.

        Parameters
        ----------
        path : str or os.PathLike
            The ``.onnx`` file (its folder must exist).

        Returns
        -------
        pathlib.Path
        """
        from nbqat._io import atomic_open

        data = (self._run() / "model.onnx").read_bytes()
        with atomic_open(path, "wb", prefix=".nbqat-onnx-") as f:
            f.write(data)
        return Path(path)


def _index_hint(data: Any) -> str:
    """For a DataFrame whose times are its (unnamed) index: how to name them as ``time_col``."""
    import pandas as pd

    frame = isinstance(data, pd.DataFrame)
    if not frame or not isinstance(data.index, (pd.DatetimeIndex, pd.PeriodIndex)):
        return ""
    name = data.index.name if isinstance(data.index.name, str) else "time"
    return (f"; the DataFrame's times are its index: pass time_col={name!r}"
            + ("" if name == data.index.name else f" after df.index.name = {name!r}"))  # fmt: skip


def _series_frame(data: Any) -> Any:
    """A long-format DataFrame of :class:`~nbqat.data.SeriesData` (entity, time, target,
    observed, known, static columns)."""
    import numpy as np
    import pandas as pd

    from nbqat.data._months import month_dates

    parts = []
    for e, name in enumerate(data.entity_names):
        t = month_dates(data.times[e], data.month_day)  # a month axis: its dates
        cols = {"entity": name, "time": t, data.target_name: data.target[e]}
        for j, c in enumerate(data.observed_names):
            cols[c] = data.observed[e][:, j]
        for j, c in enumerate(data.known_names):
            cols[c] = data.known[e][:, j]
        for j, c in enumerate(data.static_names):
            cols[c] = np.full(len(data.times[e]), data.static[e, j])
        parts.append(pd.DataFrame(cols))
    return pd.concat(parts, ignore_index=True)
