"""LSQ scales / zero points as a parameter group of the weights' optimizer (torch's
``param_groups``), and the optimizer's parameter groups themselves.

Oracles: ``torch.optim.Adam`` / ``SGD`` with two parameter groups (the same update rule,
per-group hyper-parameters), and the LSQ vector update computed by torch's optimizer from the
gathered scale gradients.
"""

from __future__ import annotations

import numpy as np
import pytest
from ref_nn import forecast_batch

import nbqat
from nbqat.nn import LSTMForecaster, LSTMForecasterConfig, prepare_qat
from nbqat.optim import ArrayGroup

CFG = LSTMForecasterConfig(2, 3, 4, 6, 5, 3)  # m_s, m_x, m_z, d, k, tau


def _batch(rng, nb=6):
    return forecast_batch(rng, CFG, nb)


def _lsq_qat(rng, seed=3):
    cfg = nbqat.QATConfig(calibration_batches=2, learnable_scales=True)
    qat = prepare_qat(LSTMForecaster(CFG, seed=seed), config=cfg)
    for _ in range(2):
        qat(*_batch(rng)[:3])
    qat.disable_calibration()
    return qat


@pytest.mark.parametrize("kind", ["adam", "sgd"])
def test_two_groups_match_torch(torch, rng, kind):
    p0 = rng.standard_normal(7).astype(np.float32)
    a0 = rng.standard_normal(5).astype(np.float32)
    p, a = p0.copy(), a0.copy()
    gp = np.zeros_like(p)
    ga = np.zeros_like(a)
    tp = torch.tensor(p0.copy(), requires_grad=True)
    ta = torch.tensor(a0.copy(), requires_grad=True)
    if kind == "adam":
        opt = nbqat.Adam(p, lr=1e-2)
        topt = torch.optim.Adam([{"params": [tp]}, {"params": [ta], "lr": 3e-3}], lr=1e-2)
    else:
        opt = nbqat.SGD(p, lr=0.1, momentum=0.9)
        topt = torch.optim.SGD(
            [{"params": [tp]}, {"params": [ta], "lr": 0.05}], lr=0.1, momentum=0.9
        )
    opt.add_param_group({"params": ArrayGroup([a], [ga]), "lr": topt.param_groups[1]["lr"]})
    assert opt.param_groups[1]["lr"] == topt.param_groups[1]["lr"]
    for _ in range(3):
        gp[...] = rng.standard_normal(7).astype(np.float32)
        ga[...] = rng.standard_normal(5).astype(np.float32)
        tp.grad, ta.grad = torch.tensor(gp.copy()), torch.tensor(ga.copy())
        opt.step(gp)
        topt.step()
    # Adam: torch's vectorised sqrt may differ in the last bit (see nbqat.Adam's Notes)
    np.testing.assert_allclose(p, tp.detach().numpy(), rtol=2e-6, atol=1e-7)
    np.testing.assert_allclose(a, ta.detach().numpy(), rtol=2e-6, atol=1e-7)


def test_group_state_roundtrip_and_errors(rng):
    def make(seed_vals):
        p, a = seed_vals[0].copy(), seed_vals[1].copy()
        g = np.zeros_like(a)
        opt = nbqat.AdamW(p, lr=1e-2)
        opt.add_param_group({"params": ArrayGroup([a], [g]), "lr": 1e-3, "weight_decay": 0.0})
        return opt, p, a, g

    vals = (rng.standard_normal(4).astype(np.float32), rng.standard_normal(3).astype(np.float32))
    opt, p, a, g = make(vals)
    for _ in range(2):
        g[...] = rng.standard_normal(3).astype(np.float32)
        opt.step(rng.standard_normal(4).astype(np.float32))
    st = opt.state_dict()
    opt2, p2, a2, g2 = make((p, a))
    opt2.load_state_dict(st)
    gw = rng.standard_normal(4).astype(np.float32)
    g[...] = g2[...] = rng.standard_normal(3).astype(np.float32)
    opt.step(gw)
    opt2.step(gw)
    assert np.array_equal(p, p2) and np.array_equal(a, a2)  # the next step, bit for bit
    bare = nbqat.AdamW(p.copy(), lr=1e-2)
    with pytest.raises(ValueError, match="add the same groups"):
        bare.load_state_dict(st)
    with pytest.raises(ValueError, match="unknown hyper-parameters"):
        bare.add_param_group({"params": ArrayGroup([a], [g]), "momentum": 0.9})
    with pytest.raises(TypeError, match="ParamSource"):
        bare.add_param_group({"params": [a]})
    with pytest.raises(ValueError, match="in a group already"):
        opt.add_param_group({"params": opt.param_groups[1]["params"]})


