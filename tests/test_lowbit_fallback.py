"""The 8-bit fallback of grouped int4 weights (issue 30, ``QConfig.weight_fallback``): a layer
whose input width is not a multiple of the group size keeps 8-bit per-channel weights.

Oracles: torch's ``MovingAveragePerChannelMinMaxObserver`` + ``fake_quantize_per_channel_affine``
for the fallback weights, torchao's ``Int8DynActInt4WeightQATLinear`` weight fake quantizer for
the grouped ones, onnxruntime for the exported model, and the default (``--weight-bits 8``) run
for the int8 rows that a ``--weight-bits 4`` run replays.
"""

from __future__ import annotations

import json
import warnings

import numpy as np
import onnx
import pytest
from ref_lowbit import assert_same_bits
from test_export import _batch, _qat
from test_predict import TINY

from nbqat import FakeQuantize, QConfig
from nbqat.cli import main
from nbqat.export.onnx_export import build_model
from nbqat.export.parity import ort_session
from nbqat.nn import ELU, Linear, ParameterBuffer, Sequential, prepare_qat
from nbqat.nn.convert import convert
from nbqat.nn.int4 import GroupedLinear
from nbqat.nn.int8 import Int8Linear
from nbqat.quantization.lowbit_quantize import GroupFakeQuantize
from nbqat.quantization.qconfig import int4_weight_qconfig


def _mlp():
    m = Sequential(Linear(32, 32), ELU(), Linear(32, 24), ELU(), Linear(24, 3))
    ParameterBuffer(m, dtype=np.float32, seed=0)
    return m


def _x(shape, seed):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def test_fallback_weights_are_torchs_int8_per_channel(torch):
    from torch.ao.quantization.observer import MovingAveragePerChannelMinMaxObserver

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from torchao.quantization.qat import linear as tlin
        from torchao.quantization.qat.fake_quantizer import IntxFakeQuantizer
    qat = prepare_qat(_mlp(), int4_weight_qconfig(16, int8_fallback=True))
    fqs = {k: v for k, v in qat.fake_quants.items() if k.endswith("weight_fake_quant")}
    assert [type(v) for v in fqs.values()] == [GroupFakeQuantize, GroupFakeQuantize, FakeQuantize]
    qat.calibrate([(_x((7, 32), 1),)])
    # the 24-wide layer: torch's per-channel symmetric qint8, bit for bit
    lin = qat.model[4]
    obs = MovingAveragePerChannelMinMaxObserver(
        ch_axis=0, dtype=torch.qint8, qscheme=torch.per_channel_symmetric
    )
    w = torch.from_numpy(np.array(lin.weight))
    obs(w)
    s, z = obs.calculate_qparams()
    ref = torch.fake_quantize_per_channel_affine(w, s, z.to(torch.int32), 0, -128, 127)
    assert_same_bits(lin.weight_fake_quant.forward(np.array(lin.weight)), ref.numpy(), "int8")
    # the 32-wide ones stay torchao's grouped int4
    lin0 = qat.model[2]
    ref4 = IntxFakeQuantizer(tlin._get_8da4w_weight_config(16, torch.float32))
    y4 = lin0.weight_fake_quant.forward(np.array(lin0.weight))
    assert_same_bits(y4, ref4(torch.from_numpy(np.array(lin0.weight))).numpy(), "int4")
    int8 = convert(qat)
    kinds = [type(int8.layers[str(i)].int8) for i in (0, 2, 4)]
    assert kinds == [GroupedLinear, GroupedLinear, Int8Linear]


def test_without_fallback_the_narrow_layer_is_int4_per_channel():
    qat = prepare_qat(_mlp(), int4_weight_qconfig(16))
    qat.calibrate([(_x((7, 32), 1),)])
    fq = qat.model[4].weight_fake_quant
    assert isinstance(fq, GroupFakeQuantize) and fq.per_channel_fallback is True
    assert (fq.quant_min, fq.quant_max) == (-8, 7)


