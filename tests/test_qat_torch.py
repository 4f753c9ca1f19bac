"""PyTorch oracle for QAT: the same layers / the same network in torch with
``torch.ao.quantization.FakeQuantize`` modules at the same places (torch's default QAT observers:
activations MovingAverageMinMaxObserver quint8 [0, 255] per-tensor affine, reduce_range=False;
weights MovingAveragePerChannelMinMaxObserver qint8 per-channel symmetric, ch_axis 0), float32.

Checked: the fake-quantized tensors are bit-identical where both sides quantize the same input
(layer inputs, weights, the first hidden state), scales and zero points agree, outputs agree to
1e-5 and gradients to 1e-5 (layers) / 1e-4 per tensor (the whole network, float32 BLAS noise),
and the total gradient norm of a QAT step equals ``torch.nn.utils.clip_grad_norm_``.
"""

from __future__ import annotations

import numpy as np
import pytest
from ref_nn import rel_err
from ref_qat_torch import instrument, t_act, t_weight, torch_qlstm
from ref_tft_torch import make_torch_tft, torch_name

from nbqat import SGD, QATConfig
from nbqat.nn import (
    LSTM,
    Linear,
    ParameterBuffer,
    TemporalFusionTransformer,
    TFTConfig,
    quantile_loss,
    quantile_loss_grad,
)
from nbqat.nn.qat import QATTemporalFusionTransformer
from nbqat.quantization.qconfig import default_qat_qconfig as QC


def T(torch, a, grad=False):
    return torch.tensor(np.asarray(a), requires_grad=grad)


def same_qparams(fq, tfq):
    assert np.array_equal(fq.scale, tfq.scale.detach().numpy().astype(np.float32).reshape(-1))
    assert np.array_equal(fq.zero_point, tfq.zero_point.detach().numpy().reshape(-1))


