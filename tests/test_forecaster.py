"""Forecasting the future on held-back data of another kind than the shipped one.

A synthetic hourly demand table (three sites, a holiday flag and a price known in advance, a
temperature observed) is built here: ``nbqat predict`` forecasts the steps after the last
demand value (rows with the demand empty and the known columns filled), ``--at`` gives actuals,
the onnxruntime example of docs/export.md reproduces ``nbqat predict`` without nbqat, and
``nbqat.Forecaster`` gives the CLI's numbers.
"""

from __future__ import annotations

import os
import re
import shutil
import stat
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from nbqat.cli import main
from nbqat.data import DataError

TAU, K = 6, 24
TINY = [
    "--epochs", "1", "--qat-epochs", "1", "--batch-size", "16", "--hidden-dim", "4",
    "--heads", "1", "--history", str(K), "--horizon", str(TAU), "--windows-per-epoch", "32",
    "--calibration-batches", "2", "--eval-stride", "48", "--no-progress", "--no-plots",
]  # fmt: skip
COLS = [
    "--time-col", "ts", "--target-col", "demand", "--entity-col", "site",
    "--known-cols", "holiday,price", "--observed-cols", "temp",
]  # fmt: skip
ROOT = Path(__file__).resolve().parents[1]
#: TINY and COLS as Forecaster / fit keywords.
TINY_KW = dict(epochs=1, qat_epochs=1, batch_size=16, hidden_dim=4, heads=1, history=K,
               horizon=TAU, windows_per_epoch=32, calibration_batches=2, eval_stride=48,
               progress=False, plots=False)  # fmt: skip
COLS_KW = dict(time_col="ts", target_col="demand", entity_col="site", observed_cols=["temp"],
               known_cols=["holiday", "price"])  # fmt: skip


def _demand(days: int = 30) -> pd.DataFrame:
    """Hourly demand of three sites (daily cycle, holidays, price response, noise)."""
    rng = np.random.default_rng(7)
    parts = []
    for i, site in enumerate(["north", "south", "east"]):
        t = pd.date_range("2024-03-01", periods=24 * days, freq="h")
        hol = ((t.day_of_week >= 5) | (t.day == 15)).astype(int)
        price = 20 + 5 * np.sin(np.arange(len(t)) / 17.0) + rng.normal(0, 1, len(t))
        temp = 10 + 8 * np.sin(2 * np.pi * (t.hour - 6) / 24) + rng.normal(0, 1, len(t))
        y = (100 * (i + 1) + 30 * np.sin(2 * np.pi * t.hour / 24) - 25 * hol - 1.5 * price
             + rng.normal(0, 3, len(t)))  # fmt: skip
        parts.append(pd.DataFrame({"site": site, "ts": t.strftime("%Y-%m-%d %H:%M"),
                                   "demand": y.round(2), "temp": temp.round(2),
                                   "holiday": hol, "price": price.round(3)}))  # fmt: skip
    return pd.concat(parts, ignore_index=True)


@pytest.fixture(scope="module")
def demand(tmp_path_factory):
    """(folder, full frame, train CSV, future CSV, trained run)."""
    d = tmp_path_factory.mktemp("demand")
    full = _demand()
    last = full.groupby("site").cumcount(ascending=False) < TAU  # the last 6 h of each site
    full[~last].to_csv(d / "train.csv", index=False)
    fut = full.copy()
    fut.loc[last, ["demand", "temp"]] = np.nan  # the future: demand unknown, covariates known
    fut.to_csv(d / "future.csv", index=False)
    run = d / "run"
    assert main(["train", *TINY, *COLS, "--csv", str(d / "train.csv"), "--out", str(run)]) == 0
    return d, full, d / "train.csv", d / "future.csv", run


def _fails(argv, capsys, needle: str, out: Path | None = None) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and needle in err, err
    if out is not None:
        assert not out.exists()
    return err


def test_predict_forecasts_the_future_from_future_rows(demand, tmp_path):
    d, full, _, fut, run = demand
    old = os.umask(0o022)
    try:
        out = tmp_path / "f.csv"
        assert main(["predict", str(run), "--csv", str(fut), "--out", str(out)]) == 0
    finally:
        os.umask(old)
    assert stat.S_IMODE(out.stat().st_mode) == 0o644
    got = pd.read_csv(out)
    assert list(got.columns) == ["entity", "time", "step", "p10", "p50", "p90"]
    raw = pd.read_csv(fut)
    for site, g in got.groupby("entity", sort=False):
        r = raw[raw.site == site]
        last_t = pd.Timestamp(r.ts[r.demand.notna()].iloc[-1])  # oracle: the raw file
        want = [last_t + pd.Timedelta(hours=h) for h in range(1, TAU + 1)]
        assert [pd.Timestamp(x) for x in g.time] == want
        assert g.time.iloc[0] == want[0].strftime("%Y-%m-%d %H:%M")  # the data's spelling
        assert list(g.step) == list(range(1, TAU + 1))
        assert np.all(g.p10 <= g.p90)
    # the model's run files honour the umask as well
    for f in ("metrics.json", "summary.txt", "model.onnx", "checkpoint/state.json"):
        assert stat.S_IMODE((run / f).stat().st_mode) & 0o044 == 0o044, f


def test_future_known_values_are_used_and_scaling_is_not_refitted(demand, tmp_path):
    d, full, _, fut, run = demand
    a, b, c = tmp_path / "a.csv", tmp_path / "b.csv", tmp_path / "c.csv"
    assert main(["predict", str(run), "--csv", str(fut), "--out", str(a)]) == 0
    raw = pd.read_csv(fut)
    raw.loc[raw.demand.isna(), "price"] += 25.0  # a price shock in the future rows only
    raw.to_csv(tmp_path / "shock.csv", index=False)
    assert main(["predict", str(run), "--csv", str(tmp_path / "shock.csv"), "--out", str(b)]) == 0
    assert not np.allclose(pd.read_csv(a).p50, pd.read_csv(b).p50)
    # only the last three days given: the same forecast (the run's scaling, not the data's)
    short = pd.read_csv(fut).groupby("site").tail(72)
    short.to_csv(tmp_path / "short.csv", index=False)
    assert main(["predict", str(run), "--csv", str(tmp_path / "short.csv"), "--out", str(c)]) == 0
    np.testing.assert_allclose(pd.read_csv(c)[["p10", "p50", "p90"]],
                               pd.read_csv(a)[["p10", "p50", "p90"]], rtol=1e-5)  # fmt: skip


