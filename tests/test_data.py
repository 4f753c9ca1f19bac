"""nbqat.data: the shipped dataset, the CSV loader's checks and the TFT window builder.

Oracles: the raw CSV text read row by row with the csv module, Python's datetime/math for the
calendar features, and slow per-window loops over the raw series (tests/ref_data.py style,
inline here) for the window contents and the training-only statistics.
"""

from __future__ import annotations

import csv
import gzip
import math
import statistics
from datetime import datetime, timedelta
from pathlib import Path

import numpy as np
import pytest

from nbqat.data import (
    TMY3_FILE,
    DataError,
    from_dataframe,
    load_csv,
    load_tmy3,
    make_windows,
    seasonal_naive_quantiles,
)

DATA_DIR = Path(__file__).resolve().parents[1] / "nbqat" / "data"


def _pvlib_data() -> Path:
    """pvlib's data folder (the test extra installs pvlib; its wheel ships the TMY3 files)."""
    import importlib.util

    spec = importlib.util.find_spec("pvlib")
    if spec is None or spec.origin is None:
        raise RuntimeError("pvlib is not installed: pip install -e '.[test]'")
    return Path(spec.origin).parent / "data"


PVLIB_DATA = _pvlib_data()


@pytest.fixture(scope="module")
def tmy3():
    return load_tmy3()


@pytest.fixture(scope="module")
def raw_rows():
    with gzip.open(DATA_DIR / TMY3_FILE, "rt", newline="") as f:
        return list(csv.DictReader(f))


def write_csv(path: Path, header: list[str], rows: list[list]) -> Path:
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(header)
        w.writerows(rows)
    return path


def hourly_rows(n: int, entity: str = "a", start: datetime = datetime(2020, 3, 1), seed=0):
    rng = np.random.default_rng(seed)
    return [
        [
            entity,
            (start + timedelta(hours=i)).isoformat(),
            f"{rng.normal():.4f}",
            f"{rng.normal():.4f}",
            f"{i % 24}",
            "1.5",
        ]
        for i in range(n)
    ]


HEADER = ["id", "ts", "y", "x", "k", "s"]


def csv_with_cell(path: Path, row: int, col: int, value: str) -> tuple[Path, list[list]]:
    """``hourly_rows(50)`` with cell ``[row][col]`` set to ``value``, written to ``path``;
    returns the path and the rows."""
    rows = hourly_rows(50)
    rows[row][col] = value
    return write_csv(path, HEADER, rows), rows


# --------------------------------------------------------------------------------- shipped data


def test_shipped_file_is_small_and_documented():
    size = (DATA_DIR / TMY3_FILE).stat().st_size
    assert 0 < size < 1_000_000
    readme = (DATA_DIR / "README.md").read_text()
    for needle in ("public domain", "BSD 3-Clause", "pvlib", "TMY3", "2001"):
        assert needle in readme


def test_tmy3_matches_raw_text(tmy3, raw_rows):
    assert tmy3.entity_names == ["sand_point_ak", "greensboro_nc"]
    assert tmy3.lengths == [8760, 8760]
    assert tmy3.target_name == "temp_air"
    for e, ent in enumerate(tmy3.entity_names):
        rows = [r for r in raw_rows if r["station"] == ent]
        for i in (0, 1, 4000, 8759):
            r = rows[i]
            assert tmy3.target[e][i] == float(r["temp_air"])
            for j, c in enumerate(tmy3.observed_names):
                assert tmy3.observed[e][i, j] == float(r[c])
            assert tmy3.known[e][i, 0] == float(r["etr"])
            # continuous nominal-year hourly index
            expect = datetime(2001, 1, 1) + timedelta(hours=i)
            assert tmy3.times[e][i] == np.datetime64(expect.isoformat(), "s")
    # static values from the station header lines (Sand Point AK, Greensboro NC)
    np.testing.assert_array_equal(tmy3.static, [[55.317, -160.517, 7.0], [36.100, -79.950, 273.0]])


def test_build_script_reproduces_the_shipped_file(tmp_path):
    from nbqat.data import _build

    out = _build.build(PVLIB_DATA, tmp_path)
    assert out.read_bytes() == (DATA_DIR / TMY3_FILE).read_bytes()
    # and the values really are the TMY3 dry-bulb column, hour-ending -> hour-starting
    with open(PVLIB_DATA / "723170TYA.CSV", newline="") as f:
        r = list(csv.reader(f))
    tmy3 = load_tmy3()
    col = r[1].index("Dry-bulb (C)")
    assert [float(x[col]) for x in r[2:]] == tmy3.target[1].tolist()