# ------------------------------------------------------------------------------- layers
def test_linear_with_fake_quant_matches_torch(torch, rng):
    lin = Linear(12, 6)
    ParameterBuffer(lin, np.float32, seed=4)
    lin.weight_fake_quant, lin.input_fake_quant = QC.weight(), QC.activation()
    tw, tx = t_weight(torch), t_act(torch)
    W = T(torch, lin.weight.copy(), True)
    b = T(torch, lin.bias.copy(), True)
    for step in range(4):  # the moving averages move: the qparams must follow torch's
        x = (rng.standard_normal((10, 12)) * (1 + step)).astype(np.float32)
        dy = rng.standard_normal((10, 6)).astype(np.float32)
        lin.weight_grad[...] = 0
        lin.bias_grad[...] = 0
        y = lin.forward(x)
        dx = lin.backward(dy)
        xt = T(torch, x, True)
        xq_t, wq_t = tx(xt), tw(W)
        yt = torch.nn.functional.linear(xq_t, wq_t, b)
        W.grad = b.grad = None
        yt.backward(T(torch, dy))
        xq, wq = lin._cache[0], lin._cache[1]
        assert np.array_equal(xq, xq_t.detach().numpy())  # fake quant bit-exact
        assert np.array_equal(wq, wq_t.detach().numpy())
        same_qparams(lin.input_fake_quant, tx)
        same_qparams(lin.weight_fake_quant, tw)
        np.testing.assert_allclose(y, yt.detach().numpy(), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(lin.weight_grad, W.grad.numpy(), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(lin.bias_grad, b.grad.numpy(), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(dx, xt.grad.numpy(), rtol=1e-5, atol=1e-6)


def test_lstm_with_fake_quant_matches_torch(torch, rng):
    lstm = LSTM(5, 4)
    ParameterBuffer(lstm, np.float32, seed=5)
    hooks = ("weight_ih", "weight_hh", "input", "hidden")
    for hk in hooks:
        setattr(lstm, hk + "_fake_quant", (QC.weight if "weight" in hk else QC.activation)())
    fq = {hk: (t_weight if "weight" in hk else t_act)(torch) for hk in hooks}
    names = [n for n, _ in lstm.named_parameters(recurse=False)]  # its own: all of them
    params = {n: T(torch, getattr(lstm, n).copy(), True) for n in names}
    for it in range(2):
        x = rng.standard_normal((3, 6, 5)).astype(np.float32)
        h0 = (0.5 * rng.standard_normal((3, 4))).astype(np.float32)
        c0 = (0.5 * rng.standard_normal((3, 4))).astype(np.float32)
        dout = rng.standard_normal((3, 6, 4)).astype(np.float32)
        for n in names:
            getattr(lstm, n + "_grad")[...] = 0
            params[n].grad = None
        out, (hn, cn) = lstm.forward(x, h0, c0)
        dx, dh0, dc0 = lstm.backward(dout)
        xt, ht, ct = T(torch, x, True), T(torch, h0, True), T(torch, c0, True)
        o_t, _, c_t, xq_t, hq0_t = torch_qlstm(torch, xt, ht, ct, *(params[n] for n in names), fq)
        o_t.backward(T(torch, dout))
        cache = lstm._cache
        assert np.array_equal(cache[0].transpose(1, 0, 2), xq_t.detach().numpy())
        for hk in ("weight_ih", "weight_hh", "input"):
            same_qparams(getattr(lstm, hk + "_fake_quant"), fq[hk])
        if it == 0:  # identical h_0 and observer history: bit-exact
            assert np.array_equal(cache[10][0], hq0_t.detach().numpy())  # quantized h_0
        else:  # the observer has seen h_t that differ in the last bit (tanh/sigmoid)
            np.testing.assert_allclose(cache[10][0], hq0_t.detach().numpy(), rtol=1e-6)
            hfq = lstm.hidden_fake_quant
            np.testing.assert_allclose(hfq.scale, fq["hidden"].scale.numpy(), rtol=1e-6)
        np.testing.assert_allclose(out, o_t.detach().numpy(), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(cn, c_t.detach().numpy(), rtol=1e-5, atol=1e-6)
        for n in names:
            np.testing.assert_allclose(
                getattr(lstm, n + "_grad"), params[n].grad.numpy(), rtol=1e-5, atol=1e-5
            )
        for a, b in ((dx, xt), (dh0, ht), (dc0, ct)):
            np.testing.assert_allclose(a, b.grad.numpy(), rtol=1e-5, atol=1e-6)


# --------------------------------------------------------------------- the whole network
def test_qat_network_matches_torch_fake_quantize(torch, rng):
    cfg = TFTConfig(2, 3, 2, 8, 5, 3, num_heads=2)
    model = TemporalFusionTransformer(cfg, seed=7)
    qat = QATTemporalFusionTransformer.from_float(model, config=QATConfig(calibration_batches=2))
    tm = make_torch_tft(torch, cfg, model.state_dict(), torch.float32)
    pairs = instrument(torch, tm, qat)
    assert len(pairs) == len(qat.fake_quants) - 1  # all but the (observe-only) output
    for f in pairs.values():  # torch's calibration phase
        f.enable_observer()
        f.disable_fake_quant()

    def batch(nb=3):
        return (
            rng.standard_normal((nb, 2)).astype(np.float32),
            rng.standard_normal((nb, 5, 2)).astype(np.float32),
            rng.standard_normal((nb, 3, 3)).astype(np.float32),
            rng.standard_normal((nb, 3)).astype(np.float32),
        )

    for _ in range(2):  # calibration
        s, h, f, _ = batch()
        qat.forward(s, h, f)
        tm(T(torch, s), T(torch, h), T(torch, f))
    qat.disable_calibration()
    for f in pairs.values():
        f.enable_fake_quant()
    tparams = dict(tm.named_parameters())
    for _ in range(2):  # QAT forward / backward, observers still moving
        s, h, f, y = batch()
        qat.zero_grad()
        out = qat.forward(s, h, f)
        qat.backward(quantile_loss_grad(out, y, cfg.quantiles))
        for p in tparams.values():
            p.grad = None
        tout = tm(T(torch, s), T(torch, h), T(torch, f))
        ty = T(torch, y).unsqueeze(-1)
        q = torch.tensor(cfg.quantiles)
        e = ty - tout
        tloss = torch.maximum(q * e, (q - 1) * e).mean()
        tloss.backward()
        assert rel_err(out, tout.detach().numpy()) < 1e-5
        assert quantile_loss(out, y, cfg.quantiles) == pytest.approx(tloss.item(), rel=1e-5)
        for name, fq in qat.fake_quants.items():
            if name in pairs:
                tf = pairs[name]
                np.testing.assert_allclose(
                    fq.scale, tf.scale.detach().numpy().reshape(-1), rtol=1e-5
                )
                assert np.array_equal(fq.zero_point, tf.zero_point.numpy().reshape(-1))
        # per tensor, relative to max(its own largest gradient, 1e-3 x the network's largest):
        # the static selection GRN's gradients are ~1e-7 and come out of a cancelling softmax
        # backward, where BOTH float32 implementations carry ~1e-3 relative error (the NN
        # helper's tests/test_tft_torch.py documents the same float32 caveat)
        gmax = float(np.max(np.abs(qat.grads)))
        worst = 0.0
        for pname, view in qat.model.named_grads():
            tg = tparams[torch_name(pname)].grad
            tg = np.zeros(view.shape, np.float32) if tg is None else tg.numpy()
            err = rel_err(view, tg, floor=1e-3 * gmax)
            worst = max(worst, err)
            assert err < 1e-4, pname
        assert qat.model.output_layer.weight_fake_quant is None


def test_reported_norm_equals_torch_clip_grad_norm(torch, rng):
    cfg = TFTConfig(2, 3, 2, 8, 5, 3, num_heads=2)
    qat = QATTemporalFusionTransformer.from_float(
        TemporalFusionTransformer(cfg, seed=2), config=QATConfig(calibration_batches=1)
    )
    s = rng.standard_normal((4, 2)).astype(np.float32)
    h = rng.standard_normal((4, 5, 2)).astype(np.float32)
    f = rng.standard_normal((4, 3, 3)).astype(np.float32)
    qat.forward(s, h, f)  # calibration
    y = (100 * rng.standard_normal((4, 3))).astype(np.float32)
    opt = SGD(qat.params, lr=0.01)
    p0 = qat.params.copy()
    loss, total = qat.train_step((s, h, f, y), opt, max_norm=0.25)
    # torch clips the same (STE-masked) gradients, one tensor per parameter
    tps = []
    for _, g in qat.model.named_grads():
        p = torch.zeros(g.shape, requires_grad=True)
        p.grad = torch.tensor(g.copy())
        tps.append(p)
    t_total = torch.nn.utils.clip_grad_norm_(tps, max_norm=0.25)
    assert total == pytest.approx(float(t_total), rel=1e-6)
    clipped = np.concatenate([p.grad.numpy().reshape(-1) for p in tps])
    expected = p0 - np.float32(0.01) * clipped  # torch's SGD on torch's clipped grads
    # torch's float32 norm may differ from nbqat's by an ulp, so the coefficient may too
    tol = np.spacing(np.abs(expected)) + 0.01 * np.abs(clipped) * 2.5e-7
    assert np.all(np.abs(qat.params - expected) <= tol)