def test_bad_inputs(demand, tmp_path, capsys):
    d, full, train, fut, run = demand
    out = tmp_path / "x.csv"
    base = ["predict", str(run), "--out", str(out)]
    # no future rows: the known columns are needed, no silent zero-fill
    err = _fails([*base, "--csv", str(train)], capsys, "['holiday', 'price']", out)
    assert "add the rows from 2024-03-30 18:00" in err
    # a future row with a known value missing
    raw = pd.read_csv(fut)
    i = raw.index[raw.demand.isna() & (raw.site == "south")][2]
    raw.loc[i, "price"] = np.nan
    raw.to_csv(tmp_path / "hole.csv", index=False)
    err = _fails([*base, "--csv", str(tmp_path / "hole.csv")], capsys, "'price'", out)
    assert "2024-03-30 20:00" in err and "south" in err
    # an --at outside the data
    _fails([*base, "--csv", str(fut), "--at", "2025-01-01T00:00"], capsys, "outside the data", out)
    _fails([*base, "--csv", str(fut), "--at", "2024-03-01T03:00"], capsys, "outside the data", out)
    # an --out that exists is refused, --overwrite replaces it
    out.write_text("keep\n")
    _fails([*base, "--csv", str(fut)], capsys, "--overwrite")
    assert out.read_text() == "keep\n"
    assert main([*base, "--csv", str(fut), "--overwrite"]) == 0
    # an entity the run does not know
    raw = pd.read_csv(fut)
    raw.loc[raw.site == "east", "site"] = "west"
    raw.to_csv(tmp_path / "west.csv", index=False)
    _fails([*base, "--overwrite", "--csv", str(tmp_path / "west.csv")], capsys, "'west'")
    # a column the run was trained with is missing: the error names the run's columns
    pd.read_csv(fut).rename(columns={"ts": "when"}).to_csv(tmp_path / "when.csv", index=False)
    err = _fails([*base, "--overwrite", "--csv", str(tmp_path / "when.csv")], capsys, "['ts']")
    assert "the run's columns" in err and "time_col='ts'" in err and "target_col='demand'" in err
    # no rows after the last target value for the known columns: the error also offers --at
    err = _fails([*base, "--overwrite", "--csv", str(train)], capsys, "--at TIME")
    # a value error prints one line, not the usage block
    with pytest.raises(SystemExit) as ex:
        main(["train", "--epochs", "0", "--out", str(tmp_path / "r")])
    err = capsys.readouterr().err.strip()
    assert ex.value.code == 2 and len(err.splitlines()) == 1 and "--epochs" in err, err


def test_at_gives_actuals_and_backtest_q_risk(demand, tmp_path, capsys):
    d, full, _, fut, run = demand
    out = tmp_path / "at.csv"
    assert main(["predict", str(run), "--csv", str(fut), "--at", "2024-03-28 05:00",
                 "--out", str(out)]) == 0  # fmt: skip
    got = pd.read_csv(out)
    assert list(got.columns)[-1] == "actual"
    for site, g in got.groupby("entity", sort=False):
        f = full[full.site == site].set_index("ts")
        want = f.loc[[pd.Timestamp(t).strftime("%Y-%m-%d %H:%M") for t in g.time], "demand"]
        np.testing.assert_allclose(g.actual, want.to_numpy())
        assert g.time.iloc[0] == "2024-03-28 05:00"
    bt = tmp_path / "bt.csv"
    capsys.readouterr()
    assert main(["backtest", str(run), "--csv", str(fut), "--stride", "12", "--out", str(bt)]) == 0
    printed = capsys.readouterr().out
    df = pd.read_csv(bt)
    assert {"origin", "actual"} <= set(df.columns) and df.actual.notna().all()
    y = df.actual.to_numpy()
    for q, col in ((0.1, "p10"), (0.5, "p50"), (0.9, "p90")):  # an independent q-risk
        e = y - df[col].to_numpy()
        qr = 2 * np.sum(np.maximum(q * e, (q - 1) * e)) / np.sum(np.abs(y))
        assert f"{col.upper()} {qr:.4f}" in printed
    # predict --backtest (with --data and --fill-gaps, as train accepts them) is the same
    bt2 = tmp_path / "bt2.csv"
    argv = ["predict", str(run), "--data", str(fut), "--backtest", "--stride", "12",
            "--fill-gaps", "--out", str(bt2)]  # fmt: skip
    assert main(argv) == 0
    assert bt2.read_bytes() == bt.read_bytes()
    # the default outputs: RUN/forecasts.csv and RUN/backtest.csv, so predict, then backtest works
    run2 = tmp_path / "run2"
    shutil.copytree(run, run2)
    assert main(["predict", str(run2), "--csv", str(fut)]) == 0
    assert main(["backtest", str(run2), "--csv", str(fut), "--stride", "12"]) == 0
    assert (run2 / "backtest.csv").read_bytes() == bt.read_bytes()
    assert "origin" not in pd.read_csv(run2 / "forecasts.csv").columns
    # a --start inside the first --history steps: its grid kept (05:00 every 12 h), the origins
    # without K history rows before them skipped, not moved to the first 00:00
    bt3 = tmp_path / "bt3.csv"
    argv = ["backtest", str(run), "--csv", str(fut), "--start", "2024-03-01 05:00",
            "--stride", "12", "--out", str(bt3)]  # fmt: skip
    assert main(argv) == 0
    origins = pd.read_csv(bt3).groupby("entity").origin.unique()
    for o in origins:
        assert o[0] == "2024-03-02 05:00"  # K = 24 rows from 2024-03-01 00:00
        assert all(pd.Timestamp(x).hour in (5, 17) for x in o)


def _example_code() -> str:
    text = (ROOT / "docs" / "export.md").read_text()
    m = re.search(r"```python\n(import json, numpy as np, onnxruntime.*?)```", text, re.S)
    assert m is not None
    return m.group(1)


@pytest.mark.parametrize("offsets", [False, True], ids=["naive", "utc_offsets"])
def test_docs_onnxruntime_example_reproduces_predict(demand, tmp_path, offsets):
    """The example on the future CSV, and on the same CSV with its times written as New York
    local times with their UTC offsets (-05:00, then -04:00 from the DST change of 2024-03-10):
    pandas' ``read_csv(parse_dates=...)`` left such mixed offsets strings, and the example
    failed ('can only concatenate str') where nbqat reads the same instants."""
    d, full, _, fut, run = demand
    code = _example_code()
    assert "nbqat" not in code.replace('["nbqat"]', "").replace('"nbqat-run"', "")
    assert len([ln for ln in code.splitlines() if ln.strip()]) <= 17  # imports + 16 lines
    csv = fut
    if offsets:
        df = pd.read_csv(fut)
        local = pd.to_datetime(df.ts).dt.tz_localize("UTC").dt.tz_convert("America/New_York")
        df["ts"], csv = [t.isoformat() for t in local], tmp_path / "offsets.csv"
        df.to_csv(csv, index=False)
    code = code.replace('"nbqat-run", "demand.csv"', f"{str(run)!r}, {str(csv)!r}")
    ns: dict = {}
    exec(compile(code, "docs/export.md", "exec"), ns)
    ref = tmp_path / "ref.csv"
    assert main(["predict", str(run), "--csv", str(fut), "--out", str(ref)]) == 0
    want, got = pd.read_csv(ref), ns["out"]
    assert list(got.entity) == list(want.entity)
    assert [pd.Timestamp(t) for t in got.time] == [pd.Timestamp(t) for t in want.time]
    for c in ("p10", "p50", "p90"):
        np.testing.assert_allclose(got[c].to_numpy(np.float64), want[c], rtol=1e-4)


