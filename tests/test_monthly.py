"""Monthly, quarterly and yearly dates: a calendar-month time axis (nbqat/data/_months.py).

Oracles: pandas' own ``date_range`` for the dates of each frequency (the loaded axis spelled
back, and the forecast dates after a series' last row), Python's ``datetime`` month numbers
for the month-of-year features, and a tiny train + predict on monthly data.
"""

from __future__ import annotations

import math
from datetime import datetime

import numpy as np
import pandas as pd
import pytest

from nbqat.data import DataError, from_dataframe, load_csv, make_windows
from nbqat.data._calendar import calendar_features, season_of
from nbqat.data._months import MONTH_END, month_dates
from nbqat.data._timecol import format_times

#: pandas frequency -> (first date, months per step, SeriesData.month_day)
FREQS = {
    "MS": ("2000-01-01", 1, 1),
    "ME": ("1999-11-30", 1, MONTH_END),
    "QS": ("2000-01-01", 3, 1),
    "QE": ("1999-12-31", 3, MONTH_END),
    "YS": ("1990-01-01", 12, 1),
    "YE": ("1990-12-31", 12, MONTH_END),
}


def _frame(dates, n_entities: int = 1) -> pd.DataFrame:
    n = len(dates)
    return pd.concat(
        [pd.DataFrame({"site": f"s{e}", "date": dates, "y": np.sin(np.arange(n) + e)})
         for e in range(n_entities)], ignore_index=True,
    )  # fmt: skip


@pytest.mark.parametrize("freq", sorted(FREQS))
def test_month_axes_against_pandas(freq, tmp_path):
    start, k, day = FREQS[freq]
    dates = pd.date_range(start, periods=40, freq=freq)
    path = tmp_path / "m.csv"
    _frame(dates.strftime("%Y-%m-%d"), 2).to_csv(path, index=False)
    s = load_csv(path, time_col="date", target_col="y", entity_col="site")
    assert s.times[0].dtype == np.dtype("datetime64[M]") and s.is_datetime
    assert int(s.step.astype(np.int64)) == k and s.month_day == day
    for t in s.times:  # the axis spelled back is the file's dates
        assert format_times(t, s.time_format, s.month_day) == list(dates.strftime("%Y-%m-%d"))
    # the dates after the last row: pandas' next dates of the frequency
    h = 7
    future = s.times[0][-1] + np.arange(1, h + 1) * s.step
    want = pd.date_range(dates[-1], periods=h + 1, freq=freq)[1:]
    assert list(month_dates(future, s.month_day)) == list(want.to_numpy().astype("M8[s]"))


def test_month_day_other_than_first(tmp_path):
    dates = pd.date_range("2000-01-15", periods=30, freq="MS") + pd.Timedelta(days=14)
    s = from_dataframe(_frame(dates), time_col="date", target_col="y", entity_col="site")
    assert s.month_day == 15
    assert list(month_dates(s.times[0], 15)) == list(dates.to_numpy().astype("M8[s]"))


def test_monthly_gap_needs_fill_gaps():
    dates = pd.date_range("2000-01-01", periods=40, freq="MS").delete([5])
    df = _frame(dates)
    with pytest.raises(DataError, match="1 missing step"):
        from_dataframe(df, time_col="date", target_col="y", entity_col="site")
    s = from_dataframe(df, time_col="date", target_col="y", entity_col="site", fill_gaps=True)
    assert s.n_filled == 1 and len(s.times[0]) == 40
    full = pd.date_range("2000-01-01", periods=40, freq="MS")
    assert list(month_dates(s.times[0], 1)) == list(full.to_numpy().astype("M8[s]"))


@pytest.mark.parametrize(
    "shift",
    [pd.Timedelta(days=3), pd.Timedelta(hours=6)],  # another day of month; not midnight
)
def test_irregular_month_dates_refused(shift):
    dates = pd.date_range("2000-01-01", periods=40, freq="MS").tolist()
    dates[5] = dates[5] + shift
    with pytest.raises(DataError, match="same day of month") as e:
        from_dataframe(_frame(dates), time_col="date", target_col="y", entity_col="site")
    assert "not a whole number of steps" in str(e.value)


