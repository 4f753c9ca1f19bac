"""nbqat train: argument parsing, clear errors, an end-to-end tiny run, determinism, resume.

Oracles: the seasonal-naive q-risk recomputed with plain Python loops from the raw shipped CSV;
q-risk/pinball recomputed by hand; byte comparison of metrics.json between runs; PNG headers.
"""

from __future__ import annotations

import csv
import gzip
import json
import math
from pathlib import Path

import numpy as np
import pytest

from nbqat.cli import build_parser, main
from nbqat.data import TMY3_FILE
from nbqat.train import TrainConfig, pinball_loss, plots, q_risk

PNG = b"\x89PNG\r\n\x1a\n"

# A tiny configuration: a few training steps, small network, coarse evaluation.
TINY = [
    "--epochs", "2", "--qat-epochs", "1", "--batch-size", "16", "--hidden-dim", "4",
    "--heads", "1", "--history", "24", "--horizon", "6", "--windows-per-epoch", "48",
    "--calibration-batches", "2", "--eval-stride", "96", "--no-progress", "--seed", "3",
]  # fmt: skip


def _train(out: Path, *extra: str) -> int:
    return main(["train", *TINY, "--out", str(out), *extra])


# ------------------------------------------------------------------------------------ parser


def test_parser_defaults_and_values():
    a = build_parser().parse_args(["train"])
    cfg = TrainConfig.from_args(a).resolved()
    assert (cfg.epochs, cfg.history, cfg.horizon, cfg.max_norm, cfg.device) == (
        TrainConfig.FULL["epochs"],
        TrainConfig.FULL["history"],
        24,
        1.0,
        "cpu",
    )
    assert cfg.qat_lr == pytest.approx(cfg.lr / 10)
    q = TrainConfig.from_args(build_parser().parse_args(["train", "--quick"])).resolved()
    assert q.hidden_dim == TrainConfig.QUICK["hidden_dim"] and q.quick
    q = TrainConfig.from_args(
        build_parser().parse_args(["train", "--quick", "--hidden-dim", "12", "--max-norm", "none"])
    ).resolved()
    assert q.hidden_dim == 12 and q.max_norm is None


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["train", "--epochs", "0"], "positive integer"),
        (["train", "--lr", "-1"], "positive"),
        (["train", "--device", "tpu"], "invalid choice"),
        (["train", "--seed", "-1"], "argument --seed: expected an integer >= 0"),
        (["train", "--time-col", "t"], "--time-col need --csv"),
        (["train", "--csv", "x.csv"], "--csv needs --time-col and --target-col"),
        # a misspelt option: the closest option of the command named
        (
            ["train", "--hiden", "8"],
            "unrecognized arguments: --hiden 8; did you mean --hidden-dim?",
        ),
        (["train", "--qat-epohcs=2"], "did you mean --qat-epochs?"),
        (["backtest", "runs/x", "--strdie", "2"], "did you mean --stride?"),
        (
            ["train", "--hiden", "8", "--lrr", "1"],
            "did you mean --hidden-dim for --hiden, --lr for",
        ),
        (["train", "--zzzz"], "unrecognized arguments: --zzzz (see"),  # nothing close
    ],
)
def test_parser_errors(argv, needle, capsys):
    with pytest.raises(SystemExit) as ei:
        main(argv)
    assert ei.value.code == 2
    assert needle in capsys.readouterr().err


@pytest.mark.parametrize("seed", [-1, 1.5, True])
def test_a_bad_seed_is_refused_by_the_check(tmp_path, seed):
    # numpy's default_rng(-1) raised "expected non-negative integer" (no option named) and a
    # float seed passed --check; the oracle is numpy's own refusal of these seeds.
    if not isinstance(seed, bool):
        with pytest.raises((TypeError, ValueError)):
            np.random.SeedSequence(seed)
    from nbqat.train import run

    with pytest.raises(ValueError, match="--seed must be an integer >= 0"):
        run(TrainConfig(seed=seed, quick=True, out=str(tmp_path / "r")), check_only=True)
    assert not (tmp_path / "r").exists()


def test_heads_must_divide_hidden(tmp_path, capsys):
    rc = main(["train", "--hidden-dim", "6", "--heads", "4", "--out", str(tmp_path)])
    assert rc == 2
    assert "--heads 4 must divide --hidden-dim 6" in capsys.readouterr().err