def test_onnx_graph_matches_nbqat_features_and_qdq_part(demand):
    """The self-contained graph against nbqat's own path: nbqat's features fed to the QDQ part
    (rebuilt from the checkpoint), unscaled by nbqat, on every backtest window."""
    from nbqat.data import Scaling
    from nbqat.data._forecast import forecast_windows
    from nbqat.export.onnx_export import build_model
    from nbqat.export.parity import ort_session
    from nbqat.train import predict as P

    d, full, _, fut, run = demand
    r, cfg = P.load_run(run)
    info = P.run_info(r, cfg)
    fw = forecast_windows(P.read_data(cfg, str(fut)), Scaling.from_json(info["scaling"]),
                          history=K, horizon=TAU, quantiles=info["quantiles"],
                          backtest=(None, 5))  # fmt: skip
    qat = P._model(r, cfg)
    qat.freeze_observers()
    s, h, f, _ = fw.split.batch()
    inner = ort_session(build_model(qat)[0], optimize=True)
    ref = fw.split.unscale(inner.run(None, {"static": s, "historical": h, "future": f})[0])
    got = P._batched(P._onnx_engine(r), fw)
    assert len(fw.split) > 100
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4 * np.abs(ref).max())
    meta = info
    for key in ("history", "horizon", "step_seconds", "quantiles", "entities", "history_columns",
                "future_columns", "target", "time_col", "entity_col"):  # fmt: skip
        assert key in meta
    assert meta["history_columns"] == ["demand", "temp", "holiday", "price"]
    assert meta["future_columns"] == ["holiday", "price"] and meta["step_seconds"] == 3600.0


def test_forecaster_fit_predict_load_round_trip(demand, tmp_path, capsys):
    import nbqat

    d, full, train, fut, run = demand
    opts = TINY_KW
    df = pd.read_csv(train)
    capsys.readouterr()
    fc = nbqat.Forecaster(**opts).fit(df, **COLS_KW)
    assert capsys.readouterr().out == ""  # a library call: the CLI prints the summary
    assert "q-risk" in (fc.run_dir / "summary.txt").read_text()
    # the CLI run on the same data and options: the same numbers
    cli = nbqat.Forecaster.load(run)
    assert fc.metrics["q_risk_test"] == cli.metrics["q_risk_test"]
    a = fc.predict(pd.read_csv(fut))
    b = pd.read_csv(_cli_predict(run, fut, tmp_path))
    assert list(a.columns) == list(b.columns) and list(a.time) == list(b.time)
    np.testing.assert_allclose(a[["p10", "p50", "p90"]], b[["p10", "p50", "p90"]], rtol=1e-5)
    saved = fc.save(tmp_path / "kept")
    back = nbqat.Forecaster.load(saved)
    pd.testing.assert_frame_equal(back.predict(pd.read_csv(fut)), a)
    at = back.predict(at="2024-03-20 00:00")  # data=None: the data it was fitted on
    assert at.time.iloc[0] == "2024-03-20 00:00" and at.actual.notna().all()
    onnx_path = back.to_onnx(tmp_path / "m.onnx")
    assert onnx_path.read_bytes() == (saved / "model.onnx").read_bytes()
    # a refused fit into that run (options its new data cannot serve) leaves it as it was
    before = {p.name: p.read_bytes() for p in saved.iterdir() if p.is_file()}
    with pytest.raises(ValueError, match="window"):
        nbqat.Forecaster(out=str(saved), overwrite=True, **{**opts, "horizon": 6000}).fit(
            df.assign(demand=df.demand + 100), **COLS_KW
        )
    assert {p.name: p.read_bytes() for p in saved.iterdir() if p.is_file()} == before
    with pytest.raises(TypeError, match="unknown option"):
        nbqat.Forecaster(epoch=3)
    # a column the DataFrame lacks: the argument, a close match and the columns, nothing run
    out = tmp_path / "never"
    for kw, needle in (
        (dict(known_cols=["holiday", "prices"]), "known_cols='prices' is not a column"),
        (dict(known_cols="holiday,prices"), "did you mean 'price'?"),
        (dict(entity_col="sites"), "entity_col='sites'"),
        (dict(target_col="Demand"), "did you mean 'demand'?"),
    ):
        args = dict(time_col="ts", target_col="demand", entity_col="site", **opts)
        fit_kw = {k: args.pop(k) for k in ("time_col", "target_col", "entity_col")}
        fit_kw.update(kw)
        with pytest.raises(DataError, match=needle) as ei:
            nbqat.Forecaster(out=str(out), **args).fit(df, **fit_kw)
        assert "'ts', 'site'" in str(ei.value) or "'site', 'ts'" in str(ei.value)
        assert not out.exists()


def _respaced(frame: pd.DataFrame, freq: str) -> pd.DataFrame:
    """``frame`` with each site's times re-spaced to ``freq`` (the same rows and values)."""
    out = frame.copy()
    for _, g in out.groupby("site", sort=False):
        t = pd.date_range("2024-03-01", periods=len(g), freq=freq)
        out.loc[g.index, "ts"] = t.strftime("%Y-%m-%d %H:%M")
    return out


def test_predict_refuses_data_at_another_time_step(demand, tmp_path, capsys):
    import nbqat

    d, full, _, fut, run = demand
    fc = nbqat.Forecaster.load(run)
    raw = pd.read_csv(fut)
    for freq, words in (("min", "1 minute"), ("2h", "2 hours")):
        with pytest.raises(DataError, match=rf"time step is {words} but the model was trained "
                           r"on a time step of 1 hour: .*resample it to 1 hour"):  # fmt: skip
            fc.predict(_respaced(raw, freq))
    with pytest.raises(DataError, match="time step is 15 minutes but the model was trained"):
        fc.backtest(_respaced(raw, "15min"), stride=12)
    # nbqat predict --csv reads the data on the same path
    _respaced(raw, "min").to_csv(tmp_path / "minutes.csv", index=False)
    out = tmp_path / "f.csv"
    _fails(["predict", str(run), "--csv", str(tmp_path / "minutes.csv"), "--out", str(out)],
           capsys, "time step is 1 minute but the model was trained on a time step of 1 hour",
           out)  # fmt: skip
    assert len(fc.predict(raw)) == 3 * TAU  # the training run's step: forecasts


def _hourly(n: int = 120) -> pd.DataFrame:
    t = pd.date_range("2024-01-01", periods=n, freq="h")
    return pd.DataFrame({"ts": t, "demand": np.sin(np.arange(n) / 4.0), "temp": np.cos(t.hour)})


def _with(col: str, i: int, value) -> pd.DataFrame:
    df = _hourly()
    if isinstance(value, str):
        df[col] = df[col].astype(object)  # numbers and one string
    df.loc[i, col] = value
    return df


