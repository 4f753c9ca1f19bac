"""prepare_qat / convert over user models built from nbqat.nn layers (Sequential, a user's own
composite Module, a registered custom layer).

Oracles: float64 central finite differences (the float model's backward), torch.ao
FakeQuantize modules at the same places (the prepared model's forward, qparams and every
gradient), and the frozen fake-quant model (convert's output within one output step).
"""

from __future__ import annotations

import numpy as np
import pytest
from ref_nn import fd_grad, forecast_batch
from ref_qat_torch import t_act, t_weight
from tolerances import dot_bound

import nbqat
from nbqat.nn import (
    ELU,
    LSTM,
    GatedResidualNetwork,
    LayerNorm,
    Linear,
    Module,
    ParameterBuffer,
    QATModel,
    Sequential,
    convert,
    prepare_qat,
    register_qat_module,
)
from nbqat.nn.convert import QuantizedLinear
from nbqat.nn.int8 import Int8TemporalFusionTransformer
from nbqat.nn.quantize import QAT_MODULE_MAPPINGS


class Residual(Module):
    """A user's own composite: ``y = fc2(elu(fc1(x))) + skip(x)``, its backward by hand."""

    def __init__(self, n_in, n_hidden, n_out):
        super().__init__()
        self.fc1, self.act, self.fc2 = Linear(n_in, n_hidden), ELU(), Linear(n_hidden, n_out)
        self.skip = Linear(n_in, n_out, bias=False)

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x))) + self.skip(x)

    def backward(self, dy):
        return self.fc1.backward(self.act.backward(self.fc2.backward(dy))) + self.skip.backward(dy)


def mlp():
    return Sequential(Linear(6, 16), ELU(), LayerNorm(16), Residual(16, 8, 3))


def _assert_fd(loss, arrays_and_indices):
    """Each ``(array, flat indices, analytic gradient)``: the analytic entries equal
    :func:`ref_nn.fd_grad`'s float64 finite differences of ``loss()``."""
    for arr, idx, grad in arrays_and_indices:
        fd = fd_grad(loss, arr, indices=idx)
        for i in idx:
            assert grad.reshape(-1)[i] == pytest.approx(fd.reshape(-1)[i], rel=1e-6, abs=1e-8)


def fd_check(model, buf, x, rng):
    w = rng.standard_normal(model(x).shape)

    def loss():
        return float(np.sum(model(x) * w))

    buf.zero_grad()
    model(x)
    dx = model.backward(w.copy())
    picks = rng.choice(buf.params.size, 40, replace=False)
    xs = [np.ravel_multi_index(i, x.shape) for i in [(0, 0), (2, 5), (4, 3)]]
    _assert_fd(loss, [(buf.params, picks, buf.grads), (x, xs, dx)])


def test_sequential_and_composite_gradients_match_finite_differences(rng):
    model = mlp()
    buf = ParameterBuffer(model, np.float64, seed=3)
    fd_check(model, buf, rng.standard_normal((5, 6)), rng)


def test_prepare_places_quantizers_and_copies_weights(rng):
    model = mlp()
    buf = ParameterBuffer(model, np.float32, seed=3)
    qat = prepare_qat(model)
    assert isinstance(qat, QATModel) and qat.phase == "calibration"
    assert np.array_equal(qat.params, buf.params) and not np.shares_memory(qat.params, buf.params)
    names = sorted(qat.fake_quants)
    want = sorted(
        f"{m}.{h}"
        for m in ("0", "3.fc1", "3.fc2", "3.skip")
        for h in ("weight_fake_quant", "input_fake_quant")
    )
    assert names == want
    assert model[0].weight_fake_quant is None  # the float model is untouched


