"""PyTorch oracle for the whole TFT: the same network written in torch (tests/ref_tft_torch.py)
with nbqat's weights copied in; forward outputs, input gradients and every parameter gradient
must agree within 1e-9 relative (float64) and 1e-4 relative (float32), per tensor
(``max|a - b| / max|b|``).

float32 caveat: at random initialisation the static selection GRN's gradients are ~1e-8 of the
largest ones and come out of a cancelling softmax backward, so BOTH float32 implementations
carry ~1% error there (measured against float64). For a tensor that misses 1e-4 against torch
float32, nbqat float32 must instead be at least as close to the float64 truth (nbqat float64,
itself checked against torch float64 to 1e-9) as torch float32 is, within a factor 4 (or
3e-4): float32 rounding noise on a cancelling sum is not reproducible to better than that."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from ref_nn import forecast_batch, rel_err
from ref_tft_torch import make_torch_tft, torch_name

from nbqat.nn import TemporalFusionTransformer, TFTConfig, quantile_loss, quantile_loss_grad

_SMALL = TFTConfig(2, 3, 2, 8, 5, 3, num_heads=2)  # m_s, m_x, m_z, d, k, tau
CONFIGS = [
    _SMALL,
    TFTConfig(1, 2, 4, 12, 7, 4, num_heads=3, quantiles=(0.1, 0.25, 0.5, 0.75, 0.9)),
    dataclasses.replace(_SMALL, linear_skip=True),
    dataclasses.replace(_SMALL, linear_skip=True, skip_sequence_length=9),  # longer than k = 5
    dataclasses.replace(_SMALL, linear_skip=True, skip_sequence_length=3),  # shorter
]


@pytest.mark.parametrize("fold", [True, False], ids=["folded", "materialised"])
@pytest.mark.parametrize("cfg", CONFIGS)
@pytest.mark.parametrize("dtype,tol", [(np.float64, 1e-9), (np.float32, 1e-4)])
def test_tft_matches_torch(torch, rng, cfg, dtype, tol, fold):
    model = TemporalFusionTransformer(cfg, seed=7, dtype=dtype)
    model.set_folding(fold)  # VSN embedding and GRN fc2 folds (their classes' Notes)
    tdt = torch.float64 if dtype == np.float64 else torch.float32
    ref = make_torch_tft(torch, cfg, model.state_dict(), tdt)
    s, h, f, y = forecast_batch(rng, cfg, 3, dtype)

    out = model.forward(s, h, f)
    loss = quantile_loss(out, y, cfg.quantiles)
    ds, dh, df = model.backward(quantile_loss_grad(out, y, cfg.quantiles))

    ts, th, tf = (torch.tensor(a, requires_grad=True) for a in (s, h, f))
    tout = ref(ts, th, tf)
    q = torch.tensor(cfg.quantiles, dtype=tdt)
    e = torch.tensor(y).unsqueeze(-1) - tout
    tloss = (q * torch.relu(e) + (1 - q) * torch.relu(-e)).mean()
    tloss.backward()

    assert rel_err(out, tout.detach().numpy()) < tol
    assert loss == pytest.approx(tloss.item(), rel=tol)
    np.testing.assert_allclose(
        model.attention_weights, ref.multihead_attn.p.mean(1).detach().numpy(), atol=tol
    )
    for x, tx in ((ds, ts), (dh, th), (df, tf)):
        assert rel_err(x, tx.grad.numpy()) < tol
    tparams = dict(ref.named_parameters())
    checked = ill = 0
    if dtype == np.float32:
        m64 = TemporalFusionTransformer(cfg, seed=7, dtype=np.float64)
        m64.load_state_dict(model.state_dict())
        o64 = m64.forward(s, h, f)
        m64.backward(quantile_loss_grad(o64, y, cfg.quantiles))
        truth64 = {n: g.copy() for n, g in m64.named_grads()}
    for name, g in model.named_grads():
        tg = tparams[torch_name(name)].grad
        tg = np.zeros(g.shape) if tg is None else tg.numpy()
        err = rel_err(g, tg, 1e-30)
        # a key-projection bias has an exactly-zero true gradient (softmax shift invariance)
        if name == "multihead_attn.k_proj.bias":
            assert np.max(np.abs(g)) < 1e-6 * np.max(np.abs(model.grads))
            continue
        if err >= tol and dtype == np.float32:
            truth = truth64[name]
            err_nb, err_t = rel_err(g, truth), rel_err(tg, truth)
            assert err_nb <= max(4 * err_t, 3 * tol), f"{name}: {err_nb:.3g} vs torch {err_t:.3g}"
            ill += 1
        else:
            assert err < tol, f"{name}: {err:.3g}"
        checked += 1
    assert checked == len(tparams) - 1
    assert ill <= 12, ill  # a few small-gradient selection-GRN tensors, not the bulk


def test_tft_with_dropout_masks_matches_torch(torch, rng):
    # training-mode dropout at every GLU input: nbqat's masks copied into the torch reference
    from nbqat.nn import Dropout, set_dropout

    cfg = dataclasses.replace(CONFIGS[0], dropout=0.2, linear_skip=True)
    model = TemporalFusionTransformer(cfg, seed=9, dtype=np.float64)
    set_dropout(model, True, seed=(3, 1, 5))
    ref = make_torch_tft(torch, cfg, model.state_dict(), torch.float64)
    s, h, f, y = forecast_batch(rng, cfg, 3, np.float64)
    out = model.forward(s, h, f)
    ds, dh, df = model.backward(quantile_loss_grad(out, y, cfg.quantiles))
    tmods = dict(ref.named_modules())
    n = 0
    for name, mod in model.named_modules():
        if isinstance(mod, Dropout):
            assert mod.mask is not None and 0 < (mod.mask == 0).mean() < 0.5
            tmods[name.removesuffix(".dropout")].mask = torch.tensor(mod.mask)
            n += 1
    assert n > 10
    ts, th, tf = (torch.tensor(a, requires_grad=True) for a in (s, h, f))
    tout = ref(ts, th, tf)
    q = torch.tensor(cfg.quantiles, dtype=torch.float64)
    e = torch.tensor(y).unsqueeze(-1) - tout
    (q * torch.relu(e) + (1 - q) * torch.relu(-e)).mean().backward()
    assert rel_err(out, tout.detach().numpy()) < 1e-9
    for x, tx in ((ds, ts), (dh, th), (df, tf)):
        assert rel_err(x, tx.grad.numpy()) < 1e-9
    tparams = dict(ref.named_parameters())
    for name, g in model.named_grads():
        if name == "multihead_attn.k_proj.bias":
            continue
        tg = tparams[torch_name(name)].grad
        assert rel_err(g, tg.numpy(), 1e-30) < 1e-9, name
