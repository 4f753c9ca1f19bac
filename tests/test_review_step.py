"""train_step refuses a batch holding NaN / Inf before any state changes (found in review: one
NaN window silently turned every parameter into NaN, loss and norm NaN, exit 0)."""

from __future__ import annotations

import numpy as np
import pytest
from ref_nn import forecast_batch

import nbqat
from nbqat.nn import LSTMForecaster, LSTMForecasterConfig, prepare_qat, train_step

CFG = LSTMForecasterConfig(2, 3, 4, 8, 6, 3)


def _batch(rng, nb=4):
    return forecast_batch(rng, CFG, nb)


@pytest.mark.parametrize("which, bad", [(1, np.nan), (3, np.inf), (0, -np.inf)])
@pytest.mark.parametrize("prepared", [False, True])
def test_nonfinite_batch_is_refused_and_nothing_changes(rng, which, bad, prepared):
    model = LSTMForecaster(CFG, seed=0)
    if prepared:
        model = prepare_qat(model, config=nbqat.QATConfig(calibration_batches=1))
        model(*_batch(rng)[:3])
        model.disable_calibration()
    opt = nbqat.Adam(model.params, lr=1e-2)
    train_step(model, _batch(rng), opt)  # one good step: Adam has state
    p0, s0 = model.params.copy(), opt.state_dict()
    batch = list(_batch(rng))
    batch[which] = batch[which].copy()
    batch[which].flat[1] = bad
    name = ("static", "historical", "future", "target")[which]
    with pytest.raises(ValueError, match=f"batch {name} holds 1 NaN/Inf"):
        train_step(model, tuple(batch), opt)
    assert np.array_equal(model.params, p0)
    s1 = opt.state_dict()
    assert s1.keys() == s0.keys() and all(np.array_equal(s1[k], s0[k]) for k in s0)
    loss, norm = train_step(model, _batch(rng), opt)  # still trains
    assert np.isfinite(loss) and np.isfinite(norm) and np.isfinite(model.params).all()


def test_lstm_forecaster_checks_its_config_and_input_shapes():
    """A history of the wrong length ran silently (the LSTM accepts any length; the export and
    the forecasts assume sequence_length); hidden_dim=0 was a ZeroDivisionError, unsorted
    quantiles were accepted."""
    with pytest.raises(ValueError, match="hidden_dim must be a positive int"):
        LSTMForecasterConfig(2, 3, 4, 0, 6, 3)
    with pytest.raises(ValueError, match="quantiles must be strictly increasing"):
        LSTMForecasterConfig(2, 3, 4, 8, 6, 3, quantiles=(0.9, 0.1))
    model = LSTMForecaster(CFG, seed=0)
    s, h, f, _ = _batch(np.random.default_rng(0))
    with pytest.raises(ValueError, match=r"historical must have shape \(B, 6, 4\)"):
        model(s, h[:, :5], f)
    with pytest.raises(ValueError, match=r"future must have shape \(B, 3, 3\)"):
        model(s, h, f[:, :, :2])
    with pytest.raises(ValueError, match="share the batch size"):
        model(s[:3], h, f)
    assert model(s, h, f).shape == (4, 3, 3)


@pytest.mark.parametrize("grouped", [False, True])
def test_an_optimizer_refusing_the_step_is_asked_before_the_forward_pass(rng, grouped):
    # opt.lr = inf (a schedule) or read-only parameters: the optimizer refused the update
    # only after the forward pass, whose observers had already taken in the batch (a
    # half-applied step: the observers moved, the parameters and step count did not)
    from nbqat.train.recipe import AveragedOptimizer, GroupedAdamW

    model = prepare_qat(LSTMForecaster(CFG, seed=0), config=nbqat.QATConfig(calibration_batches=1))
    model(*_batch(rng)[:3])
    model.disable_calibration()
    n = model.params.size
    opt = (
        AveragedOptimizer(GroupedAdamW(model.params, lr=1e-2, offset=n - 3), 0.9)
        if grouped
        else nbqat.Adam(model.params, lr=1e-2)
    )
    train_step(model, _batch(rng), opt)

    def observers():
        return [np.array(v) for fq in model.fake_quants.values() for v in fq.state_dict().values()]

    for spoil, match in (
        (lambda: setattr(opt, "lr", float("inf")), "learning rate"),
        (lambda: setattr(model.params.flags, "writeable", False), "read-only"),
    ):
        before, p0 = observers(), model.params.copy()
        spoil()
        with pytest.raises(ValueError, match=match):
            train_step(model, _batch(rng), opt)
        assert all(np.array_equal(a, b) for a, b in zip(before, observers()))
        assert np.array_equal(model.params, p0) and model.step == 1
        opt.lr, model.params.flags.writeable = 1e-2, True


@pytest.mark.parametrize("bad", [np.inf, np.nan, None])
@pytest.mark.parametrize("max_norm", [np.inf, 0.5, None])
def test_max_norm_inf_clips_a_nonfinite_gradient_as_torch_does(torch, rng, bad, max_norm):
    """train_step(max_norm=inf) skipped clipping, so an Inf gradient reached the update as it
    was (SGD: that one parameter -inf, the others updated), where torch's
    clip_grad_norm_(max_norm=inf) gives every gradient the coefficient inf / inf = NaN (NaN
    parameters). Oracle: torch's clip_grad_norm_ and SGD step on the same gradients (None:
    no clip_grad_norm_ call, as a torch loop without clipping); NaN where torch has NaN, the
    rest within the total norm's float32 summation order."""
    model = LSTMForecaster(CFG, seed=0)
    opt = nbqat.SGD(model.params, lr=0.1)
    p0 = model.params.copy()
    seen = {}

    def spoil(grads):
        if bad is not None:
            grads[0][5] = bad
        seen["g"] = grads[0].copy()

    _, total = train_step(model, _batch(rng), opt, max_norm=max_norm, grad_hook=spoil)
    p = torch.tensor(p0, requires_grad=True)
    p.grad = torch.tensor(seen["g"])
    if max_norm is not None:
        want = torch.nn.utils.clip_grad_norm_([p], max_norm)
        np.testing.assert_allclose(total, want.item(), rtol=1e-6)  # the sum's order
    torch.optim.SGD([p], lr=0.1).step()
    np.testing.assert_allclose(model.params, p.detach().numpy(), rtol=1e-6, atol=1e-7)