def test_month_end_mixed_with_other_days_refused():
    dates = pd.date_range("2000-01-31", periods=40, freq="ME").tolist()
    dates[7] = dates[7] - pd.Timedelta(days=1)
    with pytest.raises(DataError, match=r"2000-08-30T00:00:00 is not on the last day"):
        from_dataframe(_frame(dates), time_col="date", target_col="y", entity_col="site")


@pytest.mark.parametrize("freq", ["1D", "7D", "28D"])
def test_day_steps_keep_their_seconds_axis(freq):
    """Days that happen to be the 1st (a 1-day step from 2000-01-01 ... ) and 28-day steps:
    every difference is the same number of seconds, so no calendar-month axis."""
    dates = pd.date_range("2000-01-01", periods=60, freq=freq)
    s = from_dataframe(_frame(dates), time_col="date", target_col="y", entity_col="site")
    assert s.times[0].dtype == np.dtype("datetime64[s]") and s.month_day == 0
    assert s.step == pd.Timedelta(freq).to_timedelta64()


def test_quarter_strings_name_the_fix_that_loads(tmp_path):
    """Quarters spelled as strings such as 2000Q1 (the str of pandas' quarterly Period) were
    refused as 'neither a number nor an ISO 8601 date time', naming no fix; now the message
    gives the quarter's start date and pandas' conversion, and the converted column loads as
    a 3-month axis (oracle: pandas' period_range start dates), as a Period column itself does
    (read as its periods' start times)."""
    from types import SimpleNamespace

    from nbqat.train.predict import parse_when

    periods = pd.period_range("1999Q3", periods=12, freq="Q")
    df = _frame([str(p) for p in periods], 2)
    with pytest.raises(DataError, match=r"row 0: time value '1999Q3' is a quarter, not a date "
                       r"time; give each quarter as the date it starts \(1999-07-01\), e.g. "
                       r"with pandas df\['date'\] = pd.PeriodIndex\(df\['date'\], freq='Q'\)"
                       r".to_timestamp\(\)"):  # fmt: skip
        from_dataframe(df, time_col="date", target_col="y", entity_col="site")
    df["date"] = pd.PeriodIndex(df["date"], freq="Q").to_timestamp()  # the fix as written
    s = from_dataframe(df, time_col="date", target_col="y", entity_col="site")
    assert s.times[0].dtype == np.dtype("datetime64[M]") and int(s.step.astype(int)) == 3
    assert s.month_day == 1
    want = periods.to_timestamp().to_numpy().astype("M8[s]")
    assert list(month_dates(s.times[0], s.month_day)) == list(want)
    df["date"] = periods.append(periods)  # a Period column: its start times, the same axis
    p = from_dataframe(df, time_col="date", target_col="y", entity_col="site")
    assert list(month_dates(p.times[0], p.month_day)) == list(want)
    sc = SimpleNamespace(is_datetime=True, month_day=1)
    with pytest.raises(DataError, match=r"--at '2001Q4' is not a time.*a quarter.*2001-10-01"):
        parse_when("2001Q4", sc)
    assert parse_when("2001-10-01", sc) == np.datetime64("2001-10", "M")


def test_two_rows_a_month_apart_on_the_first():
    """Every difference equal in seconds (one difference): the seconds axis, as before."""
    dates = pd.to_datetime(["2000-01-01", "2000-02-01"])
    s = from_dataframe(_frame(dates), time_col="date", target_col="y", entity_col="site")
    assert s.month_day == 0 and s.step == np.timedelta64(31 * 86400, "s")


@pytest.mark.parametrize("freq", ["MS", "ME", "QS", "YS"])
def test_month_of_year_features(freq):
    start, _, _ = FREQS[freq]
    dates = pd.date_range(start, periods=30, freq=freq)
    s = from_dataframe(_frame(dates), time_col="date", target_col="y", entity_col="site")
    feats, names = calendar_features(s.times[0])
    assert names == ["doy_sin", "doy_cos"]
    for row, d in zip(feats, dates.to_pydatetime()):
        assert isinstance(d, datetime)
        ang = 2 * math.pi * (d.month - 1) / 12
        assert row[0] == pytest.approx(math.sin(ang), abs=1e-15)
        assert row[1] == pytest.approx(math.cos(ang), abs=1e-15)


