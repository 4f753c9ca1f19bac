"""The forecasters by name (nbqat.nn.forecasters), the TFT's QAT model as prepare_qat through the
public mapping, checkpoints of a generic prepared forecaster, and the npz codec.

Oracles: prepare_qat's own module walk (the TFT's quantizer set), the saved model's next step
(bit for bit after load), and the codec's input (a round trip)."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import numpy as np
import pytest
from ref_nn import SMALL_TFT as TCFG
from ref_nn import forecast_batch

import nbqat
from nbqat.nn import (
    LSTMForecaster,
    LSTMForecasterConfig,
    QATModel,
    QATTemporalFusionTransformer,
    TemporalFusionTransformer,
    prepare_qat,
)
from nbqat.nn.forecasters import (
    build_forecaster,
    forecaster_name,
    load_qat_forecaster,
    prepare_forecaster,
)
from nbqat.nn.layers import Linear
from nbqat.nn.qat import tft_qconfig_mapping
from nbqat.nn.quantize import QAT_MODULE_MAPPINGS
from nbqat.npz_state import CheckpointError, load_state, save_state
from nbqat.quantization.fake_quantize import FakeQuantize


def _windows():
    return SimpleNamespace(
        static=np.zeros((1, 2)),
        future_features=np.zeros((1, 3)),
        hist_features=np.zeros((1, 4)),
        history=5,
        horizon=3,
        quantiles=(0.1, 0.5, 0.9),
    )


def _opts(**kw):
    return SimpleNamespace(hidden_dim=6, heads=2, linear_skip=False, dropout=0.0, seed=4, **kw)


def _batch(rng, nb=5):
    return forecast_batch(rng, _SIZES, nb)


_SIZES = LSTMForecasterConfig(2, 3, 4, 6, 5, 3)  # the batches' m_s, m_x, m_z, d, k, tau


# ------------------------------------------------------------------ the TFT through the mapping
@pytest.mark.parametrize("head,attn", [(False, True), (True, False)])
def test_tft_qat_is_prepare_qat_plus_the_output_quantizer(head, attn):
    cfg = nbqat.QATConfig(quantize_output_head=head, quantize_attention=attn)
    tft = TemporalFusionTransformer(TCFG, seed=2)
    qat = QATTemporalFusionTransformer.from_float(tft, config=cfg)
    ref = prepare_qat(tft, qconfig_mapping=tft_qconfig_mapping(tft, cfg), config=cfg)
    assert isinstance(qat, QATModel)
    assert list(qat.fake_quants) == [*ref.fake_quants, "output_fake_quant"]
    for k, fq in ref.fake_quants.items():
        other = qat.fake_quants[k]
        assert type(other) is type(fq) and other.qscheme == fq.qscheme, k
    assert ("output_layer" in qat.float_fallback) is (not head)
    assert np.array_equal(qat.params, tft.params)


def test_tft_qat_reads_a_registered_mapping():
    """Changing the public mapping changes what the TFT's QAT model quantizes."""
    saved = dict(QAT_MODULE_MAPPINGS[Linear])
    try:
        QAT_MODULE_MAPPINGS[Linear] = {"weight_fake_quant": "weight"}  # weights only
        qat = QATTemporalFusionTransformer.from_float(TemporalFusionTransformer(TCFG, seed=2))
        assert not any(k.endswith(".input_fake_quant") and "lstm" not in k for k in qat.fake_quants)
        assert any(k.endswith(".weight_fake_quant") for k in qat.fake_quants)
    finally:
        QAT_MODULE_MAPPINGS[Linear] = saved


# ------------------------------------------------------------------------------- by name
def test_build_forecaster_by_name():
    w = _windows()
    lstm, tft = build_forecaster("lstm", _opts(), w), build_forecaster("tft", _opts(), w)
    assert isinstance(lstm, LSTMForecaster) and isinstance(tft, TemporalFusionTransformer)
    assert lstm.config.hidden_dim == 6 and lstm.config.sequence_length == 5
    assert (tft.config.num_heads, tft.config.prediction_horizon) == (2, 3)
    again = build_forecaster("lstm", _opts(), w)
    assert np.array_equal(again.params, lstm.params)  # cfg.seed
    assert not np.array_equal(build_forecaster("lstm", _opts(), w, seed=5).params, lstm.params)
    assert forecaster_name(lstm) == "lstm" and forecaster_name(prepare_forecaster(tft)) == "tft"
    with pytest.raises(ValueError, match="unknown forecaster 'gru'"):
        build_forecaster("gru", _opts(), w)
    with pytest.raises(TypeError, match="not an nbqat forecaster"):
        forecaster_name(object())


