"""torch.optim state dicts into nbqat's optimizers and back, and torch's keyword options.

Oracle: torch 2.13's optimizers (``foreach=False``) run on, before and after the hand-over; a
state dict crosses in NumPy (torch's tensors converted), over two parameters of other shapes
whose flat concatenation is nbqat's buffer.
"""

from __future__ import annotations

import numpy as np
import pytest

import nbqat
from nbqat.optim_torch import to_torch_state_dict

SHAPES = [(3, 5), (7,)]
CASES = [
    ("SGD", dict(lr=0.1, momentum=0.9, weight_decay=0.01)),
    ("SGD", dict(lr=0.1, momentum=0.8, nesterov=True)),
    ("Adam", dict(lr=1e-2, betas=(0.8, 0.99), weight_decay=0.1)),
    ("AdamW", dict(lr=1e-2, weight_decay=0.2)),
]


def _grads(seed, steps):
    rng = np.random.default_rng(seed)
    return [[rng.standard_normal(s).astype(np.float32) for s in SHAPES] for _ in range(steps)]


def _torch_opt(torch, name, kw, values):
    tps = [torch.nn.Parameter(torch.from_numpy(v.copy())) for v in values]
    return tps, getattr(torch.optim, name)(tps, foreach=False, **kw)


def _torch_steps(torch, tps, topt, grads):
    for gs in grads:
        for tp, g in zip(tps, gs):
            tp.grad = torch.from_numpy(g.copy())
        topt.step()


def _nbqat_steps(opt, grads):
    for gs in grads:
        opt.step(np.concatenate([g.ravel() for g in gs]))


