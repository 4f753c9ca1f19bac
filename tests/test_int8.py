"""The int8 reference inference path: codes, integer matmuls, and the whole converted model.

Oracles: nbqat's fake-quantize functions (themselves bit-exact with torch) for the codes, NumPy
int64 matmuls for the int32 accumulation, and the fake-quant QAT model for the converted
network (within one output quantization step).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from ref_nn import forecast_batch, observed_lstm

from nbqat import (
    Adam,
    QATConfig,
    fake_quantize_per_channel_affine,
    fake_quantize_per_tensor_affine,
)
from nbqat.nn import Linear, TemporalFusionTransformer, TFTConfig
from nbqat.nn.int8 import (
    Int8Linear,
    Int8LSTM,
    qlinear,
    quantize_per_channel,
    quantize_per_tensor,
)
from nbqat.nn.qat import QATTemporalFusionTransformer

CFG = TFTConfig(2, 3, 4, 8, 5, 3, num_heads=2)


def make_batch(rng, nb=4):
    return forecast_batch(rng, CFG, nb)


def test_codes_reproduce_fake_quantize_exactly(rng):
    x = (rng.standard_normal(500) * 3).astype(np.float32)
    x[:6] = [0.5, 1.5, 2.5, -0.5, 1e9, np.nan]  # ties, far out of range, NaN
    s, zp = 0.5, 7
    q = quantize_per_tensor(x, s, zp, 0, 255)
    assert q.dtype == np.int32 and q.min() >= 0 and q.max() <= 255
    want = fake_quantize_per_tensor_affine(x, s, zp, 0, 255)
    got = ((q - zp) * np.float32(s)).astype(np.float32)
    assert np.array_equal(got, want)
    w = rng.standard_normal((6, 10)).astype(np.float32)
    sc = (np.abs(w).max(axis=1) / 127.5).astype(np.float32)
    sc[0] /= 4  # some codes clamp
    zc = np.zeros(6, np.int32)
    qc = quantize_per_channel(w, sc, zc, -128, 127)
    want = fake_quantize_per_channel_affine(w, sc, zc, 0, -128, 127)
    assert np.array_equal((qc * sc[:, None]).astype(np.float32), want)
    with pytest.raises(ValueError, match="scale"):
        quantize_per_tensor(x, 0.0, 0, 0, 255)
    with pytest.raises(ValueError, match="shape"):
        quantize_per_channel(w, sc[:3], zc, -128, 127)


def test_qlinear_accumulates_exactly_in_integers(rng):
    m, k, n = 7, 33, 5
    xq = rng.integers(0, 256, size=(m, k)).astype(np.int32)
    wq = rng.integers(-128, 128, size=(n, k)).astype(np.int32)
    sx, zx = np.float32(0.03), 131
    sw = rng.uniform(0.001, 0.01, n).astype(np.float32)
    b = rng.standard_normal(n).astype(np.float32)
    y = qlinear(xq, sx, zx, wq, sw, bias=b)
    acc = (xq.astype(np.int64) - zx) @ wq.astype(np.int64).T  # (m, n) exact
    mult = np.float64(sx) * sw.astype(np.float64)
    assert np.array_equal(y, (acc * mult).astype(np.float32) + b)
    # and it is the dequantized matmul up to float32 rounding
    ref = ((xq - zx) * np.float64(sx)) @ (wq * sw[:, None].astype(np.float64)).T + b
    np.testing.assert_allclose(y, ref, rtol=1e-6, atol=1e-6)
    with pytest.raises(ValueError, match="do not fit"):
        qlinear(xq[:, :5], sx, zx, wq, sw)
    with pytest.raises(ValueError, match="w_scale"):
        qlinear(xq, sx, zx, wq, sw[:2])


def test_int8_linear_and_lstm_match_their_fake_quant_layers(rng):
    from nbqat.nn import ParameterBuffer
    from nbqat.quantization.qconfig import default_qat_qconfig as qc

    lin = Linear(12, 5)
    ParameterBuffer(lin, np.float32, seed=1)
    lin.weight_fake_quant, lin.input_fake_quant = qc.weight(), qc.activation()
    x = rng.standard_normal((9, 12)).astype(np.float32)
    lin.forward(x)
    for fq in (lin.weight_fake_quant, lin.input_fake_quant):
        fq.disable_observer()
    y_fq = lin.forward(x)
    i8 = Int8Linear(lin.weight, lin.bias, lin.weight_fake_quant, lin.input_fake_quant)
    assert i8.weight_q.dtype == np.int8 and i8.weight_scale.shape == (5,)
    np.testing.assert_allclose(i8.forward(x), y_fq, rtol=1e-5, atol=1e-6)

    lstm, xs, h0, c0 = observed_lstm(rng, 4, 6, batch=3, steps=5, seed=2)
    for hook in ("weight_ih", "weight_hh", "input", "hidden"):
        getattr(lstm, hook + "_fake_quant").disable_observer()
    out_fq, (h_fq, c_fq) = lstm.forward(xs, h0, c0)
    out, (h, c) = Int8LSTM(lstm).forward(xs, h0, c0)
    np.testing.assert_allclose(out, out_fq, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(c, c_fq, rtol=1e-5, atol=1e-5)


def test_empty_batches_and_sequences(rng, torch):
    """A batch of 0 failed in the LSTMs with NumPy's 'cannot reshape array of size 0' (torch
    returns (0, L, H)); an empty sequence is refused as torch refuses it; a converted
    per-token int4 model failed on an empty batch that its QAT model ran."""
    lstm, xs, h0, c0 = observed_lstm(rng, 4, 6, batch=3, steps=5, seed=2)
    for hook in ("weight_ih", "weight_hh", "input", "hidden"):
        getattr(lstm, hook + "_fake_quant").disable_observer()
    tl = torch.nn.LSTM(4, 6, batch_first=True)
    t_out, (t_h, t_c) = tl(torch.zeros(0, 5, 4), (torch.zeros(1, 0, 6), torch.zeros(1, 0, 6)))
    for layer in (lstm, Int8LSTM(lstm)):
        out, (h, c) = layer.forward(xs[:0], h0[:0], c0[:0])
        assert out.shape == tuple(t_out.shape) and h.shape == c.shape == tuple(t_h.shape[1:])
        with pytest.raises(ValueError, match=r"with L >= 1 \(torch's rule\), got \(3, 0, 4\)"):
            layer.forward(xs[:, :0], h0, c0)
    with pytest.raises(RuntimeError):  # torch: "Expected sequence length to be larger than 0"
        tl(torch.zeros(3, 0, 4))
    lstm.backward(np.zeros((0, 5, 6), np.float32), np.zeros((0, 6), np.float32),
                  np.zeros((0, 6), np.float32))  # fmt: skip
    from nbqat.nn import ELU, ParameterBuffer, Sequential, convert, prepare_qat
    from nbqat.quantization.qconfig import int4_weight_qconfig

    m = Sequential(Linear(32, 16), ELU(), Linear(16, 3))
    ParameterBuffer(m, seed=0)
    q = prepare_qat(m, int4_weight_qconfig(16, "per_token"))
    q.calibrate([(rng.standard_normal((20, 32)).astype(np.float32),)])
    q.freeze_observers()
    x0 = np.zeros((0, 32), np.float32)
    assert convert(q)(x0).shape == q.predict(x0).shape == (0, 3)


@pytest.mark.parametrize(
    "head,skip,qskip", [(False, False, False), (True, False, False), (False, True, False),
                        (False, True, True)]
)  # fmt: skip
def test_int8_model_matches_the_fake_quant_model_within_one_output_step(rng, head, skip, qskip):
    model = TemporalFusionTransformer(dataclasses.replace(CFG, linear_skip=skip), seed=11)
    config = QATConfig(calibration_batches=3, quantize_output_head=head, quantize_linear_skip=qskip)
    qat = QATTemporalFusionTransformer.from_float(model, config=config)
    with pytest.raises(RuntimeError, match="calibrate"):
        qat.to_int8()
    qat.calibrate(make_batch(rng) for _ in range(3))
    opt = Adam(qat.params, lr=1e-2)
    for _ in range(3):
        qat.train_step(make_batch(rng), opt, max_norm=1.0)
    qat.freeze_observers()
    i8 = qat.to_int8()
    n_weighted = sum(1 for n, fq in qat.fake_quants.items() if n.endswith("weight_fake_quant"))
    n_lstm = 2
    assert len(i8.layers) == n_weighted + n_lstm
    # the linear skip is float by default; with quantize_linear_skip a Linear like any other
    # (QAT quantizes its weight and input, int8 converts it)
    assert ("linear_skip" in i8.layers) == qskip
    assert ("linear_skip.input_fake_quant" in qat.fake_quants) == qskip
    for lay in i8.layers.values():
        for sub in (lay.ih, lay.hh) if isinstance(lay, Int8LSTM) else (lay,):
            assert sub.weight_q.dtype == np.int8
            assert sub.weight_scale.shape == (sub.out_features,)
            assert 0 <= sub.input_zero_point <= 255
    step = float(i8.output_scale)
    assert step == float(qat.output_fake_quant.scale[0]) and step > 0
    for _ in range(3):
        s, h, f, _ = make_batch(rng, nb=6)
        y_fq = qat.forward(s, h, f)
        y_i8 = i8.forward(s, h, f)
        assert y_i8.dtype == np.float32 and y_i8.shape == y_fq.shape
        assert float(np.max(np.abs(y_i8 - y_fq))) <= step
    # the QAT model is not changed by the conversion
    assert qat.model.output_layer.forward.__self__ is qat.model.output_layer