def test_prepare_forecaster_lstm_keeps_the_head_float(rng):
    m = build_forecaster("lstm", _opts(), _windows())
    qat = prepare_forecaster(m, nbqat.QATConfig(calibration_batches=1))
    assert isinstance(qat, QATModel) and qat.float_fallback == ["head"]
    assert qat.model.head.weight_fake_quant is None
    assert isinstance(qat.model.fc.weight_fake_quant, FakeQuantize)
    head_q = prepare_forecaster(m, nbqat.QATConfig(quantize_output_head=True))
    assert head_q.model.head.weight_fake_quant is not None
    with pytest.raises(TypeError, match="QATConfig"):
        prepare_forecaster(m, {"calibration_batches": 1})


def test_lstm_forecaster_backward_names_grad_out(rng):
    """A grad_out of another shape was refused by the head's Linear.backward ('Linear.backward:
    dy must have shape ...'), naming neither the forecaster's method nor its argument (the
    TFT names grad_out); now the TFT's ValueError, for the float and the prepared model, with
    no gradient accumulated."""
    s, h, f, _ = _batch(rng)
    for model in (LSTMForecaster(_SIZES), prepare_qat(LSTMForecaster(_SIZES))):
        model.forward(s, h, f)
        model.zero_grad()
        for g in (np.ones((5, 3, 2)), np.ones((4, 3, 3)), np.ones((5, 3, 3)).tolist()):
            with pytest.raises(ValueError, match=r"grad_out must be an ndarray of the last "):
                model.backward(g)
        assert not model.grads.any()
        model.backward(np.ones((5, 3, 3)))  # float64 for a float32 model: cast
        assert model.grads.any()


# ----------------------------------------------------------- checkpoints of a generic model
def _trained_lstm_qat(rng, lsq, steps):
    """``(QATConfig, QAT LSTM forecaster, its Adam)`` after 2 calibration batches and ``steps``
    training steps."""
    cfg = nbqat.QATConfig(calibration_batches=2, learnable_scales=lsq)
    qat = prepare_forecaster(build_forecaster("lstm", _opts(), _windows()), cfg)
    for _ in range(2):
        qat(*_batch(rng)[:3])
    opt = nbqat.Adam(qat.params, lr=1e-2)
    for _ in range(steps):
        qat.train_step(_batch(rng), opt, max_norm=0.5)
    return cfg, qat, opt


@pytest.mark.parametrize("lsq", [False, True])
def test_lstm_qat_checkpoint_reproduces_the_next_step(tmp_path, rng, lsq):
    cfg, qat, opt = _trained_lstm_qat(rng, lsq, steps=2)
    path = tmp_path / "qat.npz"
    qat.save(path)
    batch = _batch(rng)
    a = qat.train_step(batch, opt, max_norm=0.5)
    other = prepare_forecaster(build_forecaster("lstm", _opts(), _windows(), seed=9), cfg)
    opt_b = nbqat.Adam(other.params, lr=1e-2)
    other.load(path, optimizer=opt_b)
    assert other.step == 2 and other.phase == "qat"
    b = other.train_step(batch, opt_b, max_norm=0.5)
    assert a == b and np.array_equal(qat.params, other.params)
    for k, fq in qat.fake_quants.items():
        assert np.array_equal(fq.scale, other.fake_quants[k].scale), k
    rebuilt = load_qat_forecaster(path)
    assert isinstance(rebuilt, QATModel) and rebuilt.config.learnable_scales == lsq
    assert rebuilt.step == 2 and list(rebuilt.fake_quants) == list(qat.fake_quants)
    fresh = prepare_forecaster(build_forecaster("lstm", _opts(), _windows(), seed=11), cfg)
    fresh.load(path)
    s, h, f, _ = _batch(rng)
    assert np.array_equal(rebuilt.predict(s, h, f), fresh.predict(s, h, f))
    assert not np.array_equal(rebuilt.predict(s, h, f), other.predict(s, h, f))  # one step on