def test_fallback_argument_errors():
    with pytest.raises(TypeError, match="weight_fallback must be a factory"):
        QConfig(activation=None, weight=FakeQuantize, weight_fallback=FakeQuantize())
    with pytest.raises(TypeError, match="int8_fallback must be a bool"):
        int4_weight_qconfig(16, int8_fallback=1)
    qc = int4_weight_qconfig(16, int8_fallback=True)
    assert tuple(qc) == (qc.activation, qc.weight)  # torch's two fields when iterated
    fq = qc.weight()
    assert qc.weight_quantizer(fq, np.zeros((3, 32), np.float32)) is fq
    assert isinstance(qc.weight_quantizer(fq, np.zeros((3, 8), np.float32)), FakeQuantize)
    assert qc.weight_quantizer(fq, None) is fq  # shape unknown: the grouped quantizer


def test_tft_export_with_fallback_layers():
    """INT4 initializers for the grouped layers, INT8 for the fallback ones, and onnxruntime
    within one output step of the reference engine."""
    q = _qat(qconfig=int4_weight_qconfig(8, int8_fallback=True))
    fb = [k for k, v in q.fake_quants.items() if k.endswith("weight_fake_quant")
          and isinstance(v, FakeQuantize)]  # fmt: skip
    assert "multihead_attn.out_proj.weight_fake_quant" in fb  # 8 / 2 heads = 4 < 8
    proto, _ = build_model(q)
    types = {t.name: t.data_type for t in proto.graph.initializer}
    for k in fb:
        assert types[k.replace("_fake_quant", "_q")] == onnx.TensorProto.INT8, k
    assert types["static_vsn.flat_grn.fc1.weight_q"] == onnx.TensorProto.INT4
    b = _batch(np.random.default_rng(3), 12)
    int8 = q.to_int8()
    for optimize in (False, True):
        y = ort_session(proto, optimize).run(None, dict(zip(("static", "historical", "future"),
                                                            b, strict=True)))[0]  # fmt: skip
        assert np.abs(y - int8(*b)).max() <= float(int8.output_scale)


def test_weight_bits_4_run_has_the_int8_rows(tmp_path):
    """A --weight-bits 4 run's int8 rows are the default run's, bit for bit (the same seed,
    batches and schedule replayed), next to its int4 rows; layers whose width is not a multiple
    of the group (the LSTMs' 4 inputs against G = 8) are kept at 8 bits, and the linear skip,
    part of the float output head, is not quantized at all."""
    runs = {}
    for bits, extra in (("8", []), ("4", ["--weight-bits", "4", "--group-size", "8"])):
        out = tmp_path / bits
        assert main(["train", *TINY, *extra, "--out", str(out)]) == 0
        runs[bits] = json.loads((out / "metrics.json").read_text())
    q8, q4 = runs["8"]["q_risk_test"], runs["4"]["q_risk_test"]
    assert q4["ptq_int8"] == q8["ptq_int8"] and q4["qat_int8"] == q8["int8"]
    assert q4["float_finetuned"] == q8["float_finetuned"]
    wf = runs["4"]["weight_format"]
    assert list(wf["rows"]) == ["float_finetuned", "ptq_int8", "qat_int8", "ptq_int4_g8",
                                "qat_int4_g8"]  # fmt: skip
    assert wf["rows"]["qat_int4_g8"] == q4["int8"] != q8["int8"]  # (the ridge-started head
    # is zero at the start: PTQ int4 and int8 agree on this tiny run, QAT moves it)
    assert "lstm_encoder" in wf["per_channel_fallback"]
    assert "linear_skip" not in wf["per_channel_fallback"]
    table = runs["4"]["quality_table"]["minmax"]
    assert table["qat_int8"] == q8["int8"] and table["qat_int4_g8"] == q4["int8"]
    report = json.loads((tmp_path / "4" / "quant_report.json").read_text())
    assert report["fallback_bits"]["lstm_encoder"] == 8
    assert not [q for q in report["quantizers"] if q["name"].startswith("linear_skip.")]
    summary = (tmp_path / "4" / "summary.txt").read_text()
    assert "QAT int8" in summary and "PTQ int4_g8" in summary and "lstm_encoder" in summary
    assert "qat_int8" not in q8 and "ptq_int4_g8" not in q8  # the default run as before
