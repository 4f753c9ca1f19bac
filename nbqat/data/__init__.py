"""The shipped dataset and the TFT window builder.

Two steps, both in plain NumPy (no pandas):

1. :func:`load_csv` (or :func:`load_tmy3` for the shipped data) reads a long-format CSV (one row
   per entity and time step) into a :class:`SeriesData`: per entity, a regular time axis, the
   target, the observed inputs, the known inputs and the static values. Bad input gets a clear
   :class:`DataError` naming the file, line and column: missing columns, non-numeric values,
   duplicate or unsorted timestamps, gaps (or, with ``fill_gaps=True``, a documented repair),
   series too short.
2. :func:`make_windows` turns it into TFT windows (:class:`Windows`): a split by time into
   train / validation / test with no leakage, per-entity standardisation fitted on the training
   rows only, calendar features, static features, and a seasonal-naive baseline.

The shipped dataset (``tmy3_two_stations.csv.gz``) holds one year of hourly NREL TMY3 weather
observations for two US stations; see ``nbqat/data/README.md`` for its source and licence
(U.S. government data, public domain; copied from pvlib-python's test data, BSD-3-Clause).
"""

from __future__ import annotations

import csv
import gzip
import io
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

__all__ = [
    "DataError",
    "SeriesData",
    "SplitWindows",
    "Windows",
    "TMY3_FILE",
    "load_csv",
    "load_tmy3",
    "make_windows",
    "seasonal_naive_quantiles",
]

#: File name of the shipped dataset inside the package.
TMY3_FILE = "tmy3_two_stations.csv.gz"

#: How :func:`load_tmy3` reads the shipped file.
TMY3_COLUMNS = {
    "time_col": "time",
    "target_col": "temp_air",
    "entity_col": "station",
    "known_cols": ("etr",),
    "static_cols": ("latitude", "longitude", "elevation"),
    "observed_cols": (
        "temp_dew",
        "relative_humidity",
        "pressure",
        "wind_speed",
        "total_cloud",
        "ghi",
    ),
}


class DataError(ValueError):
    """A problem with the input data (a subclass of ValueError, with a message saying the fix)."""


@dataclass
class SeriesData:
    """Regular, gap-free time series of several entities (the output of :func:`load_csv`).

    Attributes
    ----------
    entity_names : list of str
        One name per entity, in order of first appearance in the file.
    times : list of ndarray
        Per entity, the time axis: ``datetime64[s]`` when the time column holds ISO 8601 date
        times, float64 when it holds numbers. Strictly increasing with a constant step.
    step : numpy.timedelta64 or float
        The time step shared by all entities.
    target : list of ndarray
        Per entity, float64 (N_e,): the target values (unscaled).
    observed : list of ndarray
        Per entity, float64 (N_e, m_obs): the other observed (past-only) inputs.
    known : list of ndarray
        Per entity, float64 (N_e, m_known): the user's known-in-advance inputs.
    static : ndarray
        float64 (n_entities, m_static): the static values of each entity.
    target_name, observed_names, known_names, static_names
        Column names.
    n_filled : int
        Rows or cells repaired by linear interpolation (``fill_gaps=True``); 0 otherwise.
    source : str
        Where the data came from (a path or the shipped file's name).
    """

    entity_names: list[str]
    times: list[np.ndarray]
    step: Any
    target: list[np.ndarray]
    observed: list[np.ndarray]
    known: list[np.ndarray]
    static: np.ndarray
    target_name: str
    observed_names: list[str]
    known_names: list[str]
    static_names: list[str]
    n_filled: int = 0
    source: str = ""

    @property
    def is_datetime(self) -> bool:
        """Whether the time axis holds date times (then calendar features are derived)."""
        return self.times[0].dtype.kind == "M"

    @property
    def lengths(self) -> list[int]:
        """Number of time steps of each entity."""
        return [len(t) for t in self.times]


# ---------------------------------------------------------------------------------------------
# CSV parsing


def _open_text(path: Path) -> io.TextIOBase:
    if path.suffix == ".gz":
        return io.TextIOWrapper(gzip.open(path, "rb"), encoding="utf-8", newline="")
    return open(path, encoding="utf-8", newline="")


def _parse_time(value: str, where: str) -> float | datetime:
    try:
        return float(value)
    except ValueError:
        pass
    try:
        t = datetime.fromisoformat(value.strip())
    except ValueError:
        raise DataError(
            f"{where}: time value {value!r} is neither a number nor an ISO 8601 date time "
            "(e.g. 2001-01-31T23:00); fix the value or choose another --time-col"
        ) from None
    if t.tzinfo is not None:
        t = t.astimezone(timezone.utc).replace(tzinfo=None)
    return t