def test_cuda_unavailable_is_a_clear_error(tmp_path, capsys, monkeypatch):
    from nbqat import _cuda

    monkeypatch.setattr(_cuda, "cuda_available", lambda: False)
    rc = main(["train", "--quick", "--device", "cuda", "--out", str(tmp_path)])
    assert rc == 2
    err = capsys.readouterr().err
    assert "CUDA is not available" in err and "nbqat[cuda]" in err and "--device cpu" in err


def test_resume_needs_a_checkpoint(tmp_path, capsys):
    rc = main(["train", "--resume", str(tmp_path)])
    assert rc == 2
    assert "not a checkpoint folder" in capsys.readouterr().err


@pytest.mark.parametrize("earlier", [False, True])
def test_an_interrupt_after_a_nan_step_loss_exits_130_and_says_why(
    tmp_path, capsys, monkeypatch, earlier
):
    # A NaN step loss, then Ctrl-C: state.json (strict JSON) cannot hold it; the run wrote
    # nothing and crashed. Now it exits 130, says why no checkpoint was written, and keeps an
    # earlier valid one unchanged (oracle: its bytes).
    from nbqat.train import parallel

    ck = tmp_path / "checkpoint"
    if earlier:
        assert _train(tmp_path, "--stop-after-steps", "1") == 130
        before = (ck / "state.json").read_bytes()
    real = parallel.Parallel.step
    calls = []

    def nan_step(self, *a, **k):
        calls.append(1)
        loss, total = real(self, *a, **k)
        return (float("nan"), total) if len(calls) == 1 else (loss, total)

    monkeypatch.setattr(parallel.Parallel, "step", nan_step)
    capsys.readouterr()
    args = ["--resume", str(ck)] if earlier else ["--out", str(tmp_path)]
    rc = main(["train", *([] if earlier else TINY), *args, "--stop-after-steps", "2"])
    assert rc == 130
    err = capsys.readouterr().err
    assert "no checkpoint written: state.step_losses.float is not finite" in err, err
    assert not (tmp_path / "checkpoint.tmp").exists()
    if earlier:
        assert "earlier checkpoint" in err and (ck / "state.json").read_bytes() == before
    else:
        assert not ck.exists()


def test_resume_refuses_an_option_given_at_its_default(tmp_path, capsys):
    # An lstm run with --seed 3 stopped after one step: `--model tft` and `--seed 0` are the
    # parser's defaults but not the checkpoint's values; they were silently ignored (the run
    # went on as an lstm with seed 3). The oracle is the checkpoint's own state.json.
    i = TINY.index("--heads")
    lstm = TINY[:i] + TINY[i + 2 :]  # --heads is the TFT's: an error with --model lstm
    assert main(["train", *lstm, "--out", str(tmp_path), "--model", "lstm",
                 "--stop-after-steps", "1"]) == 130  # fmt: skip
    ck = tmp_path / "checkpoint"
    saved = json.loads((ck / "state.json").read_text())["config"]
    assert (saved["model"], saved["seed"], saved["max_norm"]) == ("lstm", 3, 1.0)
    before = (ck / "state.json").read_bytes()
    capsys.readouterr()
    assert main(["train", "--resume", str(ck), "--model", "tft", "--seed", "0",
                 "--max-norm", "1"]) == 2  # fmt: skip
    err = capsys.readouterr().err
    assert "--model 'tft' (the checkpoint has 'lstm')" in err
    assert "--seed 0 (the checkpoint has 3)" in err
    assert "--max-norm" not in err  # the checkpoint's value given again is no conflict
    assert (ck / "state.json").read_bytes() == before
    assert main(["train", "--resume", str(ck), "--no-plots", "--compare-clipping"]) == 2
    err = capsys.readouterr().err  # the flags as typed (it said "--plots False")
    assert "--no-plots (the checkpoint has plots=True)" in err
    assert "--compare-clipping (the checkpoint has compare_clipping=False)" in err
    assert main(["train", "--resume", str(ck), "--model", "lstm", "--seed", "3", "--check"]) == 0


