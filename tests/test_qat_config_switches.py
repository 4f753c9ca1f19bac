"""QATConfig.quantize_output_head / quantize_linear_skip / quantize_attention are read by
prepare_qat (issues 28, 31).

Oracle: the same model prepared with the equivalent explicit ``qconfig_mapping`` float
fallback (``{name: None}``), a path that ignores the switches, and the float layer itself: a
module left in float has no quantizer and computes exactly the float model's function of its
input. Each switch is also shown to change the result when it quantizes (the tests can fail).
"""

from __future__ import annotations

import numpy as np
import pytest

import nbqat
from nbqat.nn import (
    InterpretableMultiHeadAttention,
    LSTMForecaster,
    LSTMForecasterConfig,
    ParameterBuffer,
    Sequential,
    TemporalFusionTransformer,
    TFTConfig,
    prepare_qat,
)
from nbqat.nn.qat import QATTemporalFusionTransformer


def _batch(rng, m_s, m_z, m_x, k, tau, b=6):
    return (
        rng.standard_normal((b, m_s)).astype(np.float32),
        rng.standard_normal((b, k, m_z)).astype(np.float32),
        rng.standard_normal((b, tau, m_x)).astype(np.float32),
    )


def _run(qat, batch):
    """Calibrate on ``batch``, switch to fake quantization, return the forward output."""
    qat(*batch)
    qat.disable_calibration()
    qat.freeze_observers()
    return qat(*batch)


def _lstm():
    return LSTMForecaster(LSTMForecasterConfig(2, 3, 4, 6, 5, 3), seed=3)


def _tft():
    cfg = TFTConfig(2, 3, 4, hidden_dim=8, num_heads=2, sequence_length=5, prediction_horizon=3)
    return TemporalFusionTransformer(cfg, seed=0)


def _attention_names(model):
    from nbqat.nn.layers import InterpretableMultiHeadAttention

    return [n for n, m in model.named_modules() if isinstance(m, InterpretableMultiHeadAttention)]


@pytest.mark.parametrize("make", [_lstm, _tft])
def test_the_head_stays_float_by_default_and_is_quantized_on_request(make, rng):
    model = make()
    head = model.output_head
    batch = _batch(rng, 2, 4, 3, 5, 3)
    default = prepare_qat(model, config=nbqat.QATConfig(calibration_batches=1))
    assert not [k for k in default.fake_quants if k.startswith(head + ".")]
    assert head in default.float_fallback
    on = nbqat.QATConfig(calibration_batches=1, quantize_output_head=True)
    explicit = prepare_qat(model, config=on, qconfig_mapping={head: None})  # the oracle path
    assert sorted(explicit.fake_quants) == sorted(default.fake_quants)
    want = _run(explicit, batch)
    np.testing.assert_array_equal(_run(default, batch), want)
    quantized = prepare_qat(model, config=on)
    assert f"{head}.weight_fake_quant" in quantized.fake_quants
    assert not np.array_equal(_run(quantized, batch), want)  # the switch changes the model


def test_the_linear_skip_stays_float_by_default_and_is_quantized_on_request(rng):
    """``quantize_linear_skip=False`` is the explicit float mapping of ``linear_skip`` (the oracle
    path), for the generic prepare_qat and the TFT's QAT class alike."""
    cfg = TFTConfig(2, 3, 4, hidden_dim=8, num_heads=2, sequence_length=5, prediction_horizon=3,
                    linear_skip=True)  # fmt: skip
    model = TemporalFusionTransformer(cfg, seed=0)
    batch = _batch(rng, 2, 4, 3, 5, 3)
    default = prepare_qat(model, config=nbqat.QATConfig(calibration_batches=1))
    assert not [k for k in default.fake_quants if k.startswith("linear_skip.")]
    assert "linear_skip" in default.float_fallback
    on = nbqat.QATConfig(calibration_batches=1, quantize_linear_skip=True)
    explicit = prepare_qat(model, config=on, qconfig_mapping={"linear_skip": None})
    assert sorted(explicit.fake_quants) == sorted(default.fake_quants)
    want = _run(explicit, batch)
    np.testing.assert_array_equal(_run(default, batch), want)
    tft_class = QATTemporalFusionTransformer.from_float(
        model, config=nbqat.QATConfig(calibration_batches=1)
    )
    assert sorted(k for k in tft_class.fake_quants if k != "output_fake_quant") == sorted(
        k for k in default.fake_quants if k != "output_fake_quant"
    )
    quantized = prepare_qat(model, config=on)
    assert {"linear_skip.weight_fake_quant", "linear_skip.input_fake_quant"} <= set(
        quantized.fake_quants
    )
    assert not np.array_equal(_run(quantized, batch), want)  # the switch changes the model