@pytest.mark.parametrize(
    ("df", "needle"),
    [
        (_with("demand", 5, np.nan), "DataFrame, row 5: column 'demand' has a missing value"),
        (_with("temp", 7, np.inf), "DataFrame, row 7: column 'temp' has a non-finite value inf"),
        (_with("ts", 3, pd.NaT), "DataFrame, row 3: column 'ts' (--time-col) has a missing"),
        (_with("ts", 6, pd.Timestamp("2024-01-01 05:00")), "DataFrame, row 6: duplicate"),
        # positions, not index labels: position 4 holds label 3, position 8 label 10
        (_hourly().iloc[[0, 1, 2, 4, 3, *range(5, 120)]], "DataFrame, row 4: unsorted"),
        (_hourly().drop(index=[8, 9]), "DataFrame, row 8: gap in entity 'series'"),
        (_hourly().assign(temp="warm"), "DataFrame, row 0: column 'temp' has a non-numeric"),
        (_with("temp", 5, "x"), "DataFrame, row 5: column 'temp' has a non-numeric value 'x'"),
        (_hourly().iloc[:0], "DataFrame: no data rows"),
    ],
    ids=["nan", "inf", "nat", "duplicate", "unsorted", "gap", "string", "mixed", "empty"],
)
def test_fit_dataframe_errors_name_its_rows_not_a_file(df, needle, tmp_path):
    """A DataFrame's data errors name ``DataFrame, row N`` (its 0-based position, as predict's
    messages), not the Parquet copy in the run folder, and nothing is written."""
    import nbqat

    out = tmp_path / "run"
    with pytest.raises(DataError) as ei:
        nbqat.Forecaster(quick=True, out=str(out), plots=False, progress=False).fit(
            df, time_col="ts", target_col="demand"
        )
    msg = str(ei.value)
    assert msg.startswith(needle), msg
    assert "parquet" not in msg and "file" not in msg and str(tmp_path) not in msg, msg
    assert not out.exists()


def test_fit_column_names_must_be_strings(tmp_path):
    import nbqat

    df = _hourly()
    df.columns = [0, 1, 2]  # as pd.read_csv(header=None) names them
    fc = nbqat.Forecaster(quick=True, out=str(tmp_path / "run"), plots=False, progress=False)
    with pytest.raises(TypeError, match=r"fit: time_col names the column 0 \(int\); column "
                       r"names must be strings.*df\.columns = df\.columns\.map\(str\).*"
                       r"time_col='0'"):  # fmt: skip
        fc.fit(df, time_col=0, target_col=1)
    with pytest.raises(TypeError, match=r"known_cols names the column 2 \(int\)"):
        fc.fit(df, time_col="0", target_col="1", known_cols=[2])
    # the names as strings: read (here up to its data check, which names the row and column)
    df.loc[3, 1] = np.nan
    with pytest.raises(DataError, match=r"^DataFrame, row 3: column '1' has a missing value"):
        fc.fit(df, time_col="0", target_col="1")
    assert not (tmp_path / "run").exists()


def test_fit_dataframe_that_parquet_cannot_store(tmp_path):
    """A column of numbers and numeric strings passes the data checks but cannot be stored:
    a DataError naming the column, not pyarrow's ArrowInvalid."""
    import nbqat

    df = _hourly().assign(temp=[1.0] * 119 + ["2.5"])
    out = tmp_path / "run"
    with pytest.raises(DataError, match=r"DataFrame: cannot store it .*column temp.*one type"):
        nbqat.Forecaster(quick=True, out=str(out), plots=False, progress=False).fit(
            df, time_col="ts", target_col="demand"
        )
    assert not out.exists()


@pytest.mark.parametrize("stride", [1.5, 0.5, 2.0, True, 0, -3])
def test_backtest_stride_is_a_positive_integer(demand, stride):
    import nbqat

    fc = nbqat.Forecaster.load(demand[4])
    with pytest.raises(ValueError, match=rf"--stride must be a positive integer.*, got "
                       rf"{re.escape(repr(stride))}$"):  # fmt: skip
        fc.backtest(stride=stride)


def test_backtest_stride_counter_check(demand):
    import nbqat

    df = nbqat.Forecaster.load(demand[4]).backtest(pd.read_csv(demand[3]), stride=np.int64(12))
    origins = pd.to_datetime(df[df.entity == "north"].origin.drop_duplicates())
    assert (origins.diff().dropna() == pd.Timedelta(hours=12)).all() and len(origins) > 1


def _cli_predict(run: Path, fut: Path, tmp_path: Path) -> Path:
    out = tmp_path / "cli.csv"
    assert main(["predict", str(run), "--csv", str(fut), "--out", str(out)]) == 0
    return out


def test_fill_gaps_carries_whole_number_columns(tmp_path):
    from nbqat.data import load_csv

    df = _demand(days=3)
    df = df[df.site == "north"].drop(index=[30, 31, 32])  # a 3-hour gap
    df.to_csv(tmp_path / "gap.csv", index=False)
    data = load_csv(tmp_path / "gap.csv", time_col="ts", target_col="demand",
                    known_cols="holiday,price", observed_cols="temp", fill_gaps=True)  # fmt: skip
    hol = data.known[0][:, 0]
    assert set(np.unique(hol)) <= {0.0, 1.0}  # carried, not interpolated
    assert data.carried == {"series": ["holiday"]}
    price = data.known[0][29:34, 1]
    assert np.allclose(np.diff(price, 2)[:2], 0.0, atol=1e-9)  # interpolated linearly


@pytest.mark.parametrize(
    ("raw", "spelled"),
    [
        ("2024-03-01T00:00", "2024-03-01T05:00"),
        ("2024-03-01 00:00:00", "2024-03-01 05:00:00"),
        ("2024-03-01", "2024-03-01T05:00:00"),  # a date cannot hold 05:00: spelled in full
        ("2024-03-01T00:00Z", "2024-03-01T05:00Z"),
        # read as UTC, written back at the data's own offset (they were written in UTC)
        ("2024-03-01T00:00:00+01:00", "2024-03-01T06:00:00+01:00"),
        ("2024-03-01T00:00:00+02:00", "2024-03-01T07:00:00+02:00"),
        ("2024-03-01T00:00-0530", "2024-02-29T23:30-0530"),
        ("2024-03-01T00:00:00+00:00", "2024-03-01T05:00:00+00:00"),
        ("2024-03-01+02:00", "2024-03-01T07:00:00+02:00"),
        # slashes and dots kept (the forecasts were dated 2024-03-01 05:00, which a join on
        # the data's own time strings never matches)
        ("2024/03/01 00:00", "2024/03/01 05:00"),
        ("2024/03/01", "2024/03/01T05:00:00"),
        ("2024.03.01T00:00:00Z", "2024.03.01T05:00:00Z"),
    ],
)
def test_times_are_spelled_as_the_data_spells_them(raw, spelled):
    from nbqat.data._timecol import format_times, time_spelling

    fmt = time_spelling(pd.Series([raw], dtype=object))
    assert format_times(np.array(["2024-03-01T05:00"], "datetime64[s]"), fmt) == [spelled]
    if "+" in raw[10:] or "-" in raw[10:]:  # the same instant (pandas reads the offset)
        assert pd.Timestamp(spelled) == pd.Timestamp("2024-03-01T05:00", tz="UTC")
    assert format_times(np.array([17.0]), time_spelling(pd.Series(["17"]))) == ["17"]