def test_lsq_scales_follow_the_optimizer_rule(torch, rng):
    """One train_step: the weights and the LSQ vector both get torch's Adam update (with the
    same clipping coefficient); no hidden SGD step."""
    qat = _lsq_qat(rng)
    src = qat.quantizer_parameters()
    s0, _ = src.gather()
    opt = nbqat.Adam(qat.params, lr=1e-3)
    opt.add_param_group(qat.quantizer_param_group(lr=1e-4))
    batch = _batch(rng)
    _, total = qat.train_step(batch, opt, max_norm=0.05)
    s1, g = src.gather()  # the gradients stay in the quantizers after the step
    coef = min(0.05 / (total + 1e-6), 1.0)
    assert coef < 1.0  # the clipping coefficient is folded into the scales' update too
    t = torch.tensor(s0.copy(), requires_grad=True)
    t.grad = torch.tensor((g * np.float32(coef)).astype(np.float32))
    torch.optim.Adam([t], lr=1e-4).step()
    want = t.detach().numpy().copy()
    n = 0
    for fq in qat.learnable_quantizers():  # the scales are clamped to >= eps after the update
        want[n : n + fq.scale.size] = np.maximum(want[n : n + fq.scale.size], fq.eps)
        n += 2 * fq.scale.size
    np.testing.assert_allclose(s1, want, rtol=2e-6, atol=1e-9)
    assert np.any(s1 != s0)


def test_lsq_group_is_added_once_and_frozen_quantizers_keep_their_scales(rng):
    qat = _lsq_qat(rng)
    opt = nbqat.Adam(qat.params, lr=1e-3)
    qat.train_step(_batch(rng), opt)  # no group: added with the optimizer's hyper-parameters
    assert len(opt.param_groups) == 2 and opt.param_groups[1]["lr"] == 1e-3
    assert opt.param_groups[1]["params"] is qat.quantizer_parameters()
    qat.train_step(_batch(rng), opt)
    assert len(opt.param_groups) == 2
    qat.freeze_observers()
    before = [fq.scale.copy() for fq in qat.learnable_quantizers()]
    p0 = qat.params.copy()
    qat.train_step(_batch(rng), opt)
    assert not np.array_equal(p0, qat.params)  # the weights still move
    for b, fq in zip(before, qat.learnable_quantizers()):
        assert np.array_equal(b, fq.scale)


def test_plain_fake_quantize_adds_no_group(rng):
    qat = prepare_qat(LSTMForecaster(CFG, seed=1), config=nbqat.QATConfig(calibration_batches=1))
    qat(*_batch(rng)[:3])
    opt = nbqat.Adam(qat.params, lr=1e-3)
    qat.train_step(_batch(rng), opt)
    assert len(opt.param_groups) == 1 and "param_groups" not in opt.state_dict()


def test_a_host_group_beside_a_cuda_buffer(cuda_sim, small_cuda_blocks, rng):
    """A CUDA weight buffer (simulator) with a host group (e.g. the LSQ scales): the group is
    updated on the host with the same rule, bit for bit as an all-host optimizer's group."""
    p0 = rng.standard_normal(9).astype(np.float32)
    a_host, a_dev = (rng.standard_normal(4).astype(np.float32) for _ in range(2))
    a_dev[...] = a_host
    a0 = a_host.copy()
    g = np.zeros(4, np.float32)
    host = nbqat.Adam(p0.copy(), lr=1e-2)
    dev = nbqat.Adam(cuda_sim.to_device(p0), lr=1e-2)
    host.add_param_group({"params": ArrayGroup([a_host], [g]), "lr": 1e-3})
    dev.add_param_group({"params": ArrayGroup([a_dev], [g]), "lr": 1e-3})
    for _ in range(2):
        gw = rng.standard_normal(9).astype(np.float32)
        g[...] = rng.standard_normal(4).astype(np.float32)
        host.step(gw, grad_scale=0.5)
        dev.step(cuda_sim.to_device(gw), grad_scale=0.5)
    assert np.array_equal(a_host, a_dev) and not np.array_equal(a_host, a0)
    assert dev.state_dict()["param_groups"][0]["state"]["step"] == 2