def _numpy(obj):
    """torch's state dict with every tensor as a NumPy array."""
    if isinstance(obj, dict):
        return {k: _numpy(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_numpy(v) for v in obj]
    return obj.numpy() if hasattr(obj, "numpy") else obj


def _tensors(torch, obj):
    if isinstance(obj, dict):
        return {k: _tensors(torch, v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_tensors(torch, v) for v in obj]
    return torch.as_tensor(obj) if isinstance(obj, np.ndarray) else obj


def _same(name, flat, tps):
    """nbqat's flat parameters against torch's: the same bits for SGD; for Adam within torch's
    vectorised sqrt where it is SLEEF's (not correctly rounded: the 5e-7 of tests/test_optim.py;
    measured the same bits on the development VM, torch 2.13 CPU)."""
    ref = np.concatenate([tp.detach().numpy().ravel() for tp in tps])
    if name == "SGD":
        np.testing.assert_array_equal(flat, ref)
    else:
        np.testing.assert_allclose(flat, ref, rtol=0, atol=5e-7)


@pytest.mark.parametrize("name,kw", CASES)
def test_a_torch_state_dict_loads_and_the_steps_go_on_as_torchs(torch, name, kw):
    # it was refused ("a torch.optim state_dict ... load one from AdamW.state_dict()")
    rng = np.random.default_rng(0)
    tps, topt = _torch_opt(
        torch, name, kw, [rng.standard_normal(s).astype(np.float32) for s in SHAPES]
    )
    before, after = _grads(1, 3), _grads(2, 3)
    _torch_steps(torch, tps, topt, before)
    p = np.concatenate([tp.detach().numpy().ravel() for tp in tps])
    opt = getattr(nbqat, name)(p, **kw)
    opt.load_state_dict(_numpy(topt.state_dict()))
    assert opt.step_count == (3 if "Adam" in name else 0)  # torch's SGD counts no steps
    _torch_steps(torch, tps, topt, after)
    _nbqat_steps(opt, after)
    _same(name, p, tps)
    st = [topt.state[tp] for tp in tps]
    for k in opt._state_names:  # moments / momentum: torch's bits
        want = np.concatenate([s[k].numpy().ravel() for s in st])
        np.testing.assert_array_equal(opt.state_dict()[k], want, err_msg=k)


@pytest.mark.parametrize("name,kw", CASES)
def test_an_nbqat_state_goes_to_torch_and_its_steps_go_on_as_nbqats(torch, name, kw):
    rng = np.random.default_rng(3)
    p = rng.standard_normal(sum(int(np.prod(s)) for s in SHAPES)).astype(np.float32)
    opt = getattr(nbqat, name)(p, **kw)
    before, after = _grads(4, 3), _grads(5, 3)
    _nbqat_steps(opt, before)
    values = np.split(p.copy(), np.cumsum([int(np.prod(s)) for s in SHAPES])[:-1])
    tps, topt = _torch_opt(torch, name, kw, [v.reshape(s) for v, s in zip(values, SHAPES)])
    topt.load_state_dict(_tensors(torch, to_torch_state_dict(opt, SHAPES)))
    _torch_steps(torch, tps, topt, after)
    _nbqat_steps(opt, after)
    _same(name, p, tps)


@pytest.mark.parametrize(
    "name, option, value",
    [
        ("Adam", "amsgrad", True),
        ("AdamW", "maximize", True),
        ("SGD", "maximize", True),
        ("Adam", "foreach", True),
        ("SGD", "fused", True),
        ("AdamW", "capturable", True),
        ("SGD", "differentiable", True),
        ("Adam", "decoupled_weight_decay", True),
    ],
)
def test_torch_options_nbqat_does_not_implement_are_refused_by_name(name, option, value):
    p = np.zeros(4, np.float32)
    with pytest.raises(ValueError, match=rf"{name}: {option}=True is not"):
        getattr(nbqat, name)(p, lr=0.1, **{option: value})
    # torch's defaults are taken (its foreach=False arithmetic is nbqat's)
    opt = getattr(nbqat, name)(p, lr=0.1, **{option: False if option != "foreach" else None})
    opt.step(np.ones(4, np.float32))
    assert np.all(p < 0)
    with pytest.raises(TypeError, match="unexpected keyword argument 'amsgard'"):
        getattr(nbqat, name)(p, lr=0.1, amsgard=True)


def test_a_torch_state_dict_with_amsgrad_or_other_steps_is_refused_unchanged(torch):
    tps = [torch.nn.Parameter(torch.ones(s)) for s in SHAPES]
    topt = torch.optim.Adam(tps, amsgrad=True)
    _torch_steps(torch, tps, topt, _grads(0, 1))
    p = np.ones(22, np.float32)
    opt = nbqat.Adam(p)
    with pytest.raises(ValueError, match="amsgrad=True is not supported"):
        opt.load_state_dict(_numpy(topt.state_dict()))
    sd = _numpy(torch.optim.Adam(tps).state_dict())
    sd["state"] = {0: {"step": np.float32(2), "exp_avg": np.zeros(SHAPES[0], np.float32)}}
    with pytest.raises(ValueError, match="different steps"):
        opt.load_state_dict(sd)
    assert opt.step_count == 0 and np.all(p == 1)


@pytest.mark.parametrize("name,kw", CASES)
def test_a_float32_torch_state_loads_into_a_float64_optimizer_cast_as_torch_does(torch, name, kw):
    """torch's ``load_state_dict`` casts floating state to its parameters' dtype: a float32
    run's state goes on over float64 parameters; nbqat's float64 optimizer takes the same
    state (it refused 'dtype float32, expected float64') and steps as torch's float64 one."""
    values = [np.random.default_rng(1).standard_normal(s).astype(np.float32) for s in SHAPES]
    tps, topt = _torch_opt(torch, name, kw, values)
    _torch_steps(torch, tps, topt, _grads(2, 3))
    sd = topt.state_dict()
    t64 = [torch.nn.Parameter(tp.detach().double()) for tp in tps]
    o64 = getattr(torch.optim, name)(t64, foreach=False, **kw)
    o64.load_state_dict(sd)
    flat = np.concatenate([tp.detach().numpy().ravel() for tp in t64])
    opt = getattr(nbqat, name)(flat, **kw)
    opt.load_state_dict(_numpy(sd))
    grads = [[g.astype(np.float64) for g in gs] for gs in _grads(3, 2)]
    _torch_steps(torch, t64, o64, grads)
    _nbqat_steps(opt, grads)
    ref = np.concatenate([tp.detach().numpy().ravel() for tp in t64])
    np.testing.assert_allclose(flat, ref, rtol=0, atol=1e-12)


@pytest.mark.parametrize("name", ["Adam", "AdamW"])
def test_torchs_positional_amsgrad_is_taken_as_torch_takes_it(torch, name):
    """``torch.optim.Adam(params, lr, betas, eps, weight_decay, amsgrad)``: amsgrad is torch's
    sixth positional argument (nbqat raised 'takes from 2 to 6 positional arguments'); False
    steps as torch's, True is refused by name."""
    args = (1e-2, (0.8, 0.99), 1e-8, 0.1, False)
    values = [np.random.default_rng(4).standard_normal(s).astype(np.float32) for s in SHAPES]
    tps = [torch.nn.Parameter(torch.from_numpy(v.copy())) for v in values]
    topt = getattr(torch.optim, name)(tps, *args, foreach=False)
    flat = np.concatenate([v.ravel() for v in values])
    opt = getattr(nbqat, name)(flat, *args)
    grads = _grads(5, 3)
    _torch_steps(torch, tps, topt, grads)
    _nbqat_steps(opt, grads)
    _same(name, flat, tps)
    with pytest.raises(ValueError, match="amsgrad=True is not supported"):
        getattr(nbqat, name)(flat, *args[:-1], True)


def test_sgd_has_torchs_default_learning_rate(torch):
    """torch 2.13's ``SGD(params)`` steps with lr 1e-3 (nbqat raised 'missing 1 required
    positional argument: lr')."""
    values = [np.random.default_rng(6).standard_normal(s).astype(np.float32) for s in SHAPES]
    tps = [torch.nn.Parameter(torch.from_numpy(v.copy())) for v in values]
    topt = torch.optim.SGD(tps, foreach=False)
    flat = np.concatenate([v.ravel() for v in values])
    opt = nbqat.SGD(flat)
    grads = _grads(7, 2)
    _torch_steps(torch, tps, topt, grads)
    _nbqat_steps(opt, grads)
    _same("SGD", flat, tps)
    assert opt.defaults["lr"] == topt.defaults["lr"]


def test_a_one_group_torch_state_into_an_optimizer_with_extra_groups_is_refused_unchanged(torch):
    """torch refuses a state dict of another group count ('different number of parameter
    groups'); nbqat's load of torch's one group into an optimizer with an extra group (LSQ's
    scales) loaded it and wiped that group's moments (state None). Now refused, nothing
    changed."""
    from nbqat.optim import ArrayGroup

    values = [np.random.default_rng(8).standard_normal(s).astype(np.float32) for s in SHAPES]
    tps, topt = _torch_opt(torch, "Adam", {"lr": 1e-2}, values)
    _torch_steps(torch, tps, topt, _grads(9, 1))
    sd = topt.state_dict()
    other, _ = _torch_opt(torch, "Adam", {"lr": 1e-2}, values)
    two = torch.optim.Adam(other[:1], lr=1e-2)
    two.add_param_group({"params": other[1:], "lr": 1e-3})
    with pytest.raises(ValueError, match="different number of parameter groups"):
        two.load_state_dict(sd)
    flat = np.concatenate([v.ravel() for v in values])
    extra = [np.ones(2, np.float32)]
    opt = nbqat.Adam(flat, lr=1e-2)
    opt.add_param_group({"params": ArrayGroup(extra, [np.ones(2, np.float32)]), "lr": 1e-3})
    opt.step(np.ones_like(flat))
    before = opt.state_dict()
    with pytest.raises(ValueError, match=r"1 param group\(s\), this optimizer 2"):
        opt.load_state_dict(_numpy(sd))
    after = opt.state_dict()
    assert after["param_groups"][0]["state"] is not None
    np.testing.assert_array_equal(
        after["param_groups"][0]["state"]["exp_avg"], before["param_groups"][0]["state"]["exp_avg"]
    )
    np.testing.assert_array_equal(after["exp_avg"], before["exp_avg"])


def test_torchs_layout_round_trips_through_save_state(torch, tmp_path):
    """torch.optim's layout has int keys (``"state": {0: ...}``); save_state refused them
    ('checkpoint state keys must be str, got 0'). to_torch_state_dict's output now goes
    through save_state / load_state unchanged (int keys back as ints) and torch loads it."""
    from nbqat.npz_state import load_state, save_state

    values = [np.random.default_rng(10).standard_normal(s).astype(np.float32) for s in SHAPES]
    opt = nbqat.Adam(np.concatenate([v.ravel() for v in values]), lr=1e-2)
    _nbqat_steps(opt, _grads(11, 2))
    sd = to_torch_state_dict(opt, SHAPES)
    save_state(tmp_path / "o.npz", sd, format="torch.optim")
    back = load_state(tmp_path / "o.npz", format="torch.optim")
    assert list(back["state"]) == [0, 1] and back["param_groups"] == sd["param_groups"]
    for i in (0, 1):
        for k, v in sd["state"][i].items():
            np.testing.assert_array_equal(back["state"][i][k], v)
    tps, topt = _torch_opt(torch, "Adam", {"lr": 1e-2}, values)
    topt.load_state_dict(_tensors(torch, back))
    assert float(topt.state_dict()["state"][1]["step"]) == 2.0
    with pytest.raises(TypeError, match="str \\(or all int\\), got 0"):
        save_state(tmp_path / "m.npz", {"a": 1, 0: 2}, format="x")
