"""Issue 20's data holes, one test of each kind: every bad table is a clear DataError.

Oracles: the CSV text written here (csv module), Python's datetime for time zones, hand counts
of the cells removed for --fill-gaps, and the same data read through another route (CSV vs
DataFrame vs Parquet vs byte-order mark).
"""

from __future__ import annotations

import csv
import gzip
import math
import re
from datetime import date, datetime, timedelta, timezone
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from nbqat.data import (
    MAX_FILL_FRACTION,
    DataError,
    from_dataframe,
    load_csv,
    make_windows,
)


def rows(n: int, entity: str = "a", seed: int = 0) -> list[list[str]]:
    rng = np.random.default_rng(seed)
    t0 = datetime(2020, 3, 1)
    return [
        [entity, (t0 + timedelta(hours=i)).isoformat(), f"{rng.normal():.4f}", f"{i % 7}"]
        for i in range(n)
    ]


HEADER = ["id", "ts", "y", "x"]
ARGS = dict(time_col="ts", target_col="y", entity_col="id")


def write(path: Path, body: list[list[str]], header=HEADER, encoding="utf-8") -> Path:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "wt", newline="", encoding=encoding) as f:  # type: ignore[operator]
        w = csv.writer(f)
        w.writerow(header)
        w.writerows(body)
    return path


def test_duplicate_column_names_are_refused(tmp_path):
    body = [r + [r[2]] for r in rows(30)]
    p = write(tmp_path / "d.csv", body, HEADER + ["y"])
    with pytest.raises(DataError, match=r"names column\(s\) \['y'\] more than once"):
        load_csv(p, **ARGS)
    df = pd.DataFrame(body, columns=HEADER + ["y"])
    with pytest.raises(DataError, match="more than once"):
        from_dataframe(df, **ARGS)


def test_mixed_utc_offsets_are_refused(tmp_path):
    body = rows(30)
    body[5][1] += "+02:00"
    with pytest.raises(DataError, match=r"line 7: column 'ts' mixes time zones"):
        load_csv(write(tmp_path / "z.csv", body), **ARGS)


def test_a_date_ending_in_a_day_is_no_utc_offset(tmp_path):
    # '2020-03-02' ends in '-02', which is no UTC offset: a day-first date among ISO dates
    # was reported as "mixes time zones: '2020-03-02' has a UTC offset", a false diagnosis
    body = [
        ["a", (date(2020, 3, 1) + timedelta(days=i)).isoformat(), "1.0", "2"] for i in range(30)
    ]
    body[4][1] = "05/03/2020"
    df = pd.DataFrame(body, columns=HEADER)
    for read in (lambda: load_csv(write(tmp_path / "d.csv", body), **ARGS),
                 lambda: from_dataframe(df, **ARGS)):  # fmt: skip
        with pytest.raises(DataError) as e:
            read()
        msg = str(e.value)
        assert "time zone" not in msg and "UTC offset" not in msg
        assert "'05/03/2020' is neither a number nor an ISO 8601 date" in msg
        assert "pd.to_datetime(df['ts']" in msg  # the pandas conversion that fixes it


def test_aware_offsets_convert_to_utc(tmp_path):
    # a DST change: -05:00 then -04:00, one hour apart in UTC
    t0 = datetime(2021, 3, 14, 0, tzinfo=timezone(timedelta(hours=-5)))
    body = []
    for i in range(30):
        t = (t0 + timedelta(hours=i)).astimezone(timezone(timedelta(hours=-4 if i > 2 else -5)))
        body.append(["a", t.isoformat(), str(i), "1"])
    d = load_csv(write(tmp_path / "a.csv", body), **ARGS)
    expect = [datetime.fromisoformat(r[1]).astimezone(timezone.utc) for r in body]
    got = [datetime.fromisoformat(str(t)).replace(tzinfo=timezone.utc) for t in d.times[0]]
    assert got == expect


@pytest.mark.parametrize("col, value, needle", [
    (2, "1e300", "column 'y' has a huge value 1e+300"),
    (3, "-1e300", "column 'x' has a huge value -1e+300"),
    (2, "inf", "column 'y' has a non-finite value inf"),
])  # fmt: skip
def test_huge_and_infinite_values(tmp_path, col, value, needle):
    body = rows(40)
    body[11][col] = value
    with pytest.raises(DataError, match="line 13: " + re.escape(needle)):
        load_csv(write(tmp_path / "h.csv", body), **ARGS)