def test_hourly_calendar_features_unchanged():
    t = np.arange("2001-01-01T00", "2001-01-03T00", dtype="datetime64[h]").astype("M8[s]")
    feats, names = calendar_features(t)
    assert names == ["hour_sin", "hour_cos", "doy_sin", "doy_cos", "day_of_week"]
    assert feats[1, 0] == pytest.approx(math.sin(2 * math.pi / 24))


@pytest.mark.parametrize(
    "freq, season, words",
    [("MS", 12, "one year"), ("2MS", 6, "one year"), ("QS", 4, "one year"),
     ("YS", 5, "one horizon"), ("5MS", 5, "one horizon")],
)  # fmt: skip
def test_season_of_month_axes(freq, season, words):
    dates = pd.date_range("1990-01-01", periods=30, freq=freq)
    s = from_dataframe(_frame(dates), time_col="date", target_col="y", entity_col="site")
    assert season_of(s, 5) == (season, words)


def test_month_windows_use_month_features_only():
    dates = pd.date_range("1990-01-01", periods=120, freq="MS")
    s = from_dataframe(_frame(dates), time_col="date", target_col="y", entity_col="site")
    w = make_windows(s, history=24, horizon=6, calendar=("hour", "doy", "dow", "time_index"))
    assert w.scaling.calendar_names == ["doy_sin", "doy_cos"] and w.scaling.month_day == 1
    assert w.scaling.step == 1.0 and w.season == 12
    # time_index runs over months: t0 the first month, one step per month
    months = s.times[0].astype(np.int64).astype(np.float64)
    assert w.scaling.t0 == months[0]
    with pytest.raises(DataError, match="no known input"):
        make_windows(s, history=24, horizon=6, calendar=("hour", "dow"))


def test_step_check_between_month_and_day_axes():
    from nbqat.data._forecast import _check_roles

    monthly = from_dataframe(
        _frame(pd.date_range("1990-01-01", periods=120, freq="MS")), time_col="date",
        target_col="y", entity_col="site",
    )  # fmt: skip
    daily = from_dataframe(
        _frame(pd.date_range("1990-01-01", periods=120, freq="D")), time_col="date",
        target_col="y", entity_col="site",
    )  # fmt: skip
    quarterly = from_dataframe(
        _frame(pd.date_range("1990-01-01", periods=120, freq="QS")), time_col="date",
        target_col="y", entity_col="site",
    )  # fmt: skip
    sc_m = make_windows(monthly, history=24, horizon=6).scaling
    sc_d = make_windows(daily, history=24, horizon=6).scaling
    with pytest.raises(DataError, match="time step is 1 day but .* of 1 month"):
        _check_roles(daily, sc_m)
    with pytest.raises(DataError, match="time step is 1 month but .* of 1 day"):
        _check_roles(monthly, sc_d)
    with pytest.raises(DataError, match="time step is 3 months but .* of 1 month"):
        _check_roles(quarterly, sc_m)
    secondly = from_dataframe(  # the same step number (1), in seconds: still refused
        _frame(pd.date_range("1990-01-01", periods=120, freq="1s")), time_col="date",
        target_col="y", entity_col="site",
    )  # fmt: skip
    with pytest.raises(DataError, match="time step is 1 second but .* of 1 month"):
        _check_roles(secondly, sc_m)
    _check_roles(monthly, sc_m)


TINY = dict(epochs=1, qat_epochs=1, batch_size=16, hidden_dim=4, heads=1, horizon=12,
            windows_per_epoch=32, calibration_batches=2, progress=False, plots=False)  # fmt: skip


@pytest.fixture(scope="module")
def monthly_run(tmp_path_factory):
    """A tiny run on 20 years of month-end data (2 entities), fitted from a DataFrame."""
    import nbqat

    dates = pd.date_range("2000-01-31", periods=240, freq="ME")
    rng = np.random.default_rng(0)
    df = pd.concat(
        [pd.DataFrame({"site": f"s{e}", "date": dates,
                       "y": 10 + e + np.sin(np.arange(240) * 2 * np.pi / 12)
                       + rng.normal(0, 0.1, 240)}) for e in range(2)], ignore_index=True,
    )  # fmt: skip
    out = tmp_path_factory.mktemp("monthly")
    fc = nbqat.Forecaster(out=str(out / "run"), overwrite=True, **TINY)
    fc.fit(df, time_col="date", target_col="y", entity_col="site")
    return fc, df, dates


