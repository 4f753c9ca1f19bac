"""ONNX export of low-bit TFTs (issue 30): INT4 blocked DequantizeLinear and FLOAT8 Q/DQ.
Oracles: onnxruntime's CPU provider (as written and optimized, which fuses INT4 DQ + MatMul
into MatMulNBits) against the nbqat reference engine, and onnx's own unpacking of the INT4
initializers against the engine's codes."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import numpy_helper
from test_export import _batch, _qat

from nbqat.export import to_onnx
from nbqat.export.onnx_export import INPUTS, build_model
from nbqat.export.parity import ort_session
from nbqat.quantization.qconfig import float8_qconfig, int4_weight_qconfig


@pytest.fixture(scope="module")
def q4():
    return _qat(qconfig=int4_weight_qconfig(4))


def _run(proto, b, optimize):
    return ort_session(proto, optimize).run(None, dict(zip(INPUTS, b, strict=True)))[0]


@pytest.mark.parametrize("optimize", [False, True])
def test_int4_parity_with_engine(q4, optimize):
    proto, _ = build_model(q4)
    b = _batch(np.random.default_rng(3), 12)
    int8 = q4.to_int8()
    y = _run(proto, b, optimize)
    assert np.abs(y - int8(*b)).max() <= float(int8.output_scale)


def test_int4_initializers_are_blocked(q4):
    proto, _ = build_model(q4)
    int8 = q4.to_int8()
    inits = {t.name: t for t in proto.graph.initializer}
    dqs = [n for n in proto.graph.node if n.op_type == "DequantizeLinear"]
    blocked = [n for n in dqs if any(a.name == "block_size" for a in n.attribute)]
    assert blocked and all(inits[n.input[0]].data_type == onnx.TensorProto.INT4 for n in blocked)
    lin = int8.layers["static_vsn.flat_grn.fc1"]
    t = inits["static_vsn.flat_grn.fc1.weight_q"]
    assert len(t.raw_data) == (t.dims[0] * t.dims[1] + 1) // 2  # two codes per byte
    np.testing.assert_array_equal(numpy_helper.to_array(t).astype(np.int8), lin.weight_q.T)


def test_int4_weight_bytes_about_half_of_int8(q4):
    def wbytes(proto, types):
        return sum(len(t.raw_data) for t in proto.graph.initializer if t.data_type in types)

    p4, _ = build_model(q4)
    p8, _ = build_model(_qat())
    b4 = wbytes(p4, (onnx.TensorProto.INT4,))
    b8 = wbytes(p8, (onnx.TensorProto.INT8,))
    assert 0.4 * b8 < b4 < 0.6 * b8


@pytest.mark.parametrize("act", ["per_token", None])
def test_int4_dynamic_and_weight_only_parity(act):
    q = _qat(qconfig=int4_weight_qconfig(4, act))
    b = _batch(np.random.default_rng(4), 8)
    int8 = q.to_int8()
    np.testing.assert_allclose(int8(*b), q.predict(*b), rtol=0, atol=float(int8.output_scale))
    y = _run(build_model(q)[0], b, True)
    assert np.abs(y - int8(*b)).max() <= float(int8.output_scale)


def test_float8_export(tmp_path):
    q = _qat(qconfig=float8_qconfig())
    path = to_onnx(q, tmp_path / "f8.onnx")
    proto = onnx.load(str(path))
    types = {t.data_type for t in proto.graph.initializer}
    assert onnx.TensorProto.FLOAT8E4M3FN in types
    b = _batch(np.random.default_rng(5), 8)
    int8 = q.to_int8()
    assert np.abs(_run(proto, b, False) - int8(*b)).max() <= float(int8.output_scale)


def test_int4_needs_opset_21(q4):
    with pytest.raises(ValueError, match="opset >= 21"):
        build_model(q4, opset=20)


def test_float8_weights_with_int8_activations_export():
    """``nbqat train --weight-dtype float8_e4m3fn``'s qconfig (float8 weights, the run's quint8
    per-tensor activations): the export raised KeyError 'quint8'; onnxruntime within one output
    step of the reference engine."""
    from nbqat.quantization.qconfig import QConfig, default_qat_qconfig

    qc = QConfig(activation=default_qat_qconfig.activation, weight=float8_qconfig().weight)
    q = _qat(qconfig=qc)
    proto, _ = build_model(q)
    b = _batch(np.random.default_rng(6), 8)
    int8 = q.to_int8()
    for optimize in (False, True):
        assert np.abs(_run(proto, b, optimize) - int8(*b)).max() <= float(int8.output_scale)


def _calibrated_lstm(qc, seed):
    """A small ``LSTMForecaster`` (hidden size 5) prepared with ``qc``, calibrated on one batch
    of 6 rows and frozen; returns ``(qat_model, batch)``."""
    from nbqat.nn import LSTMForecaster, LSTMForecasterConfig, prepare_qat

    q = prepare_qat(LSTMForecaster(LSTMForecasterConfig(2, 3, 4, 5, 4, 3), seed=0), qc)
    rng = np.random.default_rng(seed)
    b = (
        rng.standard_normal((6, 2)).astype(np.float32),
        rng.standard_normal((6, 4, 4)).astype(np.float32),
        rng.standard_normal((6, 3, 3)).astype(np.float32),
    )
    q.calibrate([b])
    q.freeze_observers()
    return q, b


@pytest.mark.parametrize("which", ["per_token", "weight_only", "int8_weight_only"])
def test_8bit_fallback_weights_beside_per_token_or_float_activations_export(which):
    """``int4_weight_qconfig(G, "per_token" or None, int8_fallback=True)`` (documented) and an
    int8 weight-only ``QConfig(activation=None)``: the 8-bit per-channel weights of a layer
    without per-tensor input codes raised "weight range is not 4-bit" in the export. Now int8
    codes with a per-axis DequantizeLinear; onnxruntime equals the reference engine and the
    fake-quant model to float32 rounding."""
    from nbqat.quantization.qconfig import QConfig, default_qat_qconfig

    qc = {
        "per_token": int4_weight_qconfig(4, "per_token", int8_fallback=True),
        "weight_only": int4_weight_qconfig(4, None, int8_fallback=True),
        "int8_weight_only": QConfig(activation=None, weight=default_qat_qconfig.weight),
    }[which]
    q, b = _calibrated_lstm(qc, 7)  # d = 5: no group of 4 fits the recurrence
    proto, _ = build_model(q)
    inits = {t.name: t for t in proto.graph.initializer}
    assert inits["encoder.hh.weight_q"].data_type == onnx.TensorProto.INT8
    int8 = q.to_int8()
    y8 = int8(*b)
    np.testing.assert_allclose(y8, q.predict(*b), rtol=0, atol=1e-5)
    for optimize in (False, True):
        np.testing.assert_allclose(_run(proto, b, optimize), y8, rtol=0, atol=1e-5)


@pytest.mark.parametrize("opset", [13, 17])
def test_per_token_activations_export_below_opset_18(opset):
    """Per-token activations beside 8-bit weights (which need no INT4, so any opset): the
    ReduceMin / ReduceMax took their axes as an input, which only opset 18 has (the onnx
    checker's ValidationError at opset 13-17). Now an attribute below 18; onnxruntime equals
    the reference engine."""
    from nbqat.quantization.qconfig import QConfig, default_qat_qconfig

    qc = QConfig(
        activation=int4_weight_qconfig(4, "per_token").activation,
        weight=default_qat_qconfig.weight,
    )
    q, b = _calibrated_lstm(qc, 8)
    proto, _ = build_model(q, opset=opset)
    reduce = [n for n in proto.graph.node if n.op_type == "ReduceMin"]
    assert reduce and all(len(n.input) == 1 for n in reduce)
    y8 = q.to_int8()(*b)
    for optimize in (False, True):
        np.testing.assert_allclose(_run(proto, b, optimize), y8, rtol=0, atol=1e-5)