def test_fill_gaps_counts_per_entity_and_column(tmp_path):
    a, b = rows(100, "a"), rows(100, "b", seed=1)
    del a[40:43]  # 3 missing steps: 3 cells of y and of x
    a[10][3] = ""  # one missing x
    b[7][2] = "NA"  # one missing y
    p = write(tmp_path / "f.csv", a + b)
    with pytest.raises(DataError, match="line 106: column 'y' has a missing value"):
        load_csv(p, **ARGS)
    d = load_csv(p, **ARGS, fill_gaps=True)
    assert d.filled == {"a": {"y": 3, "x": 4}, "b": {"y": 1}}
    assert d.n_filled == 8
    w = make_windows(d, history=24, horizon=6)
    assert w.summary()["filled"] == d.filled


def test_fill_gaps_refuses_beyond_the_documented_fraction(tmp_path):
    body = rows(100)
    n_missing = int(MAX_FILL_FRACTION * 100) + 1
    for r in body[20 : 20 + n_missing]:
        r[3] = ""
    with pytest.raises(DataError, match=rf"invent {n_missing} of 100 values.*column 'x'"):
        load_csv(write(tmp_path / "m.csv", body), **ARGS, fill_gaps=True)
    for r in body[20 + n_missing - 1 : 20 + n_missing]:
        r[3] = "1"
    d = load_csv(write(tmp_path / "m2.csv", body), **ARGS, fill_gaps=True)
    assert d.filled == {"a": {"x": n_missing - 1}}


def test_utf8_byte_order_mark(tmp_path):
    body = rows(30)
    plain = load_csv(write(tmp_path / "p.csv", body), **ARGS)
    bom = load_csv(write(tmp_path / "b.csv", body, encoding="utf-8-sig"), **ARGS)
    assert (tmp_path / "b.csv").read_bytes()[:3] == b"\xef\xbb\xbf"
    np.testing.assert_array_equal(plain.target[0], bom.target[0])
    np.testing.assert_array_equal(plain.times[0], bom.times[0])


def test_numeric_time_without_known_inputs(tmp_path):
    body = [[str(i), f"{math.sin(i / 3):.4f}"] for i in range(200)]
    d = load_csv(write(tmp_path / "n.csv", body, ["t", "v"]), time_col="t", target_col="v")
    with pytest.raises(DataError, match="no known input: the time axis is numeric.*time_index"):
        make_windows(d, history=24, horizon=6, calendar=("hour", "dow"))


def test_fractional_numeric_steps(tmp_path):
    body = [[repr(0.1 * i), f"{math.sin(i / 3):.4f}"] for i in range(200)]
    d = load_csv(write(tmp_path / "f.csv", body, ["t", "v"]), time_col="t", target_col="v")
    assert d.lengths == [200] and d.step == pytest.approx(0.1)
    np.testing.assert_allclose(d.times[0], [0.1 * i for i in range(200)], atol=1e-9)
    del body[50]
    with pytest.raises(DataError, match="gap in entity 'series': 1 missing step"):
        load_csv(write(tmp_path / "g.csv", body, ["t", "v"]), time_col="t", target_col="v")