def test_forecaster_monthly_fit_predict(monthly_run):
    fc, df, dates = monthly_run
    data = fc.metrics["data"]
    assert data["history"] == 24 and data["season"] == 12  # max(24, one year); one year
    assert data["future_inputs"] == ["doy_sin", "doy_cos"]  # the default calendar: doy
    want = pd.date_range(dates[-1], periods=13, freq="ME")[1:]
    for engine in ("onnx", "int8"):
        out = fc.predict(engine=engine)
        assert list(out.entity.unique()) == ["s0", "s1"]
        for _, g in out.groupby("entity"):
            assert list(pd.to_datetime(g.time)) == list(want)
            assert list(g.step) == list(range(1, 13))
    a, b = fc.predict(engine="onnx"), fc.predict(engine="int8")
    np.testing.assert_allclose(a[["p10", "p50", "p90"]], b[["p10", "p50", "p90"]], rtol=1e-4)
    from nbqat.train.predict import load_run, run_info

    info = run_info(*load_run(fc.run_dir))  # model.onnx's metadata: the step in months
    assert info["step_months"] == 1 and info["step_seconds"] is None
    assert info["scaling"]["month_day"] == MONTH_END and info["scaling"]["step"] == 1.0
    at = fc.predict(at="2010-03-31", engine="int8")  # an origin inside the data
    assert pd.to_datetime(at.time.iloc[0]) == pd.Timestamp("2010-03-31")
    assert at.actual.notna().all()


def test_cli_predict_monthly_run_and_daily_data_refused(monthly_run, tmp_path):
    from nbqat.cli import main

    fc, df, dates = monthly_run
    data = tmp_path / "m.csv"
    df.assign(date=df.date.dt.strftime("%Y-%m-%d")).to_csv(data, index=False)
    out = tmp_path / "f.csv"
    assert main(["predict", str(fc.run_dir), "--csv", str(data), "--engine", "int8",
                 "--out", str(out)]) == 0  # fmt: skip
    got = pd.read_csv(out)
    want = pd.date_range(dates[-1], periods=13, freq="ME")[1:].strftime("%Y-%m-%d")
    assert list(got[got.entity == "s0"].time) == list(want)  # month-end spelled as given
    bt = tmp_path / "bt.csv"
    assert main(["backtest", str(fc.run_dir), "--csv", str(data), "--engine", "int8",
                 "--stride", "12", "--out", str(bt)]) == 0  # fmt: skip
    got = pd.read_csv(bt)
    origins = pd.to_datetime(got.origin.unique())
    assert len(origins) >= 2 and all(o.is_month_end for o in origins)
    assert list(origins) == list(pd.date_range(origins[0], periods=len(origins), freq="12ME"))
    first = got[(got.entity == "s0") & (got.origin == got.origin.iloc[0])]
    assert list(first.time) == list(
        pd.date_range(origins[0], periods=12, freq="ME").strftime("%Y-%m-%d")
    )
    daily = tmp_path / "d.csv"
    days = pd.date_range("2000-01-01", periods=400, freq="D").strftime("%Y-%m-%d")
    pd.DataFrame({"site": "s0", "date": days, "y": 1.0}).to_csv(daily, index=False)
    with pytest.raises(DataError, match="time step is 1 day but the model was trained on a "
                       "time step of 1 month"):  # fmt: skip
        fc.predict(pd.read_csv(daily))
    assert main(["predict", str(fc.run_dir), "--csv", str(daily), "--out",
                 str(tmp_path / "x.csv")]) == 2  # fmt: skip