def test_aware_datetime_column_is_spelled_at_its_offset():
    """A time-zone-aware column is read as UTC: its forecast times say so (spelled without an
    offset, 17:00 UTC read back as 17:00 local, an hour off in Berlin), at the column's own
    offset (its first value's: they were spelled in UTC, +00:00)."""
    import pyarrow as pa

    from nbqat.data._timecol import format_times, time_spelling

    s = pd.Series(pd.to_datetime(["2024-03-01 18:00"]).tz_localize("Europe/Berlin"))
    t = np.array(["2024-03-01T17:00"], "datetime64[s]")  # s[0] on the UTC axis
    spelled = format_times(t, time_spelling(s))
    assert pd.Timestamp(spelled[0]) == s[0]
    assert spelled == ["2024-03-01T18:00:00+01:00"]
    arrow = s.astype(pd.ArrowDtype(pa.timestamp("s", tz="Europe/Berlin")))  # pandas' other kind
    assert format_times(t, time_spelling(arrow)) == spelled
    naive = s.dt.tz_localize(None).astype(pd.ArrowDtype(pa.timestamp("s")))
    assert format_times(t, time_spelling(naive)) == ["2024-03-01T17:00:00"]


def test_forecaster_without_out_fits_again():
    """A Forecaster without ``out`` refits into a new temporary folder (the second fit was
    refused: its temporary ``--out`` 'holds a previous run'); a refused refit keeps the run.
    ``out=None`` spelled out is the default (README; it was refused: "--out must be a
    string")."""
    import nbqat

    opts = {**TINY_KW, "out": None}
    df = _demand(days=12)
    cols = COLS_KW
    fc = nbqat.Forecaster(**opts).fit(df, **cols)
    at = "2024-03-12 00:00"  # the known columns of the forecast steps are in the data
    first, p1 = fc.run_dir, fc.predict(at=at)
    with pytest.raises(DataError):
        fc.fit(df.assign(demand=np.inf), **cols)
    assert fc.run_dir == first and first.is_dir()
    pd.testing.assert_frame_equal(fc.predict(at=at), p1)
    fc.fit(df.assign(demand=df.demand * 10), **cols)
    assert fc.run_dir != first and not first.exists()
    assert fc.predict(at=at).p50.abs().mean() > 5 * p1.p50.abs().mean()


def test_a_temporary_run_goes_with_its_forecaster_without_a_warning():
    """A Forecaster without ``out`` left its temporary folder to TemporaryDirectory's own
    finalizer, which warned "Implicitly cleaning up <TemporaryDirectory '/tmp/nbqat-run-...'>"
    (a ResourceWarning, shown under -X dev or -W error) each time one was dropped, and after
    every refit in a loop. The folder now goes with the Forecaster, silently."""
    import gc
    import warnings

    import nbqat

    fc = nbqat.Forecaster(**TINY_KW).fit(_demand(days=12), **COLS_KW)
    folder = fc.run_dir.parent
    assert folder.is_dir()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        del fc
        gc.collect()
    assert not folder.exists()
    assert [str(w.message) for w in caught if w.category is ResourceWarning] == []


def test_moved_run_resumes_with_its_data_parquet(tmp_path, capsys):
    """A run whose data is its folder's ``data.parquet`` (a Forecaster's) is resumed after the
    folder moved (the stored path, in the old folder, was 'no such file')."""
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    _demand(days=12).to_parquet(a / "data.parquet", index=False)
    argv = ["train", *TINY, *COLS, "--csv", str(a / "data.parquet"), "--out", str(a)]
    assert main([*argv, "--stop-after-steps", "1"]) == 130
    a.rename(b)
    capsys.readouterr()
    assert main(["train", "--resume", str(b / "checkpoint")]) == 0, capsys.readouterr().err
    assert (b / "metrics.json").is_file() and not a.exists()


@pytest.mark.parametrize(
    ("name", "needle"),
    [("price, EUR", "has a comma"), ("price ", "has leading or trailing whitespace")],
)
def test_fit_refuses_list_column_names_the_run_cannot_keep(name, needle, tmp_path):
    """A known column named ``"price, EUR"`` or ``"price "`` is refused naming it and the
    rename (it passed fit's column check, then the comma-separated option split or stripped
    it: '--known-cols names column(s) ['price', 'EUR'] that the header does not have')."""
    import nbqat

    df = _hourly().rename(columns={"temp": name})
    out = tmp_path / "never"
    with pytest.raises(DataError, match=f"known_cols names the column {name!r}, which {needle}"):
        nbqat.Forecaster(out=str(out), quick=True).fit(
            df, time_col="ts", target_col="demand", known_cols=[name]
        )
    assert not out.exists()


def test_saved_copy_forecasts_from_its_own_data(tmp_path):
    """A saved run forecasts from its own data.parquet: it read the stored path, the folder
    it was fitted in, where a later fit had written other data (forecasts and actuals of that
    data, silently)."""
    import nbqat

    opts = TINY_KW
    df = _demand(days=12)
    cols = COLS_KW
    at, out = "2024-03-12 00:00", str(tmp_path / "a")
    fc = nbqat.Forecaster(out=out, **opts).fit(df, **cols)
    want = fc.predict(at=at)
    kept = fc.save(tmp_path / "kept")
    nbqat.Forecaster(out=out, overwrite=True, **opts).fit(df.assign(demand=df.demand * 100),
                                                          **cols)  # fmt: skip
    pd.testing.assert_frame_equal(nbqat.Forecaster.load(kept).predict(at=at), want)


def test_failed_overwrite_fit_keeps_the_previous_runs_data(tmp_path, monkeypatch):
    """A fit with overwrite=True that fails in training puts the previous run back with its own
    data.parquet (the new data stayed: the restored model then forecast it, silently)."""
    import nbqat
    from nbqat.train import job

    opts = TINY_KW
    df = _demand(days=12)
    cols = COLS_KW
    at, out = "2024-03-12 00:00", tmp_path / "a"
    want = nbqat.Forecaster(out=str(out), **opts).fit(df, **cols).predict(at=at)
    before = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}

    def diverged(r):
        raise RuntimeError("diverged")

    monkeypatch.setattr(job, "_phases", diverged)
    with pytest.raises(RuntimeError, match="diverged"):
        nbqat.Forecaster(out=str(out), overwrite=True, **opts).fit(
            df.assign(demand=df.demand * 100), **cols
        )
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()} == before
    pd.testing.assert_frame_equal(nbqat.Forecaster.load(out).predict(at=at), want)


def test_integer_spelling_of_fractional_times_keeps_the_fraction(tmp_path):
    """A numeric time column whose first value is whole (``0, 0.5, 1, ...``) spells every time
    in full: it was read as 'integer' and 0.5 was written as 0, 1.5 as 2."""
    from nbqat.data import load_csv
    from nbqat.data._timecol import format_times

    t = np.arange(40) * 0.5
    spelled = [f"{v:g}" for v in t]  # 0, 0.5, 1, 1.5 ...
    pd.DataFrame({"t": spelled, "y": np.sin(t)}).to_csv(tmp_path / "h.csv", index=False)
    d = load_csv(tmp_path / "h.csv", time_col="t", target_col="y")
    got = format_times(d.times[0][:4], d.time_format)
    assert [float(v) for v in got] == [0.0, 0.5, 1.0, 1.5]
    assert format_times(np.array([3.0, 4.0]), "integer") == ["3", "4"]


