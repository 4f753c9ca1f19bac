"""``nbqat predict``: forecasts from a finished run, engines, and the error cases (no output)."""

from __future__ import annotations

import csv
import gzip
import json
import math
import shutil
from pathlib import Path

import numpy as np
import pytest

from nbqat.cli import main
from nbqat.data import TMY3_FILE

TINY = [
    "--epochs", "1", "--qat-epochs", "1", "--batch-size", "16", "--hidden-dim", "4",
    "--heads", "1", "--history", "24", "--horizon", "6", "--windows-per-epoch", "32",
    "--calibration-batches", "2", "--eval-stride", "96", "--no-progress", "--no-plots",
]  # fmt: skip
SHIPPED = Path(__file__).resolve().parents[1] / "nbqat" / "data" / TMY3_FILE
#: The origin of the shipped data's last 6 hours (the shipped data's known column etr ends there:
#: a forecast of the steps after the data needs future rows, see tests/test_forecaster.py).
AT = ["--at", "2001-12-31T18:00"]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("run")
    assert main(["train", *TINY, "--out", str(out)]) == 0
    return out


def _raw_rows() -> list[dict]:
    with gzip.open(SHIPPED, "rt", newline="") as f:
        return list(csv.DictReader(f))


def _read(path: Path) -> list[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_engines_agree_and_rows_are_the_last_steps(run, tmp_path, capsys):
    outs = {}
    for eng in ("onnx", "int8", "float"):
        p = tmp_path / f"{eng}.csv"
        assert main(["predict", str(run), *AT, "--engine", eng, "--out", str(p)]) == 0
        outs[eng] = _read(p)
    rows = outs["onnx"]
    assert list(rows[0]) == ["entity", "time", "step", "p10", "p50", "p90", "actual"]
    # oracle: the last 6 time stamps of every station in the raw shipped file
    raw = _raw_rows()
    stations = list(dict.fromkeys(r["station"] for r in raw))
    want = []
    for st in stations:
        ts = [r["time"] for r in raw if r["station"] == st][-6:]
        want += [(st, i + 1, t) for i, t in enumerate(ts)]
    got = [(r["entity"], int(r["step"]), r["time"]) for r in rows]
    assert [(e, s) for e, s, _ in got] == [(e, s) for e, s, _ in want]
    for (_, _, t_got), (_, _, t_raw) in zip(got, want):
        assert np.datetime64(t_got) == np.datetime64(t_raw.replace("Z", "").split("+")[0])
    # onnxruntime vs the int8 reference: within one output step in the target's units
    m = json.loads((run / "metrics.json").read_text())
    step = m["onnx_parity"]["output_scale"]
    scale = max(s["scale"] for s in _scaling(run).values())
    a = np.array([[float(r[q]) for q in ("p10", "p50", "p90")] for r in rows])
    b = np.array([[float(r[q]) for q in ("p10", "p50", "p90")] for r in outs["int8"]])
    c = np.array([[float(r[q]) for q in ("p10", "p50", "p90")] for r in outs["float"]])
    assert np.max(np.abs(a - b)) <= step * scale * 1.001 + 1e-5
    assert np.all(np.isfinite(c)) and not np.array_equal(b, c)


def _scaling(run: Path) -> dict:
    import onnx

    props = {p.key: p.value for p in onnx.load(str(run / "model.onnx")).metadata_props}
    return json.loads(props["target_scaling"])


def test_csv_of_the_shipped_file_gives_the_same_forecasts(run, tmp_path):
    a, b = tmp_path / "a.csv", tmp_path / "b.csv"
    assert main(["predict", str(run), *AT, "--engine", "int8", "--out", str(a)]) == 0
    argv = ["predict", str(run), *AT, "--engine", "int8", "--csv", str(SHIPPED), "--out", str(b)]
    assert main(argv) == 0
    assert a.read_bytes() == b.read_bytes()


def _write_csv(path: Path, rows: list[dict], drop: str | None = None) -> Path:
    cols = [c for c in rows[0] if c != drop]
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=cols, extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)
    return path