@pytest.mark.parametrize(
    "other, words",
    [(pd.date_range("2000-01-31", periods=30, freq="ME"), "the last day of their month"),
     (pd.date_range("2000-01-15", periods=30, freq="MS") + pd.Timedelta(days=14),
      "day 15 of the month")],
)  # fmt: skip
def test_entities_on_different_days_of_month_named(other, words, tmp_path):
    """One entity on the 1st, another on another day (each regular on its own): the message
    names the entity off the first one's day and that day; it blamed the regular first
    entity ('not a whole number of steps') without naming a date."""
    first = pd.date_range("2000-01-01", periods=30, freq="MS")
    df = pd.concat([_frame(first), _frame(other).assign(site="s1")], ignore_index=True)
    path = tmp_path / "mixed.csv"
    df.assign(date=pd.to_datetime(df.date).dt.strftime("%Y-%m-%d")).to_csv(path, index=False)
    want = f"entity 's1' has its dates on {words} and entity 's0' on day 1 of the month"
    with pytest.raises(DataError, match=want) as e:
        from_dataframe(df, time_col="date", target_col="y", entity_col="site")
    assert "row 30" in str(e.value)  # s1's first row
    with pytest.raises(DataError, match=want):
        load_csv(path, time_col="date", target_col="y", entity_col="site")
    # each entity alone is a calendar-month axis
    for d in (first, other):
        s = from_dataframe(_frame(d), time_col="date", target_col="y", entity_col="site")
        assert s.times[0].dtype == np.dtype("datetime64[M]")
    # one difference per entity, the same number of seconds (31 days): a seconds axis, as before
    a = _frame(pd.to_datetime(["2000-01-01", "2000-02-01"]))
    two = pd.concat([a, _frame(pd.to_datetime(["2000-03-15", "2000-04-15"])).assign(site="s1")])
    s = from_dataframe(two, time_col="date", target_col="y", entity_col="site")
    assert s.month_day == 0 and s.step == np.timedelta64(31 * 86400, "s")


def test_year_month_values_spelled_back_as_given(monthly_run, tmp_path):
    """Year-month values (``2000-01``: ISO 8601 for a month) were read but their forecasts
    spelled ``2020-01-01``: not the data's spelling, so they did not join back onto it."""
    from nbqat.cli import main

    fc, df, dates = monthly_run
    months = pd.PeriodIndex(dates, freq="M")
    path = tmp_path / "ym.csv"
    df.assign(date=np.tile(months.strftime("%Y-%m"), 2)).to_csv(path, index=False)
    s = load_csv(path, time_col="date", target_col="y", entity_col="site")
    assert s.month_day == 1 and s.time_format == "%Y-%m"
    assert format_times(s.times[0], s.time_format, s.month_day) == list(months.strftime("%Y-%m"))
    out = tmp_path / "f.csv"
    assert main(["predict", str(fc.run_dir), "--csv", str(path), "--engine", "int8",
                 "--out", str(out)]) == 0  # fmt: skip
    got = pd.read_csv(out)
    want = pd.period_range(months[-1] + 1, periods=12, freq="M").strftime("%Y-%m")
    assert list(got[got.entity == "s1"].time) == list(want)
    # a date off the 1st (or a time of day) keeps its day in that spelling
    assert format_times(np.array(["2000-01-15"], "M8[s]"), "%Y-%m") == ["2000-01-15"]
    hours = np.array(["2000-01-01", "2000-01-01T06:00"], "M8[s]")
    assert format_times(hours, "%Y-%m") == ["2000-01-01T00:00:00", "2000-01-01T06:00:00"]


def test_few_yearly_rows_365_days_apart_forecast_by_a_yearly_run(tmp_path):
    """A yearly run (history 3) given just its history rows, 2001-12-31 .. 2003-12-31: each
    difference is 365 days, so the loader keeps that step in seconds, and predict refused the
    data ('time step is 365 days but the model was trained on a time step of 12 months'). Now
    such rows are put on the run's calendar-month axis: the forecasts equal those of the
    whole series up to 2003 (the same history rows), on pandas' next year ends."""
    import nbqat

    dates = pd.date_range("1950-12-31", periods=60, freq="YE")
    df = pd.DataFrame({"date": dates.strftime("%Y-%m-%d"), "y": np.sin(np.arange(60.0))})
    kw = {**TINY, "horizon": 2, "history": 3}
    fc = nbqat.Forecaster(out=str(tmp_path / "run"), **kw).fit(df, time_col="date", target_col="y")
    upto = df[df.date < "2004"]
    tail = upto.iloc[-3:]
    assert from_dataframe(tail, time_col="date", target_col="y").month_day == 0  # as before
    got, want = fc.predict(tail, engine="int8"), fc.predict(upto, engine="int8")
    assert list(got.time) == list(pd.date_range("2003-12-31", periods=3, freq="YE")[1:]
                                  .strftime("%Y-%m-%d"))  # fmt: skip
    pd.testing.assert_frame_equal(got, want)