def test_resume_takes_a_restated_word_or_float_and_names_none(tmp_path, capsys):
    # The checkpoint keeps resolved values: --history auto as the chosen number and the
    # default --qat-lr (--lr / 10) as 0.00030000000000000003, so restating `--history auto`
    # or `--qat-lr 0.0003` was refused as a conflict; --max-norm inf was shown as None. The
    # oracle is the checkpoint's own state.json.
    i = TINY.index("--history")
    auto = [*TINY[:i], "--history", "auto", *TINY[i + 2 :]]
    assert main(["train", *auto, "--out", str(tmp_path), "--max-norm", "inf",
                 "--stop-after-steps", "1"]) == 130  # fmt: skip
    ck = tmp_path / "checkpoint"
    saved = json.loads((ck / "state.json").read_text())["config"]
    assert isinstance(saved["history"], int) and saved["max_norm"] is None
    assert saved["qat_lr"] == saved["lr"] / 10 != float(f"{saved['qat_lr']:.6g}")  # the noise
    capsys.readouterr()
    restated = ["--history", "auto", "--qat-lr", f"{saved['qat_lr']:.6g}", "--max-norm", "inf"]
    assert main(["train", "--resume", str(ck), *restated, "--check"]) == 0, capsys.readouterr()
    assert main(["train", "--resume", str(ck), "--max-norm", "1", "--qat-lr", "1e-3"]) == 2
    err = capsys.readouterr().err
    assert "--max-norm 1.0 (the checkpoint has 'none')" in err, err
    assert "--qat-lr 0.001 (the checkpoint has 0.00030000000000000003)" in err, err


# ------------------------------------------------------------------------------ --csv errors


def _csv(path: Path, rows: list[list[str]]) -> Path:
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["t", "y", "x"])
        w.writerows(rows)
    return path


def _rows(n: int) -> list[list[str]]:
    return [[f"2020-01-{1 + i // 24:02d}T{i % 24:02d}:00", f"{math.sin(i / 4):.3f}", "1"]
            for i in range(n)]  # fmt: skip


@pytest.mark.parametrize(
    "mutate, extra, needle",
    [
        (None, ["--target-col", "temp"], "--target-col names column(s) ['temp']"),
        (lambda r: r[5].__setitem__(1, "warm"), [], "line 7: column 'y' has a non-numeric value"),
        (lambda r: r.pop(30), [], "gap in entity 'series'"),
        (lambda r: r.__setitem__(9, r[8]), [], "duplicate timestamp"),
        (lambda r: r.__setitem__(slice(10, 12), [r[11], r[10]]), [], "unsorted"),
    ],
)
def test_bad_csv_inputs_give_clear_errors(tmp_path, capsys, mutate, extra, needle):
    rows = _rows(200)
    if mutate:
        mutate(rows)
    p = _csv(tmp_path / "d.csv", rows)
    argv = ["train", "--csv", str(p), "--time-col", "t", "--target-col", "y", *extra]
    rc = main([*argv, "--out", str(tmp_path / "o")])
    assert rc == 2
    err = capsys.readouterr().err
    assert err.startswith("nbqat train: error:") and needle in err
    assert "Traceback" not in err


def test_too_short_csv(tmp_path, capsys):
    p = _csv(tmp_path / "d.csv", _rows(100))
    rc = main(["train", "--csv", str(p), "--time-col", "t", "--target-col", "y",
               "--out", str(tmp_path / "o")])  # fmt: skip
    assert rc == 2
    assert "split has no window" in capsys.readouterr().err


def test_missing_csv_file(tmp_path, capsys):
    rc = main(["train", "--csv", str(tmp_path / "nope.csv"), "--time-col", "t",
               "--target-col", "y", "--out", str(tmp_path / "o")])  # fmt: skip
    assert rc == 2
    assert "no such file" in capsys.readouterr().err


# ----------------------------------------------------------------------------------- metrics