def _fails(argv, out: Path, capsys, needle: str) -> None:
    assert main([*argv, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert needle in err, err
    assert not out.exists()
    assert not [p for p in out.parent.iterdir() if p.name.startswith(".nbqat-")]


def test_error_missing_column(run, tmp_path, capsys):
    bad = _write_csv(tmp_path / "bad.csv", _raw_rows(), drop="etr")
    _fails(["predict", str(run), "--csv", str(bad)], tmp_path / "f.csv", capsys, "etr")


def test_a_too_short_series_is_left_out_and_the_others_forecast(run, tmp_path, capsys):
    """One entity too short to forecast made predict and backtest fail for every entity."""
    raw = _raw_rows()
    first = raw[0]["station"]
    short = [r for r in raw if r["station"] == first][:20]
    short += [r for r in raw if r["station"] != first]
    part = _write_csv(tmp_path / "short.csv", short)
    full, got = tmp_path / "full.csv", tmp_path / "f.csv"
    assert main(["predict", str(run), *AT, "--engine", "int8", "--out", str(full)]) == 0
    with pytest.warns(UserWarning, match=rf"1 entities are too short.*entity '{first}' has 20"):
        assert main(["predict", str(run), *AT, "--engine", "int8", "--csv", str(part),
                     "--out", str(got)]) == 0  # fmt: skip
    # the other station's forecasts are those made with the whole file (to float32 rounding:
    # the float linear skip's BLAS product may sum a batch of one window otherwise)
    a, b = _read(got), [r for r in _read(full) if r["entity"] != first]
    assert [(r["entity"], r["time"], r["step"]) for r in a] == [
        (r["entity"], r["time"], r["step"]) for r in b
    ]
    for q in ("p10", "p50", "p90"):
        np.testing.assert_allclose([float(r[q]) for r in a], [float(r[q]) for r in b], atol=1e-5)
    only_short = _write_csv(tmp_path / "only.csv", short[:20])
    _fails(["predict", str(run), "--csv", str(only_short)], tmp_path / "g.csv", capsys, "rows")


def test_error_unfinished_or_empty_run(run, tmp_path, capsys):
    empty = tmp_path / "empty"
    empty.mkdir()
    _fails(["predict", str(empty)], tmp_path / "f.csv", capsys, "no finished model")
    part = tmp_path / "part"
    shutil.copytree(run, part)
    st = json.loads((part / "checkpoint" / "state.json").read_text())
    st["state"]["phase"] = "qat"
    (part / "checkpoint" / "state.json").write_text(json.dumps(st))  # a hand edit: refused
    _fails(["predict", str(part)], tmp_path / "f.csv", capsys, "checksum")
    from nbqat.train.checkpoint_schema import digest

    st["checksum"] = digest(st)  # an interrupted run's state, as the main job writes it
    (part / "checkpoint" / "state.json").write_text(json.dumps(st))
    _fails(["predict", str(part)], tmp_path / "f.csv", capsys, "unfinished run")
    _fails(["predict", str(tmp_path / "nope")], tmp_path / "f.csv", capsys, "not a folder")


def test_error_missing_onnx_file(run, tmp_path, capsys):
    part = tmp_path / "noonnx"
    shutil.copytree(run, part)
    (part / "model.onnx").unlink()
    _fails(["predict", str(part), *AT], tmp_path / "f.csv", capsys, "no model.onnx")
    argv = ["predict", str(part), *AT, "--engine", "int8", "--out", str(tmp_path / "g.csv")]
    assert main(argv) == 0


@pytest.mark.parametrize("size", [0, 2000])  # empty, truncated
def test_error_damaged_onnx_file(run, tmp_path, capsys, size):
    """A damaged model.onnx: the ONNX engine names it (no protobuf traceback); the int8 engine,
    which does not read it, forecasts as from the intact run."""
    part = tmp_path / "damaged"
    shutil.copytree(run, part)
    data = (part / "model.onnx").read_bytes()
    (part / "model.onnx").write_bytes(data[:size])
    _fails(["predict", str(part), *AT], tmp_path / "f.csv", capsys, "is not a readable ONNX model")
    for r, name in ((part, "g.csv"), (run, "h.csv")):
        argv = ["predict", str(r), *AT, "--engine", "int8", "--out", str(tmp_path / name)]
        assert main(argv) == 0
    assert _read(tmp_path / "g.csv") == _read(tmp_path / "h.csv")


def test_error_out_is_one_of_the_runs_own_files(run, tmp_path, capsys):
    """Even with --overwrite a forecast never replaces the model it came from."""
    part = tmp_path / "own"
    shutil.copytree(run, part)
    for own in ("model.onnx", "checkpoint/state.json", "metrics.json"):
        before = (part / own).read_bytes()
        argv = ["predict", str(part), *AT, "--out", str(part / own), "--overwrite"]
        assert main(argv) == 2
        assert f"is the run's own {own.split('/')[0]}" in capsys.readouterr().err
        assert (part / own).read_bytes() == before
    assert main(["predict", str(part), *AT, "--out", str(part / "f.csv")]) == 0


def test_error_out_folder_missing(run, tmp_path, capsys):
    out = tmp_path / "nope" / "f.csv"
    assert main(["predict", str(run), "--out", str(out)]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert not out.parent.exists()


def test_error_out_is_a_folder(run, tmp_path, capsys):
    # was an IsADirectoryError traceback from os.replace after the whole forecast had run
    assert main(["predict", str(run), "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "is a folder" in err and "forecasts.csv" in err
    assert list(tmp_path.iterdir()) == []  # no temporary file left behind


def test_train_writes_onnx_and_parity(run):
    import onnx

    m = json.loads((run / "metrics.json").read_text())
    par = m["onnx_parity"]
    assert par["file"] == "model.onnx" and par["bytes"] == (run / "model.onnx").stat().st_size
    onnx.checker.check_model(onnx.load(str(run / "model.onnx")), full_check=True)
    for key in ("int8_vs_ort_disable_all", "int8_vs_ort_default", "int8_vs_reference"):
        assert par["pairs"][key]["max_diff_output_steps"] <= 1.0, key
    qr = m["q_risk_test"]["int8"]
    for q, v in par["engines"]["ort_default"]["q_risk"].items():
        assert float(f"{v:.4g}") == float(f"{qr[q]:.4g}"), q
    assert par["engines"]["int8"]["q_risk"] == qr  # the harness's int8 is the job's int8
    assert par["division_vs_reciprocal"]["runtime_vs_division"] == 0
    assert "output steps" in (run / "summary.txt").read_text()


def test_other_data_is_standardised_with_the_runs_scaling(run, tmp_path):
    """The data's own statistics are not refitted: a target shifted by 1 degree moves the
    forecast (it would not move a refitted standardisation's inputs)."""
    import warnings

    from nbqat.train.predict import forecast

    raw = _raw_rows()
    for r in raw:
        r["temp_air"] = str(float(r["temp_air"]) + 1.0)
    shifted = _write_csv(tmp_path / "shifted.csv", raw)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        a = forecast(run, str(shifted), at="2001-12-31T18:00", engine="int8")
    b = forecast(run, str(SHIPPED), at="2001-12-31T18:00", engine="int8")
    assert len(a) == 2 * 6
    np.testing.assert_allclose(a.actual, b.actual + 1.0)
    assert np.all(a.p50.to_numpy() > b.p50.to_numpy())


def test_onnx_metadata_of_the_run(run):
    """Feature names and per-entity target scaling in model.onnx against the windows rebuilt
    from the shipped data with the run's options."""
    import onnx

    from nbqat.data import load_tmy3, make_windows

    w = make_windows(load_tmy3(), history=24, horizon=6, eval_stride=96, calendar=["hour", "dow"])
    props = {p.key: p.value for p in onnx.load(str(run / "model.onnx")).metadata_props}
    assert json.loads(props["historical_features"]) == w.historical_names
    assert json.loads(props["future_features"]) == w.future_names
    assert json.loads(props["static_features"]) == w.static_names
    sc = json.loads(props["target_scaling"])
    for e, lv, s in zip(w.entity_names, w.level, w.scale):
        assert sc[e] == {"level": lv, "scale": s}
    m = json.loads((run / "metrics.json").read_text())
    assert json.loads(props["q_risk_test"]) == m["q_risk_test"]


@pytest.mark.parametrize(
    "options",
    [["--observer", "histogram"], ["--weight-bits", "4", "--group-size", "16"],
     ["--window-norm", "last"]],
)  # fmt: skip
def test_predict_a_run_trained_with_another_qconfig(tmp_path, options):
    """predict rebuilt the model with min/max observers and int8 weights, which refused the
    checkpoint's histogram state ("unexpected key(s) ['histogram_count', ...]") for every
    --observer run, and the grouped weights' state ("unexpected key(s) ['block_size']") of a
    --weight-bits 4 run; --window-norm last puts the shift into model.onnx's graph. Oracle:
    the int8 engine (the checkpoint, reloaded) agrees with model.onnx (exported by the run
    itself) within one output step."""
    run = tmp_path / "run"
    assert main(["train", *TINY, *options, "--out", str(run)]) == 0
    outs = {}
    for eng in ("onnx", "int8"):
        p = tmp_path / f"{eng}.csv"
        assert main(["predict", str(run), *AT, "--engine", eng, "--out", str(p)]) == 0
        outs[eng] = np.array([[float(r[q]) for q in ("p10", "p50", "p90")] for r in _read(p)])
    step = json.loads((run / "metrics.json").read_text())["onnx_parity"]["output_scale"]
    scale = max(s["scale"] for s in _scaling(run).values())
    assert outs["int8"].shape == outs["onnx"].shape and outs["int8"].size > 0
    assert np.max(np.abs(outs["int8"] - outs["onnx"])) <= step * scale * 1.001 + 1e-5


def test_forecast_files_keep_every_digit_and_tiny_q_risks_print(tmp_path):
    """A series at 1e7 +- 8 was written as 1e+07 in every row (6 significant digits), and its
    q-risks (divided by sum |y|, near 1e-7) printed as 0.0000."""
    import pandas as pd

    from nbqat.train.predict import write_csv
    from nbqat.train.summary import q_text

    df = pd.DataFrame({"entity": ["a", "a"], "p50": [10000008.463287354, 9999991.25]})
    df["p10"] = df.p50 - 1.5e-3
    back = pd.read_csv(write_csv(df, tmp_path / "f.csv"))
    assert back.p50.tolist() == df.p50.tolist() and back.p10.tolist() == df.p10.tolist()
    assert q_text(8.812e-8, 9) == " 8.81e-08" and q_text(0.34326, 9) == "   0.3433"
    assert q_text(0.0) == "0.0000"


def test_backtest_q_risk_is_undefined_for_all_zero_actuals():
    """A backtest over an all-zero target printed a q-risk of 0 or about 1e300 (sum |y| was
    floored at 1e-300); the definition (2 sum pinball / sum |y|) is undefined there: NaN.
    Elsewhere the table is the definition, computed here directly (a NaN actual is left out)."""
    import pandas as pd

    from nbqat.train.predict import q_risk_table

    qs = (0.1, 0.5, 0.9)
    zero = pd.DataFrame({"actual": [0.0, 0.0, np.nan], "p10": [-1.0, 0.0, 1.0],
                         "p50": [0.5, 0.0, 1.0], "p90": [2.0, 1.0, 1.0]})  # fmt: skip
    got = q_risk_table(zero, qs)
    assert list(got) == ["P10", "P50", "P90"] and all(math.isnan(v) for v in got.values())
    df = zero.assign(actual=[1.0, -3.0, np.nan])
    y = np.array([1.0, -3.0])
    for q, col in zip(qs, ("p10", "p50", "p90")):
        e = y - df[col].to_numpy()[:2]
        want = 2 * sum(q * v if v >= 0 else (q - 1) * v for v in e) / 4.0
        assert q_risk_table(df, qs)[col.upper()] == pytest.approx(want, rel=1e-15)


def test_out_dash_writes_the_csv_to_standard_output(run, tmp_path, capsys, monkeypatch):
    """``--out -`` is standard output (the CSV only; messages on stderr), as in most command
    line tools: it wrote a file named '-' in the working folder."""
    monkeypatch.chdir(tmp_path)
    file = tmp_path / "f.csv"
    assert main(["predict", str(run), *AT, "--out", str(file)]) == 0
    capsys.readouterr()
    assert main(["predict", str(run), *AT, "--out", "-"]) == 0
    out = capsys.readouterr()
    assert out.out == file.read_text() and "wrote" not in out.err
    assert list(tmp_path.iterdir()) == [file]
    assert main(["backtest", str(run), "--stride", "24", "--out", "-"]) == 0
    out = capsys.readouterr()
    assert out.out.startswith("entity,origin,time,") and "backtest q-risk" in out.err


def test_out_dash_into_a_closed_pipe_ends_quietly(run):
    """``nbqat predict RUN --out - | head -1`` printed a BrokenPipeError traceback (from
    pandas' to_csv) once head had left; line tools stop quietly there. The reader is gone
    before the CSV is written: no traceback, the status a tool stopped by SIGPIPE has."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    for cmd in (["predict", *AT], ["backtest", "--stride", "24"]):
        p = subprocess.Popen(
            [sys.executable, "-m", "nbqat", cmd[0], str(run), *cmd[1:], "--out", "-"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
        )  # fmt: skip
        p.stdout.close()  # type: ignore[union-attr]
        err = p.stderr.read().decode()  # type: ignore[union-attr]
        assert p.wait(timeout=120) == 141, err
        assert "Traceback" not in err and "BrokenPipe" not in err, err


def test_out_a_pipe_or_device_is_written_into_not_replaced(run, tmp_path):
    """``--out /dev/null`` was refused ("exists; pass --overwrite"), and with --overwrite the
    atomic rename would have put a regular file in the device's place. A FIFO stands in for
    it here: the CSV arrives through the pipe, which is still a pipe afterwards, with or
    without --overwrite; the text equals --out FILE's."""
    import os
    import stat
    import threading

    file = tmp_path / "f.csv"
    assert main(["predict", str(run), *AT, "--out", str(file)]) == 0
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    for extra in ([], ["--overwrite"]):
        got: list[str] = []
        reader = threading.Thread(target=lambda got=got: got.append(fifo.read_text()))
        reader.start()
        try:
            rc = main(["predict", str(run), *AT, "--out", str(fifo), *extra])
        finally:
            if reader.is_alive() and not got:  # refused before opening it: free the reader
                with open(fifo, "w"):
                    pass
            reader.join(timeout=60)
        assert rc == 0 and got == [file.read_text()]
        assert stat.S_ISFIFO(fifo.stat().st_mode)