def test_qat_sequential_matches_torch_fake_quantize(torch, rng):
    model = Sequential(Linear(6, 16), ELU(), Linear(16, 3))
    ParameterBuffer(model, np.float32, seed=5)
    qat = prepare_qat(model, config=nbqat.QATConfig(calibration_batches=2))
    l0, l2 = qat.model[0], qat.model[2]
    T = lambda a, g=False: torch.tensor(np.array(a), requires_grad=g)  # noqa: E731
    W0, b0, W2, b2 = (T(p, True) for p in (l0.weight, l0.bias, l2.weight, l2.bias))
    fq = {k: (t_act(torch) if "input" in k else t_weight(torch)) for k in qat.fake_quants}

    def torch_forward(x):
        h = torch.nn.functional.linear(
            fq["0.input_fake_quant"](x), fq["0.weight_fake_quant"](W0), b0
        )
        h = torch.nn.functional.elu(h)
        return torch.nn.functional.linear(
            fq["2.input_fake_quant"](h), fq["2.weight_fake_quant"](W2), b2
        )

    for f in fq.values():  # calibration: observe only
        f.disable_fake_quant()
    for step in range(5):
        if step == 2:
            for f in fq.values():
                f.enable_fake_quant()
        x = (rng.standard_normal((7, 6)) * (1 + step)).astype(np.float32)
        dy = rng.standard_normal((7, 3)).astype(np.float32)
        qat.zero_grad()
        y = qat(x)
        dx = qat.backward(dy)
        xt = T(x, True)
        for p in (W0, b0, W2, b2):
            p.grad = None
        yt = torch_forward(xt)
        yt.backward(T(dy))
        np.testing.assert_allclose(y, yt.detach().numpy(), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(dx, xt.grad.numpy(), rtol=1e-5, atol=1e-6)
        for lin, W, b in ((l0, W0, b0), (l2, W2, b2)):
            np.testing.assert_allclose(lin.weight_grad, W.grad.numpy(), rtol=1e-5, atol=1e-6)
            np.testing.assert_allclose(lin.bias_grad, b.grad.numpy(), rtol=1e-5, atol=1e-6)
        for k, f in qat.fake_quants.items():
            assert np.array_equal(f.scale, f_s := fq[k].scale.numpy().reshape(-1)), (k, f_s)
            assert np.array_equal(f.zero_point, fq[k].zero_point.numpy().reshape(-1))
    assert qat.phase == "qat"


def test_eval_mode_never_updates_observers(rng):
    model = Sequential(Linear(4, 4), ELU(), Linear(4, 2))
    ParameterBuffer(model, np.float32, seed=1)
    qat = prepare_qat(model)
    qat(rng.standard_normal((8, 4)).astype(np.float32))
    qat.disable_calibration()
    before = {k: f.state_dict() for k, f in qat.fake_quants.items()}
    qat.eval()
    assert not qat.model.training and not qat.model[0].training
    y1 = qat(10 * rng.standard_normal((8, 4)).astype(np.float32))
    for k, f in qat.fake_quants.items():
        for key, v in f.state_dict().items():
            if not key.endswith("_enabled"):  # statistics and qparams, not the switches
                np.testing.assert_array_equal(v, before[k][key], err_msg=f"{k}.{key}")
    assert y1.shape == (8, 2)
    qat.train()
    qat(10 * rng.standard_normal((8, 4)).astype(np.float32))  # observers run again
    moved = qat.fake_quants["0.input_fake_quant"].state_dict()
    assert not np.array_equal(
        moved["activation_post_process.max_val"],
        before["0.input_fake_quant"]["activation_post_process.max_val"],
    )


def test_calibrate_in_evaluation_mode_is_refused(rng):
    """``calibrate`` in evaluation mode observed nothing (eval never updates an observer), yet
    returned the batch count and ended calibration: a re-calibration on new data after an
    evaluation silently kept the old qparams. Now a ValueError naming ``qat.train()``."""
    model = Sequential(Linear(6, 5), ELU(), Linear(5, 3))
    ParameterBuffer(model, np.float32, seed=0)
    xs = [rng.standard_normal((8, 6)).astype(np.float32) * (1 + i) for i in range(3)]
    qat = prepare_qat(model)
    qat.calibrate(xs[:1])
    qat.eval()
    before = {k: np.array(fq.scale) for k, fq in qat.fake_quants.items()}
    with pytest.raises(ValueError, match=r"evaluation mode.*qat\.train\(\)"):
        qat.calibrate(xs)
    for k, fq in qat.fake_quants.items():
        np.testing.assert_array_equal(fq.scale, before[k])
    assert qat.phase == "qat" and not qat.training
    qat.train()
    assert qat.calibrate(xs) == 3
    fresh = prepare_qat(model)  # the oracle: a fresh model calibrated on the same batches
    fresh.calibrate(xs)
    for k, fq in qat.fake_quants.items():
        np.testing.assert_array_equal(fq.scale, fresh.fake_quants[k].scale, err_msg=k)


def test_float_fallback_by_name_and_type(rng):
    model = mlp()
    ParameterBuffer(model, np.float32, seed=3)
    qat = prepare_qat(model, qconfig_mapping={"3": None})
    assert sorted(qat.fake_quants) == ["0.input_fake_quant", "0.weight_fake_quant"]
    assert qat.float_fallback == ["3.fc1", "3.fc2", "3.skip"]
    qat2 = prepare_qat(model, qconfig_mapping={Linear: None, "3.fc2": nbqat.default_qat_qconfig})
    assert sorted(qat2.fake_quants) == ["3.fc2.input_fake_quant", "3.fc2.weight_fake_quant"]
    x = rng.standard_normal((5, 6)).astype(np.float32)
    qat(x)
    qat.disable_calibration()
    qat.freeze_observers()
    int8 = convert(qat)
    assert sorted(int8.layers) == ["0"]  # the fallback modules stay float Linears
    assert type(int8.model[3].fc1) is Linear


def test_unknown_layer_with_parameters_is_a_clear_type_error():
    class Scale(Module):
        def __init__(self):
            super().__init__()
            self.declare("gain", (3,), lambda rng, shape: np.ones(shape))

        def forward(self, x):
            return x * self.gain

    model = Sequential(Linear(2, 3), Scale())
    ParameterBuffer(model)
    with pytest.raises(TypeError, match=r"module 1 \(Scale\).*register_qat_module"):
        prepare_qat(model)
    saved = dict(QAT_MODULE_MAPPINGS)
    try:
        register_qat_module(Scale, {})
        assert sorted(prepare_qat(model).fake_quants) == [
            "0.input_fake_quant",
            "0.weight_fake_quant",
        ]
        with pytest.raises(ValueError, match="hook kinds"):
            register_qat_module(Scale, {"x": "bias"})
        with pytest.raises(TypeError, match="hooks must be a mapping.*got list"):
            register_qat_module(Scale, [("weight_fake_quant", "weight")])
        with pytest.raises(TypeError, match=r"hook names must be attribute names, got \[1\]"):
            register_qat_module(Scale, {1: "weight"})
    finally:
        QAT_MODULE_MAPPINGS.clear()
        QAT_MODULE_MAPPINGS.update(saved)


def test_preparing_twice_or_converting_float_is_refused():
    model = Sequential(Linear(2, 3))
    ParameterBuffer(model)
    qat = prepare_qat(model)
    with pytest.raises(ValueError, match="already"):
        prepare_qat(qat)
    with pytest.raises(ValueError, match="already holds a quantizer"):
        prepare_qat(qat.model)
    with pytest.raises(TypeError, match="prepare_qat"):
        convert(model)
    with pytest.raises(ValueError, match="unbound parameters"):
        prepare_qat(Sequential(Linear(2, 3)))


def test_a_type_entry_covers_subclasses_where_torchs_matches_the_exact_type(torch):
    """Pins the documented difference (docs/qat-own-model.md): nbqat's type entries match
    subclasses, the nearest class of the MRO winning, as its QAT mapping does; torch's eager
    qconfig dict (propagate_qconfig_, the oracle of torch's rule) matches the exact type."""
    from torch.ao.quantization import get_default_qat_qconfig, propagate_qconfig_

    class MyLinear(Linear):
        pass

    class TorchLinear(torch.nn.Linear):
        pass

    ref = torch.nn.Sequential(TorchLinear(3, 4), torch.nn.Linear(4, 2))
    propagate_qconfig_(ref, {"": get_default_qat_qconfig("x86"), torch.nn.Linear: None})
    assert [m.qconfig is None for m in ref] == [False, True]  # torch: the subclass quantized
    model = Sequential(MyLinear(3, 4), Linear(4, 2))
    ParameterBuffer(model)
    assert prepare_qat(model, qconfig_mapping={Linear: None}).float_fallback == ["0", "1"]
    mixed = prepare_qat(model, qconfig_mapping={Linear: None, MyLinear: nbqat.default_qat_qconfig})
    assert mixed.float_fallback == ["1"] and "0.weight_fake_quant" in mixed.fake_quants


def test_qconfig_mapping_typos_and_bad_values_are_refused_before_any_change():
    """A mistyped module name used to be ignored silently (everything quantized, the float
    fallback lost); a bad value (inplace) left the model half prepared."""
    model = Sequential(Linear(2, 3), ELU(), Linear(3, 2))
    ParameterBuffer(model)
    with pytest.raises(ValueError, match=r"names module '3'.*\['0', '1', '2'\]"):
        prepare_qat(model, qconfig_mapping={"3": None})
    with pytest.raises(TypeError, match="keys must be module names"):
        prepare_qat(model, qconfig_mapping={0: None})
    with pytest.raises(TypeError, match=r"nbqat.nn.Module subclasses.*got <class 'int'>"):
        prepare_qat(model, qconfig_mapping={int: None})  # a type no layer is: matched nothing
    with pytest.raises(TypeError, match="qconfig_mapping must be a mapping"):
        prepare_qat(model, qconfig_mapping=[("0", None)])
    with pytest.raises(TypeError, match=r"qconfig must be a QConfig"):
        prepare_qat(model, qconfig=3)
    bad = {"0": nbqat.default_qat_qconfig, "2": "int8"}
    with pytest.raises(TypeError, match=r"qconfig_mapping\['2'\] must be a QConfig"):
        prepare_qat(model, qconfig_mapping=bad, inplace=True)
    assert model[0].weight_fake_quant is None  # nothing attached by the failed call
    qat = prepare_qat(model, qconfig_mapping={"2": None}, inplace=True)  # still preparable
    assert qat.float_fallback == ["2"]


def test_convert_is_within_one_output_step_of_the_frozen_fake_quant_model(rng):
    model = Sequential(Linear(6, 32), ELU(), Linear(32, 16), ELU(), Linear(16, 3))
    ParameterBuffer(model, np.float32, seed=2)
    qat = prepare_qat(model)
    for _ in range(4):
        qat(rng.standard_normal((64, 6)).astype(np.float32))
    qat.disable_calibration()
    qat.freeze_observers()
    qat.eval()
    int8 = convert(qat)
    assert all(type(m) is QuantizedLinear for m in int8.layers.values()) and len(int8.layers) == 3
    assert type(qat.model[0]) is Linear  # the QAT model is unchanged
    x = rng.standard_normal((256, 6)).astype(np.float32)
    y_fq, y8 = qat(x), int8(x)
    # one code of the last layer's input quantizer, times the largest |W| row sum
    fq = qat.fake_quants["4.input_fake_quant"]
    step = float(fq.scale[0]) * float(np.abs(qat.model[4].weight).sum(axis=1).max())
    assert np.max(np.abs(y8 - y_fq)) <= step
    # float32 summation order only, except where a code of a later quantizer flips
    close = np.abs(y8 - y_fq) <= 1e-5 * np.abs(y_fq).max()
    assert np.mean(close) > 0.9


def test_convert_of_a_model_in_training_mode_drops_nothing(rng):
    # A QAT model converted in training mode (dropout active) gave an int8 model whose Dropout
    # stayed in training mode: int8(x) applied a dropout mask (0.28 from the eval model here),
    # unlike the TFT's integer twin and the ONNX graph, where Dropout is the identity.
    from nbqat.nn import Dropout

    model = Sequential(Linear(6, 8), Dropout(0.5), ELU(), Linear(8, 2))
    plain = Sequential(Linear(6, 8), ELU(), Linear(8, 2))  # the same network without dropout
    ParameterBuffer(model, np.float32, seed=0)
    ParameterBuffer(plain, np.float32, seed=0)
    x = rng.standard_normal((16, 6)).astype(np.float32)
    qats = [prepare_qat(m) for m in (model, plain)]
    for q in qats:
        q.calibrate([x])  # a new Dropout is off: both observe the same activations
        q.freeze_observers()
        q.train()
    assert qats[0].model[1].active()  # the QAT model drops in training mode
    y8 = convert(qats[0])(x)
    assert qats[0].model[1].training  # the QAT model is left as it was
    np.testing.assert_array_equal(y8, convert(qats[1])(x))
    qats[1].eval()
    np.testing.assert_allclose(y8, qats[1](x), atol=1e-6)


def test_the_int8_models_name_their_training_entry_points_as_inference_only(rng):
    """``convert(qat).backward(g)`` raised a bare AttributeError ('Int8Model' object has no
    attribute 'backward'); the integer models are inference-only, and the error now says so
    and names the fix (train the QAT model, then convert)."""
    model = Sequential(Linear(3, 4), ELU(), Linear(4, 2))
    ParameterBuffer(model, np.float32, seed=0)
    qat = prepare_qat(model)
    x = rng.standard_normal((5, 3)).astype(np.float32)
    qat.calibrate([x])
    int8 = convert(qat)
    y = int8(x)
    for obj in (int8, Int8TemporalFusionTransformer()):  # the TFT's twin too
        for name in ("backward", "train_step", "zero_grad", "params", "grads"):
            with pytest.raises(AttributeError, match=rf"{name}: .*inference-only.*before convert"):
                getattr(obj, name)
            assert not hasattr(obj, name)
    with pytest.raises(AttributeError, match="no attribute 'nonsense'"):
        int8.nonsense  # noqa: B018 - other names: Python's message
    np.testing.assert_array_equal(int8(x), y)  # still runs


# ------------------------------------------------------------------ the second forecaster
def _lf_batch(rng, cfg, nb=4, dtype=np.float32):
    return forecast_batch(rng, cfg, nb, dtype)


def _lf_cfg():
    from nbqat.nn import LSTMForecasterConfig

    return LSTMForecasterConfig(2, 3, 4, 6, 5, 3)  # m_s, m_x, m_z, d, k, tau


def test_lstm_forecaster_gradients_match_finite_differences(rng):
    from nbqat.nn import LSTMForecaster

    cfg = _lf_cfg()
    m = LSTMForecaster(cfg, seed=2, dtype=np.float64)
    s, h, f, _ = _lf_batch(rng, cfg, dtype=np.float64)
    w = rng.standard_normal((4, cfg.prediction_horizon, 3))

    def loss(s=s, h=h, f=f):
        return float(np.sum(m.forward(s, h, f) * w))

    m.zero_grad()
    m.forward(s, h, f)
    ds, dh, df = m.backward(w.copy())
    picks = rng.choice(m.params.size, 40, replace=False)
    inputs = [(s, ds, (1, 0)), (h, dh, (2, 3, 1)), (f, df, (0, 2, 2))]
    checks = [(a, [np.ravel_multi_index(i, a.shape)], g) for a, g, i in inputs]
    _assert_fd(loss, [(m.params, picks, m.grads), *checks])


def test_qat_lstm_forecaster_matches_torch_fake_quantize(torch, rng):
    from ref_qat_torch import torch_qlstm

    from nbqat.nn import LSTMForecaster, train_step

    cfg = _lf_cfg()
    qcfg = nbqat.QATConfig(calibration_batches=2, quantize_output_head=True)  # the head too
    qat = prepare_qat(LSTMForecaster(cfg, seed=3), config=qcfg)
    m = qat.model
    assert sorted(qat.fake_quants) == sorted(
        ["encoder.weight_ih_fake_quant", "encoder.weight_hh_fake_quant",
         "encoder.input_fake_quant", "encoder.hidden_fake_quant",
         "fc.weight_fake_quant", "fc.input_fake_quant",
         "head.weight_fake_quant", "head.input_fake_quant"]
    )  # fmt: skip
    T = lambda a, g=False: torch.tensor(np.array(a), requires_grad=g)  # noqa: E731
    P = {n: T(p, True) for n, p in m.named_parameters()}
    fq = {k: (t_weight(torch) if "weight" in k else t_act(torch)) for k in qat.fake_quants}
    lfq = {k.split(".")[1].replace("_fake_quant", ""): v for k, v in fq.items() if "encoder" in k}
    F = torch.nn.functional

    def torch_forward(s, h, f):
        z0 = torch.zeros(s.shape[0], cfg.hidden_dim)
        _, hk, _, _, _ = torch_qlstm(
            torch, h, z0, z0, P["encoder.weight_ih"], P["encoder.weight_hh"],
            P["encoder.bias_ih"], P["encoder.bias_hh"], lfq,
        )  # fmt: skip
        tau = cfg.prediction_horizon
        z = torch.cat([hk[:, None].expand(-1, tau, -1), f, s[:, None].expand(-1, tau, -1)], 2)
        zq, wq = fq["fc.input_fake_quant"](z), fq["fc.weight_fake_quant"](P["fc.weight"])
        a = F.linear(zq, wq)
        # sum |z||w| + |b| of fc's dots: the magnitude their rounding is relative to
        fc_mag = float((zq.abs() @ wq.abs().T + P["fc.bias"].abs()).max().detach())
        mag["fc"] = max(mag.get("fc", 0.0), fc_mag)  # over the steps the observer averaged
        a = F.elu(a + P["fc.bias"])
        x = fq["head.input_fake_quant"](a)
        return F.linear(x, fq["head.weight_fake_quant"](P["head.weight"]), P["head.bias"])

    mag: dict[str, float] = {}
    for f_ in fq.values():
        f_.disable_fake_quant()
    opt = nbqat.SGD(qat.params, lr=0.05)
    for step in range(4):
        if step == 2:
            for f_ in fq.values():
                f_.enable_fake_quant()
        s, h, f, y = _lf_batch(rng, cfg)
        before = {n: p.copy() for n, p in m.named_parameters()}
        loss, _ = train_step(qat, (s, h, f, y), opt)  # the generic step on a prepared model
        grads, params = dict(m.named_grads()), dict(m.named_parameters())
        for p in P.values():
            p.grad = None
        out = torch_forward(T(s), T(h), T(f))
        e = T(y)[..., None] - out
        qq = torch.tensor(cfg.quantiles)
        tl = torch.maximum(qq * e, (qq - 1) * e).mean()
        tl.backward()
        assert loss == pytest.approx(float(tl.detach()), rel=1e-5)
        for n, p in P.items():
            np.testing.assert_allclose(grads[n], p.grad.numpy(), rtol=1e-4, atol=1e-6, err_msg=n)
            assert not np.array_equal(params[n], before[n]) or not np.any(grads[n]), n
            with torch.no_grad():  # the next step starts from nbqat's updated weights
                p.copy_(T(params[n]))
        for k, f_ in qat.fake_quants.items():
            ts, tz = fq[k].scale.numpy().reshape(-1), fq[k].zero_point.numpy().reshape(-1)
            if k in ("encoder.hidden_fake_quant", "fc.input_fake_quant"):
                # torch's sigmoid/tanh differ by an ulp (fc's input holds the last hidden state)
                np.testing.assert_allclose(f_.scale, ts, rtol=1e-5, err_msg=k)
                assert np.all(np.abs(f_.zero_point - tz) <= 1), k
            elif k == "head.input_fake_quant":
                # fc's output through torch's BLAS and NumPy's: the dots' rounding
                # (tolerances.dot_bound, k = fc's fan-in), plus fc's input quantized on scales
                # that may differ (|d scale| * 255 codes * |w| row sum); ELU is 1-Lipschitz, the
                # moving average keeps the bound; the range is max - min (twice the bound)
                fc_in = qat.fake_quants["fc.input_fake_quant"]
                d_in = abs(float(fc_in.scale[0]) - float(fq["fc.input_fake_quant"].scale[0]))
                w_rows = float(np.abs(m.fc.weight).sum(axis=1).max())
                d_x = dot_bound(m.fc.weight.shape[1], mag["fc"]) + d_in * 255 * w_rows
                np.testing.assert_allclose(f_.scale, ts, rtol=0, atol=2 * d_x / 255, err_msg=k)
                assert np.all(np.abs(f_.zero_point - tz) <= 1), k  # round() can flip
            else:
                assert np.array_equal(f_.scale, ts) and np.array_equal(f_.zero_point, tz), k
    int8 = convert(qat)
    assert sorted(int8.layers) == ["encoder", "fc", "head"]
    s, h, f, _ = _lf_batch(rng, cfg, nb=16)
    qat.freeze_observers()
    qat.eval()
    y_fq, y8 = qat(s, h, f), int8(s, h, f)
    scale = float(qat.fake_quants["head.input_fake_quant"].scale[0])
    bound = scale * float(np.abs(m.head.weight).sum(axis=1).max())
    assert np.max(np.abs(y8 - y_fq)) <= bound


def test_learnable_scales_config_builds_lsq_quantizers(rng):
    """QATConfig(learnable_scales=True) was silently ignored by prepare_qat (plain FakeQuantize,
    scales never learned)."""
    from nbqat.quantization.fake_quantize import LearnableFakeQuantize

    model = Sequential(Linear(4, 8), ELU(), Linear(8, 2))
    ParameterBuffer(model, seed=0)
    cfg = nbqat.QATConfig(learnable_scales=True, calibration_batches=1)
    qat = prepare_qat(model, config=cfg)
    plain = prepare_qat(model)
    for name, fq in qat.fake_quants.items():
        assert isinstance(fq, LearnableFakeQuantize), name
        ref = plain.fake_quants[name]  # the same range and observer as the factory's module
        assert (fq.quant_min, fq.quant_max) == (ref.quant_min, ref.quant_max), name
    assert len(qat.learnable_quantizers()) == 4
    x = rng.standard_normal((16, 4)).astype(np.float32)
    qat(x)
    qat.disable_calibration()
    s0 = {n: fq.scale.copy() for n, fq in qat.fake_quants.items()}
    qat.zero_grad()
    y = qat(x)
    qat.backward(np.ones_like(y) / y.size)
    g = {n: fq.grad_scale.copy() for n, fq in qat.fake_quants.items()}
    assert any(np.any(v != 0) for v in g.values())
    opt = nbqat.SGD(qat.params, lr=0.5)  # the scales: a parameter group of the same optimizer
    opt.add_param_group(qat.quantizer_param_group(lr=0.25))
    opt.step(qat.grads)
    for n, fq in qat.fake_quants.items():  # p -= lr * grad, rounded once to float32
        want = np.maximum(s0[n].astype(np.float64) - 0.25 * g[n].astype(np.float64), fq.eps)
        np.testing.assert_allclose(fq.scale, want.astype(np.float32), rtol=2e-7, atol=0)


def test_zero_grad_of_an_inplace_model_clears_the_callers_gradients(rng):
    """It cleared nothing (no buffer of its own): gradients summed over steps, silently."""
    model = Sequential(Linear(3, 4), ELU(), Linear(4, 2))
    buf = ParameterBuffer(model, seed=0)
    qat = prepare_qat(model, inplace=True)
    x = rng.standard_normal((5, 3)).astype(np.float32)
    dy = rng.standard_normal((5, 2)).astype(np.float32)
    qat(x)
    qat.backward(dy)
    first = buf.grads.copy()
    assert first.any()
    qat.zero_grad()
    assert not buf.grads.any()
    qat(x)  # the same forward (calibration phase: the float model) -> the same gradient
    qat.backward(dy)
    np.testing.assert_array_equal(buf.grads, first)


@pytest.mark.parametrize("linear_skip", [False, True])
def test_convert_of_a_prepared_tft_runs_and_matches_fake_quant(rng, linear_skip):
    """convert(prepare_qat(tft)) built a model whose forward raised AttributeError
    ('QuantizedLinear' has no 'bias': the GRN adds fc1's bias with its ELU). Oracle: the frozen
    fake-quant model (tested against torch) within float32 rounding."""
    from nbqat.nn import TemporalFusionTransformer, TFTConfig

    cfg = TFTConfig(2, 3, 4, hidden_dim=8, num_heads=2, sequence_length=5, prediction_horizon=3,
                    linear_skip=linear_skip)  # fmt: skip
    b = (
        rng.standard_normal((6, 2)).astype(np.float32),
        rng.standard_normal((6, 5, 4)).astype(np.float32),
        rng.standard_normal((6, 3, 3)).astype(np.float32),
    )
    qat = prepare_qat(TemporalFusionTransformer(cfg, seed=0))
    qat(*b)
    qat.disable_calibration()
    qat.freeze_observers()
    qat.eval()
    want = qat(*b)
    np.testing.assert_allclose(convert(qat)(*b), want, rtol=0, atol=1e-6)


def test_mapping_naming_a_missing_hook_is_a_clear_type_error():
    saved = dict(QAT_MODULE_MAPPINGS)
    try:
        register_qat_module(ELU, {"typo_fake_quant": "activation"})
        model = Sequential(Linear(2, 3), ELU())
        ParameterBuffer(model)
        with pytest.raises(TypeError, match=r"module 1 \(ELU\) has no hook attribute"):
            prepare_qat(model)
    finally:
        QAT_MODULE_MAPPINGS.clear()
        QAT_MODULE_MAPPINGS.update(saved)


def test_inplace_keeps_a_model_owned_buffer(rng):
    from nbqat.nn import LSTMForecaster, train_step

    cfg = _lf_cfg()
    lf = LSTMForecaster(cfg, seed=1)
    qat = prepare_qat(lf, inplace=True)
    assert qat.params is lf.params and qat.grads is lf.grads
    qat(*_lf_batch(rng, cfg)[:3])
    qat.disable_calibration()
    before = lf.params.copy()
    train_step(qat, _lf_batch(rng, cfg), nbqat.SGD(lf.params, lr=0.1))
    assert not np.array_equal(lf.params, before)  # the caller's model trained
    bare = Sequential(Linear(2, 3))
    ParameterBuffer(bare)
    with pytest.raises(AttributeError, match="ParameterBuffer you built"):
        _ = prepare_qat(bare, inplace=True).params


def test_float_fallback_reports_a_request_beyond_the_modules(rng):
    from nbqat.train import report

    model = Sequential(Linear(4, 8), ELU(), Linear(8, 2))
    ParameterBuffer(model, seed=0)
    qat = prepare_qat(model)
    x = rng.standard_normal((32, 4)).astype(np.float32)
    qat(x)
    qat.disable_calibration()
    ref = model(x)

    def evaluate(predict):
        return float(np.mean(np.abs(predict(x) - ref)))

    sens = report.sensitivity(qat, evaluate)
    assert len(sens["modules"]) == 2
    out = report.float_fallback(qat, sens, 5, evaluate)
    assert out["capped"] and out["requested"] == 5 and sorted(out["modules"]) == ["0", "2"]
    assert out["metric"] == pytest.approx(sens["float"])  # everything in float
    one = report.float_fallback(qat, sens, 1, evaluate)
    assert not one["capped"] and len(one["modules"]) == 1


class _Scaled(Module):
    """docs/qat-own-model.md's registered layer: ``(x @ W.T) * gain``, its hooks called."""

    def __init__(self, n_in, n_out):
        super().__init__()
        self.declare("weight", (n_out, n_in), lambda rng, s: rng.uniform(-0.5, 0.5, s))
        self.declare("gain", (n_out,), lambda rng, s: rng.uniform(0.5, 1.5, s))
        self.weight_fake_quant = None
        self.input_fake_quant = None

    def forward(self, x):
        wq = self.weight if self.weight_fake_quant is None else self.weight_fake_quant(self.weight)
        xq = x if self.input_fake_quant is None else self.input_fake_quant(x)
        return (xq @ wq.T) * self.gain


@pytest.fixture
def scaled_registered():
    """``_Scaled`` registered as a QAT layer (a weight and an input quantizer) for the test;
    ``QAT_MODULE_MAPPINGS`` as it was after it."""
    saved = dict(QAT_MODULE_MAPPINGS)
    register_qat_module(_Scaled, {"weight_fake_quant": "weight", "input_fake_quant": "activation"})
    yield
    QAT_MODULE_MAPPINGS.clear()
    QAT_MODULE_MAPPINGS.update(saved)


def test_convert_keeps_a_registered_layers_per_channel_weight_quantizer(rng, scaled_registered):
    """``convert`` freezes the quantizers of a layer it does not swap: a per-channel weight
    quantizer kept only channel 0's scale (every channel quantized on it) and the frozen hook
    could not be called as the QAT one was."""
    net = Sequential(_Scaled(6, 8), ELU(), Linear(8, 3))
    ParameterBuffer(net, seed=1)
    qat = prepare_qat(net, qconfig_mapping={"2": None})
    x = rng.standard_normal((16, 6)).astype(np.float32)
    qat(x)
    qat.disable_calibration()
    qat.freeze_observers()
    qat.eval()
    wfq = qat.model[0].weight_fake_quant
    assert wfq.is_per_channel and np.unique(wfq.scale).size == 8
    int8 = convert(qat)
    frozen = int8.model[0].weight_fake_quant
    assert frozen.ch_axis == 0
    np.testing.assert_array_equal(frozen.scale, wfq.scale)
    np.testing.assert_array_equal(int8(x), qat(x))  # the same fake quantization, frozen


def test_convert_freezes_a_registered_layers_float8_quantizers(rng, scaled_registered):
    """A registered layer's float8 input quantizer was left as it was in the QAT model: converted
    in training mode (observers on), the int8 model recomputed its per-tensor scale from every
    batch (0.82 from the QAT model in evaluation mode on a wider batch). Now it keeps the
    calibrated scale: the output is the QAT model's in evaluation mode, bit for bit, and the
    float8 fake quantization of the calibrated scale (NumPy, the e4m3 grid)."""
    from nbqat.quantization.float8 import choose_scale_float8, fake_quantize_float8
    from nbqat.quantization.qconfig import FLOAT8_AMAX_LB, float8_qconfig

    net = Sequential(_Scaled(16, 8), ELU(), Linear(8, 3))
    ParameterBuffer(net, seed=1)
    qat = prepare_qat(net, float8_qconfig())
    x = rng.standard_normal((8, 16)).astype(np.float32)
    qat.calibrate([x])  # the QAT phase, training mode: the observers still run
    int8 = convert(qat)
    assert qat.model[0].input_fake_quant.observer_enabled  # the QAT model is unchanged
    x2 = (5 * rng.standard_normal((8, 16))).astype(np.float32)
    y8 = int8(x2)
    in_fq = qat.model[0].input_fake_quant
    xq = fake_quantize_float8(x2, np.asarray(in_fq.scale, np.float32))
    wider = choose_scale_float8(x2, x2.shape, hp_value_lb=FLOAT8_AMAX_LB)
    assert float(np.ravel(wider)[0]) > 2 * float(np.ravel(in_fq.scale)[0])
    qat.eval()
    np.testing.assert_array_equal(y8, qat(x2))
    np.testing.assert_array_equal(int8.model[0].input_fake_quant(x2), xq)


def test_a_failed_inplace_prepare_leaves_the_model_float(rng):
    """``prepare_qat(inplace=True)`` refused a later layer's qconfig (float8 has no LSQ
    variant) after the first layer's quantizers were in: the model was half prepared (its
    forward fake-quantized with uncalibrated LSQ hooks) and every retry said "already holds a
    quantizer". Now nothing goes in before every quantizer is built."""
    from nbqat.quantization.qconfig import float8_qconfig

    model = Sequential(Linear(6, 5), ELU(), Linear(5, 3))
    ParameterBuffer(model, np.float32, seed=0)
    x = rng.standard_normal((4, 6)).astype(np.float32)
    y0 = model(x)
    lsq = nbqat.QATConfig(learnable_scales=True)
    with pytest.raises(ValueError, match="no LSQ variant"):
        prepare_qat(model, qconfig_mapping={"2": float8_qconfig()}, config=lsq, inplace=True)
    assert all(getattr(model[i], h) is None for i in (0, 2) for h in QAT_MODULE_MAPPINGS[Linear])
    np.testing.assert_array_equal(model(x), y0)  # still the float model
    assert sorted(prepare_qat(model, inplace=True).fake_quants) == [
        "0.input_fake_quant",
        "0.weight_fake_quant",
        "2.input_fake_quant",
        "2.weight_fake_quant",
    ]


def test_a_module_used_at_two_places_is_refused_by_the_buffer():
    """``Sequential(a, ELU(), a)`` got two copies of a's parameters (a bound to the second;
    the first never got a gradient) and the second call overwrote the first's forward cache:
    the first use's gradient silently came from the second's input."""
    shared = Linear(6, 6)
    with pytest.raises(ValueError, match=r"module '2' is the same Linear object as module '0'"):
        ParameterBuffer(Sequential(shared, ELU(), shared))
    act = ELU()  # no parameters, but one cache too
    with pytest.raises(ValueError, match=r"module '3' is the same ELU object as module '1'"):
        ParameterBuffer(Sequential(Linear(2, 3), act, Linear(3, 3), act))
    assert shared.weight is None  # nothing bound by the refused call


def test_float64_weights_convert_to_the_codes_their_qat_forward_used(rng):
    """Symmetric per-channel scales put each channel's largest weight on a .5 tie (127.5): the
    float64 QAT forward rounds it there, while convert cast the weights to float32 first, which
    can move the product to the other side of the tie (other codes, outputs 4e-3 apart)."""
    model = Sequential(Linear(6, 8), ELU(), Linear(8, 3))
    ParameterBuffer(model, dtype=np.float64, seed=0)
    qat = prepare_qat(model)
    x = rng.standard_normal((32, 6))
    qat(x)
    qat.disable_calibration()
    qat.freeze_observers()
    qat.eval()
    int8 = convert(qat)
    for i in (0, 2):
        lin, fq = int8.model[i].int8, qat.model[i].weight_fake_quant
        w = qat.model[i].weight  # float64
        inv = (np.float32(1) / fq.scale).astype(np.float64)  # the kernels' float32 reciprocal
        want = np.clip(np.rint(w * inv[:, None]), fq.quant_min, fq.quant_max)  # zero point 0
        np.testing.assert_array_equal(lin.weight_q, want)
    np.testing.assert_allclose(int8(x), qat(x), rtol=0, atol=1e-5)  # float32 engine


def test_calibrate_takes_arrays_as_single_inputs(rng):
    """``calibrate([x1, x2])`` unpacked each array's rows into positional inputs (a
    'takes 2 positional arguments but 17 were given' TypeError; a one-row array ran silently
    on the wrong input)."""
    model = Sequential(Linear(4, 3))
    ParameterBuffer(model, seed=0)
    xs = [rng.standard_normal((5, 4)).astype(np.float32) for _ in range(2)]
    a, b = prepare_qat(model), prepare_qat(model)
    assert a.calibrate(xs) == b.calibrate([(x,) for x in xs]) == 2
    for name, fq in a.fake_quants.items():
        np.testing.assert_array_equal(fq.scale, b.fake_quants[name].scale)
    with pytest.raises(TypeError, match=r"calibrate: batch 0 is a dict; pass tuples"):
        prepare_qat(model).calibrate([{"x": xs[0]}])


def test_a_bad_first_calibration_batch_changes_no_phase(rng):
    """``calibrate([{"x": x}])`` on a calibrated QAT model raised its TypeError after it had
    switched to the calibration phase (fake quantization off, batch count reset, observers
    unfrozen): the model's next forwards were its float forward. Now nothing changes."""
    model = Sequential(Linear(6, 5), ELU(), Linear(5, 3))
    ParameterBuffer(model, seed=0)
    x = rng.standard_normal((8, 6)).astype(np.float32)
    qat = prepare_qat(model)
    assert qat.calibrate([x]) == 1
    qat.freeze_observers()
    want = qat(x)
    with pytest.raises(TypeError, match=r"calibrate: batch 0 is a dict; pass tuples"):
        qat.calibrate([{"x": x}])
    assert (qat.phase, qat.calibration_batches_seen, qat.observers_frozen) == ("qat", 1, True)
    np.testing.assert_array_equal(qat(x), want)
    with pytest.raises(TypeError, match=r"batch 1 is a NoneType"):  # a None batch ends nothing
        prepare_qat(model).calibrate([x, None])


def test_convert_names_a_weight_quantizer_on_the_wrong_axis(rng):
    """A per-channel weight quantizer along the input axis trains, but the integer matmul
    needs a scale per output channel: convert said 'per-channel scale and zero_point must
    have shape (8,), got (6,)', naming neither the layer nor the cause."""
    from nbqat.quantization.qconfig import QConfig, default_qat_qconfig

    model = Sequential(Linear(6, 8))
    ParameterBuffer(model, seed=0)
    w = nbqat.FakeQuantize.with_args(
        observer=nbqat.MovingAveragePerChannelMinMaxObserver, quant_min=-128, quant_max=127,
        dtype="qint8", qscheme="per_channel_symmetric", ch_axis=1,
    )  # fmt: skip
    qat = prepare_qat(model, QConfig(activation=default_qat_qconfig.activation, weight=w))
    qat(rng.standard_normal((4, 6)).astype(np.float32))
    qat.disable_calibration()
    qat.freeze_observers()
    with pytest.raises(ValueError, match=r"0\.weight_fake_quant is per channel along axis 1"):
        convert(qat)


def test_backward_passes_the_final_state_gradients_of_an_lstm_model(rng):
    """A prepared model whose output is an LSTM's ``(out, (h_n, c_n))`` took one backward
    argument ('takes 2 positional arguments but 3 were given'): a loss on the final state
    could not be trained. ``backward(dout, dh_n, dc_n)`` now reaches the model's backward
    (oracle: finite differences, float64, fake quantization off)."""
    model = LSTM(3, 4)
    ParameterBuffer(model, np.float64, seed=0)
    x, h0, c0 = (rng.standard_normal(s) for s in ((2, 5, 3), (2, 4), (2, 4)))
    qat = prepare_qat(model)
    qat.enable_calibration()  # observers only: the float forward, differentiable
    out, (h, c) = qat(x, h0, c0)
    w, wh, wc = (rng.standard_normal(a.shape) for a in (out, h, c))
    qat.zero_grad()
    qat.backward(w, wh, wc)

    def loss():
        o, (hn, cn) = qat.predict(x, h0, c0)
        return float(np.sum(w * o) + np.sum(wh * hn) + np.sum(wc * cn))

    np.testing.assert_allclose(qat.grads, fd_grad(loss, qat.params), rtol=1e-7, atol=1e-8)


def test_a_batch_of_no_rows_is_no_calibration_batch(rng):
    """A calibration forward on 0 rows observed nothing but counted: ``calibrate([x[:0], x])``
    with ``calibration_batches=1`` ended calibration after the empty batch (is_calibrated
    True; frozen by ``freeze_observers_after_calibration``), and QAT ran with scale 1.0.
    Oracle: the same model calibrated on ``x`` alone."""
    model = Sequential(Linear(6, 5), ELU(), Linear(5, 3))
    ParameterBuffer(model, seed=0)
    x = rng.standard_normal((8, 6)).astype(np.float32)
    cfg = nbqat.QATConfig(calibration_batches=1, freeze_observers_after_calibration=True)
    want = prepare_qat(model, config=cfg)
    assert want.calibrate([x]) == 1
    qat = prepare_qat(model, config=cfg)
    qat(x[:0])  # a forward: not counted either
    assert (qat.phase, qat.calibration_batches_seen, qat.is_calibrated) == ("calibration", 0, False)
    assert qat.calibrate([x[:0], x]) == 2
    assert qat.is_calibrated and qat.observers_frozen
    for name, fq in want.fake_quants.items():
        np.testing.assert_array_equal(qat.fake_quants[name].scale, fq.scale)
    np.testing.assert_array_equal(qat(x), want(x))


def test_backward_after_predict_is_refused(rng):
    """``out = qat(x); qat.predict(x_val); qat.backward(g)`` took the gradient of ``x_val``'s
    forward (predict's forward replaced the layers' caches), silently: with torch a no-grad
    evaluation leaves ``out``'s graph alone. Now a RuntimeError, before any gradient moves;
    the oracle is the same step without the predict."""
    model = Sequential(Linear(6, 5), ELU(), Linear(5, 3))
    ParameterBuffer(model, seed=0)
    x, x_val = (rng.standard_normal((8, 6)).astype(np.float32) for _ in range(2))
    qat = prepare_qat(model)
    qat.calibrate([x])
    qat.freeze_observers()
    g = rng.standard_normal((8, 3)).astype(np.float32)
    qat.zero_grad()
    qat(x)
    qat.backward(g)
    want = qat.grads.copy()
    qat.zero_grad()
    qat(x)
    qat.predict(x_val)
    with pytest.raises(RuntimeError, match=r"backward after predict.*qat\(\*inputs\)"):
        qat.backward(g)
    assert not qat.grads.any()
    qat(x)
    qat.backward(g)
    np.testing.assert_array_equal(qat.grads, want)


def test_inplace_prepare_of_an_unbound_model_is_refused_before_any_change():
    """``prepare_qat(model, inplace=True)`` on a model without its ParameterBuffer put its
    quantizers in and failed only at the first forward ('`x` must be an array, got None'),
    after which the model counted as prepared. Now the copy's ValueError, nothing changed."""
    model = Sequential(Linear(6, 4), ELU(), Linear(4, 3))
    with pytest.raises(ValueError, match=r"unbound parameters.*ParameterBuffer\(model"):
        prepare_qat(model, inplace=True)
    assert model[0].weight_fake_quant is None and model[2].input_fake_quant is None
    ParameterBuffer(model, seed=0)
    assert sorted(prepare_qat(model, inplace=True).fake_quants)[0] == "0.input_fake_quant"


def test_a_type_entry_that_matches_only_composites_is_refused():
    """``qconfig_mapping={GatedResidualNetwork: None}`` changed nothing (a type entry acts on
    modules of that type, and a GRN's quantizers are its Linears'): every GRN Linear stayed
    quantized, silently (torch's eager qconfig dict would cover the children). Now a
    ValueError naming the module; the name does what was meant (oracle: no quantizer left)."""
    model = Sequential(GatedResidualNetwork(4, 4, 4), ELU())
    ParameterBuffer(model, seed=0)
    with pytest.raises(ValueError, match=r"GatedResidualNetwork\] matches modules \['0'\].*'0'"):
        prepare_qat(model, qconfig_mapping={GatedResidualNetwork: None})
    assert prepare_qat(model, qconfig_mapping={"0": None}).fake_quants == {}
    assert len(prepare_qat(model, qconfig_mapping={ELU: None}).fake_quants) == 6  # a no-op