def test_the_float_head_computes_the_float_layer(rng):
    model = _lstm()
    qat = prepare_qat(model, config=nbqat.QATConfig(calibration_batches=1))
    batch = _batch(rng, 2, 4, 3, 5, 3)
    _run(qat, batch)
    seen = {}
    head = qat.model.head
    forward = type(head).forward

    def spy(self, x):
        seen["x"] = np.array(x)
        return forward(self, x)

    type(head).forward = spy
    try:
        out = qat(*batch)
    finally:
        type(head).forward = forward
    w, b = model.head.weight, model.head.bias  # the float model's own weights
    ref = (seen["x"].astype(np.float64) @ w.T.astype(np.float64) + b).astype(np.float32)
    np.testing.assert_allclose(out, ref, rtol=1e-6, atol=1e-6)


def test_quantize_attention_false_leaves_the_attention_float(rng):
    model = _tft()
    names = _attention_names(model)
    assert names
    batch = _batch(rng, 2, 4, 3, 5, 3)
    off = nbqat.QATConfig(calibration_batches=1, quantize_attention=False)
    qat = prepare_qat(model, config=off)
    assert not [k for k in qat.fake_quants if any(k.startswith(n + ".") for n in names)]
    assert set(names) <= set(qat.float_fallback)
    base = nbqat.QATConfig(calibration_batches=1)
    explicit = prepare_qat(model, config=base, qconfig_mapping=dict.fromkeys(names))
    assert sorted(explicit.fake_quants) == sorted(qat.fake_quants)
    want = _run(explicit, batch)
    np.testing.assert_array_equal(_run(qat, batch), want)
    on = prepare_qat(model, config=base)
    assert [k for k in on.fake_quants if any(k.startswith(n + ".") for n in names)]
    assert not np.array_equal(_run(on, batch), want)


def test_an_explicit_mapping_wins_over_the_switch():
    model = _lstm()
    qat = prepare_qat(model, qconfig_mapping={"head": nbqat.default_qat_qconfig})
    assert "head.weight_fake_quant" in qat.fake_quants


def test_a_model_without_a_head_is_prepared_as_before():
    from nbqat.nn import Linear, ParameterBuffer, Sequential

    model = Sequential(Linear(3, 4), Linear(4, 2))
    ParameterBuffer(model, seed=0)
    qat = prepare_qat(model)
    assert sorted(qat.fake_quants) == sorted(
        ["0.weight_fake_quant", "0.input_fake_quant", "1.weight_fake_quant", "1.input_fake_quant"]
    )


def test_quantize_attention_false_covers_an_attention_that_is_the_model():
    """A model that is one attention block (its name is "", the root) stays float too, as the
    same block inside a Sequential does (the root's entry used to be skipped)."""
    off = nbqat.QATConfig(quantize_attention=False)
    att = InterpretableMultiHeadAttention(8, 2)
    ParameterBuffer(att, seed=0)
    wrapped = Sequential(InterpretableMultiHeadAttention(8, 2))
    ParameterBuffer(wrapped, seed=0)
    assert prepare_qat(wrapped, config=off).fake_quants == {}  # the oracle: a named block
    qat = prepare_qat(att, config=off)
    assert qat.fake_quants == {}
    assert "" in qat.float_fallback
    assert prepare_qat(att).fake_quants  # the default quantizes it
