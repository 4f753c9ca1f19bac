"""Fused optimizers against torch.optim (single-tensor, foreach=False) and a NumPy reference."""

from __future__ import annotations

import numba
import numpy as np
import pytest
from ref_clip import adam_ref, sgd_ref

import nbqat
from nbqat import clip as C

N = 1037  # vector body and a scalar tail


def run_pair(torch, name, kw, steps=5, dtype=np.float32, grad_scale=1.0, seed=0):
    rng = np.random.default_rng(seed)
    p0 = rng.standard_normal(N).astype(dtype)
    grads = [rng.standard_normal(N).astype(dtype) for _ in range(steps)]
    p = p0.copy()
    opt = getattr(nbqat, name)(p, **kw)
    tp = torch.nn.Parameter(torch.from_numpy(p0.copy()))
    topt = getattr(torch.optim, name)([tp], foreach=False, **kw)
    for g in grads:
        g_in = g.copy()
        opt.step(g_in, grad_scale=grad_scale)
        assert np.array_equal(g_in, g)  # gradients are read, never written
        tg = torch.from_numpy(g.copy())
        if grad_scale != 1.0:  # torch: clip_grads_with_norm_ multiplies first
            tg.mul_(torch.tensor(grad_scale, dtype=tg.dtype))
        tp.grad = tg
        topt.step()
    return p, tp.detach().numpy(), opt, topt.state[tp]


SGD_CASES = [
    dict(lr=0.1),
    dict(lr=0.1, momentum=0.9),
    dict(lr=0.05, momentum=0.9, dampening=0.3, weight_decay=0.01),
    dict(lr=0.1, momentum=0.8, nesterov=True, weight_decay=0.1),
]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("kw", SGD_CASES)
def test_sgd_bit_exact_with_torch(torch, kw, dtype):
    p, tp, opt, st = run_pair(torch, "SGD", kw, dtype=dtype)
    assert np.array_equal(p, tp)
    if kw.get("momentum"):
        assert np.array_equal(opt.state_dict()["momentum_buffer"], st["momentum_buffer"].numpy())


def test_sgd_grad_scale_equals_clip_then_step(torch):
    p, tp, _, _ = run_pair(torch, "SGD", SGD_CASES[3], grad_scale=float(np.float32(0.37)))
    assert np.array_equal(p, tp)


ADAM_CASES = [
    ("Adam", dict(lr=1e-2)),
    ("Adam", dict(lr=1e-2, betas=(0.4, 0.99), weight_decay=0.1)),
    ("AdamW", dict(lr=1e-2)),
    ("AdamW", dict(lr=3e-3, betas=(0.8, 0.95), eps=1e-6, weight_decay=0.2)),
]


@pytest.mark.parametrize("name,kw", ADAM_CASES)
@pytest.mark.parametrize("grad_scale", [1.0, 0.3])
def test_adam_matches_torch(torch, name, kw, grad_scale):
    gs = float(np.float32(grad_scale))
    p, tp, opt, st = run_pair(torch, name, kw, grad_scale=gs)
    # torch's vectorised sqrt is not correctly rounded (SLEEF): params may differ in the last
    # bits of an update; measured <= 2.4e-7 absolute after 5 steps on N(0, 1) parameters
    np.testing.assert_allclose(p, tp, rtol=0, atol=5e-7)
    if not (name == "Adam" and kw.get("weight_decay")):  # moments do not depend on params
        sd = opt.state_dict()
        assert np.array_equal(sd["exp_avg"], st["exp_avg"].numpy())
        assert np.array_equal(sd["exp_avg_sq"], st["exp_avg_sq"].numpy())


def test_adam_float64_matches_torch(torch):
    p, tp, _, _ = run_pair(torch, "AdamW", dict(lr=1e-2), dtype=np.float64)
    np.testing.assert_allclose(p, tp, rtol=0, atol=1e-15)


@pytest.mark.parametrize("name,kw", ADAM_CASES)
def test_adam_bit_exact_with_numpy_reference(name, kw):
    rng = np.random.default_rng(1)
    p = rng.standard_normal(N).astype(np.float32)
    rp, m, v = p.copy(), np.zeros(N, np.float32), np.zeros(N, np.float32)
    opt = getattr(nbqat, name)(p, **kw)
    for step in range(1, 6):
        g = rng.standard_normal(N).astype(np.float32)
        opt.step(g, grad_scale=0.5)
        full = {"weight_decay": 1e-2 if name == "AdamW" else 0.0, **kw}  # class defaults
        rp, m, v = adam_ref(rp, g, m, v, step, decoupled=name == "AdamW", grad_scale=0.5, **full)
    assert np.array_equal(p, rp)
    assert np.array_equal(opt.state_dict()["exp_avg"], m)


