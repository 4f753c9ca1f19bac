"""QAT of the TFT-like forecaster: wiring, phases, STE gradients, clipping order, checkpoints.

Oracles: the float model itself (fake quantization off must be bit-identical to it), float64
finite differences of the float network evaluated at the fake-quantized weights (tests/ref_nn.py),
a NumPy float64 norm, and an independent replay of the optimizer update. The PyTorch oracle is
in tests/test_qat_torch.py.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
from ref_nn import fd_grad, forecast_batch

from nbqat import SGD, Adam, FakeQuantize, LearnableFakeQuantize, QATConfig
from nbqat.clip import clip_coef
from nbqat.nn import (
    LSTM,
    InterpretableMultiHeadAttention,
    Linear,
    TemporalFusionTransformer,
    TFTConfig,
)
from nbqat.nn.qat import CheckpointError, QATTemporalFusionTransformer

CFG = TFTConfig(2, 3, 4, 8, 5, 3, num_heads=2)  # m_s, m_x, m_z, d, k, tau


def make_batch(rng, nb=4, dtype=np.float32, target_scale=1.0):
    return forecast_batch(rng, CFG, nb, dtype, target_scale=target_scale)


def calibrated(model, rng, n=2, **cfg):
    qat = QATTemporalFusionTransformer.from_float(
        model, config=QATConfig(calibration_batches=n, **cfg)
    )
    for _ in range(n):
        qat.forward(*make_batch(rng)[:3])
    qat.disable_calibration()
    return qat


@pytest.fixture(scope="module")
def float_model():
    return TemporalFusionTransformer(CFG, seed=7)


# ---------------------------------------------------------------------------------- wiring
def test_from_float_places_quantizers_and_copies_weights(float_model):
    qat = QATTemporalFusionTransformer.from_float(float_model)
    assert np.array_equal(qat.params, float_model.params)
    assert not np.shares_memory(qat.params, float_model.params)
    assert qat.phase == "calibration" and not qat.is_calibrated
    head = qat.model.output_layer
    n_lin = n_lstm = 0
    for _, mod in qat.model.named_modules():
        if isinstance(mod, Linear):
            if mod is head:
                assert mod.weight_fake_quant is None and mod.input_fake_quant is None
                continue
            n_lin += 1
            w, x = mod.weight_fake_quant, mod.input_fake_quant
            assert isinstance(w, FakeQuantize) and w.is_per_channel and w.ch_axis == 0
            assert (w.quant_min, w.quant_max, w.qscheme) == (-128, 127, "per_channel_symmetric")
            assert not x.is_per_channel and (x.quant_min, x.quant_max) == (0, 255)
            assert x.qscheme == "per_tensor_affine"
        elif isinstance(mod, LSTM):
            n_lstm += 1
            for hook in ("weight_ih_fake_quant", "weight_hh_fake_quant"):
                assert getattr(mod, hook).is_per_channel
            for hook in ("input_fake_quant", "hidden_fake_quant"):
                assert not getattr(mod, hook).is_per_channel
        elif isinstance(mod, InterpretableMultiHeadAttention):
            assert mod.attention_fake_quant is not None
    assert n_lstm == 2 and n_lin > 40
    assert len(qat.fake_quants) == 2 * n_lin + 4 * n_lstm + 1 + 1  # + attention + output
    # the float model is untouched
    for _, mod in float_model.named_modules():
        assert getattr(mod, "weight_fake_quant", None) is None
    # the Rust original's name
    assert QATTemporalFusionTransformer.new_from_fp32(float_model).params.shape == qat.params.shape


def test_config_switches(float_model):
    qat = QATTemporalFusionTransformer.from_float(
        float_model, config=QATConfig(quantize_output_head=True, quantize_attention=False)
    )
    assert qat.model.output_layer.weight_fake_quant is not None
    att = qat.model.multihead_attn
    assert att.attention_fake_quant is None and att.q_proj.weight_fake_quant is None
    lsq = QATTemporalFusionTransformer.from_float(
        float_model, config=QATConfig(learnable_scales=True)
    )
    w = lsq.model.lstm_encoder.weight_ih_fake_quant
    assert isinstance(w, LearnableFakeQuantize) and w.is_per_channel


def test_from_float_errors(float_model):
    with pytest.raises(TypeError, match="TemporalFusionTransformer"):
        QATTemporalFusionTransformer.from_float(object())
    qat = QATTemporalFusionTransformer.from_float(float_model)
    with pytest.raises(ValueError, match="already has a quantizer"):
        QATTemporalFusionTransformer.from_float(qat.model)
    with pytest.raises(TypeError, match="QATConfig"):
        QATTemporalFusionTransformer.from_float(float_model, config={"calibration_batches": 3})


# ------------------------------------------------------------------- float equivalence
def test_fake_quant_disabled_equals_float_model_exactly(float_model, rng):
    ref = TemporalFusionTransformer(CFG, seed=7)
    ref.set_folding(False)  # hooked Linears are never folded: compare the unfolded path
    qat = QATTemporalFusionTransformer.from_float(float_model)
    batch = make_batch(rng)
    g = rng.standard_normal((4, CFG.prediction_horizon, CFG.num_quantiles)).astype(np.float32)
    # calibration phase: observers on, fake quantization off -> the float forward/backward
    assert np.array_equal(qat.forward(*batch[:3]), ref.forward(*batch[:3]))
    qat.zero_grad()
    ref.zero_grad()
    dq = qat.backward(g)
    dr = ref.backward(g)
    assert np.array_equal(qat.grads, ref.grads)
    for a, b in zip(dq, dr):
        assert np.array_equal(a, b)
    # QAT phase with every fake quantization switched off by hand: still the float model
    qat.disable_calibration()
    for fq in qat.fake_quants.values():
        fq.disable_fake_quant()
    batch = make_batch(rng)
    assert np.array_equal(qat.forward(*batch[:3]), ref.forward(*batch[:3]))
    qat.zero_grad()
    ref.zero_grad()
    qat.backward(g)
    ref.backward(g)
    assert np.array_equal(qat.grads, ref.grads)


# --------------------------------------------------------------------------------- phases
def test_phases_follow_calibration_batches(float_model, rng):
    qat = QATTemporalFusionTransformer.from_float(
        float_model, config=QATConfig(calibration_batches=2)
    )
    fqs = list(qat.fake_quants.values())
    assert all(fq.observer_enabled and not fq.fake_quant_enabled for fq in fqs)
    qat.forward(*make_batch(rng)[:3])
    assert not qat.is_calibrated
    qat.forward(*make_batch(rng)[:3])
    assert qat.is_calibrated and qat.calibration_batches_seen == 2
    y_float = TemporalFusionTransformer(CFG, seed=7).forward(
        *make_batch(np.random.default_rng(1))[:3]
    )
    y = qat.forward(*make_batch(np.random.default_rng(1))[:3])  # switches to QAT first
    assert qat.phase == "qat"
    assert not np.array_equal(y, y_float)  # now fake-quantized
    out = qat.fake_quants["output_fake_quant"]
    assert out.observer_enabled and not out.fake_quant_enabled  # the head stays float
    assert all(fq.observer_enabled and fq.fake_quant_enabled for fq in fqs if fq is not out)
    # freezing keeps every scale fixed
    qat.freeze_observers()
    before = {k: fq.scale.copy() for k, fq in qat.fake_quants.items()}
    qat.forward(*make_batch(rng, nb=3)[:3])
    assert all(np.array_equal(fq.scale, before[k]) for k, fq in qat.fake_quants.items())
    # back to calibration resets the count
    qat.enable_calibration()
    assert qat.phase == "calibration" and not qat.is_calibrated
    qat.forward(*make_batch(rng)[:3])
    qat.disable_calibration()  # ended early, after one batch: calibrated
    assert qat.is_calibrated


def test_freeze_after_calibration_and_calibrate_helper(float_model, rng):
    cfg = QATConfig(calibration_batches=3, freeze_observers_after_calibration=True)
    qat = QATTemporalFusionTransformer.from_float(float_model, config=cfg)
    batches = [make_batch(rng) for _ in range(5)]
    assert qat.calibrate(iter(batches)) == 3
    assert qat.phase == "qat" and qat.observers_frozen and qat.is_calibrated
    assert all(not fq.observer_enabled for fq in qat.fake_quants.values())


# ---------------------------------------------------- STE gradients vs finite differences
def test_ste_weight_gradients_match_finite_differences(rng):
    """In-range weights get the float network's gradient at the fake-quantized weights
    (checked against finite differences); out-of-range weights get exactly 0."""
    m64 = TemporalFusionTransformer(CFG, seed=3, dtype=np.float64)
    qat = calibrated(m64, rng, n=2)
    qat.freeze_observers()
    for name, fq in qat.fake_quants.items():  # only the weight quantizers stay on
        if "weight" not in name.rsplit(".", 1)[-1]:
            fq.disable_fake_quant()
    layer = qat.model.static_enrichment.fc1
    s = layer.weight_fake_quant.scale
    layer.weight[0, :3] = 300.0 * s[0]  # far outside [-128, 127] * s: mask False
    layer.weight[1, 0] = -300.0 * s[1]
    batch = make_batch(rng, nb=3, dtype=np.float64)
    r = rng.standard_normal((3, CFG.prediction_horizon, CFG.num_quantiles))
    qat.zero_grad()
    qat.forward(*batch[:3])
    qat.backward(r)
    g = qat.grads.copy()
    # the float network with every quantized weight replaced by its fake-quantized value
    ref = TemporalFusionTransformer(CFG, dtype=np.float64)
    ref.params[...] = qat.params
    ref_mods = dict(ref.named_modules())
    masks = {}
    for name, mod in qat.model.named_modules():
        for hook, pname in (
            ("weight_fake_quant", "weight"),
            ("weight_ih_fake_quant", "weight_ih"),
            ("weight_hh_fake_quant", "weight_hh"),
        ):
            fq = getattr(mod, hook, None)
            if fq is not None:
                wq = fq.forward(getattr(mod, pname))
                getattr(ref_mods[name], pname)[...] = wq
                masks[f"{name}.{pname}"] = fq.ctx

    def loss():
        return float(np.sum(ref.forward(*batch[:3]) * r))

    offsets = ref.buffer.offsets
    # out of range -> exactly zero gradient
    start, shape = offsets["static_enrichment.fc1.weight"]
    gw = g[start : start + int(np.prod(shape))].reshape(shape)
    assert not masks["static_enrichment.fc1.weight"][0, :3].any()
    assert np.all(gw[0, :3] == 0.0) and gw[1, 0] == 0.0
    checked = 0
    for pname in (
        "static_enrichment.fc1.weight",
        "lstm_encoder.weight_hh",
        "lstm_decoder.weight_ih",
        "multihead_attn.q_proj.weight",
        "encoder_vsn.flat_grn.fc2.weight",
        "post_attn_gate.glu.fc.bias",
    ):
        start, shape = offsets[pname]
        view = dict(ref.named_parameters())[pname]
        mask = masks.get(pname, np.ones(shape, bool))
        idx = [i for i in rng.choice(view.size, size=6, replace=False) if mask.reshape(-1)[i]]
        fd = fd_grad(loss, view, eps=1e-5, indices=idx)
        got = g[start : start + view.size]
        for i in idx:
            assert abs(got[i] - fd.reshape(-1)[i]) <= 1e-6 * max(1.0, abs(fd.reshape(-1)[i]))
            checked += 1
        out_of_range = ~mask.reshape(-1)
        assert np.all(got[out_of_range] == 0.0)
    assert checked >= 20


# ----------------------------------------------------------------------- clipping order
def test_clipping_happens_after_the_ste_gradients(float_model, rng):
    qat = calibrated(float_model, rng)
    qat.freeze_observers()
    layer = qat.model.pos_wise_ff.fc2
    layer.weight[2, :] = 500.0 * layer.weight_fake_quant.scale[2]  # a whole row out of range
    opt = SGD(qat.params, lr=0.1)
    batch = make_batch(rng, target_scale=1e3)  # large loss gradients
    p0 = qat.params.copy()
    loss, total = qat.train_step(batch, opt, max_norm=1e-2)
    g = qat.grads  # the STE gradients (the buffer itself is not rescaled)
    start, shape = qat.model.buffer.offsets["pos_wise_ff.fc2.weight"]
    row = slice(start + 2 * shape[1], start + 3 * shape[1])
    assert np.all(g[row] == 0.0)  # masked by the STE ...
    assert np.array_equal(qat.params[row], p0[row])  # ... and so never updated
    ref_total = float(np.sqrt(np.sum(g.astype(np.float64) ** 2)))
    assert total == pytest.approx(ref_total, rel=1e-6)
    assert total > 1e-2  # clipping fired
    coef = clip_coef(total, 1e-2, np.float32)
    assert coef * total == pytest.approx(1e-2, rel=1e-5)  # clipped to max_norm
    # the update is SGD on the clipped STE gradients: p - lr * (g * coef), within 1 ulp of p
    expected = p0 - np.float32(0.1) * (g * np.float32(coef))
    assert np.all(np.abs(qat.params - expected) <= np.spacing(np.abs(expected)))
    assert np.isfinite(loss)


def test_clipped_and_unclipped_runs_from_the_same_seed(float_model, capsys):
    stats = {}
    for label, max_norm in (("clipped", 0.5), ("unclipped", None)):
        rng = np.random.default_rng(2024)
        qat = calibrated(float_model, rng)
        opt = SGD(qat.params, lr=0.05, momentum=0.9)  # (Adam would hide the clipping scale)
        losses, norms = [], []
        for _ in range(12):
            loss, total = qat.train_step(make_batch(rng, target_scale=5.0), opt, max_norm=max_norm)
            losses.append(loss)
            norms.append(total)
        assert np.all(np.isfinite(losses)) and np.all(np.isfinite(norms))
        assert np.all(np.isfinite(qat.params))
        stats[label] = (float(np.mean(losses)), float(np.std(losses)), max(norms))
    with capsys.disabled():
        for label, (mean, std, mx) in stats.items():
            print(f"\n[qat] {label}: loss mean {mean:.4f} std {std:.4f} max grad norm {mx:.3f}")
    # both start from the same state: the first losses agree, the runs then differ
    assert stats["clipped"] != stats["unclipped"]


# --------------------------------------------------------------------------- validation
def test_train_step_rejects_bad_input_without_changing_state(float_model, rng):
    qat = calibrated(float_model, rng)
    opt = SGD(qat.params, lr=0.1)
    p0 = qat.params.copy()
    scales = [fq.scale.copy() for fq in qat.fake_quants.values()]
    s, h, f, y = make_batch(rng)
    with pytest.raises(ValueError, match="batch must be a tuple"):
        qat.train_step((s, h, f), opt)
    with pytest.raises(ValueError, match="target must have shape"):
        qat.train_step((s, h, f, y[:, :2]), opt)
    with pytest.raises(ValueError, match="max_norm"):
        qat.train_step((s, h, f, y), opt, max_norm=-1.0)
    with pytest.raises(ValueError, match="qat.params"):
        qat.train_step((s, h, f, y), SGD(np.zeros_like(qat.params), lr=0.1))
    with pytest.raises(ValueError, match="historical"):
        qat.train_step((s, h[:, :2], f, y), opt)
    assert np.array_equal(qat.params, p0) and qat.step == 0
    assert all(np.array_equal(fq.scale, s0) for fq, s0 in zip(qat.fake_quants.values(), scales))


# --------------------------------------------------------------------------- checkpoints
def _trained(float_model, seed, steps=2, **cfg):
    rng = np.random.default_rng(seed)
    qat = calibrated(float_model, rng, **cfg)
    opt = Adam(qat.params, lr=1e-2)
    for _ in range(steps):
        qat.train_step(make_batch(rng), opt, max_norm=0.5)
    return qat, opt, rng


@pytest.mark.parametrize("lsq", [False, True])
def test_save_load_reproduces_the_next_step_bit_for_bit(float_model, tmp_path, lsq):
    qat, opt, rng = _trained(float_model, 5, learnable_scales=lsq)
    path = tmp_path / "qat.npz"
    qat.save(path)  # the optimizer of the last train_step by default
    assert sorted(os.listdir(tmp_path)) == ["qat.npz"]  # no temporary file left behind
    batch = make_batch(rng)
    loss_a, norm_a = qat.train_step(batch, opt, max_norm=0.5)
    # a fresh model (other weights) and a fresh optimizer, then load
    other = TemporalFusionTransformer(CFG, seed=99)
    qat_b = QATTemporalFusionTransformer.from_float(
        other, config=QATConfig(calibration_batches=2, learnable_scales=lsq)
    )
    opt_b = Adam(qat_b.params, lr=1e-2)
    qat_b.load(path, optimizer=opt_b)
    assert qat_b.step == 2 and qat_b.phase == "qat"
    loss_b, norm_b = qat_b.train_step(batch, opt_b, max_norm=0.5)
    assert (loss_a, norm_a) == (loss_b, norm_b)
    assert np.array_equal(qat.params, qat_b.params)
    for k, fq in qat.fake_quants.items():
        assert np.array_equal(fq.scale, qat_b.fake_quants[k].scale)
        assert np.array_equal(fq.zero_point, qat_b.fake_quants[k].zero_point)
    # rebuilt from the file alone
    qat_c = QATTemporalFusionTransformer.from_checkpoint(path)
    assert qat_c.config.learnable_scales == lsq and qat_c.step == 2


def test_checkpoint_errors_leave_the_model_unchanged(float_model, tmp_path):
    qat, opt, _ = _trained(float_model, 6, steps=1)
    good = tmp_path / "good.npz"
    qat.save(good, optimizer=opt)
    data = good.read_bytes()
    p0 = qat.params.copy()
    st0 = {k: fq.state_dict() for k, fq in qat.fake_quants.items()}

    def unchanged():
        assert np.array_equal(qat.params, p0)
        for k, fq in qat.fake_quants.items():
            for kk, v in fq.state_dict().items():
                assert np.array_equal(v, st0[k][kk])

    (tmp_path / "trunc.npz").write_bytes(data[: len(data) // 2])
    (tmp_path / "text.npz").write_bytes(b"not a checkpoint")
    flipped = bytearray(data)
    at = data.find(p0.tobytes())  # members are stored uncompressed: flip a weight's byte
    assert at > 0
    flipped[at + p0.nbytes // 2] ^= 0xFF
    (tmp_path / "flip.npz").write_bytes(bytes(flipped))
    np.savez(tmp_path / "foreign.npz", params=p0)
    for name in ("trunc.npz", "text.npz", "flip.npz", "foreign.npz"):
        with pytest.raises(CheckpointError):
            qat.load(tmp_path / name, optimizer=opt)
        unchanged()
    with pytest.raises(FileNotFoundError):
        qat.load(tmp_path / "missing.npz")
    # another network
    small = TemporalFusionTransformer(TFTConfig(2, 3, 4, 4, 5, 3, num_heads=2))
    other = QATTemporalFusionTransformer.from_float(small)
    with pytest.raises(CheckpointError, match="different network"):
        other.load(good)
    # another quantizer set
    other = QATTemporalFusionTransformer.from_float(
        float_model, config=QATConfig(quantize_output_head=True)
    )
    with pytest.raises(CheckpointError, match="quantizers"):
        other.load(good)
    # another optimizer class
    with pytest.raises(CheckpointError, match="Adam"):
        qat.load(good, optimizer=SGD(qat.params, lr=0.1))
    unchanged()
    # an unwritable destination leaves no temporary file
    with pytest.raises(OSError):
        qat.save(tmp_path / "no-such-dir" / "x.npz")
    assert not [n for n in os.listdir(tmp_path) if n.endswith(".tmp")]


# --------------------------------------------------------------------------------- LSQ
def test_lsq_learns_scales(float_model):
    qat, opt, rng = _trained(float_model, 8, steps=0, learnable_scales=True)
    fq = qat.model.static_enrichment.fc1.input_fake_quant
    s0 = fq.scale.copy()
    for _ in range(3):
        loss, total = qat.train_step(make_batch(rng), opt, max_norm=None)
        assert np.isfinite(loss) and np.isfinite(total)
    assert not np.array_equal(fq.scale, s0) and np.all(fq.scale > 0)
    # the total norm covers the scale gradients too
    assert total >= float(np.sqrt(np.sum(qat.grads.astype(np.float64) ** 2)))