@pytest.mark.parametrize(
    ("first", "rest", "freq"),
    [("%Y-%m-%d", "%Y-%m-%d %H:%M", "h"), ("%Y-%m-%dT%H", "%Y-%m-%dT%H:%M", "30min")],
)
def test_times_spelled_from_a_coarser_first_value_keep_their_clock(tmp_path, first, rest, freq):
    """Times whose first value is spelled without (all of) its clock (midnight as a bare date,
    then hourly) are spelled in full: every forecast time of the day was the date alone."""
    from nbqat.data import load_csv
    from nbqat.data._timecol import format_times

    t = pd.date_range("2024-03-01", periods=60, freq=freq)
    spelled = [v.strftime(first) if i == 0 else v.strftime(rest) for i, v in enumerate(t)]
    pd.DataFrame({"t": spelled, "y": np.sin(np.arange(60))}).to_csv(tmp_path / "d.csv",
                                                                     index=False)  # fmt: skip
    d = load_csv(tmp_path / "d.csv", time_col="t", target_col="y")
    got = format_times(d.times[0][:3], d.time_format)
    assert list(pd.to_datetime(got)) == list(t[:3])
    day = np.array(["2024-03-01", "2024-03-02"], "datetime64[s]")
    assert format_times(day, "%Y-%m-%d") == ["2024-03-01", "2024-03-02"]


@pytest.mark.parametrize("at", ["yesterday", "", pd.NaT, ["2024-03-20 00:00"]])
def test_at_that_is_not_a_time_is_named(demand, at):
    """An ``at`` that is not a time is named as ``--at`` with the fix (the time column's
    messages said '--at (--time-col) has a missing value; every row needs a time stamp')."""
    import nbqat

    with pytest.raises(DataError, match=r"--at .* is not a time: give an ISO 8601") as e:
        nbqat.Forecaster.load(demand[4]).predict(at=at)
    assert "--time-col" not in str(e.value) and "row" not in str(e.value)


@pytest.mark.parametrize("data", [[1, 2], {"ts": [1]}, "series"])
def test_predict_names_its_data_argument(demand, data):
    """predict(data=<not a table>) names ``data`` and what it takes (the message named
    from_dataframe's ``df``, an argument the caller never saw)."""
    import nbqat

    if data == "series":
        data = pd.read_csv(demand[3])["demand"]
    with pytest.raises(TypeError, match="^data must be a pandas DataFrame, a path or a SeriesData"):
        nbqat.Forecaster.load(demand[4]).predict(data)


@pytest.mark.parametrize(
    "opt,kw",
    [("--qat-lr", {"qat_lr": 1e-4}), ("--qat-skip-lr-scale", {"qat_skip_lr_scale": 2.0}),
     ("--compare-clipping", {"compare_clipping": True})],
)  # fmt: skip
def test_forecaster_refuses_qat_options_with_qat_epochs_0_as_the_cli(opt, kw, capsys, monkeypatch):
    """Forecaster(qat_epochs=0, qat_lr=...) was taken (the option silently unused) where
    nbqat train refuses it; now the CLI's check and message. A run with qat_epochs 0 still
    loads: its resolved config holds the --lr / 10 qat_lr it never used (and a run without
    the skip the skip's options), left out as another model's options are."""
    import nbqat
    from nbqat.train import TrainConfig, predict

    msg = f"{opt} is an option of the QAT steps, but --qat-epochs 0 runs none"
    with pytest.raises(ValueError, match=msg):
        nbqat.Forecaster(qat_epochs=0, **kw)
    value = [] if opt == "--compare-clipping" else [str(next(iter(kw.values())))]
    assert main(["train", "--check", "--qat-epochs", "0", opt, *value]) == 2
    assert msg in capsys.readouterr().err
    nbqat.Forecaster(qat_epochs=0, qat_lr=None, compare_clipping=False)  # neither given
    cfg = TrainConfig(qat_epochs=0, linear_skip=False).resolved().to_json()
    assert cfg["qat_lr"] is not None and cfg["skip_lr_scale"] is not None
    monkeypatch.setattr(predict, "load_run", lambda d: (Path(d), cfg))
    fc = nbqat.Forecaster.load("run")
    assert fc.options["qat_epochs"] == 0 and fc.options["linear_skip"] is False
    assert not {"qat_lr", "skip_lr_scale", "skip_history"} & set(fc.options)


def test_loaded_forecaster_does_not_inherit_overwrite(demand, tmp_path):
    """A run written with --overwrite loads without it: fit() on the loaded forecaster
    replaced the run it was loaded from, without being asked (and only for such runs)."""
    import nbqat

    run = tmp_path / "run"
    shutil.copytree(demand[4], run)
    assert main(["train", *TINY, *COLS, "--csv", str(demand[2]), "--out", str(run),
                 "--overwrite"]) == 0  # fmt: skip
    before = (run / "model.onnx").read_bytes()
    fc = nbqat.Forecaster.load(run)
    assert not fc.options.get("overwrite")
    with pytest.raises(ValueError, match="holds a previous run") as ei:
        fc.fit(pd.read_csv(demand[2]), **COLS_KW)
    assert "(a Forecaster: out=, overwrite=True)" in str(ei.value)  # its spelling of the fix
    assert (run / "model.onnx").read_bytes() == before


def test_forecast_never_replaces_a_runs_own_data(demand, tmp_path, capsys):
    """--out RUN/data.parquet (a Forecaster run's data) is refused even with --overwrite: the
    forecast CSV replaced it, and predict without data then failed on the run's own data."""
    run = tmp_path / "run"
    shutil.copytree(demand[4], run)
    pd.read_csv(demand[2]).to_parquet(run / "data.parquet", index=False)
    before = (run / "data.parquet").read_bytes()
    argv = ["predict", str(run), "--csv", str(demand[3]), "--out", str(run / "data.parquet")]
    _fails([*argv, "--overwrite"], capsys, "is the run's own data.parquet")
    assert (run / "data.parquet").read_bytes() == before


def test_fit_never_replaces_a_data_parquet_that_is_no_runs(tmp_path):
    """A fit into a folder holding the user's own data.parquet (no run) is refused naming it:
    the fit's DataFrame replaced the file silently."""
    import nbqat

    out = tmp_path / "project"
    out.mkdir()
    _hourly().to_parquet(out / "data.parquet", index=False)
    before = (out / "data.parquet").read_bytes()
    with pytest.raises(ValueError, match="holds a data.parquet that is no run's data"):
        nbqat.Forecaster(out=str(out), quick=True).fit(_hourly(), time_col="ts",
                                                       target_col="demand")  # fmt: skip
    assert (out / "data.parquet").read_bytes() == before
    assert sorted(p.name for p in out.iterdir()) == ["data.parquet"]