# ------------------------------------------------------------------------------------ windows


@pytest.fixture(scope="module")
def windows(tmy3):
    return make_windows(tmy3, history=48, horizon=12, eval_stride=5, train_stride=3)


def test_split_by_time_no_leakage(windows):
    cut_val, cut_test = windows.cutoffs
    tr, va, te = windows.train, windows.val, windows.test
    assert tr.times().max() < cut_val
    assert va.times().min() >= cut_val and va.times().max() < cut_test
    assert te.times().min() >= cut_test
    # windows never cross entities: history + forecast times are consecutive hours
    for s in (tr, va, te):
        first_hist = windows.time[s.rows - windows.history]
        assert np.all(s.times()[:, -1] - first_hist == np.timedelta64(59, "h"))


def test_late_entity_windows_stay_on_the_split_grid_as_backtest_origins():
    """An entity starting within ``history`` rows of the test split's start had its test
    windows on a grid of its own (from its history-th row), so ``nbqat backtest`` at the
    eval stride (the test start's grid, "not moved") scored other origins than the test table.
    Oracle: the origins ``test start + k * stride`` with ``history`` earlier rows in the
    entity and all ``horizon`` steps in its data, by time arithmetic."""
    import pandas as pd

    from nbqat.data import from_dataframe
    from nbqat.data._forecast import forecast_windows

    rng = np.random.default_rng(0)
    hours = pd.date_range("2021-01-01", periods=1000, freq="h")
    parts = [("a", hours), ("b", hours[690:])]  # b: 9 training rows, 168 ~ 159 + 9 rows
    df = pd.concat(pd.DataFrame({"time": t, "id": e, "y": 5 + rng.normal(size=len(t))})
                   for e, t in parts)  # fmt: skip
    data = from_dataframe(df, time_col="time", target_col="y", entity_col="id")
    k, tau, stride = 168, 24, 6
    w = make_windows(data, history=k, horizon=tau, eval_stride=stride)
    start = pd.Timestamp(w.cutoffs[1])
    got = w.test.times()[:, 0]
    for e, t in parts:
        want = [
            o
            for o in pd.date_range(start, t[-1], freq=f"{stride}h")
            if o - t[0] >= pd.Timedelta(hours=k) and o + pd.Timedelta(hours=tau - 1) <= t[-1]
        ]
        assert [pd.Timestamp(x) for x in got[w.test.entity == int(e == "b")]] == want, e
    fw = forecast_windows(
        data,
        w.scaling,
        history=k,
        horizon=tau,
        quantiles=w.quantiles,
        backtest=(w.cutoffs[1], stride, True),
    )  # the default backtest
    np.testing.assert_array_equal(fw.time[:, k], got)
    np.testing.assert_array_equal(fw.split.entity, w.test.entity)


def test_statistics_use_training_rows_only(tmy3):
    w = make_windows(tmy3, history=48, horizon=12)
    # oracle: the level/scale of each entity from the training rows with the statistics module
    cut = w.cutoffs[0]
    for e in range(2):
        y = [float(v) for v, t in zip(tmy3.target[e], tmy3.times[e]) if t < cut]
        assert math.isclose(w.level[e], statistics.fmean(y), rel_tol=1e-12)
        assert math.isclose(w.scale[e], statistics.pstdev(y), rel_tol=1e-9)
    # changing the validation/test values changes no training input
    import copy

    t2 = copy.deepcopy(tmy3)
    for e in range(2):
        after = tmy3.times[e] >= cut
        t2.target[e][after] += 100.0
        t2.observed[e][after] *= 3.0
    w2 = make_windows(t2, history=48, horizon=12)
    idx = np.arange(0, len(w.train), 97)
    for a, b in zip(w.train.batch(idx), w2.train.batch(idx)):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(w.static, w2.static)