@pytest.mark.parametrize("tz", ["Europe/Berlin", "America/New_York"])
def test_local_month_starts_with_an_offset_explained(tz):
    """Local midnights with a UTC offset are read in UTC (23:00 or 05:00 the day before or
    after): the hint said only 'all at midnight' of times the user wrote at midnight; it now
    names the first one not at midnight in UTC and says why. In UTC they are months."""
    dates = pd.date_range("2000-01-01", periods=30, freq="MS", tz=tz)
    first = pd.Timestamp(dates[0]).tz_convert("UTC").tz_localize(None).isoformat()
    with pytest.raises(DataError, match="not a whole number of steps") as e:
        from_dataframe(_frame(dates), time_col="date", target_col="y", entity_col="site")
    assert f"({first} is not at midnight; date times with a UTC offset are read in UTC" in str(
        e.value
    )
    utc = from_dataframe(
        _frame(dates.tz_localize(None).tz_localize("UTC")), time_col="date", target_col="y",
        entity_col="site",
    )  # fmt: skip
    assert utc.month_day == 1


def test_default_backtest_of_entities_on_other_quarters(tmp_path):
    """Quarters from January (s0) and from February (s1): the default backtest start, the
    run's test split start (a January), is on s0's grid only, and the backtest stopped with
    "--start ... is not on entity 's1''s time grid" though no --start was given. Now each
    entity starts at its first quarter on or after it (pandas' dates as the oracle); s0's
    origins are those of that start given explicitly."""
    import nbqat

    df = pd.concat(
        [_frame(pd.date_range(start, periods=100, freq="3MS"), 1).assign(site=f"s{e}")
         for e, start in enumerate(["2000-01-01", "2000-02-01"])], ignore_index=True,
    )  # fmt: skip
    kw = {**TINY, "horizon": 4}
    fc = nbqat.Forecaster(out=str(tmp_path / "run"), **kw)
    fc.fit(df, time_col="date", target_col="y", entity_col="site")
    test_start = pd.Timestamp(fc.metrics["data"]["test_start"])
    bt = fc.backtest(engine="int8")
    for e, g in bt.groupby("entity"):
        dates = pd.to_datetime(df[df.site == e].date)
        first = dates[dates >= test_start].iloc[0]
        last = dates.iloc[-4]  # the last origin whose 4 steps have actuals
        want = pd.date_range(first, last, freq="12MS")  # every horizon (4 quarters)
        assert list(pd.to_datetime(g.origin.unique())) == list(want)
    explicit = fc.backtest(start=str(test_start.date()), engine="int8", data=df[df.site == "s0"])
    assert explicit.origin.dtype == df.date.dtype  # a DataFrame's keys come back in its dtypes
    text = bt[bt.entity == "s0"].reset_index(drop=True)  # the run's own data: as spelled
    text[["origin", "time"]] = text[["origin", "time"]].apply(pd.to_datetime).astype(df.date.dtype)
    pd.testing.assert_frame_equal(explicit, text, check_like=True)


def test_weekly_data_reads_the_time_of_year_not_a_constant_weekday(tmp_path):
    """Weekly dates all fall on one weekday: the default calendar (hour, dow) gave the decoder
    one constant input, so an LSTM forecast the same value for every week of its horizon (the
    co2 weekly set: 13 identical rows, test P50 0.0050 against 0.0027 with doy). The weekday
    is left out at whole weeks as the hour is at whole days, and weekly data defaults to the
    time of year, as monthly data does."""
    from nbqat.train import TrainConfig
    from nbqat.train.model import load_data

    t = pd.date_range("2000-01-01", periods=400, freq="7D")
    y = 10 + np.sin(2 * np.pi * t.day_of_year / 365.25) + np.arange(400) * 1e-3
    p = tmp_path / "weekly.csv"
    pd.DataFrame({"t": t.strftime("%Y-%m-%d"), "y": y}).to_csv(p, index=False)
    cfg = TrainConfig(csv=str(p), time_col="t", target_col="y", history=52, horizon=4,
                      eval_stride=2).resolved()  # fmt: skip
    w = load_data(cfg)
    assert cfg.calendar == "doy" and w.future_names == ["doy_sin", "doy_cos"]
    weekly = load_csv(p, time_col="t", target_col="y")
    with pytest.raises(DataError, match="add one of doy, time_index to --calendar"):
        make_windows(weekly, history=52, horizon=4, calendar=["hour", "dow"])
    daily = from_dataframe(pd.DataFrame({"t": pd.date_range("2000-01-01", periods=400),
                                         "y": y}), time_col="t", target_col="y")  # fmt: skip
    assert make_windows(daily, history=8, horizon=4, calendar=["hour", "dow"]).future_names == [
        "day_of_week"
    ]