def test_an_edited_group_learning_rate_applies_at_the_next_step(torch, rng):
    """torch's habit (a schedule edits param_groups[i]["lr"]): the extra group's dict is live;
    a bad value is refused at the next step before anything changes."""
    a0 = rng.standard_normal(4).astype(np.float32)
    a, g = a0.copy(), np.zeros(4, np.float32)
    p = np.zeros(3, np.float32)
    opt = nbqat.SGD(p, lr=0.1)
    opt.add_param_group({"params": ArrayGroup([a], [g]), "lr": 0.5})
    ta = torch.tensor(a0.copy(), requires_grad=True)
    topt = torch.optim.SGD(
        [{"params": [torch.zeros(3, requires_grad=True)]}, {"params": [ta]}], lr=0.1
    )
    topt.param_groups[1]["lr"] = 0.5
    for lr in (0.5, 0.01):
        opt.param_groups[1]["lr"] = lr
        topt.param_groups[1]["lr"] = lr
        g[...] = rng.standard_normal(4).astype(np.float32)
        ta.grad = torch.tensor(g.copy())
        opt.step(np.ones(3, np.float32))
        topt.param_groups[0]["params"][0].grad = torch.ones(3)
        topt.step()
    np.testing.assert_allclose(a, ta.detach().numpy(), rtol=1e-6)  # torch's sqrt: 1 ulp
    opt.param_groups[1]["lr"] = -1.0
    before = (p.copy(), a.copy())
    with pytest.raises(ValueError, match="learning rate"):
        opt.step(np.ones(3, np.float32))
    assert np.array_equal(p, before[0]) and np.array_equal(a, before[1])


def test_a_parameter_in_two_groups_is_refused_as_torch_does(torch, rng):
    # torch.optim raises for a parameter in two groups; nbqat updated such an array twice
    # per step (once from each group). Nothing is added when it refuses.
    p = rng.standard_normal(6).astype(np.float32)
    a = rng.standard_normal(3).astype(np.float32)
    t = torch.tensor(a.copy(), requires_grad=True)
    topt = torch.optim.Adam([torch.tensor(p.copy(), requires_grad=True)], lr=1e-2)
    topt.add_param_group({"params": [t]})
    with pytest.raises(ValueError, match="more than one parameter group"):
        topt.add_param_group({"params": [t]})
    opt = nbqat.Adam(p, lr=1e-2)
    opt.add_param_group({"params": ArrayGroup([a], [np.zeros_like(a)])})
    for other in (a, a[1:], p[2:4]):  # the same array, a view of it, a view of group 0
        with pytest.raises(ValueError, match="more than one parameter group"):
            opt.add_param_group({"params": ArrayGroup([other], [np.zeros_like(other)])})
    assert len(opt.param_groups) == 2
    qat = _lsq_qat(rng)
    opt = nbqat.Adam(qat.params, lr=1e-3)
    scale = qat.learnable_quantizers()[0].scale
    opt.add_param_group({"params": ArrayGroup([scale], [np.zeros_like(scale)])})
    with pytest.raises(ValueError, match="more than one parameter group"):
        opt.add_param_group(qat.quantizer_param_group())
    # disjoint arrays are accepted, and the same update as torch's follows
    b = rng.standard_normal(2).astype(np.float32)
    gb = rng.standard_normal(2).astype(np.float32)
    opt = nbqat.Adam(p, lr=1e-2)
    opt.add_param_group({"params": ArrayGroup([b], [gb]), "lr": 1e-1})
    tb = torch.tensor(b.copy(), requires_grad=True)
    tb.grad = torch.tensor(gb)
    torch.optim.Adam([tb], lr=1e-1).step()
    opt.step(np.zeros_like(p))
    np.testing.assert_allclose(b, tb.detach().numpy(), rtol=1e-6)  # torch's sqrt: 1 ulp


@pytest.mark.parametrize("kind", ["adam", "sgd"])
def test_a_new_group_takes_the_constructor_defaults_as_torch(torch, rng, kind):
    # After a schedule changed group 0's learning rate, torch's add_param_group fills in the
    # constructor's values (optimizer.defaults); nbqat took group 0's current lr (0.01).
    p = rng.standard_normal(4).astype(np.float32)
    a = rng.standard_normal(3).astype(np.float32)
    ga = rng.standard_normal(3).astype(np.float32)
    tp, ta = (torch.tensor(x.copy(), requires_grad=True) for x in (p, a))
    if kind == "adam":
        opt, topt = nbqat.Adam(p, lr=0.1), torch.optim.Adam([tp], lr=0.1, foreach=False)
    else:
        opt = nbqat.SGD(p, lr=0.1, momentum=0.9)
        topt = torch.optim.SGD([tp], lr=0.1, momentum=0.9, foreach=False)
    opt.lr = topt.param_groups[0]["lr"] = 0.01
    opt.add_param_group({"params": ArrayGroup([a], [ga])})
    topt.add_param_group({"params": [ta]})
    assert opt.param_groups[1]["lr"] == topt.param_groups[1]["lr"] == 0.1
    for _ in range(2):
        tp.grad, ta.grad = torch.zeros(4), torch.tensor(ga.copy())
        topt.step()
        opt.step(np.zeros_like(p))
    np.testing.assert_allclose(a, ta.detach().numpy(), rtol=1e-6)  # torch's sqrt: 1 ulp