def test_generic_checkpoint_errors(tmp_path, rng):
    qat = prepare_forecaster(build_forecaster("lstm", _opts(), _windows()))
    qat(*_batch(rng)[:3])
    path = tmp_path / "lstm.npz"
    qat.save(path)
    tft_q = QATTemporalFusionTransformer.from_float(TemporalFusionTransformer(TCFG))
    with pytest.raises(CheckpointError, match="holds a LSTMForecaster"):
        tft_q.load(path)
    cfg7 = LSTMForecasterConfig(2, 3, 4, 7, 5, 3)
    wider = prepare_forecaster(LSTMForecaster(cfg7))
    with pytest.raises(CheckpointError, match="different network"):
        wider.load(path)
    tft_q.save(tmp_path / "tft.npz")
    assert isinstance(load_qat_forecaster(tmp_path / "tft.npz"), QATTemporalFusionTransformer)
    with pytest.raises(FileNotFoundError):
        load_qat_forecaster(tmp_path / "missing.npz")
    # NaN weights (a diverged model, a damaged file) are refused like float.npz's, nothing loaded
    st = load_state(path, format="nbqat.qat")
    st["model"]["params"][3] = np.nan
    save_state(tmp_path / "nan.npz", st, format="nbqat.qat")
    before = qat.params.copy()
    with pytest.raises(CheckpointError, match=r"'params' holds non-finite values \(params\[3\]"):
        qat.load(tmp_path / "nan.npz")
    np.testing.assert_array_equal(qat.params, before)
    with pytest.raises(CheckpointError, match="non-finite"):
        load_qat_forecaster(tmp_path / "nan.npz")


def test_load_refuses_an_optimizer_over_other_parameters(tmp_path, rng):
    """``load(path, optimizer=opt)`` with ``opt`` over another buffer loaded the saved moments
    into it and made it the model's optimizer: the real optimizer resumed with fresh moments
    (not the saved step, silently). Now a CheckpointError, nothing changed; the right
    optimizer resumes the saved moments (the oracle: the saved optimizer's state)."""
    qat = prepare_forecaster(build_forecaster("lstm", _opts(), _windows()))
    qat.calibrate([_batch(rng)[:3]])
    opt = nbqat.Adam(qat.params, lr=1e-3)
    qat.train_step(_batch(rng), opt)
    qat.save(tmp_path / "q.npz", optimizer=opt)
    other = prepare_forecaster(build_forecaster("lstm", _opts(), _windows()))
    stray = nbqat.Adam(np.zeros_like(other.params), lr=1e-3)
    before = other.params.copy()
    with pytest.raises(CheckpointError, match="other parameters than this model's"):
        other.load(tmp_path / "q.npz", optimizer=stray)
    np.testing.assert_array_equal(other.params, before)
    assert stray.step_count == 0 and other.optimizer is None
    right = nbqat.Adam(other.params, lr=1e-3)
    other.load(tmp_path / "q.npz", optimizer=right)
    for k, v in opt.state_dict().items():
        np.testing.assert_array_equal(right.state_dict()[k], v, err_msg=k)


def test_a_checkpoint_from_before_quantize_linear_skip_loads_with_its_skip_quantized(tmp_path, rng):
    """Checkpoints written before ``QATConfig.quantize_linear_skip`` existed quantized the skip:
    their saved config lacks the field and loads with it True (the saved quantizers, the same
    forecasts); a current checkpoint loads as written."""
    tft = TemporalFusionTransformer(dataclasses.replace(TCFG, linear_skip=True), seed=2)
    cfg = nbqat.QATConfig(calibration_batches=2, quantize_linear_skip=True)
    qat = QATTemporalFusionTransformer.from_float(tft, config=cfg)
    b = _batch(rng)
    qat.calibrate([b, b])
    want = qat.predict(*b[:3])
    path = tmp_path / "old.npz"
    qat.save(path)
    st = load_state(path, format="nbqat.qat")
    del st["qat"]["config"]["quantize_linear_skip"]  # as the previous release wrote it
    save_state(path, st, format="nbqat.qat")
    old = load_qat_forecaster(path)
    assert old.config.quantize_linear_skip is True
    assert "linear_skip.input_fake_quant" in old.fake_quants
    np.testing.assert_array_equal(old.predict(*b[:3]), want)
    now = QATTemporalFusionTransformer.from_float(
        tft, config=nbqat.QATConfig(calibration_batches=2)
    )
    now.calibrate([b, b])
    now.save(tmp_path / "now.npz")
    loaded = load_qat_forecaster(tmp_path / "now.npz")
    assert loaded.config.quantize_linear_skip is False
    assert not [k for k in loaded.fake_quants if k.startswith("linear_skip.")]
    np.testing.assert_array_equal(loaded.predict(*b[:3]), now.predict(*b[:3]))