def test_weekly_seasonal_naive_repeats_last_year(tmp_path):
    """The weekly seasonal naive repeated the last horizon (season 4 with --horizon 4: the
    weeks just before, not the same weeks a year ago); it is now 52 weeks back (pandas'
    shift), as monthly data's is 12 months, and --history defaults to it."""
    from nbqat.train import TrainConfig
    from nbqat.train.baselines import seasonal_naive_forecast
    from nbqat.train.model import load_data

    t = pd.date_range("2000-01-02", periods=300, freq="7D")
    y = 10 + np.sin(2 * np.pi * t.day_of_year / 365.25) + np.arange(300) * 1e-3
    df = pd.DataFrame({"t": t.strftime("%Y-%m-%d"), "y": y})
    df.to_csv(tmp_path / "w.csv", index=False)
    w = make_windows(from_dataframe(df, time_col="t", target_col="y"), history=60, horizon=4,
                     calendar=["doy"])  # fmt: skip
    assert w.season == 52
    lagged = df.set_index("t").y.shift(52).to_numpy()  # the same week a year earlier
    want = lagged[w.test.rows[:, None] + np.arange(4)]
    np.testing.assert_array_equal(seasonal_naive_forecast(w.test)[1], want)
    cfg = TrainConfig(csv=str(tmp_path / "w.csv"), time_col="t", target_col="y", horizon=4,
                      eval_stride=2).resolved()  # fmt: skip
    assert load_data(cfg).history == 52
    with pytest.raises(ValueError, match="period of 52 steps \\(one year"):
        make_windows(from_dataframe(df, time_col="t", target_col="y"), history=8, horizon=4)


def test_yearly_dates_have_no_constant_month_feature(tmp_path):
    """Yearly dates all fall in one month, so the month of year (doy_sin, doy_cos) was one
    constant input at every step (0 and 1: wasted, and the default calendar's only feature);
    it is left out at whole years as the weekday is at whole weeks, and yearly data defaults
    to time_index; quarterly data keeps it (pandas: 4 distinct months)."""
    from nbqat.train import TrainConfig
    from nbqat.train.model import load_data

    t = pd.date_range("1900-01-01", periods=120, freq="YS")
    assert t.month.nunique() == 1  # the oracle: one month of year
    df = pd.DataFrame({"t": t.strftime("%Y-%m-%d"), "y": 10 + np.sin(np.arange(120.0))})
    yearly = from_dataframe(df, time_col="t", target_col="y")
    w = make_windows(yearly, history=8, horizon=4, calendar=["doy", "time_index"])
    assert w.future_names == ["time_index"]
    assert np.all(w.future_features.std(axis=0) > 0)
    with pytest.raises(DataError, match="add one of time_index to --calendar"):
        make_windows(yearly, history=8, horizon=4, calendar=["doy"])
    df.to_csv(tmp_path / "y.csv", index=False)
    cfg = TrainConfig(csv=str(tmp_path / "y.csv"), time_col="t", target_col="y", history=8,
                      horizon=4, eval_stride=2).resolved()  # fmt: skip
    assert load_data(cfg).future_names == ["time_index"] and cfg.calendar == "time_index"
    q = pd.date_range("1900-01-01", periods=120, freq="QS")
    assert q.month.nunique() == 4
    quarterly = from_dataframe(df.assign(t=q.strftime("%Y-%m-%d")), time_col="t", target_col="y")
    assert make_windows(quarterly, history=8, horizon=4, calendar=["doy"]).future_names == [
        "doy_sin", "doy_cos"
    ]  # fmt: skip