def test_batch_matches_slow_reference(tmy3, windows):
    w = windows
    cut = w.cutoffs[0]
    for split, picks in ((w.train, (0, 17, len(w.train) - 1)), (w.test, (0, len(w.test) - 1))):
        static, hist, fut, target = split.batch(np.array(picks))
        for b, i in enumerate(picks):
            e = int(split.entity[i])
            start = int(split.rows[i]) - (0 if e == 0 else tmy3.lengths[0])
            times = tmy3.times[e]
            train = times < cut
            cols = [tmy3.target[e]] + [tmy3.observed[e][:, j] for j in range(6)]
            for j, c in enumerate(cols):
                mu = statistics.fmean(c[train].tolist())
                sd = statistics.pstdev(c[train].tolist()) or 1.0
                for s in (0, w.history - 1):
                    t = start - w.history + s
                    assert hist[b, s, j] == pytest.approx((c[t] - mu) / sd, abs=1e-5)
            for h in (0, w.horizon - 1):
                t = start + h
                dt = datetime.fromisoformat(str(times[t]))
                assert fut[b, h, 0] == pytest.approx(math.sin(2 * math.pi * dt.hour / 24), abs=1e-6)
                assert fut[b, h, 1] == pytest.approx(math.cos(2 * math.pi * dt.hour / 24), abs=1e-6)
                doy = (dt - datetime(dt.year, 1, 1)).total_seconds() / (365 * 86400)
                assert fut[b, h, 2] == pytest.approx(math.sin(2 * math.pi * doy), abs=1e-6)
                assert fut[b, h, 4] == pytest.approx(dt.weekday() / 3 - 1, abs=1e-6)
                assert target[b, h] == pytest.approx(
                    (tmy3.target[e][t] - w.level[e]) / w.scale[e], abs=1e-5
                )
                # known inputs are also in the history (encoder) block, after the observed ones
                np.testing.assert_array_equal(hist[b, :, 7:].shape, (w.history, fut.shape[2]))
            raw = split.target_raw(np.array([i]))[0]
            np.testing.assert_array_equal(raw, tmy3.target[e][start : start + w.horizon])
            naive = split.seasonal_naive(np.array([i]))[0]
            np.testing.assert_array_equal(naive, tmy3.target[e][start - 24 : start - 12])
            back = split.unscale(target[b : b + 1], np.array([i]))[0]
            np.testing.assert_allclose(back, raw, atol=1e-4)
    assert static.shape == (2, 6) and static.dtype == np.float32
    assert hist.dtype == np.float32 and fut.dtype == np.float32 and target.dtype == np.float32


def test_seasonal_naive_quantiles_oracle():
    rng = np.random.default_rng(3)
    y = rng.normal(size=200)
    r = sorted(y[24:] - y[:-24])
    got = seasonal_naive_quantiles(y, 24, (0.1, 0.5, 0.9))
    assert got[1] == pytest.approx(statistics.median(r))
    n = len(r)
    pos = 0.1 * (n - 1)
    lo = int(pos)
    assert got[0] == pytest.approx(r[lo] + (pos - lo) * (r[lo + 1] - r[lo]))


