"""``nbqat train --model lstm`` end to end (tiny): the LSTMForecaster QAT'd through prepare_qat,
with the TFT run's metrics.json row layout, baselines, int8 and ONNX export; ``nbqat predict``
reloads it.

Oracles: the default (TFT) tiny run on the same data (the same baselines, to the bit, and the
same q-risk rows), pinball-free checks of the int8 forecasts against the QAT model's (within
float rounding of the integer matmuls) and the ONNX runtimes against the int8 forecasts.
"""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest

from nbqat.cli import main

TINY = [
    "--epochs", "2", "--qat-epochs", "1", "--batch-size", "16", "--hidden-dim", "4",
    "--history", "24", "--horizon", "6", "--windows-per-epoch", "48",
    "--calibration-batches", "2", "--eval-stride", "96", "--no-progress", "--no-plots",
    "--seed", "3",
]  # fmt: skip


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    out = {}
    for model in ("tft", "lstm"):
        d = tmp_path_factory.mktemp(model)
        extra = ["--model", "lstm"] if model == "lstm" else ["--heads", "1"]  # the TFT's option
        assert main(["train", *TINY, *extra, "--out", str(d)]) == 0
        out[model] = (d, json.loads((d / "metrics.json").read_text()))
    return out


def test_lstm_run_has_the_tft_runs_layout(runs):
    (_, tft), (_, lstm) = runs["tft"], runs["lstm"]
    assert set(lstm["q_risk_test"]) == set(tft["q_risk_test"])
    for row, v in lstm["q_risk_test"].items():
        assert set(v) == {"P10", "P50", "P90"} and all(np.isfinite(list(v.values()))), row
    for base in ("seasonal_naive", "ridge"):  # the data and the baselines are the model's own
        assert lstm["q_risk_test"][base] == tft["q_risk_test"][base]
    assert lstm["model"]["name"] == "lstm" and lstm["config"]["model"] == "lstm"
    assert "name" not in tft["model"] and "model" not in tft["config"]  # the default's file
    assert lstm["model"]["num_parameters"] != tft["model"]["num_parameters"]
    assert set(lstm["comparisons"]) == set(tft["comparisons"])
    par = lstm["onnx_parity"]
    assert par["output_scale"] is None  # no output quantizer in the generic model
    for key in ("int8_vs_ort_disable_all", "int8_vs_ort_default"):
        assert par["pairs"][key]["max_diff_output_steps"] is None
        assert par["pairs"][key]["max_abs_diff"] < 1e-4, key
    assert lstm["comparisons"]["int8_vs_qat_max_abs_output_diff"] < 0.05


def test_predict_reloads_the_lstm_run(runs, tmp_path):
    run, _ = runs["lstm"]
    rows = {}
    for eng in ("int8", "onnx", "float"):
        p = tmp_path / f"{eng}.csv"
        # the shipped data's known column etr ends with the file: forecast its last 6 hours
        argv = ["predict", str(run), "--at", "2001-12-31T18:00", "--engine", eng, "--out", str(p)]
        assert main(argv) == 0
        with open(p, newline="") as f:
            rows[eng] = [[float(r[q]) for q in ("p10", "p50", "p90")] for r in csv.DictReader(f)]
    a, b, c = (np.array(rows[k]) for k in ("int8", "onnx", "float"))
    assert a.shape[1] == 3 and a.shape[0] > 0 and np.all(np.isfinite(a))
    assert np.max(np.abs(a - b)) <= 1e-3 * max(1.0, float(np.max(np.abs(a))))
    assert c.shape == a.shape and np.all(np.isfinite(c)) and not np.array_equal(a, c)


def test_unknown_model_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as ei:
        main(["train", "--model", "gru"])
    assert ei.value.code == 2 and "invalid choice" in capsys.readouterr().err


def test_lstm_run_resumes_in_the_qat_phase_to_the_same_metrics(runs, tmp_path):
    """Stopped after its first QAT step (6 float steps), resumed from the checkpoint (the
    generic QAT model's own save/load): the same metrics.json as the uninterrupted run."""
    full, _ = runs["lstm"]
    out = tmp_path / "r"
    argv = ["train", *TINY, "--model", "lstm", "--out", str(out), "--stop-after-steps", "7"]
    assert main(argv) == 130
    assert (out / "checkpoint" / "qat.npz").is_file()
    assert main(["train", "--resume", str(out / "checkpoint")]) == 0
    assert (out / "metrics.json").read_bytes() == (full / "metrics.json").read_bytes()


def test_resumed_lstm_run_refuses_the_tft_options(tmp_path, capsys):
    """--resume of an LSTM checkpoint checks --heads / --dropout against the checkpoint's model
    (they were checked against the parser's default tft, and taken silently when they matched
    the value the LSTM run stored and never read)."""
    out = tmp_path / "r"
    argv = ["train", *TINY, "--model", "lstm", "--out", str(out), "--stop-after-steps", "1"]
    assert main(argv) == 130
    ck = str(out / "checkpoint")
    for extra in (["--heads", "4"], ["--dropout", "0.1"], ["--heads", "2"]):
        capsys.readouterr()
        assert main(["train", "--resume", ck, *extra, "--check"]) == 2
        flag = extra[0]
        assert f"{flag} is not used by --model lstm" in capsys.readouterr().err
    assert main(["train", "--resume", ck, "--check"]) == 0