@pytest.mark.parametrize("kw", SGD_CASES)
def test_sgd_bit_exact_with_numpy_reference(kw):
    rng = np.random.default_rng(2)
    p = rng.standard_normal(N).astype(np.float32)
    rp, buf = p.copy(), None
    opt = nbqat.SGD(p, **kw)
    for _ in range(4):
        g = rng.standard_normal(N).astype(np.float32)
        opt.step(g, grad_scale=2.0)
        rp, buf = sgd_ref(rp, g, buf, grad_scale=2.0, **kw)
    assert np.array_equal(p, rp)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_clip_folded_into_step_equals_clip_then_step(rng, dtype):
    """The documented fold (nbqat.optim's docstring): the coefficient in the gradients' dtype
    (clip_coef's float32 default gave other bits on float64 buffers)."""
    p0 = rng.standard_normal(300).astype(dtype)
    g = (rng.standard_normal(300) * 10).astype(dtype)
    a, b = p0.copy(), p0.copy()
    oa, ob = nbqat.AdamW(a, lr=1e-2), nbqat.AdamW(b, lr=1e-2)
    total = nbqat.get_total_norm(g)
    oa.step(g, grad_scale=C.clip_coef(total, 1.0, g.dtype))
    gc = g.copy()
    assert nbqat.clip_grad_norm_(gc, 1.0) == total
    ob.step(gc)
    assert np.array_equal(a, b)


def test_deterministic_thread_counts(rng, force_parallel):
    p0 = rng.standard_normal(5000).astype(np.float32)
    g = rng.standard_normal(5000).astype(np.float32)
    outs = []
    old = numba.get_num_threads()
    try:
        for nt in (1, 2):
            numba.set_num_threads(min(nt, numba.config.NUMBA_NUM_THREADS))
            p = p0.copy()
            opt = nbqat.Adam(p, lr=1e-2, weight_decay=0.1)
            opt.step(g)
            opt.step(g)
            outs.append(p)
    finally:
        numba.set_num_threads(old)
    assert np.array_equal(outs[0], outs[1])


def test_state_dict_round_trip_reproduces_next_step(rng):
    p0 = rng.standard_normal(64).astype(np.float32)
    gs = [rng.standard_normal(64).astype(np.float32) for _ in range(3)]
    for cls, kw in [(nbqat.AdamW, {}), (nbqat.SGD, dict(lr=0.1, momentum=0.9))]:
        a = p0.copy()
        oa = cls(a, **kw) if kw else cls(a)
        oa.step(gs[0])
        oa.step(gs[1])
        sd = oa.state_dict()
        b = a.copy()
        ob = cls(b, **kw) if kw else cls(b)
        ob.load_state_dict(sd)
        assert ob.step_count == 2
        oa.step(gs[2])
        ob.step(gs[2])
        assert np.array_equal(a, b)
        sd["step"] = 99  # the returned dict is a copy
        assert oa.state_dict()["step"] == 3


def test_zero_state(rng):
    p = rng.standard_normal(10).astype(np.float32)
    q = p.copy()
    g = rng.standard_normal(10).astype(np.float32)
    opt = nbqat.Adam(p)
    opt.step(g)
    opt.zero_state()
    assert opt.step_count == 0 and "exp_avg" not in opt.state_dict()
    p[:] = q
    opt.step(g)
    fresh = nbqat.Adam(q)
    fresh.step(g)
    assert np.array_equal(p, q)