def test_seasonal_naive_repeats_last_season_for_long_horizon(tmp_path):
    rows = hourly_rows(400)
    d = load_csv(
        write_csv(tmp_path / "a.csv", HEADER, rows),
        time_col="ts",
        target_col="y",
        entity_col="id",
        known_cols="k",
        static_cols="s",
    )
    w = make_windows(d, history=30, horizon=30, season=24)
    i = np.array([0])
    naive = w.test.seasonal_naive(i)[0]
    start = int(w.test.rows[0])
    y = d.target[0]
    expect = [y[start + h - 24 * (h // 24 + 1)] for h in range(30)]
    np.testing.assert_array_equal(naive, expect)


# ------------------------------------------------------------------------------ CSV validation


def load(path, **kw):
    args = dict(time_col="ts", target_col="y", entity_col="id", known_cols="k", static_cols="s")
    args.update(kw)
    return load_csv(path, **args)


def test_user_csv_roundtrip_two_entities(tmp_path):
    rows = hourly_rows(300, "a") + hourly_rows(250, "b", datetime(2020, 3, 2), seed=1)
    d = load(write_csv(tmp_path / "u.csv", HEADER, rows))
    assert d.entity_names == ["a", "b"]
    assert d.lengths == [300, 250]
    assert d.observed_names == ["x"] and d.known_names == ["k"] and d.static_names == ["s"]
    assert d.step == np.timedelta64(3600, "s")
    assert d.target[1][5] == float(rows[305][2])
    w = make_windows(d, history=24, horizon=6)
    assert len(w.train) > 0 and len(w.val) > 0 and len(w.test) > 0


def test_numeric_time_single_series(tmp_path):
    rows = [[str(10 * i), f"{math.sin(i / 5):.5f}", f"{i % 3}"] for i in range(120)]
    d = load_csv(write_csv(tmp_path / "n.csv", ["t", "v", "w"], rows), time_col="t", target_col="v")
    assert d.entity_names == ["series"] and d.step == 10.0 and not d.is_datetime
    w = make_windows(d, history=12, horizon=4)
    assert w.season == 4 and w.future_names == ["time_index"]
    assert w.historical_names == ["v", "w", "time_index"]


@pytest.mark.parametrize(
    "kwargs, needle",
    [
        (dict(target_col="temp"), "--target-col names column(s) ['temp']"),
        (dict(time_col="when"), "--time-col"),
        (dict(entity_col="station"), "--entity-col"),
        (dict(known_cols="k,z"), "['z']"),
        (dict(static_cols=["q"]), "--static-cols"),
        (dict(known_cols="x", observed_cols="x"), "another role"),
    ],
)
def test_missing_columns(tmp_path, kwargs, needle):
    p = write_csv(tmp_path / "m.csv", HEADER, hourly_rows(50))
    with pytest.raises(DataError) as ei:
        load(p, **kwargs)
    assert needle in str(ei.value)


def test_missing_column_message_lists_header(tmp_path):
    p = write_csv(tmp_path / "m.csv", HEADER, hourly_rows(50))
    with pytest.raises(DataError) as ei:
        load(p, target_col="temp")
    msg = str(ei.value)
    assert "--target-col" in msg and "'temp'" in msg and "'ts'" in msg


def test_non_numeric_value(tmp_path):
    p, _ = csv_with_cell(tmp_path / "b.csv", 7, 3, "abc")
    with pytest.raises(DataError, match=r"line 9: column 'x' has a non-numeric value 'abc'"):
        load(p)
    # fill_gaps does not repair text
    with pytest.raises(DataError, match="non-numeric"):
        load(p, fill_gaps=True)


def test_missing_value_error_and_repair(tmp_path):
    p, rows = csv_with_cell(tmp_path / "b.csv", 10, 2, "")
    with pytest.raises(DataError, match=r"line 12: column 'y' has a missing value.*--fill-gaps"):
        load(p)
    d = load(p, fill_gaps=True)
    assert d.n_filled == 1
    assert d.target[0][10] == float(rows[9][2])  # the last value carried (no look ahead)


def test_duplicate_and_unsorted_timestamps(tmp_path):
    rows = hourly_rows(50)
    rows[20][1] = rows[19][1]
    with pytest.raises(DataError, match=r"line 22: duplicate timestamp .*entity 'a'.*sort"):
        load(write_csv(tmp_path / "d.csv", HEADER, rows))
    rows = hourly_rows(50)
    rows[20], rows[21] = rows[21], rows[20]
    with pytest.raises(DataError, match=r"line 23: unsorted"):
        load(write_csv(tmp_path / "u.csv", HEADER, rows))


def test_gap_error_and_repair(tmp_path):
    rows = hourly_rows(60)
    del rows[30:33]
    p = write_csv(tmp_path / "g.csv", HEADER, rows)
    with pytest.raises(DataError, match=r"gap in entity 'a': 3 missing step\(s\).*--fill-gaps"):
        load(p)
    d = load(p, fill_gaps=True)
    assert d.lengths == [60] and d.n_filled == 3 * 3  # 3 rows x (y, x, k)
    y0 = float(rows[29][2])
    for j in range(3):  # the last value carried: never the value after the gap
        assert d.target[0][30 + j] == y0
    assert d.filled_target[0][30:33].all() and d.filled_target[0].sum() == 3
    assert d.times[0][31] == np.datetime64("2020-03-02T07:00:00")


def test_irregular_step(tmp_path):
    p, _ = csv_with_cell(tmp_path / "i.csv", 25, 1, "2020-03-02T01:30:00")
    with pytest.raises(DataError, match="not a whole number of steps"):
        load(p)


def test_static_must_be_constant(tmp_path):
    p, _ = csv_with_cell(tmp_path / "s.csv", 5, 5, "2.5")
    with pytest.raises(DataError, match="static column 's' changes within entity 'a'"):
        load(p)


@pytest.mark.parametrize("kind", ["csv", "parquet", "frame"])
def test_a_written_index_is_not_a_default_observed_input(tmp_path, kind):
    """A table written with its pandas index (to_csv / to_parquet without index=False) is
    refused naming the column and the fix: the row numbers were silently an observed input."""
    import pandas as pd

    rows = hourly_rows(50)
    df = pd.DataFrame(rows, columns=HEADER).astype({c: float for c in HEADER[2:]})
    df.index = np.arange(len(df)) * 2  # a filtered frame's index (not a RangeIndex)
    kw = dict(time_col="ts", target_col="y", entity_col="id", known_cols="k", static_cols="s")
    if kind == "frame":
        df.to_csv(tmp_path / "d.csv")
        src: object = pd.read_csv(tmp_path / "d.csv")  # the index read back as "Unnamed: 0"
        load_df = from_dataframe
    else:
        src = tmp_path / f"d.{kind}"
        if kind == "csv":
            df.to_csv(src)
        else:
            df.to_parquet(src)
        load_df = load_csv
    with pytest.raises(DataError, match="look like the table's index .* index=False"):
        load_df(src, **kw)
    assert load_df(src, observed_cols="x", **kw).observed_names == ["x"]


@pytest.mark.parametrize("fill_gaps", [False, True])
def test_missing_static_value_names_no_fix_that_fails(tmp_path, fill_gaps):
    """A static column's missing cell is refused naming the column and the fix: the message
    said to pass --fill-gaps, which does not fill a static column (the same error followed)."""
    p, _ = csv_with_cell(tmp_path / "s.csv", 5, 5, "")
    with pytest.raises(
        DataError, match="line 7: column 's' [(]--static-cols[)] has a missing"
    ) as e:
        load(p, fill_gaps=fill_gaps, future_rows=True)
    assert "pass --fill-gaps" not in str(e.value)


def test_bad_time_values(tmp_path):
    p, _ = csv_with_cell(tmp_path / "t.csv", 3, 1, "yesterday")
    with pytest.raises(DataError, match="neither a number nor an ISO 8601"):
        load(p)
    p, _ = csv_with_cell(tmp_path / "t2.csv", 3, 1, "17")
    with pytest.raises(DataError, match="mixes date times and plain numbers"):
        load(p)


def test_empty_missing_and_short(tmp_path):
    with pytest.raises(DataError, match="no such file"):
        load(tmp_path / "nope.csv")
    (tmp_path / "e.csv").write_text("")
    with pytest.raises(DataError, match="empty"):
        load(tmp_path / "e.csv")
    p = write_csv(tmp_path / "h.csv", HEADER, [])
    with pytest.raises(DataError, match="no data rows"):
        load(p)
    d = load(write_csv(tmp_path / "short.csv", HEADER, hourly_rows(100)))
    # the training split holds a whole window (192 / 0.7 -> 275 steps), the others 24 steps
    with pytest.raises(DataError, match=r"split has no window.*= 192.*about 275 steps or more"):
        make_windows(d, history=168, horizon=24)
    two = load(write_csv(tmp_path / "two.csv", HEADER, hourly_rows(2)))
    # 1 training row; validation (0.15 of the span) must hold 24 forecast steps: 160 steps
    with pytest.raises(DataError, match=r"1 row\(s\) in the training split.*about 160 steps"):
        make_windows(two, history=24, horizon=24)


def test_bad_window_options(tmy3):
    with pytest.raises(ValueError, match="history must be a positive integer"):
        make_windows(tmy3, history=0)
    with pytest.raises(ValueError, match="season must be an integer"):
        make_windows(tmy3, history=12, horizon=6, season=24)
    with pytest.raises(ValueError, match="split must be"):
        make_windows(tmy3, split=(0.9, 0.5))
    with pytest.raises(ValueError, match=r"calendar features \['bogus'\] unknown"):
        make_windows(tmy3, calendar=("hour", "bogus"))
    with pytest.raises(ValueError, match=r"calendar features \['hour'\] named twice"):
        make_windows(tmy3, calendar=("hour", "dow", "hour"))  # two identical input variables