def test_fit_takes_a_path_out_and_numpy_option_values(tmp_path):
    """out=pathlib.Path and NumPy scalars (np.int64 from a grid search) are plain JSON values in
    the run's files: the first checkpoint write failed after the float training ('Object of type
    PosixPath is not JSON serializable') and the run was lost."""
    import json

    import nbqat

    opts = {k: v for k, v in TINY_KW.items() if k not in ("history", "horizon")}
    fc = nbqat.Forecaster(out=tmp_path / "run", history=np.int64(K), horizon=np.int32(TAU),
                          lr=np.float64(3e-3), **opts)  # fmt: skip
    fc.fit(_demand(days=12), **COLS_KW)
    cfg = json.loads((tmp_path / "run" / "checkpoint" / "state.json").read_text())["config"]
    assert cfg["out"] == str(tmp_path / "run") and cfg["history"] == K and cfg["lr"] == 3e-3


def test_time_and_entity_columns_may_be_index_levels(demand):
    """A pandas time series keeps its times in a DatetimeIndex (often an (entity, time)
    MultiIndex): fit and predict read an index level that time_col / entity_col names (they
    were refused: "'ts' is not a column of the DataFrame"), with the same forecasts, and a
    fit without time_col on a DatetimeIndex says which name to pass."""
    import nbqat

    fc = nbqat.Forecaster.load(demand[4])
    fut = pd.read_csv(demand[3])
    plain = fc.predict(fut)
    pd.testing.assert_frame_equal(fc.predict(fut.set_index(["site", "ts"])), plain)
    pd.testing.assert_frame_equal(fc.predict(fut.set_index("ts")), plain)
    one = _hourly().set_index("ts")
    fit = nbqat.Forecaster(**{**TINY_KW, "eval_stride": 6})
    with pytest.raises(ValueError, match=r"its index: pass time_col='ts'"):
        fit.fit(one, target_col="demand")
    with pytest.raises(ValueError, match=r"time_col='time' after df.index.name = 'time'"):
        fit.fit(one.rename_axis(None), target_col="demand")
    fit.fit(one, time_col="ts", target_col="demand")
    assert fit.predict().time.iloc[0] == pd.Timestamp("2024-01-06")  # after the 120 hours


def test_forecast_keys_keep_the_dataframes_dtypes(demand):
    """A DataFrame with a datetime64 time column got its forecast times back as text
    ('2024-03-29T18:00:00') and a categorical entity as str, so that merging the forecasts
    with the frame raised ("You are trying to merge on str and datetime64[us] columns").
    They now come back in the frame's dtypes (naive, aware, categorical) and merge: the
    oracle is pandas' merge, whose ``actual`` must be the frame's own target."""
    import nbqat

    fc = nbqat.Forecaster.load(demand[4])
    full = demand[1]
    naive = full.assign(ts=pd.to_datetime(full.ts), site=full.site.astype("category"))
    aware = naive.assign(ts=naive.ts.dt.tz_localize("UTC").dt.tz_convert("Asia/Tokyo"))
    for df in (naive, aware):
        for got in (fc.predict(df, at="2024-03-29T18:00"), fc.backtest(df, stride=TAU)):
            assert got.time.dtype == df.ts.dtype and got.entity.dtype == df.site.dtype
            m = got.merge(df, left_on=["entity", "time"], right_on=["site", "ts"])
            assert len(m) == len(got) and (m.actual == m.demand).all()
        assert fc.backtest(df, stride=TAU).origin.dtype == df.ts.dtype
    text = fc.predict(pd.read_csv(demand[3]))  # text keys keep the data's spelling
    assert text.time.iloc[0] == "2024-03-30 18:00" and text.entity.iloc[0] == "north"


def test_an_entity_the_run_never_saw_names_the_fix(demand):
    """Data with a series the model was not fitted on was refused naming the run's entities
    but no fix; the message says to leave its rows out or fit a model that holds it, before
    any forecast, for predict and backtest alike."""
    import nbqat

    fc = nbqat.Forecaster.load(demand[4])
    fut = pd.read_csv(demand[3])
    new = pd.concat([fut, fut[fut.site == "east"].assign(site="west")], ignore_index=True)
    fix = r"'west'.*\['north', 'south', 'east'\].*leave 'west''s rows out of the data"
    with pytest.raises(ValueError, match=fix + r".*fit a model on data that holds 'west'"):
        fc.predict(new)
    with pytest.raises(ValueError, match=fix):
        fc.backtest(new)
    pd.testing.assert_frame_equal(fc.predict(new[new.site != "west"]), fc.predict(fut))


def test_a_no_flag_as_an_option_names_its_positive_form():
    """``Forecaster(no_progress=True)`` (``--no-progress`` with underscores, as the README's
    rule reads) was refused listing 42 options but not the one meant; the message names
    ``progress=False``, which works."""
    import nbqat

    with pytest.raises(TypeError, match=r"no_plots=True is plots=False; no_progress=True is "
                                        r"progress=False; the options"):  # fmt: skip
        nbqat.Forecaster(no_progress=True, no_plots=True)
    with pytest.raises(TypeError, match=r"\['no_such'\]; the options"):
        nbqat.Forecaster(no_such=True)
    assert nbqat.Forecaster(progress=False, plots=False).options["progress"] is False


def test_an_origin_too_late_for_the_known_columns_names_the_last_one(demand):
    """``predict(at=...)`` 2 hours before the data's end (horizon 6, known columns) said
    "add the rows ... or forecast from an origin inside the data (--at TIME ...)", though
    the origin given was inside the data; the message now names the last origin whose steps
    the data holds (pandas' arithmetic: the last time - 5 h), and that origin forecasts."""
    import nbqat

    fc = nbqat.Forecaster.load(demand[4])
    df = pd.read_csv(demand[2])
    end = pd.Timestamp(df.ts.max())
    last = (end - pd.Timedelta(hours=TAU - 1)).strftime("%Y-%m-%d %H:%M")
    with pytest.raises(DataError, match=f"whose {TAU} steps the data holds, on or before {last}"):
        fc.predict(df, at=end - pd.Timedelta(hours=2))
    assert len(fc.predict(df, at=last)) == TAU * df.site.nunique()


def test_an_origin_off_the_time_grid_names_the_nearest(demand):
    """``predict(at="... 12:30")`` on hourly data, or a local time with an offset, said only
    "is not on entity 'north''s time grid (... + a multiple of 3600 seconds)"; the message now
    names the grid times on either side (pandas' floor and ceil of the time read in UTC),
    and the floor forecasts. Before the data, only its first time is named."""
    import nbqat

    fc = nbqat.Forecaster.load(demand[4])
    df = pd.read_csv(demand[2])
    for at in ("2024-03-20 12:30", "2024-03-20T13:30+01:00"):
        utc = pd.Timestamp(at).tz_localize(None) if "+" not in at else (
            pd.Timestamp(at).tz_convert("UTC").tz_localize(None))  # fmt: skip
        lo, hi = utc.floor("h").isoformat(), utc.ceil("h").isoformat()
        with pytest.raises(DataError, match=f"the nearest being {lo} and {hi} \\(times"):
            fc.predict(df, at=at)
        assert len(fc.predict(df, at=lo)) == TAU * df.site.nunique()
    first = pd.Timestamp(df.ts.min()).isoformat()
    with pytest.raises(DataError, match=f"the nearest being {first} \\(times"):
        fc.predict(df, at=pd.Timestamp(df.ts.min()) - pd.Timedelta(minutes=30))


