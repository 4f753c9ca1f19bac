"""Issue 20/16 for the main job: the validation pass, safe --out, strict JSON, checkpoints.

Oracles: the files on disk (existence, bytes before/after), json.loads with NaN/Infinity
refused, the checkpoint's own timings, and hand-made corruptions of a real checkpoint.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import numpy as np
import pytest

from nbqat.cli import main
from nbqat.data import tmy3_path
from nbqat.train.preflight import finite_metrics

TINY = [
    "--epochs", "2", "--qat-epochs", "1", "--batch-size", "16", "--hidden-dim", "4",
    "--heads", "1", "--history", "24", "--horizon", "6", "--windows-per-epoch", "48",
    "--calibration-batches", "2", "--eval-stride", "96", "--no-progress", "--seed", "3",
    "--no-plots",
]  # fmt: skip
CSV = ["--time-col", "time", "--target-col", "temp_air", "--entity-col", "station"]


def strict_json(path: Path):
    def bad(c):
        raise ValueError(f"non-strict JSON constant {c}")

    return json.loads(path.read_text(), parse_constant=bad)


def snapshot(folder: Path) -> dict:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}


@pytest.fixture(scope="module")
def interrupted(tmp_path_factory):
    """A run on a copy of the shipped file, interrupted after 4 float steps."""
    root = tmp_path_factory.mktemp("interrupted")
    data = root / "data.csv.gz"
    shutil.copyfile(tmy3_path(), data)
    out = root / "run"
    rc = main(["train", *TINY, "--csv", str(data), *CSV, "--out", str(out),
               "--stop-after-steps", "4"])  # fmt: skip
    assert rc == 130
    return root


@pytest.fixture
def run_copy(interrupted, tmp_path):
    shutil.copytree(interrupted, tmp_path / "c")
    return tmp_path / "c"


def resume(ck: Path, *extra: str) -> int:
    return main(["train", "--resume", str(ck), "--no-progress", *extra])


# ------------------------------------------------------------------------------------- --out


def test_out_holding_a_run_is_refused_unless_overwrite(tmp_path, capsys):
    out = tmp_path / "o"
    out.mkdir()
    (out / "metrics.json").write_text("{}")
    (out / "attention.png").write_bytes(b"old")
    (out / "forecasts.csv").write_text("the old model's")
    (out / "notes.txt").write_text("mine")
    assert main(["train", *TINY, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "holds a previous run (attention.png, metrics.json)" in err and "--overwrite" in err
    assert main(["train", *TINY, "--out", str(out), "--overwrite"]) == 0
    m = strict_json(out / "metrics.json")
    assert "overwrite" not in m["config"] and math.isfinite(m["q_risk_test"]["int8"]["P50"])
    assert not (out / "attention.png").exists()  # --no-plots: the stale plot is gone
    assert not (out / "forecasts.csv").exists()  # the replaced model's forecasts go with it
    assert (out / "notes.txt").read_text() == "mine"
    assert f"outputs in {out.resolve()}" in capsys.readouterr().out
    assert sorted(p.name for p in out.iterdir() if p.name.startswith(".")) == []  # none set aside


def test_a_failed_overwrite_keeps_the_previous_run(tmp_path, capsys):
    """--overwrite removed the previous run's outputs before training: a run that then failed
    (here a divergence) left the folder without either run."""
    out = tmp_path / "o"
    out.mkdir()
    old = {"metrics.json": b"{}", "model.onnx": b"old model", "forecasts.csv": b"old"}
    for name, data in old.items():
        (out / name).write_bytes(data)
    (out / "checkpoint").mkdir()
    (out / "checkpoint" / "meta.json").write_text("{}")
    diverge = ["--lr", "1e6", "--max-norm", "none"]
    assert main(["train", *TINY, *diverge, "--out", str(out), "--overwrite"]) == 2
    assert "diverged" in capsys.readouterr().err
    # as before the run: no hidden folder, none of the failed run's files
    assert {p.name for p in out.iterdir()} == {*old, "checkpoint"}
    assert all((out / n).read_bytes() == d for n, d in old.items())
    assert (out / "checkpoint" / "meta.json").read_text() == "{}"
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["train", *TINY, "--out", str(empty), "--check"]) == 0


def test_out_that_is_a_file(tmp_path, capsys):
    f = tmp_path / "f"
    f.write_text("x")
    for out in (f, f / "sub"):
        assert main(["train", *TINY, "--out", str(out)]) == 2
        err = capsys.readouterr().err
        assert "is a file, not a folder" in err and "Traceback" not in err


@pytest.mark.parametrize("extra, needle", [
    (["--windows-per-epoch", "8"], "--windows-per-epoch 8 is below --batch-size 16"),
    (["--history", "12"], "--history 12 is shorter than the seasonal-naive period of 24"),
    (["--batch-size", "100000"], "fewer than --batch-size 100000"),
])  # fmt: skip
def test_option_errors_leave_no_folder(tmp_path, capsys, extra, needle):
    out = tmp_path / "new"
    assert main(["train", *TINY, *extra, "--out", str(out)]) == 2
    assert needle in capsys.readouterr().err
    assert not out.exists()


def test_exactly_periodic_target_is_refused_before_training(tmp_path, capsys):
    p = tmp_path / "p.csv"
    lines = ["t,y,x"] + [
        f"2020-01-{1 + i // 24:02d}T{i % 24:02d}:00,{math.sin(2 * math.pi * i / 24):.6f},{i % 5}"
        for i in range(24 * 28)
    ]
    p.write_text("\n".join(lines) + "\n")
    out = tmp_path / "o"
    rc = main(["train", *TINY, "--csv", str(p), "--time-col", "t", "--target-col", "y",
               "--out", str(out)])  # fmt: skip
    assert rc == 2
    assert (
        "seasonal-naive forecast (the value 24 steps earlier) is exact" in capsys.readouterr().err
    )
    assert not out.exists()


@pytest.mark.parametrize("extra", [[], ["--history", "auto"]])
def test_all_zero_validation_target_is_refused_by_name(tmp_path, capsys, extra):
    """The q-risk (2 sum pinball / sum |y|) of an all-zero validation target is undefined:
    early stopping (or --history auto's ridge search) failed on it with q_risk's bare
    "undefined"; now the validation pass names the split, as it does the test split's."""
    n = 24 * 28
    cut_val, cut_test = round((n - 1) * 0.7), round((n - 1) * 0.85)  # the default split
    p = tmp_path / "z.csv"
    rows = [
        f"2020-01-{1 + i // 24:02d}T{i % 24:02d}:00,"
        f"{0.0 if cut_val <= i < cut_test else 5 + math.sin(i) + (i % 7) / 3:.6f}"
        for i in range(n)
    ]
    p.write_text("t,y\n" + "\n".join(rows) + "\n")
    out = tmp_path / "o"
    rc = main(["train", *TINY, *extra, "--csv", str(p), "--time-col", "t", "--target-col", "y",
               "--out", str(out)])  # fmt: skip
    err = capsys.readouterr().err
    assert rc == 2 and "'y' is zero on every validation window" in err, err
    assert not out.exists()


def test_version(capsys):
    from nbqat import __version__

    with pytest.raises(SystemExit) as ei:
        main(["--version"])
    assert ei.value.code == 0 and capsys.readouterr().out.strip() == f"nbqat {__version__}"


def test_finite_metrics_names_the_path():
    finite_metrics({"a": [1.0, {"b": 2}], "c": None})
    with pytest.raises(ValueError, match=r"q_risk_test\.int8\.P50 is inf \(the predictions"):
        finite_metrics({"q_risk_test": {"int8": {"P50": math.inf}}})
    with pytest.raises(ValueError, match=r"float\.curves\.val\[1\] is nan \(the training diverged"):
        finite_metrics({"float": {"curves": {"val": [1.0, math.nan]}}})


# -------------------------------------------------------------------------------- checkpoints


def test_resume_uses_the_checkpoint_location_and_sums_timings(run_copy, interrupted, tmp_path,
                                                              monkeypatch):  # fmt: skip
    original = snapshot(interrupted / "run" / "checkpoint")
    ck = run_copy / "run" / "checkpoint"
    meta = strict_json(ck / "state.json")
    assert Path(meta["data"]["path"]).is_absolute() and meta["version"] == 3
    first = meta["state"]["timings"]
    assert first["float"] > 0 and first["data"] > 0
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    assert resume(ck) == 0
    assert not any(elsewhere.iterdir())  # nothing written in the current directory
    assert snapshot(interrupted / "run" / "checkpoint") == original  # the original run untouched
    t = strict_json(run_copy / "run" / "timings.json")["phases_s"]
    assert t["float"] >= round(first["float"], 3) and t["data"] >= round(first["data"], 3)
    assert t["total"] == pytest.approx(sum(v for k, v in t.items() if k != "total"), abs=0.01)
    m = strict_json(run_copy / "run" / "metrics.json")
    assert m["float"]["epochs_run"] == 2


def _legacy_float_npz(ck: Path) -> None:
    """Rewrite float.npz in the layout of nbqat releases before the one codec: flat members
    ``params``, ``best_params``, ``opt.<a/0/b>`` (lists as ``<path>/__list__``), no manifest."""
    from nbqat.train.checkpoint_schema import load_float_state

    state = load_float_state(ck / "float.npz")
    flat: dict[str, np.ndarray] = {}

    def put(v, key):
        if isinstance(v, dict):
            for k, x in v.items():
                put(x, f"{key}{k}/")
        elif isinstance(v, (list, tuple)):
            flat[key + "__list__"] = np.asarray(len(v))
            for i, x in enumerate(v):
                put(x, f"{key}{i}/")
        else:
            flat[key.rstrip("/")] = np.asarray(v)

    put(state.pop("opt"), "opt.")
    with open(ck / "float.npz", "wb") as fh:
        np.savez(fh, **state, **{k.replace("opt./", "opt."): v for k, v in flat.items()})


def test_checkpoint_of_the_previous_layout_resumes_to_the_same_metrics(run_copy, tmp_path):
    shutil.copytree(run_copy, tmp_path / "legacy")
    _legacy_float_npz(tmp_path / "legacy" / "run" / "checkpoint")
    with np.load(tmp_path / "legacy" / "run" / "checkpoint" / "float.npz") as z:
        assert "params" in z.files and any(k.startswith("opt.") for k in z.files)
    metrics = []
    for root in (run_copy, tmp_path / "legacy"):
        assert resume(root / "run" / "checkpoint") == 0
        m = strict_json(root / "run" / "metrics.json")
        metrics.append({k: v for k, v in m.items() if k not in ("version", "data", "out")})
    assert metrics[0] == metrics[1]


def test_resume_refuses_changed_data(run_copy, capsys):
    import gzip

    ck = run_copy / "run" / "checkpoint"
    data = run_copy / "data.csv.gz"

    def here(m):  # the copied run reads the copied data
        m["config"]["csv"] = m["data"]["path"] = str(data.resolve())

    _edit_state(ck, here)
    before = snapshot(ck)
    assert resume(ck, "--check") == 0

    text = gzip.decompress(data.read_bytes()).replace(b",4.0,3.0,93,", b",4.5,3.0,93,", 1)
    data.write_bytes(gzip.compress(text))
    assert resume(ck) == 2
    err = capsys.readouterr().err
    assert "state.json: field 'data.bytes'" in err or "field 'data.sha256'" in err
    assert "the data file changed" in err
    assert snapshot(ck) == before


def test_resume_refuses_conflicting_options(run_copy, capsys):
    ck = run_copy / "run" / "checkpoint"
    assert resume(ck, "--epochs", "5", "--seed", "3", "--lr", "0.1") == 2
    err = capsys.readouterr().err
    assert "--epochs 5 (the checkpoint has 2)" in err and "--lr 0.1" in err
    assert "--seed" not in err  # the same value is no conflict
    assert resume(ck, "--out", str(run_copy / "x")) == 2
    assert "--out" in capsys.readouterr().err
    assert resume(ck, "--epochs", "2", "--check") == 0


def _edit_state(ck: Path, fn, sign: bool = True) -> None:
    """Edit state.json; ``sign``: recompute its checksum (to reach the checks behind it)."""
    from nbqat.train.checkpoint_schema import digest

    meta = json.loads((ck / "state.json").read_text())
    fn(meta)
    if sign:
        meta["checksum"] = digest(meta)
    (ck / "state.json").write_text(json.dumps(meta))


def _npz(ck: Path, fn) -> None:
    """Edit float.npz's state through the codec (the file stays a valid npz_state file)."""
    from nbqat import npz_state
    from nbqat.train.checkpoint_schema import FLOAT_FORMAT

    state = npz_state.load_state(ck / "float.npz", format=FLOAT_FORMAT)
    fn(state)
    npz_state.save_state(ck / "float.npz", state, format=FLOAT_FORMAT)


CORRUPTIONS = [
    (lambda ck: _edit_state(ck, lambda m: m["state"].__setitem__("epoch", -1)),
     "state.json: field 'state.epoch': -1 outside"),
    (lambda ck: _edit_state(ck, lambda m: m["state"].__setitem__("epoch", 10**6)),
     "field 'state.epoch'"),
    (lambda ck: _edit_state(ck, lambda m: m["state"].__setitem__("batch_pos", 10**6)),
     "field 'state.batch_pos': 1000000 exceeds the 3 batches"),
    (lambda ck: _edit_state(ck, lambda m: m["state"].__setitem__("phase", "warmup")),
     "field 'state.phase': unknown phase 'warmup'"),
    (lambda ck: _edit_state(ck, lambda m: m["state"].__setitem__("epoch", "1")),
     "field 'state.epoch': expected int, got str"),
    (lambda ck: _edit_state(ck, lambda m: m.__setitem__("extra", 1)),
     "field 'extra': unknown field"),
    (lambda ck: _edit_state(ck, lambda m: m["config"].__setitem__("hidden_dim", 8)),
     "float.npz: field 'params'"),
    (lambda ck: _edit_state(ck, lambda m: m["config"].__setitem__("csv", "data.csv.gz")),
     "field 'config.csv': expected an absolute path"),
    (lambda ck: _edit_state(ck, lambda m: m.__setitem__("version", 1)),
     "field 'version': 1"),
    (lambda ck: _edit_state(ck, lambda m: m.__setitem__("version", 2)),
     "field 'version': 2; this nbqat reads 3 (a checkpoint of an older nbqat cannot be resumed"),
    (lambda ck: _edit_state(ck, lambda m: m["config"].__setitem__("csv", 0)),
     "field 'config.csv': expected a string or null, got 0"),
    (lambda ck: _edit_state(ck, lambda m: m["config"].__setitem__("seed", 4), sign=False),
     "field 'checksum': the content does not match it"),
    (lambda ck: _edit_state(ck, lambda m: m.pop("checksum"), sign=False),
     "field 'checksum': missing"),
    (lambda ck: (ck / "state.json").write_text('{"version": 2, '),
     "state.json: not readable JSON"),
    (lambda ck: (ck / "float.npz").write_bytes((ck / "float.npz").read_bytes()[:300]),
     "float.npz: unreadable (truncated or corrupt?)"),
    (lambda ck: _npz(ck, lambda a: a.pop("params")), "float.npz: field 'params': missing member"),
    (lambda ck: _npz(ck, lambda a: a.__setitem__("junk", np.zeros(2))),
     "float.npz: field 'junk': unknown member"),
    (lambda ck: _npz(ck, lambda a: a.pop("best_params")),
     "float.npz: field 'best_params': missing"),
]  # fmt: skip


@pytest.mark.parametrize("corrupt, needle", CORRUPTIONS)
def test_corrupt_checkpoints_are_clear_errors_and_left_alone(run_copy, capsys, corrupt, needle):
    ck = run_copy / "run" / "checkpoint"
    corrupt(ck)
    before = snapshot(ck)
    assert resume(ck) == 2
    err = capsys.readouterr().err
    assert err.startswith("nbqat train: error:") and "Traceback" not in err
    assert needle in err, err
    assert snapshot(ck) == before
    assert not (run_copy / "run" / "metrics.json").exists()


# ------------------------------------------------------------------------------------- plots


@pytest.mark.parametrize(("k", "tau"), [(12, 6), (12, 12), (8, 4), (24, 24)])
def test_step_axes_are_ticked_at_whole_steps(tmp_path, monkeypatch, k, tau):
    """The forecast fan of monthly data (12 months of history, 6 forecast) was ticked at
    -12.5, -7.5, ... steps; every step axis (the fan's, the attention plot's key positions and
    decoder steps) now ticks whole steps."""
    from nbqat.train import plots

    ticks, save = [], plots._save

    def grab(fig, path):  # each step axis's ticks as drawn (colour bars have no x label)
        for ax in fig.axes:
            if ax.get_xlabel():
                steps = ax.get_ylabel() == "decoder step"
                ticks.append([*ax.get_xticks(), *(ax.get_yticks() if steps else [])])
        return save(fig, path)

    monkeypatch.setattr(plots, "_save", grab)
    rng = np.random.default_rng(k)
    plots.plot_forecast_fan(rng.normal(size=(2, k)), rng.normal(size=(2, tau)),
                            np.sort(rng.normal(size=(2, tau, 3)), axis=2), (0.1, 0.5, 0.9),
                            tmp_path / "f.png", show_history=k, xlabel="months")  # fmt: skip
    plots.plot_attention(rng.random((tau, k + tau)), tmp_path / "a.png", history=k)
    values = [float(v) for axis in ticks for v in axis]
    assert len(ticks) == 4 and values and all(v.is_integer() for v in values)


def test_plots_take_dollar_names_and_label_units(tmp_path):
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: F401

    from nbqat.train import plots

    rng = np.random.default_rng(0)
    names = ["$x", "a$b$c", "price $", r"y$\nope$", "$a_b_c$"]  # the last two: bad mathtext
    f = plots.plot_forecast_fan(
        rng.normal(size=(2, 30)),
        rng.normal(size=(2, 6)),
        np.sort(rng.normal(size=(2, 6, 3)), axis=2),
        (0.1, 0.5, 0.9),
        tmp_path / "f.png",
        titles=["$a_b_c$ from 2020", r"$\nope$"],
        ylabel="cost $ ($)",
        model="int8 $model$",
    )
    w = [0.2, 0.3, 0.1, 0.1, 0.3]
    v = plots.plot_variable_importance({"en$coder": (names, w)}, tmp_path / "v.png")
    c = plots.plot_clipping_comparison(
        {"$clipped$": {"loss": [1, 0.5], "grad_norm": [3, 0.2]}}, tmp_path / "c.png", max_norm=1.0
    )
    for p in (f, v, c):
        assert p.read_bytes()[:4] == b"\x89PNG"
    assert plots.step_unit(np.timedelta64(3600, "s")) == "hours"
    assert plots.step_unit(np.timedelta64(86400, "s")) == "days"
    # weekly and half-hourly data were labelled "steps of 604800 seconds" / "... 1800 seconds"
    assert plots.step_unit(np.timedelta64(604800, "s")) == "weeks"
    assert plots.step_unit(np.timedelta64(1800, "s")) == "steps of 30 minutes"
    assert plots.step_unit(np.timedelta64(2 * 86400, "s")) == "steps of 2 days"
    assert plots.step_unit(0.5) == "steps"
    assert plots.target_label("temp_air", "nbqat/data/tmy3_two_stations.csv.gz") == (
        "temp_air (deg C)"
    )
    assert plots._esc("a$b") == "a\\$b"


def test_qat_phase_checkpoint_corruption_and_config(interrupted, tmp_path, capsys):
    from nbqat.train import read_run_config

    shutil.copytree(interrupted, tmp_path / "c")
    ck = tmp_path / "c" / "run" / "checkpoint"
    assert resume(ck, "--stop-after-steps", "3") == 130  # 2 float steps, 1 QAT step
    cfg = read_run_config(ck)
    assert cfg.out == str((tmp_path / "c" / "run").resolve()) and Path(cfg.csv).is_absolute()
    assert (cfg.hidden_dim, cfg.epochs, cfg.batch_size) == (4, 2, 16)
    meta = strict_json(ck / "state.json")
    assert meta["state"]["phase"] == "qat" and (ck / "qat.npz").is_file()
    capsys.readouterr()
    (ck / "qat.npz").write_bytes((ck / "qat.npz").read_bytes()[:500])
    before = snapshot(ck)
    assert resume(ck) == 2
    err = capsys.readouterr().err
    assert "qat.npz" in err and "truncated" in err and "Traceback" not in err
    assert snapshot(ck) == before
    (ck / "qat.npz").unlink()
    assert resume(ck) == 2
    assert "qat.npz: missing for phase 'qat'" in capsys.readouterr().err


def test_fill_gaps_counts_reach_metrics_and_summary(tmp_path, capsys):
    lines = ["t,y,x"]
    for i in range(24 * 30):
        y = f"{10 + 5 * math.sin(i / 3.8) + (i % 7) * 0.1:.3f}"
        lines.append(f"2020-01-{1 + i // 24:02d}T{i % 24:02d}:00,{y},{'' if i == 50 else i % 5}")
    del lines[100:104]  # 4 missing steps: 4 cells of y and of x
    p = tmp_path / "g.csv"
    p.write_text("\n".join(lines) + "\n")
    out = tmp_path / "o"
    argv = ["train", *TINY, "--csv", str(p), "--time-col", "t", "--target-col", "y"]
    assert main([*argv, "--out", str(out)]) == 2
    assert "--fill-gaps" in capsys.readouterr().err and not out.exists()
    assert main([*argv, "--out", str(out), "--fill-gaps"]) == 0
    m = strict_json(out / "metrics.json")
    assert m["data"]["filled"] == {"series": {"y": 4, "x": 5}}
    assert "filled by --fill-gaps (cells): series: y 4, x 5" in (out / "summary.txt").read_text()


def test_parquet_through_data_option(tmp_path, capsys):
    import pandas as pd

    from nbqat.data import load_tmy3

    df = pd.read_csv(tmy3_path())
    df.to_parquet(tmp_path / "t.parquet")
    out = tmp_path / "o"
    rc = main(["train", *TINY, "--data", str(tmp_path / "t.parquet"), *CSV,
               "--known-cols", "etr", "--static-cols", "latitude,longitude,elevation",
               "--out", str(out), "--check"])  # fmt: skip
    assert rc == 0 and not out.exists()
    msg = capsys.readouterr().out
    ref = load_tmy3()
    assert "2 series" in msg
    from nbqat.data import load_csv

    d = load_csv(tmp_path / "t.parquet", **_TMY3)
    for e in range(2):
        np.testing.assert_array_equal(d.target[e], ref.target[e])
        np.testing.assert_array_equal(d.times[e], ref.times[e])


_TMY3 = dict(time_col="time", target_col="temp_air", entity_col="station", known_cols="etr",
             static_cols="latitude,longitude,elevation")  # fmt: skip


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_diverged_float_training_is_a_clear_error(tmp_path, capsys):
    rc = main(["train", *TINY, "--lr", "1e30", "--max-norm", "none", "--out", str(tmp_path / "o")])
    assert rc == 2
    err = capsys.readouterr().err
    assert "the float training diverged" in err and "--lr" in err and "Traceback" not in err
    assert not (tmp_path / "o").exists()  # README: a failed run leaves no folder behind
    assert main(["train", *TINY, "--lr", "1e30", "--max-norm", "none",
                 "--out", str(tmp_path / "p" / "q")]) == 2  # fmt: skip
    assert not (tmp_path / "p").exists()  # nor the parents it created
    capsys.readouterr()
    assert main(["train", *TINY, "--lr", "1e30", "--out", str(tmp_path / "c")]) == 2
    err = capsys.readouterr().err  # clipped already (--max-norm 1.0): no advice to set one
    assert "lower --lr" in err and "--max-norm" not in err


def test_resuming_a_finished_run_is_refused_and_changes_nothing(tmp_path, capsys):
    # a finished run has nothing to resume: evaluating it again would add to timings.json
    out = tmp_path / "o"
    assert main(["train", *TINY, "--out", str(out)]) == 0
    before = {p.name: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    capsys.readouterr()
    assert main(["train", "--resume", str(out / "checkpoint")]) == 2
    err = capsys.readouterr().err
    assert "that run is finished" in err and str(out) in err and "Traceback" not in err
    assert {p.name: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before


def test_an_out_that_cannot_be_created_is_named(tmp_path, capsys, monkeypatch):
    """--check said OK for such an --out, and the run failed with a bare '[Errno 2] No such
    file or directory'."""
    import os

    if os.path.isdir("/proc/self"):  # a folder the OS refuses to create anything in
        assert main(["train", *TINY, "--out", "/proc/nbqat-run"]) == 2
        err = capsys.readouterr().err
        assert "--out '/proc/nbqat-run': cannot create it" in err and "Errno" not in err
    monkeypatch.setattr(os, "access", lambda *a, **k: False)  # as for a user without rights
    assert main(["train", *TINY, "--out", str(tmp_path / "new" / "run"), "--check"]) == 2
    err = capsys.readouterr().err
    assert f"{str(tmp_path)!r} is not writable" in err


@pytest.mark.parametrize(("steps", "side"), [(7, "qat_start.npz"), (10, "qat_clipped.npz")])
def test_compare_clipping_state_checked_before_the_phase(tmp_path, capsys, steps, side):
    """A --compare-clipping checkpoint in QAT (7 steps) or the unclipped QAT (10) without the
    state that phase loads at its end: --check said OK and the resumed run trained the phase,
    then failed ('checkpoint ... does not exist'); now refused up front, naming the file."""
    out = tmp_path / "run"
    argv = ["train", *TINY, "--compare-clipping", "--out", str(out)]
    assert main([*argv, "--stop-after-steps", str(steps)]) == 130
    ck = out / "checkpoint"
    (ck / side).unlink()
    (out / side).unlink()
    capsys.readouterr()
    assert resume(ck, "--check") == 2
    assert f"{ck / side}: missing for phase" in capsys.readouterr().err
    (ck / side).write_bytes(b"PK\x03\x04 truncated")
    assert resume(ck, "--check") == 2
    assert "not a readable nbqat checkpoint" in capsys.readouterr().err