def test_validation(rng):
    p = np.zeros(8, np.float32)
    with pytest.raises(TypeError, match="float32 and float64"):
        nbqat.SGD(np.zeros(8, np.float16), lr=0.1)
    with pytest.raises(TypeError, match="flat NumPy or CUDA"):
        nbqat.Adam([0.0, 1.0])
    with pytest.raises(ValueError, match="1-D"):
        nbqat.Adam(np.zeros((2, 4), np.float32))
    with pytest.raises(ValueError, match="contiguous"):
        nbqat.Adam(np.zeros(16, np.float32)[::2])
    with pytest.raises(ValueError, match="learning rate"):
        nbqat.SGD(p, lr=-1.0)
    with pytest.raises(ValueError, match="Nesterov"):
        nbqat.SGD(p, lr=0.1, nesterov=True)
    with pytest.raises(ValueError, match="beta parameter at index 1"):
        nbqat.AdamW(p, betas=(0.9, 1.0))
    with pytest.raises(ValueError, match="epsilon"):
        nbqat.Adam(p, eps=-1.0)
    opt = nbqat.AdamW(p)
    with pytest.raises(ValueError, match="grads must match"):
        opt.step(np.zeros(7, np.float32))
    with pytest.raises(ValueError, match="grads must match"):
        opt.step(np.zeros(8, np.float64))
    with pytest.raises(TypeError, match="same device"):
        opt.step([0.0] * 8)
    # hyper-parameters and the gradient factor: numbers, finite (torch takes an infinite rate,
    # whose first step writes Inf / NaN), not strings or bools; nothing changes on refusal
    for ctor, exc, match in (
        (lambda: nbqat.SGD(p, lr="0.1"), TypeError, "learning rate must be a float, got str"),
        (lambda: nbqat.Adam(p, lr=True), TypeError, "learning rate must be a float, got bool"),
        (lambda: nbqat.Adam(p, lr=float("inf")), ValueError, "learning rate"),
        (lambda: nbqat.AdamW(p, weight_decay=float("inf")), ValueError, "weight_decay"),
        (lambda: nbqat.SGD(p, lr=0.1, dampening=-float("inf")), ValueError, "dampening"),
    ):
        with pytest.raises(exc, match=match):
            ctor()
    g = np.full(8, 0.5, np.float32)
    for gs, exc in (("2", TypeError), (True, TypeError), (-1.0, ValueError), (np.inf, ValueError)):
        with pytest.raises(exc, match="grad_scale"):
            opt.step(g, grad_scale=gs)
    np.testing.assert_array_equal(p, 0.0)
    assert opt.step_count == 0 and not opt.state_dict().keys() - {
        "type",
        "step",
        "lr",
        "betas",
        "eps",
        "weight_decay",
    }
    sd = opt.state_dict()
    sd["exp_avg"] = np.zeros(3, np.float32)
    with pytest.raises(ValueError, match="exp_avg"):
        opt.load_state_dict(sd)
    with pytest.raises(ValueError, match="not AdamW"):
        opt.load_state_dict(nbqat.SGD(p, lr=0.1).state_dict())
    bad = nbqat.AdamW(p).state_dict()
    bad["betas"] = (2.0, 0.5)
    with pytest.raises(ValueError, match="beta"):
        opt.load_state_dict(bad)
    assert opt.betas == (0.9, 0.999)


def test_load_state_dict_converts_like_the_constructor(torch, rng):
    # a float32 lr from a state dict was kept as np.float32, so lr / bias_correction1 ran in
    # float32: a resumed float64 run left torch's (and the uninterrupted run's) bits
    lr = np.float32(3e-3)
    p0 = rng.standard_normal(N)
    grads = [rng.standard_normal(N) for _ in range(3)]
    p = p0.copy()
    opt = nbqat.AdamW(p, lr=1.0)
    opt.load_state_dict({**nbqat.AdamW(p0.copy(), lr=lr).state_dict(), "lr": lr})
    assert type(opt.lr) is float and type(opt.state_dict()["lr"]) is float
    tp = torch.nn.Parameter(torch.from_numpy(p0.copy()))
    topt = torch.optim.AdamW([tp], lr=float(lr), foreach=False)
    for g in grads:
        opt.step(g.copy())
        tp.grad = torch.from_numpy(g.copy())
        topt.step()
    np.testing.assert_allclose(p, tp.detach().numpy(), rtol=0, atol=1e-15)
    for step in (2.7, "3", True):  # 2.7 was truncated to 2, "3" and True taken as steps
        with pytest.raises(ValueError, match="step"):
            opt.load_state_dict({**opt.state_dict(), "step": step})
    assert opt.step_count == 3


def test_params_made_read_only_after_construction_are_refused_at_step():
    # a Numba TypingError from inside the kernel, after SGD had created its momentum buffer
    # (the next step then took the not-first-step branch: (1 - dampening) * g, not g)
    p = np.ones(4, np.float32)
    opt = nbqat.SGD(p, lr=0.1, momentum=0.9, dampening=0.5)
    p.flags.writeable = False
    with pytest.raises(ValueError, match="params is read-only"):
        opt.step(np.full(4, 0.5, np.float32))
    assert opt.step_count == 0 and "momentum_buffer" not in opt.state_dict()
    p.flags.writeable = True
    opt.step(np.full(4, 0.5, np.float32))
    np.testing.assert_array_equal(p, np.float32(1) - np.float32(0.1) * np.float32(0.5))