def test_pinball_and_q_risk_against_loops():
    rng = np.random.default_rng(0)
    pred = rng.normal(size=(3, 4, 3)).astype(np.float32)
    y = rng.normal(size=(3, 4)).astype(np.float32)
    qs = (0.1, 0.5, 0.9)
    tot = 0.0
    num = [0.0, 0.0, 0.0]
    for b in range(3):
        for t in range(4):
            for j, q in enumerate(qs):
                e = float(y[b, t]) - float(pred[b, t, j])
                ql = q * e if e > 0 else (q - 1) * e
                tot += ql
                num[j] += ql
    loss, grad = pinball_loss(pred, y, qs)
    assert loss == pytest.approx(tot / 36, rel=1e-6)
    assert grad.shape == pred.shape and grad.dtype == np.float32
    e = y[..., None] - pred
    np.testing.assert_allclose(grad, np.where(e > 0, -np.array(qs), 1 - np.array(qs)) / 36,
                               rtol=1e-6)  # fmt: skip
    qr = q_risk(pred, y, qs)
    den = float(np.abs(y.astype(np.float64)).sum())
    for j, k in enumerate(("P10", "P50", "P90")):
        assert qr[k] == pytest.approx(2 * num[j] / den, rel=1e-6)


# ------------------------------------------------------------------------------------- plots


def test_plots_write_pngs(tmp_path):
    import matplotlib.image as mpimg

    rng = np.random.default_rng(1)
    files = [
        plots.plot_loss_curves(
            {
                "float": {
                    "train": [3, 2, 1.5],
                    "val": [3.1, 2.2, 2.0],
                    "start_val_q_risk_P50": [2.5],
                },
                "qat": {"train": [1.4], "val": [1.9]},
            },
            tmp_path / "l.png",
            {"float": {"best epoch": 3, "plateau: lr x 0.1": 2}},
        ),  # fmt: skip
        plots.plot_forecast_fan(
            rng.normal(size=(3, 48)),
            rng.normal(size=(3, 12)),
            np.sort(rng.normal(size=(3, 12, 3)), axis=2),
            (0.1, 0.5, 0.9),
            tmp_path / "f.png",
            titles=["a", "b", "c"],
            naive=rng.normal(size=(3, 12)),
        ),  # fmt: skip
        plots.plot_variable_importance(
            {"static": (["a", "b"], [0.3, 0.7]), "encoder": (["x", "y", "z"], [0.2, 0.5, 0.3])},
            tmp_path / "v.png",
        ),  # fmt: skip
        plots.plot_attention(rng.random((6, 30)), tmp_path / "a.png", history=24),
        plots.plot_clipping_comparison(
            {
                "clipped": {"loss": [1, 0.9, 0.8], "grad_norm": [2, 1, 0.5]},
                "unclipped": {"loss": [1, 0.95, 0.7], "grad_norm": [2, 3, 0.4]},
            },
            tmp_path / "c.png",
        ),  # fmt: skip
    ]
    for f in files:
        assert f.read_bytes()[:8] == PNG
        img = mpimg.imread(f)
        assert img.ndim == 3 and img.shape[0] > 100 and img.shape[1] > 100
        assert img[..., :3].std() > 0.01  # not blank


# ---------------------------------------------------------------------------- end to end run


