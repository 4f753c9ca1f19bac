"""The quantization report: per-quantizer statistics against a NumPy re-computation from the
captured float inputs, sensitivity bookkeeping against direct evaluations, strict JSON."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from ref_nn import SMALL_TFT as CFG
from ref_nn import forecast_batch

import nbqat
from nbqat.nn import TemporalFusionTransformer
from nbqat.nn.qat import QATTemporalFusionTransformer
from nbqat.train import report


def _batch(rng, nb=4):
    return forecast_batch(rng, CFG, nb, target=False)


@pytest.fixture(scope="module")
def setup():
    rng = np.random.default_rng(3)
    batches = [_batch(rng) for _ in range(3)]
    model = TemporalFusionTransformer(CFG, seed=7)
    qcfg = nbqat.QATConfig(calibration_batches=3, qconfig=report.activation_qconfig("histogram"))
    qat = QATTemporalFusionTransformer.from_float(model, config=qcfg)
    qat.calibrate(batches)
    return qat, batches


def test_rows_match_numpy_recomputation(setup):
    qat, batches = setup
    name = next(n for n in qat.fake_quants if n.endswith("input_fake_quant"))
    fq = qat.fake_quants[name]
    seen = []
    orig = fq.forward
    fq.forward = lambda x: (seen.append(np.array(x, np.float64)), orig(x))[1]
    try:
        for b in batches:
            qat.predict(*b)
    finally:
        del fq.forward
    rows = {r["name"]: r for r in report.quantizer_report(qat, batches)}
    assert set(rows) == set(qat.fake_quants)
    row = rows[name]
    x = np.concatenate([v.ravel() for v in seen])
    s, z = float(fq.scale[0]), int(fq.zero_point[0])
    q = np.rint(x / s) + z
    y = (np.clip(q, fq.quant_min, fq.quant_max) - z) * s
    assert row["values"] == x.size
    assert row["saturated_fraction"] == pytest.approx(np.mean((q < 0) | (q > 255)))
    assert row["sqnr_db"] == pytest.approx(10 * np.log10(np.sum(x**2) / np.sum((y - x) ** 2)))
    assert row["range"] == pytest.approx([(0 - z) * s, (255 - z) * s])
    assert row["observer"] == "HistogramObserver" and row["kind"] == "activation"
    weights = [r for r in rows.values() if r["kind"] == "weight"]
    assert weights and all(r["per_channel"] for r in weights)


def test_sensitivity_and_fallback_bookkeeping(setup):
    qat, batches = setup
    probe = batches[0]
    ref_float = TemporalFusionTransformer(CFG, seed=7)  # the same (untrained) float weights

    def evaluate(predict):
        return float(np.mean(np.abs(predict(*probe))))

    flags = {n: fq.fake_quant_enabled for n, fq in qat.fake_quants.items()}
    sens = report.sensitivity(qat, evaluate)
    assert {n: fq.fake_quant_enabled for n, fq in qat.fake_quants.items()} == flags
    assert sens["float"] == pytest.approx(evaluate(ref_float.forward))
    assert sens["all"] == pytest.approx(evaluate(qat.predict))
    gaps = [m["only"] - sens["float"] for m in sens["modules"]]
    assert gaps == sorted(gaps, reverse=True)
    fb = report.float_fallback(qat, sens, 0, evaluate)
    assert fb["metric"] == pytest.approx(sens["all"]) and fb["modules"] == []
    everything = report.float_fallback(qat, sens, len(sens["modules"]), evaluate)
    assert everything["metric"] == pytest.approx(sens["float"])


def test_write_report_is_strict_json(setup, tmp_path):
    qat, batches = setup
    rows = report.quantizer_report(qat, batches[:1])
    rows.append({**rows[0], "name": "x", "sqnr_db": math.inf})
    files = report.write_report({"quantizers": rows, "nan": float("nan")}, tmp_path)
    data = json.loads(files[0].read_text(), parse_constant=lambda c: pytest.fail(c))
    assert data["nan"] is None and data["quantizers"][-1]["sqnr_db"] is None
    assert files[1].suffix == ".png" and files[1].stat().st_size > 0


@pytest.mark.parametrize("name", report.OBSERVERS)
def test_activation_qconfig(name):
    fq = report.activation_qconfig(name).activation()
    assert fq.quant_min == 0 and fq.quant_max == 255
    if name != "minmax":
        assert type(fq.activation_post_process).__name__.lower().startswith(name[:4])
    with pytest.raises(ValueError, match="unknown observer"):
        report.activation_qconfig("entropy")


def test_main_job_report_options(tmp_path, capsys):
    from test_cli import TINY

    from nbqat.cli import main

    argv = ["train", *TINY, "--no-plots", "--out", str(tmp_path)]
    assert main([*argv, "--observer", "all", "--float-fallback", "1"]) == 0
    rep = json.loads((tmp_path / "quant_report.json").read_text())
    m = json.loads((tmp_path / "metrics.json").read_text())
    assert m["quant_report"]["quantizers"] == len(rep["quantizers"]) > 0
    assert set(rep["observers_ptq"]) == set(report.OBSERVERS)
    sens = rep["sensitivity"]
    assert len(sens["modules"]) > 0 and rep["float_fallback"]["modules"] == [
        sens["modules"][0]["module"]
    ]
    # q-risk with every quantizer on is the fake-quant model's test P50 in metrics.json
    assert sens["all"] == pytest.approx(m["q_risk_test"]["qat_fake_quant"]["P50"], rel=1e-12)
    with pytest.raises(SystemExit):
        main([*argv, "--observer", "entropy"])
    assert "invalid choice" in capsys.readouterr().err


def test_report_of_a_prepare_qat_model(rng):
    from nbqat.nn import ELU, Linear, ParameterBuffer, Sequential, prepare_qat

    model = Sequential(Linear(4, 8), ELU(), Linear(8, 2))
    ParameterBuffer(model, np.float32, seed=2)
    qcfg = nbqat.QATConfig(calibration_batches=2, qconfig=report.activation_qconfig("mse"))
    qat = prepare_qat(model, config=qcfg)
    xs = [(rng.standard_normal((16, 4)).astype(np.float32),) for _ in range(2)]
    for (x,) in xs:
        qat(x)
    qat.disable_calibration()
    before = {k: f.activation_post_process.state_dict() for k, f in qat.fake_quants.items()}
    rows = report.quantizer_report(qat, xs, n_inputs=1)
    assert [r["name"] for r in rows] == list(qat.fake_quants)
    assert all(r["values"] > 0 and r["sqnr_db"] is not None for r in rows)
    for k, f in qat.fake_quants.items():  # no observer moved
        for key, v in f.activation_post_process.state_dict().items():
            np.testing.assert_array_equal(v, before[k][key])
    sens = report.sensitivity(qat, lambda predict: float(np.abs(predict(xs[0][0])).sum()))
    assert {m["module"] for m in sens["modules"]} == {"0", "2"}


def test_report_in_the_calibration_phase_changes_no_state(rng):
    """The report's forwards used to go through QATModel.forward: they counted as calibration
    batches, and once the count was reached ended the phase, whose observers then moved."""
    from nbqat.nn import ELU, Linear, ParameterBuffer, Sequential, prepare_qat

    model = Sequential(Linear(4, 8), ELU(), Linear(8, 2))
    ParameterBuffer(model, np.float32, seed=2)
    qat = prepare_qat(model, config=nbqat.QATConfig(calibration_batches=2))
    x = rng.standard_normal((16, 4)).astype(np.float32)
    qat(x)
    qat(x)  # calibration counted 2 of 2; the phase ends at the next forward of the user's
    before = {k: f.activation_post_process.state_dict() for k, f in qat.fake_quants.items()}
    wide = [(10 * rng.standard_normal((16, 4)).astype(np.float32),)]
    report.quantizer_report(qat, wide, n_inputs=1)
    report.sensitivity(qat, lambda predict: float(np.abs(predict(wide[0][0])).sum()))
    assert (qat.phase, qat.calibration_batches_seen) == ("calibration", 2)
    for k, f in qat.fake_quants.items():
        for key, v in f.activation_post_process.state_dict().items():
            np.testing.assert_array_equal(v, before[k][key], err_msg=f"{k}.{key}")