def test_a_period_time_column_reads_as_its_start_times(demand):
    """A pandas Period column (``df.index.to_period("M")``, statsmodels' quarterly data) was
    refused as "neither a number nor an ISO 8601 date time"; it reads as its periods' start
    times: monthly periods on the calendar-month axis, hourly ones as the same hours."""
    import nbqat
    from nbqat.data import from_dataframe

    fut = pd.read_csv(demand[3])
    plain = nbqat.Forecaster.load(demand[4]).predict(fut)
    hourly = fut.assign(ts=pd.to_datetime(fut.ts).dt.to_period("h"))
    got = nbqat.Forecaster.load(demand[4]).predict(hourly)
    pd.testing.assert_frame_equal(got.drop(columns="time"), plain.drop(columns="time"))
    assert (pd.to_datetime(got.time) == pd.to_datetime(plain.time)).all()
    q = pd.period_range("1959Q1", periods=8, freq="Q")
    data = from_dataframe(pd.DataFrame({"q": q, "gdp": np.arange(8.0)}).set_index("q"),
                          time_col="q", target_col="gdp")  # fmt: skip
    assert data.month_day == 1 and data.times[0][1] == np.datetime64("1959-04", "M")


@pytest.mark.parametrize("role", ["static_cols", "known_cols"])
def test_a_category_named_as_an_input_gets_its_fix(role):
    """A string category named as a static or known column (a region, a weather label) was
    told to "choose the input columns with ... --static-cols", the option it was given in;
    the message names that option and how to code the category as numbers."""
    from nbqat.data import from_dataframe

    df = _hourly().assign(region="north")
    opt = "--" + role.replace("_", "-")
    with pytest.raises(DataError) as ei:
        from_dataframe(df, time_col="ts", target_col="demand", **{role: ["region"]})
    msg = str(ei.value)
    assert msg.startswith(f"DataFrame, row 0: column 'region' has a non-numeric value 'north' "
                          f"({opt}); inputs must hold numbers"), msg  # fmt: skip
    assert "pandas.get_dummies(df, columns=['region'], dtype=int)" in msg
    assert f"leave 'region' out of {opt}" in msg and "choose the input columns" not in msg
    with pytest.raises(DataError, match=r"'warm' \(--target-col\); the target must hold"):
        from_dataframe(df.assign(demand="warm"), time_col="ts", target_col="demand")


def test_a_missing_history_value_counts_the_missing_values_in_words(demand):
    """The count after a missing history value read as a step offset ("at 2024-03-30T20:00
    (1 before the entity's last target value)" for the last row itself); it says what it
    counts."""
    import nbqat

    fut = pd.read_csv(demand[3])
    last = fut[fut.site == "north"].demand.last_valid_index()
    fut.loc[last, "temp"] = np.nan
    want = r"'temp' of entity 'north' has a missing value at \S+ \(1 missing value\(s\) up to"
    with pytest.raises(DataError, match=want):
        nbqat.Forecaster.load(demand[4]).predict(fut)


def test_predict_without_data_keeps_the_fitted_frames_dtypes(tmp_path, capsys):
    """fc.predict() / fc.backtest() (the data it was fitted on) gave the times as text
    ('2024-01-05T20:00:00') where fc.predict(df) gives them in the frame's datetime64: the
    same forecast in two dtypes. Without data they now come back in the fitted DataFrame's
    dtypes (pandas' own dtypes are the oracle), also after Forecaster.load; the CLI's CSV of
    that run keeps its text (read back by pandas, the same as the Forecaster's with the times
    spelled), and a run fitted from a CSV file keeps text."""
    import nbqat

    df = _hourly().assign(site=pd.Categorical(["a"] * 120))
    df = df.assign(ts=df.ts.dt.tz_localize("Europe/Paris"))
    run = tmp_path / "run"
    fc = nbqat.Forecaster(out=str(run), **{**TINY_KW, "eval_stride": 6})
    fc.fit(df, time_col="ts", target_col="demand", entity_col="site")
    at = "2024-01-05T10:00+01:00"
    for f in (fc, nbqat.Forecaster.load(run)):
        pd.testing.assert_frame_equal(f.predict(at=at), f.predict(df, at=at))
        bt = f.backtest(stride=TAU)
        pd.testing.assert_frame_equal(bt, f.backtest(df, stride=TAU))
        assert bt.time.dtype == bt.origin.dtype == df.ts.dtype and bt.entity.dtype == "category"
    assert main(["predict", str(run), "--at", at, "--out", str(tmp_path / "p.csv")]) == 0
    cli = pd.read_csv(tmp_path / "p.csv")
    assert cli.time.iloc[0] == "2024-01-05T10:00:00+01:00"  # the data's offset, as before
    want = fc.predict(at=at)
    assert (pd.to_datetime(cli.time, format="ISO8601") == want.time).all()
    df.assign(ts=df.ts.dt.strftime("%Y-%m-%d %H:%M%z")).to_csv(tmp_path / "d.csv", index=False)
    fc = nbqat.Forecaster(out=str(tmp_path / "csv"), **{**TINY_KW, "eval_stride": 6})
    fc.fit(str(tmp_path / "d.csv"), time_col="ts", target_col="demand", entity_col="site")
    assert pd.api.types.is_string_dtype(fc.predict(at=at).time)  # a file's keys: text


@pytest.mark.parametrize("dtype", [bool, "boolean", "bool[pyarrow]"])
def test_a_boolean_target_is_refused_naming_the_fix(dtype, tmp_path):
    """A True/False target (a classification target) trained silently as a 0/1 series, its
    quantiles fractions between them; it is refused before anything is written, naming the
    column and the conversion for a 0/1 series that is really meant (the docs promise numbers
    only), which then fits; a file's true/false column (pyarrow reads it as bool) too."""
    import nbqat

    df = _hourly().assign(demand=lambda d: (d.demand > 0).astype(dtype))
    out = tmp_path / "run"
    fc = nbqat.Forecaster(out=str(out), **{**TINY_KW, "eval_stride": 6})
    fix = re.escape("df['demand'] = df['demand'].astype(float)")
    with pytest.raises(DataError, match=rf"column 'demand' \(--target-col\) is boolean.*{fix}"):
        fc.fit(df, time_col="ts", target_col="demand")
    assert not out.exists()
    df.to_csv(tmp_path / "d.csv", index=False)
    assert pd.read_csv(tmp_path / "d.csv").demand.dtype == bool  # the file holds true/false
    with pytest.raises(DataError, match=r"d.csv, line 2: column 'demand' \(--target-col\)"):
        fc.fit(str(tmp_path / "d.csv"), time_col="ts", target_col="demand")
    if dtype is bool:
        fc.fit(df.assign(demand=df.demand.astype(float)), time_col="ts", target_col="demand")
        assert fc.predict().p50.dtype == np.float64