@pytest.mark.parametrize(
    ("name", "attr", "value", "exc", "match"),
    [
        ("Adam", "lr", float("inf"), ValueError, "learning rate"),
        ("AdamW", "lr", "1e-3", TypeError, "learning rate must be a float, got str"),
        ("AdamW", "betas", (0.9, 1.0), ValueError, "beta parameter at index 1"),
        ("Adam", "eps", float("nan"), ValueError, "epsilon"),
        ("SGD", "lr", -0.1, ValueError, "learning rate"),
        ("SGD", "weight_decay", float("inf"), ValueError, "weight_decay"),
    ],
)
def test_hyper_parameters_set_after_construction_are_checked_at_step(name, attr, value, exc, match):
    # the constructor refused them, but opt.lr = inf (a schedule) was taken: the step wrote
    # -inf / NaN into every parameter (the extra groups' values were checked, group 0's not);
    # a string failed inside the update with "can't multiply sequence by non-int"
    p = np.ones(4, np.float32)
    opt = (
        getattr(nbqat, name)(p, lr=0.1, momentum=0.9) if name == "SGD" else getattr(nbqat, name)(p)
    )
    setattr(opt, attr, value)
    with pytest.raises(exc, match=match):
        opt.step(np.full(4, 0.5, np.float32))
    np.testing.assert_array_equal(p, 1.0)
    assert opt.step_count == 0 and opt.state_dict().keys().isdisjoint(opt._state_names)


@pytest.mark.parametrize("shift", [1, -1])
def test_grads_overlapping_params_at_another_offset_are_refused(shift):
    # params = buf[1:], grads = buf[:-1]: the parallel, vectorised pass read gradients it had
    # already overwritten (3124 of 200 000 parameters wrong, at multiples of 64; the result
    # depends on the thread count); torch refuses the partial overlap. The same array is fine.
    n = 1000
    buf = np.linspace(-1, 1, n + 1).astype(np.float32)
    p, g = (buf[1:], buf[:n]) if shift > 0 else (buf[:n], buf[1:])
    opt = nbqat.SGD(p, lr=0.5, momentum=0.9)
    with pytest.raises(ValueError, match=r"grads overlaps params .*grads.copy\(\)"):
        opt.step(g)
    np.testing.assert_array_equal(buf, np.linspace(-1, 1, n + 1).astype(np.float32))
    assert opt.step_count == 0
    want = p - np.float32(0.5) * g
    opt.step(g.copy())
    np.testing.assert_array_equal(p, want)
    q = np.ones(4, np.float32)
    nbqat.SGD(q, lr=0.1).step(q)  # grads is params: each element reads its gradient first
    np.testing.assert_array_equal(q, np.float32(1) - np.float32(0.1))


def test_a_view_of_a_buffer_made_read_only_since_is_refused_at_step():
    # the view keeps its own writeable flag: SGD over buf[:4] (GroupedAdamW's groups are such
    # views) wrote into buf after buf.flags.writeable = False
    from nbqat.train.recipe import GroupedAdamW

    buf = np.ones(6, np.float32)
    for opt, g in ((nbqat.SGD(buf[:4], lr=0.1), np.ones(4, np.float32)),
                   (GroupedAdamW(buf, lr=0.1, offset=4), np.ones(6, np.float32))):  # fmt: skip
        buf.flags.writeable = False
        with pytest.raises(ValueError, match="read-only"):
            opt.step(g)
        np.testing.assert_array_equal(buf, 1.0)
        buf.flags.writeable = True


def test_adam_state_past_step_zero_without_its_moments_is_refused(rng):
    # {"step": 5, ...} without exp_avg / exp_avg_sq loaded zero moments at step 5: the next
    # update was neither the saved run's nor a fresh start's (torch starts such a state afresh)
    p = rng.standard_normal(8).astype(np.float32)
    opt = nbqat.Adam(p.copy())
    for _ in range(5):
        opt.step(rng.standard_normal(8).astype(np.float32))
    sd = opt.state_dict()
    fresh = nbqat.Adam(p.copy())
    for drop in ("exp_avg", "exp_avg_sq"):
        with pytest.raises(ValueError, match=f"lacks \\['{drop}'\\]"):
            fresh.load_state_dict({k: v for k, v in sd.items() if k != drop})
        assert fresh.step_count == 0
    fresh.load_state_dict({k: v for k, v in sd.items() if not k.startswith("exp_")} | {"step": 0})