def _naive_q_risk_from_raw(metrics: dict) -> dict:
    """Seasonal naive (value 24 h earlier + training residual quantiles), from the raw file."""
    with gzip.open(Path(__file__).resolve().parents[1] / "nbqat" / "data" / TMY3_FILE, "rt") as f:
        rows = list(csv.DictReader(f))
    d = metrics["data"]
    horizon, season = d["horizon"], d["season"]
    val_start, test_start = d["val_start"][:16], d["test_start"][:16]
    qs = metrics["model"]["quantiles"]
    num = [0.0] * len(qs)
    den = 0.0
    for ent in d["entities"]:
        r = [x for x in rows if x["station"] == ent]
        y = [float(x["temp_air"]) for x in r]
        t = [x["time"] for x in r]
        n_train = sum(1 for x in t if x < val_start)
        res = sorted(y[i] - y[i - season] for i in range(season, n_train))
        rq = []
        for q in qs:  # linear-interpolation quantile (numpy's default), by hand
            pos = q * (len(res) - 1)
            lo = int(math.floor(pos))
            hi = min(lo + 1, len(res) - 1)
            rq.append(res[lo] + (pos - lo) * (res[hi] - res[lo]))
        first = next(i for i, x in enumerate(t) if x >= test_start)
        for s in range(first, len(y) - horizon + 1, d["eval_stride"]):
            for h in range(horizon):
                yt = y[s + h]
                den += abs(yt)
                base = y[s + h - season * (h // season + 1)]
                for j, q in enumerate(qs):
                    e = yt - (base + rq[j])
                    num[j] += q * e if e > 0 else (q - 1) * e
    return {f"P{round(100 * q)}": 2 * num[j] / den for j, q in enumerate(qs)}


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("run_a")
    rc = _train(out, "--compare-clipping", "--max-norm", "0.5")
    assert rc == 0
    return out


def test_end_to_end_outputs(tiny_run, capsys):
    out = tiny_run
    m = json.loads((out / "metrics.json").read_text())
    for model in ("seasonal_naive", "float", "qat_fake_quant", "int8"):
        for q in ("P10", "P50", "P90"):
            v = m["q_risk_test"][model][q]
            assert isinstance(v, float) and math.isfinite(v) and v > 0
    for key in ("float_vs_naive_P50_improvement", "int8_vs_float_P50_relative_diff"):
        assert math.isfinite(m["comparisons"][key])
    g = m["grad_norm"]
    assert g["float"]["steps"] == 2 * 3 and g["qat"]["steps"] == 3
    for ph in ("float", "qat"):
        assert 0 <= g[ph]["clipped_steps"] <= g[ph]["steps"]
        assert g[ph]["max"] >= g[ph]["mean"] >= g[ph]["min"] > 0
        assert g[ph]["clipped_fraction"] == g[ph]["clipped_steps"] / g[ph]["steps"]
    cc = m["compare_clipping"]
    assert set(cc) == {"clipped", "unclipped"}
    for v in cc.values():
        assert set(v["loss"]) >= {"mean", "std", "final"} and v["loss"]["finite"]
        assert v["largest_grad_norm"] > 0
    assert cc["unclipped"]["max_norm"] is None and cc["clipped"]["max_norm"] == 0.5
    assert m["float"]["epochs_run"] == 2 and m["data"]["history"] == 24
    assert "timings_file" in m and "wall" not in json.dumps(m)
    t = json.loads((out / "timings.json").read_text())
    for ph in ("data", "float", "calibration", "qat", "int8", "evaluate", "total"):
        assert t["phases_s"][ph] >= 0
    for f in ("loss_curves.png", "forecast_int8.png", "forecast_float.png",
              "variable_importance.png", "attention.png", "clipping_comparison.png"):  # fmt: skip
        assert (out / f).read_bytes()[:8] == PNG, f
    assert (out / "checkpoint" / "state.json").is_file()
    assert "q-risk on the test split" in (out / "summary.txt").read_text()
    # the metric pipeline against an independent recomputation from the raw file
    naive = _naive_q_risk_from_raw(m)
    for q, v in naive.items():
        assert m["q_risk_test"]["seasonal_naive"][q] == pytest.approx(v, rel=1e-9)


def test_same_seed_same_metrics(tiny_run, tmp_path):
    assert _train(tmp_path, "--compare-clipping", "--max-norm", "0.5", "--no-plots") == 0
    a = json.loads((tiny_run / "metrics.json").read_text())
    b = json.loads((tmp_path / "metrics.json").read_text())
    a.pop("plots")
    a["config"]["plots"] = b["config"]["plots"]
    assert a == b


def test_interrupt_and_resume_gives_the_same_metrics(tiny_run, tmp_path, capsys):
    # "Ctrl-C" after 4 float steps (inside epoch 2), then after the first QAT step.
    rc = _train(tmp_path, "--compare-clipping", "--max-norm", "0.5", "--stop-after-steps", "4")
    assert rc == 130
    err = capsys.readouterr().err
    assert "checkpoint saved" in err and "--resume" in err
    ck = tmp_path / "checkpoint"
    state = json.loads((ck / "state.json").read_text())["state"]
    assert state["phase"] == "float" and state["epoch"] == 1 and state["batch_pos"] == 1
    assert main(["train", "--resume", str(ck), "--stop-after-steps", "3"]) == 130
    state = json.loads((ck / "state.json").read_text())["state"]
    assert state["phase"] in ("qat", "qat_noclip")
    assert main(["train", "--resume", str(ck)]) == 0
    assert (tmp_path / "metrics.json").read_bytes() == (tiny_run / "metrics.json").read_bytes()


def test_check_of_a_compare_clipping_checkpoint_writes_nothing(tmp_path):
    """--check copied the checkpoint's qat_start.npz / qat_clipped.npz into --out."""
    assert _train(tmp_path, "--compare-clipping", "--no-plots", "--stop-after-steps", "10") == 130
    for side in ("qat_start.npz", "qat_clipped.npz"):
        (tmp_path / side).unlink()
    assert main(["train", "--resume", str(tmp_path / "checkpoint"), "--check"]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint"]


def test_ctrl_c_in_the_evaluation_keeps_the_trained_run(tiny_run, tmp_path, capsys, monkeypatch):
    # Ctrl-C after the last QAT step (in the test-split evaluation) raised a bare
    # KeyboardInterrupt and left no checkpoint: the whole training was lost. The oracle is
    # the uninterrupted run's metrics.json.
    import nbqat.train.job as job

    real = job.evaluate

    def ctrl_c(r):
        raise KeyboardInterrupt

    monkeypatch.setattr(job, "evaluate", ctrl_c)
    try:
        rc = _train(tmp_path, "--compare-clipping", "--max-norm", "0.5")
    except KeyboardInterrupt:  # not pytest's own: fail this test, not the session
        pytest.fail("a Ctrl-C in the evaluation escaped nbqat train")
    assert rc == 130
    assert "checkpoint saved" in capsys.readouterr().err
    state = json.loads((tmp_path / "checkpoint" / "state.json").read_text())["state"]
    assert state["phase"] == "evaluate"
    monkeypatch.setattr(job, "evaluate", real)
    assert main(["train", "--resume", str(tmp_path / "checkpoint")]) == 0
    assert (tmp_path / "metrics.json").read_bytes() == (tiny_run / "metrics.json").read_bytes()


def test_device_cuda_under_the_simulator(
    tiny_run, tmp_path, cuda_sim, small_cuda_blocks, monkeypatch
):
    # The Adam update runs as a CUDA kernel on device copies of the flat buffers; the gradient
    # norm stays on the host (README, docs/tutorial.md); the results match the CPU run up to
    # float32 rounding.
    import nbqat.nn.step as step

    norms_of, real_norm = [], step.get_total_norm
    monkeypatch.setattr(step, "get_total_norm", lambda g: norms_of.append(type(g)) or real_norm(g))
    rc = _train(tmp_path, "--compare-clipping", "--max-norm", "0.5", "--no-plots",
                "--device", "cuda")  # fmt: skip
    assert rc == 0
    assert norms_of and set(norms_of) == {np.ndarray}
    a = json.loads((tiny_run / "metrics.json").read_text())
    b = json.loads((tmp_path / "metrics.json").read_text())
    assert b["config"]["device"] == "cuda"
    for model, v in a["q_risk_test"].items():
        for q, x in v.items():
            assert b["q_risk_test"][model][q] == pytest.approx(x, rel=1e-3), (model, q)
    assert b["grad_norm"]["float"]["max"] == pytest.approx(a["grad_norm"]["float"]["max"], rel=1e-3)


def test_csv_path_reproduces_the_shipped_run(tiny_run, tmp_path):
    # The shipped file through --csv (user-data path) gives the same model and metrics.
    csv_path = Path(__file__).resolve().parents[1] / "nbqat" / "data" / TMY3_FILE
    rc = _train(tmp_path, "--compare-clipping", "--max-norm", "0.5", "--no-plots",
                "--csv", str(csv_path), "--time-col", "time", "--target-col", "temp_air",
                "--entity-col", "station", "--known-cols", "etr",
                "--static-cols", "latitude,longitude,elevation")  # fmt: skip
    assert rc == 0
    a = json.loads((tiny_run / "metrics.json").read_text())
    b = json.loads((tmp_path / "metrics.json").read_text())
    assert b["data"]["historical_inputs"] == a["data"]["historical_inputs"]
    assert b["q_risk_test"] == a["q_risk_test"]
    assert b["grad_norm"] == a["grad_norm"]


def test_too_many_threads(tmp_path, capsys):
    rc = main(["train", "--quick", "--threads", "100000", "--out", str(tmp_path)])
    assert rc == 2
    assert "--threads 100000 exceeds" in capsys.readouterr().err