# ------------------------------------------------------------------------------- the codec
def test_npz_state_round_trip_and_refusals(tmp_path):
    state = {
        "a": np.arange(5, dtype=np.float32),
        "t": (1, 2.5, "x", None, True),
        "l": [np.int64(3), {"deep": np.zeros((2, 3), np.uint8)}],
    }
    path = tmp_path / "s.npz"
    save_state(path, state, format="test.fmt", version=3)
    back = load_state(path, format="test.fmt", version=3)
    assert back["t"] == state["t"] and isinstance(back["t"], tuple)
    assert np.array_equal(back["a"], state["a"]) and back["a"].dtype == np.float32
    assert isinstance(back["l"][0], np.int64) and back["l"][0] == 3
    assert back["l"][1]["deep"].shape == (2, 3)
    with pytest.raises(CheckpointError, match="not a 'other' checkpoint"):
        load_state(path, format="other", version=3)
    with pytest.raises(CheckpointError, match="version 3"):
        load_state(path, format="test.fmt", version=1)
    with pytest.raises(TypeError, match="cannot checkpoint a set at '/bad'"):
        save_state(tmp_path / "x.npz", {"bad": {1, 2}}, format="f")
    assert not (tmp_path / "x.npz").exists()


def test_save_names_a_missing_folder_or_a_folder_target(tmp_path):
    # The errors named the temporary file ('.../nodir/.nbqat-ckpt-XXXX.tmp'), not the path.
    for target, err, needle in (
        (tmp_path / "nodir" / "s.npz", FileNotFoundError, "the folder .*nodir' does not exist"),
        (tmp_path, IsADirectoryError, "is a folder: pass a file name"),
    ):
        with pytest.raises(err, match=needle):
            save_state(target, {"a": 1}, format="f")
    assert list(tmp_path.iterdir()) == []  # nothing created, no temporary file left


def test_a_prepared_sequential_saves_and_loads(tmp_path, rng):
    """The checkpoint of any prepare_qat model (no config dataclass): params, quantizer state
    and phase come back; another architecture is refused."""
    from nbqat.nn import ELU, ParameterBuffer, Sequential

    def make(seed, width=5):
        m = Sequential(Linear(3, width), ELU(), Linear(width, 2))
        ParameterBuffer(m, seed=seed)
        return prepare_qat(m, config=nbqat.QATConfig(calibration_batches=1))

    a = make(0)
    x = rng.standard_normal((7, 3)).astype(np.float32)
    a(x)
    a.disable_calibration()
    a.freeze_observers()
    a.save(tmp_path / "seq.npz")
    b = make(1)
    b.load(tmp_path / "seq.npz")
    assert np.array_equal(a.params, b.params) and b.phase == "qat" and b.observers_frozen
    assert np.array_equal(a.predict(x), b.predict(x))
    with pytest.raises(CheckpointError, match="parameters"):
        make(0, width=6).load(tmp_path / "seq.npz")


# ------------------------------------------------------------------ state_dict / load_state_dict
@pytest.mark.parametrize("lsq", [False, True])
def test_state_dict_round_trip_reproduces_the_forward_and_the_next_step(tmp_path, rng, lsq):
    """QAT models had no state_dict / load_state_dict (torch's nn.Module pair) to checkpoint in
    memory mid-training. Oracle: the saved model itself (its forward bits and its next step)."""
    cfg, qat, opt = _trained_lstm_qat(rng, lsq, steps=3)
    sd, osd = qat.state_dict(), opt.state_dict()
    assert sd["_extra_state"] == {
        "phase": "qat",
        "observers_frozen": False,
        "calibration_batches_seen": 2,
        "calibration_ended": True,
        "step": 3,
    }
    save_state(tmp_path / "sd.npz", sd, format="nbqat.qat.state_dict")  # the one codec
    sd = load_state(tmp_path / "sd.npz", format="nbqat.qat.state_dict")
    fresh = prepare_forecaster(build_forecaster("lstm", _opts(), _windows(), seed=9), cfg)
    assert fresh.load_state_dict(sd) == ([], [])
    assert fresh.step == 3 and fresh.phase == "qat" and fresh.is_calibrated
    s, h, f, _ = batch = _batch(rng)
    assert np.array_equal(fresh.predict(s, h, f), qat.predict(s, h, f))
    assert np.array_equal(fresh(s, h, f), qat(s, h, f))  # observers update alike
    opt2 = nbqat.Adam(fresh.params, lr=1e-2)
    if lsq:
        opt2.add_param_group(fresh.quantizer_param_group())
    opt2.load_state_dict(osd)
    assert qat.train_step(batch, opt, max_norm=0.5) == fresh.train_step(batch, opt2, max_norm=0.5)
    assert np.array_equal(qat.params, fresh.params)
    for k, fq in qat.fake_quants.items():
        for key, v in fq.state_dict().items():
            assert np.array_equal(v, fresh.fake_quants[k].state_dict()[key]), (k, key)