def test_a_read_only_group_array_is_refused_before_any_update(rng):
    # the read-only array failed in scatter after the flat buffer had been updated and the
    # step counted (a half-applied step); now refused at ArrayGroup and before the step
    p, g = np.ones(4, np.float32), np.full(4, 0.5, np.float32)
    q, gq = np.ones(3, np.float32), np.full(3, 0.5, np.float32)
    frozen = q.copy()
    frozen.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        ArrayGroup([frozen], [gq])
    opt = nbqat.SGD(p, lr=0.1, momentum=0.9)
    opt.add_param_group({"params": ArrayGroup([q], [gq])})
    q.flags.writeable = False  # made read-only after the group was added
    with pytest.raises(ValueError, match="read-only"):
        opt.step(g)
    np.testing.assert_array_equal(p, 1.0)
    assert opt.step_count == 0 and "momentum_buffer" not in opt.state_dict()


def test_a_parameter_listed_twice_in_one_group_is_refused():
    # ArrayGroup([x[:4], x[2:]], ...) was accepted: gather copied both views, the step updated
    # each copy, and scatter wrote the second over the first, so x[2:4] moved once where torch
    # moves a listed-twice parameter twice (0.9 everywhere, torch 0.8 there)
    x = np.ones(6, np.float32)
    g = np.ones(4, np.float32)
    for params in ([x[:4], x[2:]], [x, np.zeros(2, np.float32), x]):
        with pytest.raises(ValueError, match=r"params\[0\] and params\[(1|2)\] share memory"):
            ArrayGroup(params, [g if p.size == 4 else np.zeros_like(p) for p in params])
    ArrayGroup([x[:3], x[3:]], [g[:3], g[:3]])  # adjacent views are disjoint


def test_every_group_learning_rate_set_through_param_groups_applies(torch, rng):
    # torch's schedule idiom, for g in opt.param_groups: g["lr"] = lr, changed the extra
    # groups but not group 0 (its dict was a copy): the flat buffer kept the old rate
    p0, a0 = rng.standard_normal(5).astype(np.float32), rng.standard_normal(3).astype(np.float32)
    p, a, ga = p0.copy(), a0.copy(), np.zeros(3, np.float32)
    opt = nbqat.SGD(p, lr=0.1, momentum=0.9)
    opt.add_param_group({"params": ArrayGroup([a], [ga])})
    tp, ta = (torch.tensor(x.copy(), requires_grad=True) for x in (p0, a0))
    topt = torch.optim.SGD([{"params": [tp]}, {"params": [ta]}], lr=0.1, momentum=0.9)
    for lr in (0.1, 0.02, 0.0):
        for groups in (opt.param_groups, topt.param_groups):
            for grp in groups:
                grp["lr"] = lr
        g = rng.standard_normal(5).astype(np.float32)
        ga[...] = rng.standard_normal(3).astype(np.float32)
        tp.grad, ta.grad = torch.tensor(g.copy()), torch.tensor(ga.copy())
        opt.step(g)
        topt.step()
        assert opt.lr == opt.param_groups[0]["lr"] == lr
    assert np.array_equal(p, tp.detach().numpy()) and np.array_equal(a, ta.detach().numpy())
    opt.param_groups[0].update(momentum=0.5)
    assert opt.momentum == 0.5
    with pytest.raises(KeyError, match="cannot be set"):
        opt.param_groups[0]["params"] = np.zeros(5, np.float32)


def test_an_unknown_key_set_in_a_group_is_named_at_the_step():
    # param_groups[1]["initial_lr"] = 0.1 (a torch scheduler's key) failed at the step with
    # "SGD._validate() got an unexpected keyword argument 'initial_lr'"
    p, a = np.ones(3, np.float32), np.ones(2, np.float32)
    opt = nbqat.SGD(p, lr=0.1)
    opt.add_param_group({"params": ArrayGroup([a], [np.ones(2, np.float32)])})
    opt.param_groups[1]["initial_lr"] = 0.1
    with pytest.raises(ValueError, match=r"param_groups\[1\] has unknown .*'initial_lr'"):
        opt.step(np.ones(3, np.float32))
    assert (p == 1).all() and (a == 1).all() and opt.step_count == 0
    del opt.param_groups[1]["initial_lr"]
    opt.step(np.ones(3, np.float32))
    assert (a < 1).all()