def _parse_number(value: str, col: str, where: str, allow_missing: bool) -> float:
    v = value.strip()
    if v == "" or v.lower() in ("nan", "na", "n/a", "null", "none"):
        if allow_missing:
            return math.nan
        raise DataError(
            f"{where}: column {col!r} has a missing value ({value!r}); fill it in the file, "
            "or pass --fill-gaps (fill_gaps=True) to interpolate missing values linearly"
        )
    try:
        x = float(v)
    except ValueError:
        raise DataError(
            f"{where}: column {col!r} has a non-numeric value {value!r}; every input column "
            "must hold numbers (choose the input columns with --observed-cols / --known-cols "
            "/ --static-cols)"
        ) from None
    if not math.isfinite(x):
        raise DataError(f"{where}: column {col!r} has a non-finite value {value!r}")
    return x


def _names(cols: Sequence[str] | str | None) -> list[str]:
    if cols is None:
        return []
    if isinstance(cols, str):
        return [c.strip() for c in cols.split(",") if c.strip()]
    return [str(c) for c in cols]


def load_csv(
    path: str | Path,
    *,
    time_col: str,
    target_col: str,
    entity_col: str | None = None,
    known_cols: Sequence[str] | str | None = None,
    static_cols: Sequence[str] | str | None = None,
    observed_cols: Sequence[str] | str | None = None,
    fill_gaps: bool = False,
) -> SeriesData:
    """Read a long-format CSV (optionally gzip-compressed) into :class:`SeriesData`.

    Parameters
    ----------
    path : str or Path
        A ``.csv`` or ``.csv.gz`` file with a header row, one row per (entity, time step).
    time_col : str
        The time column: ISO 8601 date times (``2001-01-31T23:00``, ``2001-01-31 23:00``;
        time-zone-aware values are converted to UTC) or plain numbers (a step counter).
    target_col : str
        The column to forecast. It is also the first observed input.
    entity_col : str, optional
        The column naming the series (entity) of each row; without it the file is one series.
        Rows of one entity keep their file order, which must be by increasing time.
    known_cols : sequence of str or comma-separated str, optional
        Inputs known in advance (their future values are given to the decoder).
    static_cols : sequence of str or comma-separated str, optional
        Per-entity constants (latitude, ...); each must be constant within an entity.
    observed_cols : sequence of str or comma-separated str, optional
        Past-only inputs besides the target. Default: every column not named above.
    fill_gaps : bool, default False
        Repair instead of rejecting: missing time steps are inserted and missing cells (empty,
        ``NaN``, ``NA``) filled, both by linear interpolation in time within the entity (the
        nearest value at the ends of a series). The count is in ``SeriesData.n_filled``.

    Returns
    -------
    SeriesData

    Raises
    ------
    DataError
        (a ValueError) for a missing file or column, a non-numeric or missing value, a duplicate,
        unsorted or irregular timestamp, a gap (without ``fill_gaps``), mixed date/number time
        values, or a static column that varies within an entity. The message names the line
        and column and says the fix.
    """
    path = Path(path)
    if not path.is_file():
        raise DataError(f"--csv {str(path)!r}: no such file")
    known = _names(known_cols)
    static = _names(static_cols)
    with _open_text(path) as f:
        reader = csv.reader(f)
        try:
            header = [h.strip() for h in next(reader)]
        except StopIteration:
            raise DataError(f"{path}: the file is empty (expected a header row)") from None
        except (UnicodeDecodeError, OSError, csv.Error) as e:
            raise DataError(f"{path}: cannot read it as CSV text ({e})") from None
        try:
            rows = list(reader)
        except (UnicodeDecodeError, OSError, csv.Error) as e:
            raise DataError(f"{path}: cannot read it as CSV text ({e})") from None

    named = {"--time-col": [time_col], "--target-col": [target_col]}
    if entity_col is not None:
        named["--entity-col"] = [entity_col]
    named["--known-cols"] = known
    named["--static-cols"] = static
    if observed_cols is not None:
        named["--observed-cols"] = _names(observed_cols)
    for opt, cols in named.items():
        missing = [c for c in cols if c not in header]
        if missing:
            raise DataError(
                f"{path}: {opt} names column(s) {missing} that the header does not have; "
                f"the header's columns are {header}"
            )
    used = [time_col, target_col] + ([entity_col] if entity_col else []) + known + static
    dup = sorted({c for c in used if used.count(c) > 1})
    if dup:
        raise DataError(f"{path}: column(s) {dup} are named for more than one role")
    if observed_cols is None:
        observed = [c for c in header if c not in used]
    else:
        observed = _names(observed_cols)
        clash = [c for c in observed if c in used]
        if clash:
            raise DataError(f"{path}: --observed-cols {clash} already have another role")
    if not rows:
        raise DataError(f"{path}: the file has a header but no data rows")

    col = {c: i for i, c in enumerate(header)}
    ncol = len(header)
    # Group rows by entity, keeping file order.
    groups: dict[str, list[tuple[int, list[str]]]] = {}
    for lineno, r in enumerate(rows, start=2):
        if not r or all(not x.strip() for x in r):
            continue
        if len(r) != ncol:
            raise DataError(f"{path}, line {lineno}: {len(r)} fields, the header has {ncol}")
        ent = r[col[entity_col]].strip() if entity_col else "series"
        groups.setdefault(ent, []).append((lineno, r))

    numeric_cols = [target_col] + observed + known
    times: list[list[Any]] = []
    values: list[np.ndarray] = []
    statics = np.zeros((len(groups), len(static)))
    kinds = set()
    for ie, (ent, grp) in enumerate(groups.items()):
        ts = []
        vals = np.empty((len(grp), len(numeric_cols)))
        for i, (lineno, r) in enumerate(grp):
            where = f"{path}, line {lineno}"
            tv = _parse_time(r[col[time_col]], where)
            kinds.add(type(tv))
            if len(kinds) > 1:
                raise DataError(f"{where}: column {time_col!r} mixes date times and plain numbers")
            ts.append(tv)
            for j, c in enumerate(numeric_cols):
                vals[i, j] = _parse_number(r[col[c]], c, where, fill_gaps)
            for j, c in enumerate(static):
                v = _parse_number(r[col[c]], c, where, False)
                if i == 0:
                    statics[ie, j] = v
                elif v != statics[ie, j]:
                    raise DataError(
                        f"{where}: static column {c!r} changes within entity {ent!r} "
                        f"({statics[ie, j]!r} then {v!r}); a static input must be constant "
                        "per entity"
                    )
        times.append(ts)
        values.append(vals)

    is_dt = datetime in kinds
    t_arrays = []
    for ts in times:
        if is_dt:
            t_arrays.append(np.array(ts, dtype="datetime64[s]"))
        else:
            t_arrays.append(np.array(ts, dtype=np.float64))
    names = list(groups)

    # Check order, find the common step.
    diffs_all = []
    for ie, ta in enumerate(t_arrays):
        d = np.diff(ta)
        lines = [ln for ln, _ in groups[names[ie]]]
        bad = np.flatnonzero(d <= d.dtype.type(0)) if len(d) else np.array([], dtype=np.int64)
        if len(bad):
            i = int(bad[0])
            what = (
                "duplicate" if d[i] == d.dtype.type(0) else "unsorted (earlier than the row before)"
            )
            raise DataError(
                f"{path}, line {lines[i + 1]}: {what} timestamp {ta[i + 1]} for entity "
                f"{names[ie]!r} (line {lines[i]} has {ta[i]}); each entity's rows must be in "
                "strictly increasing time order: sort the file by entity and time and drop "
                "duplicate rows"
            )
        diffs_all.append(d)
    nonempty = [d for d in diffs_all if len(d)]
    if not nonempty:
        raise DataError(f"{path}: every series has a single row; a series needs many time steps")
    alld = np.concatenate(nonempty)
    uniq, counts = np.unique(alld, return_counts=True)
    step = uniq[np.argmax(counts)]  # the most common difference (ties: the smallest)

    n_filled = 0
    out_t, out_y, out_obs, out_known = [], [], [], []
    for ie, (ta, vals_e) in enumerate(zip(t_arrays, values)):
        d = diffs_all[ie]
        lines = [ln for ln, _ in groups[names[ie]]]
        irregular = np.flatnonzero((d % step) != d.dtype.type(0)) if len(d) else np.zeros(0, int)
        if len(irregular):
            i = int(irregular[0])
            raise DataError(
                f"{path}, line {lines[i + 1]}: timestamp {ta[i + 1]} of entity {names[ie]!r} is "
                f"not a whole number of steps ({step}) after the previous one ({ta[i]}); the "
                "series must be regular"
            )
        nsteps = (d // step).astype(np.int64) if len(d) else np.zeros(0, np.int64)
        gaps = np.flatnonzero(nsteps > 1)
        if len(gaps) and not fill_gaps:
            i = int(gaps[0])
            raise DataError(
                f"{path}, line {lines[i + 1]}: gap in entity {names[ie]!r}: {int(nsteps[i]) - 1} "
                f"missing step(s) of {step} between {ta[i]} and {ta[i + 1]} "
                f"({len(gaps)} gap(s) in this entity); fill them in the file, or pass "
                "--fill-gaps (fill_gaps=True) to insert the missing steps by linear interpolation"
            )
        pos = np.concatenate([[0], np.cumsum(nsteps)])  # step index of each row
        n = int(pos[-1]) + 1
        grid_t = ta[0] + np.arange(n) * step
        full = np.full((n, vals_e.shape[1]), np.nan)
        full[pos] = vals_e
        if fill_gaps:
            xs = np.arange(n, dtype=np.float64)
            for j in range(full.shape[1]):
                ok = np.isfinite(full[:, j])
                n_bad = int(n - ok.sum())
                if n_bad == 0:
                    continue
                if not ok.any():
                    raise DataError(
                        f"{path}: column {numeric_cols[j]!r} of entity {names[ie]!r} has no "
                        "value at all; nothing to interpolate from"
                    )
                full[:, j] = np.interp(xs, xs[ok], full[ok, j])
                n_filled += n_bad
        out_t.append(grid_t)
        out_y.append(full[:, 0].copy())
        out_obs.append(full[:, 1 : 1 + len(observed)].copy())
        out_known.append(full[:, 1 + len(observed) :].copy())

    return SeriesData(
        entity_names=names,
        times=out_t,
        step=step,
        target=out_y,
        observed=out_obs,
        known=out_known,
        static=statics,
        target_name=target_col,
        observed_names=observed,
        known_names=known,
        static_names=static,
        n_filled=n_filled,
        source=str(path),
    )


def tmy3_path() -> Path:
    """Path of the shipped dataset file (inside the installed package)."""
    return Path(str(resources.files("nbqat.data").joinpath(TMY3_FILE)))


def load_tmy3() -> SeriesData:
    """The shipped dataset: hourly NREL TMY3 weather at Sand Point AK and Greensboro NC.

    Target ``temp_air`` (dry-bulb temperature, deg C); observed inputs dew point, relative
    humidity, pressure, wind speed, total cloud cover and GHI; known input ETR (extraterrestrial
    radiation, astronomical); static inputs latitude, longitude, elevation. 8,760 hours per
    station in a nominal year 2001 (see ``nbqat/data/README.md``).

    Returns
    -------
    SeriesData
    """
    data = load_csv(tmy3_path(), **TMY3_COLUMNS)  # type: ignore[arg-type]
    data.source = f"nbqat/data/{TMY3_FILE} (NREL TMY3, public domain; via pvlib-python)"
    return data


# ---------------------------------------------------------------------------------------------
# Windows


@dataclass
class SplitWindows:
    """The windows of one split (train, validation or test).

    A window is an (entity, forecast start) pair; :meth:`batch` gathers its arrays from the
    shared feature matrices of :class:`Windows`, so no window is stored twice.

    Attributes
    ----------
    name : str
        ``"train"``, ``"val"`` or ``"test"``.
    rows : ndarray
        int64 (n,): the global row (into the concatenated series) of each window's first
        forecast step.
    entity : ndarray
        int64 (n,): the entity of each window.
    """

    name: str
    rows: np.ndarray
    entity: np.ndarray
    parent: Windows = field(repr=False)

    def __len__(self) -> int:
        return len(self.rows)

    def batch(self, idx: np.ndarray | slice | None = None):
        """Model inputs and standardised target of the windows ``idx``.

        Returns
        -------
        static : ndarray float32 (B, m_s)
        historical : ndarray float32 (B, k, m_z)
            Observed inputs (target first) and known inputs over the k history steps.
        future : ndarray float32 (B, tau, m_x)
            Known inputs over the tau forecast steps.
        target : ndarray float32 (B, tau)
            The standardised target (per-entity level/scale of the training split).
        """
        p = self.parent
        rows = self.rows if idx is None else self.rows[idx]
        ent = self.entity if idx is None else self.entity[idx]
        hist_idx = rows[:, None] + np.arange(-p.history, 0)
        fut_idx = rows[:, None] + np.arange(p.horizon)
        return (
            p.static[ent],
            p.hist_features[hist_idx],
            p.future_features[fut_idx],
            p.target_std[fut_idx],
        )

    def target_raw(self, idx: np.ndarray | slice | None = None) -> np.ndarray:
        """float64 (B, tau): the unscaled target over the forecast steps."""
        rows = self.rows if idx is None else self.rows[idx]
        return self.parent.target_raw[rows[:, None] + np.arange(self.parent.horizon)]

    def history_raw(self, idx: np.ndarray | slice | None = None) -> np.ndarray:
        """float64 (B, k): the unscaled target over the history steps."""
        rows = self.rows if idx is None else self.rows[idx]
        return self.parent.target_raw[rows[:, None] + np.arange(-self.parent.history, 0)]

    def unscale(self, pred: np.ndarray, idx: np.ndarray | slice | None = None) -> np.ndarray:
        """Undo the per-entity standardisation of predictions (B, tau[, Q]) -> float64."""
        ent = self.entity if idx is None else self.entity[idx]
        lvl = self.parent.level[ent].reshape((-1,) + (1,) * (pred.ndim - 1))
        scl = self.parent.scale[ent].reshape((-1,) + (1,) * (pred.ndim - 1))
        return pred.astype(np.float64) * scl + lvl

    def seasonal_naive(self, idx: np.ndarray | slice | None = None) -> np.ndarray:
        """float64 (B, tau): the seasonal-naive point forecast, ``y[t - season]``.

        For forecast step h (0-based) it is the target ``season * ceil((h + 1) / season)``
        steps earlier, i.e. the last observed season repeated; with hourly data, season 24 and
        tau 24 it is the value 24 hours earlier.
        """
        p = self.parent
        rows = self.rows if idx is None else self.rows[idx]
        h = np.arange(p.horizon)
        lag = p.season * ((h // p.season) + 1)
        return p.target_raw[rows[:, None] + h - lag]

    def times(self, idx: np.ndarray | slice | None = None) -> np.ndarray:
        """The time stamps (B, tau) of the forecast steps."""
        rows = self.rows if idx is None else self.rows[idx]
        return self.parent.time[rows[:, None] + np.arange(self.parent.horizon)]


@dataclass
class Windows:
    """TFT windows over :class:`SeriesData` (the output of :func:`make_windows`).

    The series of all entities are concatenated row-wise into shared feature matrices;
    the splits hold only row indices (see :class:`SplitWindows`).

    Attributes
    ----------
    history, horizon, season : int
        k (encoder steps), tau (forecast steps), seasonal-naive period (steps).
    static : ndarray float32 (n_entities, m_s)
    hist_features : ndarray float32 (n_rows, m_z)
    future_features : ndarray float32 (n_rows, m_x)
    target_std : ndarray float32 (n_rows,)
    target_raw : ndarray float64 (n_rows,)
    time : ndarray (n_rows,)
    level, scale : ndarray float64 (n_entities,)
        Per-entity mean and standard deviation of the target on the training rows.
    static_names, historical_names, future_names : list of str
    train, val, test : SplitWindows
    naive_residual_quantiles : ndarray float64 (n_entities, Q)
        Empirical quantiles of the seasonal-naive residual ``y[t] - y[t - season]`` on the
        training rows of each entity (see :func:`seasonal_naive_quantiles`).
    cutoffs : tuple
        The first time of the validation split and of the test split.
    """

    history: int
    horizon: int
    season: int
    quantiles: tuple[float, ...]
    static: np.ndarray
    hist_features: np.ndarray
    future_features: np.ndarray
    target_std: np.ndarray
    target_raw: np.ndarray
    time: np.ndarray
    level: np.ndarray
    scale: np.ndarray
    entity_names: list[str]
    static_names: list[str]
    historical_names: list[str]
    future_names: list[str]
    naive_residual_quantiles: np.ndarray
    cutoffs: tuple
    target_name: str
    source: str
    train_stride: int = 1
    eval_stride: int = 1
    train: SplitWindows = field(init=False, repr=False)
    val: SplitWindows = field(init=False, repr=False)
    test: SplitWindows = field(init=False, repr=False)

    def summary(self) -> dict:
        """A JSON-friendly description (sizes, names, cutoffs)."""
        return {
            "source": self.source,
            "target": self.target_name,
            "entities": self.entity_names,
            "history": self.history,
            "horizon": self.horizon,
            "season": self.season,
            "train_stride": self.train_stride,
            "eval_stride": self.eval_stride,
            "static_inputs": self.static_names,
            "historical_inputs": self.historical_names,
            "future_inputs": self.future_names,
            "windows": {"train": len(self.train), "val": len(self.val), "test": len(self.test)},
            "val_start": str(self.cutoffs[0]),
            "test_start": str(self.cutoffs[1]),
        }


#: Derived known inputs (``calendar`` option of :func:`make_windows`).
CALENDAR_FEATURES = ("hour", "doy", "dow", "time_index")
_CAL_GROUP = {
    "hour_sin": "hour",
    "hour_cos": "hour",
    "doy_sin": "doy",
    "doy_cos": "doy",
    "day_of_week": "dow",
}


def _default_season(data: SeriesData, horizon: int) -> int:
    if data.is_datetime:
        step_s = int(data.step / np.timedelta64(1, "s"))  # type: ignore[operator]
        if step_s > 0 and 86400 % step_s == 0 and step_s < 86400:
            return 86400 // step_s  # one day
        if step_s == 86400:
            return 7  # daily data: one week
    return horizon


def _calendar(t: np.ndarray) -> tuple[np.ndarray, list[str]]:
    """Calendar features of datetime64[s] times: hour of day and day of year as sin/cos,
    day of week scaled to [-1, 1]."""
    secs = t.astype("datetime64[s]").astype(np.int64)
    day = np.floor_divide(secs, 86400)
    sec_of_day = secs - day * 86400
    year_start = t.astype("datetime64[Y]").astype("datetime64[s]").astype(np.int64)
    next_year = (t.astype("datetime64[Y]") + 1).astype("datetime64[s]").astype(np.int64)
    frac_year = (secs - year_start) / (next_year - year_start)
    frac_day = sec_of_day / 86400.0
    dow = (day + 3) % 7  # 1970-01-01 was a Thursday; Monday = 0
    feats = [
        np.sin(2 * np.pi * frac_day),
        np.cos(2 * np.pi * frac_day),
        np.sin(2 * np.pi * frac_year),
        np.cos(2 * np.pi * frac_year),
        dow / 3.0 - 1.0,
    ]
    names = ["hour_sin", "hour_cos", "doy_sin", "doy_cos", "day_of_week"]
    return np.stack(feats, axis=1), names


def _zscore_fit(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    mu = x.mean(axis=0)
    sd = x.std(axis=0)
    sd = np.where(sd > 1e-12 * np.maximum(1.0, np.abs(mu)), sd, 1.0)
    return mu, sd


def seasonal_naive_quantiles(
    y_train: np.ndarray, season: int, quantiles: Sequence[float]
) -> np.ndarray:
    """Empirical quantiles of the seasonal-naive residual ``y[t] - y[t - season]``.

    The seasonal-naive baseline predicts the quantile q as ``y[t - season] + r_q`` with
    ``r_q`` these residual quantiles, so it is a probabilistic baseline (a point forecast with a
    residual spread) and its P50 is the classic seasonal-naive point forecast shifted by the
    median residual (about 0).

    Parameters
    ----------
    y_train : ndarray (N,)
        The training rows of one entity's target.
    season : int
    quantiles : sequence of float

    Returns
    -------
    ndarray float64 (Q,)
        ``numpy.quantile(residuals, q)`` (linear interpolation), or zeros when the training
        rows are not longer than one season.
    """
    if len(y_train) <= season:
        return np.zeros(len(quantiles))
    r = y_train[season:] - y_train[:-season]
    return np.quantile(r, np.asarray(quantiles, dtype=np.float64))


def make_windows(
    data: SeriesData,
    *,
    history: int = 168,
    horizon: int = 24,
    split: tuple[float, float] = (0.7, 0.85),
    season: int | None = None,
    quantiles: Sequence[float] = (0.1, 0.5, 0.9),
    train_stride: int = 1,
    eval_stride: int = 1,
    calendar: Sequence[str] = CALENDAR_FEATURES,
) -> Windows:
    """Build TFT windows: features, standardisation fitted on train rows, split by time.

    Parameters
    ----------
    data : SeriesData
    history : int, default 168
        k, the encoder length in steps (one week of hours).
    horizon : int, default 24
        tau, the number of steps forecast.
    split : (float, float), default (0.7, 0.85)
        Cut points as fractions of the global time range ``[t_min, t_max]`` over all entities:
        rows with time before the first cut are training rows, before the second validation
        rows, the rest test rows. Cutting by time (not by row count) keeps every entity's
        training rows before every entity's validation and test rows.
    season : int, optional
        Period of the seasonal-naive baseline in steps. Default: one day for sub-daily date
        times (24 for hourly data), 7 for daily data, else ``horizon``.
    quantiles : sequence of float, default (0.1, 0.5, 0.9)
    train_stride, eval_stride : int, default 1
        Distance in steps between the forecast starts of consecutive windows in the training
        split and in the validation/test splits.

    Returns
    -------
    Windows

    Raises
    ------
    DataError
        When a split gets no window, or an entity has no training rows to fit its
        standardisation (the message gives the lengths needed).
    ValueError
        For a bad option (history, horizon, split, season, strides).

    Notes
    -----
    No leakage: a window belongs to the split that holds ALL of its forecast steps; its history
    may reach back into earlier splits (those values are observed before the forecast time).
    Every statistic (target level/scale, input standardisation, the naive residual quantiles)
    is computed on training rows only.

    Inputs of a window:

    * static (per entity): entity id (scaled to [-1, 1]), the user's static columns, the
      target's training level and scale; each standardised across entities (z-score; a column
      constant across entities becomes 0).
    * historical (k steps): the standardised target, the standardised observed inputs, then
      the known inputs below (the encoder also sees the past values of known inputs).
    * future (tau steps): the known inputs: for date times hour of day (sin, cos; only for
      sub-daily steps), day of year (sin, cos), day of week (scaled to [-1, 1]); always the time
      index (scaled so the training range maps to [-1, 1]) and the user's known columns
      (standardised per entity on training rows).

    A column with zero spread on the training rows (Sand Point's constant pressure) gets scale
    1 (it is centred only).
    """
    for name, v in (("history", history), ("horizon", horizon)):
        if not isinstance(v, (int, np.integer)) or v < 1:
            raise ValueError(f"{name} must be a positive integer, got {v!r}")
    for name, v in (("train_stride", train_stride), ("eval_stride", eval_stride)):
        if not isinstance(v, (int, np.integer)) or v < 1:
            raise ValueError(f"{name} must be a positive integer, got {v!r}")
    if len(split) != 2 or not (0.0 < split[0] < split[1] < 1.0):
        raise ValueError(f"split must be two fractions 0 < a < b < 1, got {split!r}")
    if season is None:
        season = _default_season(data, horizon)
    if not isinstance(season, (int, np.integer)) or not (1 <= season <= history):
        raise ValueError(
            f"season must be an integer in [1, history={history}] (the seasonal-naive forecast "
            f"reads the history), got {season!r}"
        )
    quantiles = tuple(float(q) for q in quantiles)
    calendar = tuple(calendar)
    bad = [c for c in calendar if c not in CALENDAR_FEATURES]
    if bad:
        raise ValueError(f"calendar features {bad} unknown; choose from {CALENDAR_FEATURES}")

    t0 = min(t[0] for t in data.times)
    t1 = max(t[-1] for t in data.times)
    # Cut points on the step grid: t0 + round(fraction * span / step) * step.
    n_steps = (t1 - t0) / data.step
    cut_val = t0 + int(round(float(n_steps) * split[0])) * data.step
    cut_test = t0 + int(round(float(n_steps) * split[1])) * data.step

    n_ent = len(data.entity_names)
    need = history + horizon
    level = np.zeros(n_ent)
    scale = np.ones(n_ent)
    hist_blocks, fut_blocks, ystd_blocks = [], [], []
    split_rows: dict[str, list[np.ndarray]] = {"train": [], "val": [], "test": []}
    split_ent: dict[str, list[np.ndarray]] = {"train": [], "val": [], "test": []}
    naive_q = np.zeros((n_ent, len(quantiles)))
    offset = 0
    cal_names: list[str] = []
    for e in range(n_ent):
        t = data.times[e]
        y = data.target[e]
        n = len(t)
        i_val = int(np.searchsorted(t, cut_val, side="left"))
        i_test = int(np.searchsorted(t, cut_test, side="left"))
        if i_val < 2:
            raise DataError(
                f"entity {data.entity_names[e]!r} has {i_val} row(s) in the training split "
                f"(before {cut_val}); each entity needs training rows to fit its standardisation"
            )
        lvl, scl = _zscore_fit(y[:i_val, None])
        level[e], scale[e] = lvl[0], scl[0]
        obs = np.concatenate([y[:, None], data.observed[e]], axis=1)
        mu, sd = _zscore_fit(obs[:i_val])
        obs_std = (obs - mu) / sd
        known_parts = []
        if data.is_datetime:
            cal, cal_names = _calendar(t)
            step_s = int(data.step / np.timedelta64(1, "s"))  # type: ignore[operator]
            keep = [
                j
                for j, c in enumerate(cal_names)
                if _CAL_GROUP[c] in calendar and not (step_s >= 86400 and _CAL_GROUP[c] == "hour")
            ]
            cal = cal[:, keep]
            cal_names = [cal_names[j] for j in keep]
            known_parts.append(cal)
            tnum = (t - t0) / np.timedelta64(1, "s")
            tval = (cut_val - t0) / np.timedelta64(1, "s")
        else:
            cal_names = []
            tnum = t - t0
            tval = cut_val - t0
        if "time_index" in calendar:
            known_parts.append((2.0 * tnum / max(float(tval), 1e-300) - 1.0)[:, None])
        if data.known[e].shape[1]:
            mu_k, sd_k = _zscore_fit(data.known[e][:i_val])
            known_parts.append((data.known[e] - mu_k) / sd_k)
        known = np.concatenate(known_parts, axis=1)
        hist_blocks.append(np.concatenate([obs_std, known], axis=1))
        fut_blocks.append(known)
        ystd_blocks.append((y - level[e]) / scale[e])
        naive_q[e] = seasonal_naive_quantiles(y[:i_val], int(season), quantiles)
        # Forecast starts s (row index of the first forecast step) per split.
        bounds = {"train": (0, i_val), "val": (i_val, i_test), "test": (i_test, n)}
        for name, (lo, hi) in bounds.items():
            stride = train_stride if name == "train" else eval_stride
            first = max(lo, history)
            starts = np.arange(first, hi - horizon + 1, stride, dtype=np.int64)
            split_rows[name].append(starts + offset)
            split_ent[name].append(np.full(len(starts), e, dtype=np.int64))
        offset += n

    static_cols = [np.linspace(-1.0, 1.0, n_ent) if n_ent > 1 else np.zeros(1)]
    static_names = ["entity_id"]
    for j, c in enumerate(data.static_names):
        static_cols.append(data.static[:, j])
        static_names.append(c)
    static_cols += [level, scale]
    static_names += [f"{data.target_name}_level", f"{data.target_name}_scale"]
    s = np.stack(static_cols, axis=1)
    mu_s = s.mean(axis=0)
    sd_s = s.std(axis=0)
    s = np.where(sd_s > 0, (s - mu_s) / np.where(sd_s > 0, sd_s, 1.0), 0.0)

    future_names = (
        cal_names + (["time_index"] if "time_index" in calendar else []) + list(data.known_names)
    )
    if not future_names:
        raise DataError(
            "the decoder has no known input: keep a calendar feature or pass --known-cols"
        )
    historical_names = [data.target_name] + list(data.observed_names) + future_names

    w = Windows(
        history=int(history),
        horizon=int(horizon),
        season=int(season),
        quantiles=quantiles,
        static=np.ascontiguousarray(s, dtype=np.float32),
        hist_features=np.ascontiguousarray(np.concatenate(hist_blocks), dtype=np.float32),
        future_features=np.ascontiguousarray(np.concatenate(fut_blocks), dtype=np.float32),
        target_std=np.concatenate(ystd_blocks).astype(np.float32),
        target_raw=np.concatenate(data.target).astype(np.float64),
        time=np.concatenate(data.times),
        level=level,
        scale=scale,
        entity_names=list(data.entity_names),
        static_names=static_names,
        historical_names=historical_names,
        future_names=future_names,
        naive_residual_quantiles=naive_q,
        cutoffs=(cut_val, cut_test),
        target_name=data.target_name,
        source=data.source,
        train_stride=int(train_stride),
        eval_stride=int(eval_stride),
    )
    for name in ("train", "val", "test"):
        rows = np.concatenate(split_rows[name])
        ent = np.concatenate(split_ent[name])
        if len(rows) == 0:
            lens = dict(zip(data.entity_names, data.lengths))
            raise DataError(
                f"the {name} split has no window: a window needs history + horizon = {need} "
                f"consecutive steps, all {horizon} forecast steps inside the split "
                f"(split fractions {split}, series lengths {lens}); use a longer series, a "
                "shorter --history / --horizon, or other split fractions"
            )
        setattr(w, name, SplitWindows(name=name, rows=rows, entity=ent, parent=w))
    return w