def test_state_dict_keys_and_strict_as_torch(torch, rng):
    """Keys: the float model's parameter names and each quantizer's torch keys (torch's
    prepare_qat of the same Sequential has them, beside its output observers); strict=False
    reports the same missing / unexpected keys as torch's load_state_dict."""
    from nbqat.nn import ELU, ParameterBuffer, Sequential

    model = Sequential(Linear(3, 4), ELU(), Linear(4, 2))
    ParameterBuffer(model, np.float32, seed=0)
    qat = prepare_qat(model)
    qat.calibrate([rng.standard_normal((6, 3)).astype(np.float32)])
    ref = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ELU(), torch.nn.Linear(4, 2))
    ref.qconfig = torch.ao.quantization.get_default_qat_qconfig("x86")
    ref = torch.ao.quantization.prepare_qat(ref.train())
    # all but torch's output observers ("1.activation_post_process.*"; nbqat: input quantizers)
    tkeys = [k for k in ref.state_dict() if k.split(".")[1] != "activation_post_process"]
    sd = qat.state_dict()
    assert tkeys and all(k in sd for k in tkeys), sorted(set(tkeys) - set(sd))
    assert [k for k in sd if k[0] == "0"][:2] == ["0.weight", "0.bias"]
    assert "0.input_fake_quant.scale" in sd and "0.weight_fake_quant.scale" in sd
    srcs = {"torch": dict(ref.state_dict()), "nbqat": dict(sd)}
    for lib, target in (("torch", ref), ("nbqat", qat)):
        src = srcs[lib]
        del src["2.bias"]
        src["2.junk"] = src["2.weight"]
        got = target.load_state_dict(src, strict=False)
        assert (list(got.missing_keys), list(got.unexpected_keys)) == (["2.bias"], ["2.junk"]), lib
    with pytest.raises(RuntimeError, match=r"Missing key.*2.bias(.|\n)*Unexpected key.*2.junk"):
        ref.load_state_dict(srcs["torch"], strict=True)
    with pytest.raises(
        CheckpointError, match=r"missing key\(s\) \['2.bias'\], unexpected .*2.junk"
    ):
        qat.load_state_dict(srcs["nbqat"])


def test_a_refused_load_state_dict_changes_nothing(rng):
    """Shapes, quantizer states and the phase state are all checked before anything is
    written (torch copies the parameters it can before raising a size mismatch)."""
    cfg = nbqat.QATConfig(calibration_batches=1)
    qat = prepare_forecaster(build_forecaster("lstm", _opts(), _windows()), cfg)
    other = prepare_forecaster(build_forecaster("lstm", _opts(), _windows(), seed=9), cfg)
    for m in (qat, other):
        m(*_batch(rng)[:3])
    good = other.state_dict()

    def snapshot():
        return {k: np.array(v) if k != "_extra_state" else v for k, v in qat.state_dict().items()}

    first_w = next(iter(good))
    last_fq = [k for k in good if k.endswith(".scale")][-1]
    cases = [
        ({first_w: np.zeros((1, 1), np.float32)}, f"size mismatch for {first_w}"),
        ({last_fq: -good[last_fq]}, "quantizer .*scale"),
        ({"_extra_state": {**good["_extra_state"], "phase": "warmup"}}, "unknown phase"),
        ({"_extra_state": {**good["_extra_state"], "step": -1}}, "step must be an int >= 0"),
        ({first_w: good[first_w].astype(complex)}, "expected real numbers"),
    ]
    for change, match in cases:
        before = snapshot()
        with pytest.raises((CheckpointError, TypeError), match=match):
            qat.load_state_dict({**good, **change})
        after = snapshot()
        assert after["_extra_state"] == before["_extra_state"]
        assert all(np.array_equal(before[k], after[k]) for k in before if k != "_extra_state")
    with pytest.raises(TypeError, match="must be a mapping"):
        qat.load_state_dict([("a", 1)])
    partial = {k: v for k, v in good.items() if k != first_w}
    keep = np.array(dict(qat.model.named_parameters())[first_w])
    assert qat.load_state_dict(partial, strict=False) == ([first_w], [])
    assert np.array_equal(dict(qat.model.named_parameters())[first_w], keep)  # left as it was