def test_truncated_gzip(tmp_path):
    p = write(tmp_path / "t.csv.gz", rows(3000))
    data = p.read_bytes()
    p.write_bytes(data[: len(data) // 2])
    with pytest.raises(DataError, match=r"t\.csv\.gz: cannot read it .*truncated"):
        load_csv(p, **ARGS)


def test_history_shorter_than_season_names_history(tmp_path):
    d = load_csv(write(tmp_path / "s.csv", rows(300)), **ARGS)
    with pytest.raises(ValueError, match=r"--history 12 is shorter than the seasonal-naive period "
                       r"of 24 steps \(one day of"):  # fmt: skip
        make_windows(d, history=12, horizon=6)
    with pytest.raises(ValueError, match=r"period of 24 steps \(one day of"):  # said 'horizon'
        make_windows(d, history=12, horizon=24)


def test_an_entity_without_any_window_is_named(tmp_path):
    """A 20-row series beside a 300-row one (window 24 + 6) was taken silently: it got a
    standardisation and an entity id but no window in any split (the windows counted by hand
    below), so the model never saw it. Now a DataError names it and the fix; with a history
    that fits it, it trains."""
    d = load_csv(write(tmp_path / "s.csv", rows(300) + rows(20, "short", seed=1)), **ARGS)
    want = r"'short' \(20 rows\) has no window in any split: .* = 30 .*leave their rows out"
    with pytest.raises(DataError, match=want):
        make_windows(d, history=24, horizon=6, season=12)
    w = make_windows(d, history=12, horizon=6, season=12)
    assert int(np.sum(w.train.entity == 1)) == 20 - 12 - 6 + 1


def test_local_daily_dates_across_daylight_saving_name_the_fix():
    """Daily local midnights in Europe/Berlin (tz-aware, as pandas gives them) are read in
    UTC, 23 hours apart at the March change: refused as 'not a whole number of steps', with
    no fix. The message now says why and names pandas' tz_localize(None), with which the
    same frame loads as 60 days (pandas' own count of its dates)."""
    days = pd.date_range("2023-03-01", periods=60, freq="D", tz="Europe/Berlin")
    df = pd.DataFrame({"id": "a", "ts": days, "y": np.arange(60.0), "x": 1.0})
    with pytest.raises(DataError, match=r"not a whole number of steps .* 23 hours apart: a "
                       r"daylight-saving change.*df\[col\].dt.tz_localize\(None\)"):  # fmt: skip
        from_dataframe(df, **ARGS)
    d = from_dataframe(df.assign(ts=df.ts.dt.tz_localize(None)), **ARGS)
    assert d.lengths == [len(days.normalize().unique())]


def test_a_calendar_feature_named_as_a_column_points_to_calendar(tmp_path):
    """The tutorial's own data line (--known-cols hour,holiday) on a file without an 'hour'
    column said only that the header lacks it; 'hour' is a calendar feature, and the message
    now names --calendar. A real 'hour' column is still read as one."""
    p = write(tmp_path / "c.csv", rows(60))
    with pytest.raises(DataError, match=r"\['hour'\] that the header does not have \('hour': "
                       r"a calendar feature, .* --calendar hour"):  # fmt: skip
        load_csv(p, **ARGS, known_cols=["hour", "x"])
    with pytest.raises(DataError, match=r"\['temp'\] that the header does not have; "):
        load_csv(p, **ARGS, known_cols=["temp"])
    body = [r[:3] + [r[1][11:13]] for r in rows(60)]  # x -> the hour, as a column
    d = load_csv(write(tmp_path / "h.csv", body, header=["id", "ts", "y", "hour"]),
                 **ARGS, known_cols=["hour"])  # fmt: skip
    assert d.known_names == ["hour"]


def test_a_decimal_comma_names_the_conversion(tmp_path):
    """A European number ('0,5', as a German spreadsheet exports it) was refused as 'the
    target must hold numbers: choose a numeric one', as if the column were text; the message
    now names the conversion, in a CSV and a DataFrame, for the target and an input. The
    converted frame loads with the values float() gives."""
    body = [[r[0], r[1], r[2].replace(".", ","), r[3]] for r in rows(40)]
    df = pd.DataFrame(body, columns=HEADER)
    fix = r"non-numeric value '[-0-9]+,[0-9]+': a decimal comma .* decimal=','"
    with pytest.raises(DataError, match=r"line 2: column 'y' has a " + fix):
        load_csv(write(tmp_path / "c.csv", body), **ARGS)
    with pytest.raises(DataError, match=r"row 0: column 'y' has a " + fix):
        from_dataframe(df, **ARGS)
    with pytest.raises(DataError, match=r"column 'x' has a " + fix):
        from_dataframe(df.assign(y=1.0, x="0,25"), **ARGS)
    ok = from_dataframe(df.assign(y=df.y.str.replace(",", ".").astype(float)), **ARGS)
    assert ok.target[0].tolist() == [float(r[2].replace(",", ".")) for r in body]


def test_dataframe_and_parquet_match_csv(tmp_path):
    body = rows(60, "a") + rows(50, "b", seed=2)
    p = write(tmp_path / "u.csv", body)
    ref = load_csv(p, **ARGS)
    df = pd.read_csv(p)
    df["ts"] = pd.to_datetime(df["ts"])
    got = from_dataframe(df.sample(frac=1.0, random_state=0).sort_index(), **ARGS)
    df.to_parquet(tmp_path / "u.parquet")
    pq = load_csv(tmp_path / "u.parquet", **ARGS)
    for d in (got, pq):
        assert d.entity_names == ref.entity_names == ["a", "b"]
        for e in range(2):
            np.testing.assert_array_equal(d.target[e], ref.target[e])
            np.testing.assert_array_equal(d.observed[e], ref.observed[e])
            np.testing.assert_array_equal(d.times[e], ref.times[e])
    with pytest.raises(TypeError, match="pandas DataFrame"):
        from_dataframe(body, **ARGS)
    body[4][2] = "oops"
    bad = pd.DataFrame(body, columns=HEADER)
    with pytest.raises(DataError, match="DataFrame, row 4: column 'y' has a non-numeric value"):
        from_dataframe(bad, **ARGS)


def test_late_bad_value_in_a_big_file_names_its_line(tmp_path, monkeypatch):
    # more than one read block: the column types come from the first block, and a later row
    # that does not fit is still reported with its line
    from nbqat.data import _arrow

    monkeypatch.setattr(_arrow, "_BLOCK_BYTES", 1 << 12)
    n = 3000
    body = rows(n)
    body[-5][2] = "abc"
    p = write(tmp_path / "big.csv", body)
    assert p.stat().st_size > 20 * _arrow._BLOCK_BYTES
    d = load_csv(write(tmp_path / "ok.csv", rows(n)), **ARGS)  # many blocks, no error
    assert d.lengths == [n]
    with pytest.raises(DataError, match=f"line {n - 5 + 2}: column 'y' has a non-numeric value"):
        load_csv(p, **ARGS)
    body[-5][2] = "1.0"
    body[-3][1] += "+01:00"
    with pytest.raises(DataError, match=f"line {n - 3 + 2}: column 'ts' mixes time zones"):
        load_csv(write(tmp_path / "big2.csv", body), **ARGS)


def test_interleaved_entities_keep_file_order(tmp_path):
    a, b = rows(50, "a"), rows(50, "b", seed=1)
    mixed = [r for pair in zip(a, b) for r in pair]
    d = load_csv(write(tmp_path / "m.csv", mixed), **ARGS)
    ref = load_csv(write(tmp_path / "g.csv", a + b), **ARGS)
    assert d.entity_names == ["a", "b"]
    for e in range(2):
        np.testing.assert_array_equal(d.target[e], ref.target[e])
        np.testing.assert_array_equal(d.times[e], ref.times[e])
    mixed[7], mixed[9] = mixed[9], mixed[7]  # two rows of entity b swapped
    with pytest.raises(DataError, match=r"line 11: unsorted .* entity 'b' \(line 9 has"):
        load_csv(write(tmp_path / "u.csv", mixed), **ARGS)


def test_field_count_and_blank_lines_name_the_file_line(tmp_path):
    body = rows(40)
    body[9] = body[9] + ["5"]
    with pytest.raises(DataError, match=r"line 11: 5 fields, the header has 4"):
        load_csv(write(tmp_path / "f.csv", body), **ARGS)
    body = rows(40)
    body[20][2] = "abc"
    p = write(tmp_path / "b.csv", body)
    text = p.read_text().splitlines()
    text.insert(5, "")  # a blank line before the bad row: the bad row is now on line 23
    p.write_text("\n".join(text) + "\n")
    with pytest.raises(DataError, match=r"line 23: column 'y' has a non-numeric value 'abc'"):
        load_csv(p, **ARGS)


@pytest.mark.parametrize("value", ["", " ", "NaT"])
def test_blank_time_stamp(tmp_path, value):
    body = rows(30)
    body[4][1] = value
    with pytest.raises(DataError, match=r"line 6: column 'ts' \(--time-col\) has a missing value|"
                       r"line 6: time value 'NaT' is neither"):  # fmt: skip
        load_csv(write(tmp_path / "b.csv", body), **ARGS)


def test_split_target_matches_batch_without_gathering_inputs(tmp_path):
    d = load_csv(write(tmp_path / "t.csv", rows(200, "a") + rows(150, "b", seed=4)), **ARGS)
    w = make_windows(d, history=24, horizon=6)
    idx = np.array([0, 3, len(w.val) - 1])
    np.testing.assert_array_equal(w.val.target(idx), w.val.batch(idx)[3])
    np.testing.assert_array_equal(w.val.target(), w.val.batch()[3])
    # oracle: the standardised target from the raw series by hand
    e, r = int(w.val.entity[3]), int(w.val.rows[3]) - (0 if w.val.entity[3] == 0 else 200)
    raw = d.target[e][r : r + 6]
    np.testing.assert_allclose(w.val.target(idx)[1], (raw - w.level[e]) / w.scale[e], rtol=1e-6)


def test_non_finite_numeric_time(tmp_path):
    body = [[str(i), str(i % 5)] for i in range(50)] + [["inf", "1"]]
    with pytest.raises(DataError, match=r"line 52: column 't' \(--time-col\) has a non-finite"):
        load_csv(write(tmp_path / "n.csv", body, ["t", "v"]), time_col="t", target_col="v")


def test_from_dataframe_with_aware_datetimes_and_an_index():
    t = pd.date_range("2021-03-13", periods=72, freq="h", tz="America/New_York")  # a DST change
    df = pd.DataFrame({"ts": t, "y": np.arange(72.0), "x": 1.0}, index=np.arange(72) * 10)
    d = from_dataframe(df, time_col="ts", target_col="y")
    expect = [datetime.fromisoformat(str(v)).astimezone(timezone.utc).replace(tzinfo=None)
              for v in t]  # fmt: skip
    assert [datetime.fromisoformat(str(v)) for v in d.times[0]] == expect
    assert d.step == np.timedelta64(3600, "s") and d.lengths == [72]
    df.loc[df.index[5], "y"] = np.nan
    with pytest.raises(DataError, match="DataFrame, row 5: column 'y' has a missing value"):
        from_dataframe(df, time_col="ts", target_col="y")


@pytest.mark.parametrize(
    ("times", "spelled"),
    [
        (pd.date_range("2012-01-01", periods=60, freq="D").strftime("%Y%m%d"), "YYYYMMDD"),
        (pd.date_range("2012-01-01", periods=30, freq="MS").strftime("%Y%m"), "YYYYMM"),
    ],
)
@pytest.mark.parametrize("fill_gaps", [False, True])
def test_dates_spelled_as_numbers_are_named(times, spelled, fill_gaps):
    """Dates written as numbers (20120131, 201201) read as a numeric axis whose month or year
    ends are gaps of 69 or 88 steps: the error said to add the missing rows or pass
    --fill-gaps (which then refused to invent most of the values); it names the dates'
    spelling and how to convert them, with --fill-gaps too (no repair of such gaps is right)."""
    df = pd.DataFrame({"t": times.astype(np.int64), "y": np.arange(len(times), dtype=float)})
    with pytest.raises(DataError, match=f"dates spelled {spelled}: give it as dates") as ei:
        from_dataframe(df, time_col="t", target_col="y", fill_gaps=fill_gaps)
    assert "pass --fill-gaps" not in str(ei.value)
    years = pd.DataFrame({"t": np.arange(1700, 1760), "y": np.arange(60.0)})
    assert from_dataframe(years, time_col="t", target_col="y").step == 1.0  # plain numbers


@pytest.mark.parametrize("sep", [";", "\t"])
def test_a_file_separated_otherwise_than_by_commas_is_named(tmp_path, sep):
    """A semicolon-separated file (a European spreadsheet's export, decimal commas) or a
    tab-separated one reads as one column: the error listed that one column and said no
    more; it names the separator and how to convert the file."""
    p = tmp_path / "semi.csv"
    rows = [f"2024-01-{d:02d}{sep}1,5" for d in range(1, 20)]
    p.write_text("\n".join([f"t{sep}y", *rows]) + "\n")
    with pytest.raises(DataError, match=f"its header is separated by {re.escape(repr(sep))}"):
        load_csv(p, time_col="t", target_col="y")


def test_fill_gaps_does_not_extend_the_target_past_its_last_value():
    """A training table with the rows to forecast at its end (target empty, known columns
    filled: the file nbqat predict reads) was repaired by --fill-gaps with the last target
    value carried over those rows: invented actuals in the test split (and rows before the
    first value got the first one). Those rows are refused, named, and the fix said; a gap
    inside the series is still filled."""
    t = pd.date_range("2024-01-01", periods=200, freq="h")
    df = pd.DataFrame({"t": t, "y": np.sin(np.arange(200) / 5.0), "k": np.arange(200) % 2})
    df.loc[190:, "y"] = np.nan  # the last 10 hours: rows to forecast
    with pytest.raises(
        DataError,
        match=r"10 row\(s\) after its last 'y' value, from "
        r"2024-01-08T22:00:00 .* train on the rows from 2024-01-01T00:00:00 to "
        r"2024-01-08T21:00:00",
    ):
        from_dataframe(df, time_col="t", target_col="y", known_cols=["k"], fill_gaps=True)
    late = df.iloc[:190].copy()
    late.loc[:2, "y"] = np.nan  # a series that starts later (a wide table melted): the same
    with pytest.raises(DataError, match=r"3 row\(s\) before its first 'y' value, from "
                       r"2024-01-01T00:00:00 to 2024-01-01T02:00:00"):  # fmt: skip
        from_dataframe(late, time_col="t", target_col="y", fill_gaps=True)
    inner = df.iloc[:190].copy()
    inner.loc[50, "y"] = np.nan
    assert from_dataframe(inner, time_col="t", target_col="y", fill_gaps=True).n_filled == 1
    future = from_dataframe(df, time_col="t", target_col="y", known_cols=["k"],
                            future_rows=True)  # fmt: skip
    assert len(future.times[0]) == 200  # predict still reads them
