"""FakeQuantize / LearnableFakeQuantize modules and QConfig / QATConfig against PyTorch 2.13."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from fq_configs import per_channel_kwargs

import nbqat

#: name -> nbqat.FakeQuantize arguments; torch's FakeQuantize gets the same (torch_args)
CONFIGS = {
    "tensor_affine_quint8": dict(
        observer=nbqat.MovingAverageMinMaxObserver, quant_min=0, quant_max=255
    ),
    "tensor_symmetric_qint8": dict(
        observer=nbqat.MinMaxObserver, dtype="qint8", qscheme="per_tensor_symmetric"
    ),
    "channel0_symmetric_qint8": per_channel_kwargs(0),
    "channel1_affine_quint8": dict(
        observer=nbqat.PerChannelMinMaxObserver, ch_axis=1, qscheme="per_channel_affine"
    ),
}


def torch_args(torch, kw):
    """torch's observer class of the name of ``kw["observer"]`` and the other arguments of
    ``kw`` with torch's dtype and qscheme objects."""
    out = {k: v for k, v in kw.items() if k != "observer"}
    for k in ("dtype", "qscheme"):
        if k in out:
            out[k] = getattr(torch, out[k])
    return getattr(torch.ao.quantization.observer, kw["observer"].__name__), out


def make_pair(torch, name):
    observer, tkw = torch_args(torch, CONFIGS[name])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        theirs = torch.ao.quantization.FakeQuantize(observer=observer, **tkw)
    return nbqat.FakeQuantize(**CONFIGS[name]), theirs


def bits(a):
    return np.ascontiguousarray(a).view(np.int32)


@pytest.mark.parametrize("name", list(CONFIGS))
def test_phases_match_torch(torch, rng, name):
    ours, theirs = make_pair(torch, name)
    # calibration -> QAT -> frozen, as a QAT loop runs them
    plan = ["calib", "calib", "qat", "qat", "frozen", "frozen"]
    for step, phase in enumerate(plan):
        for m in (ours, theirs):
            m.enable_observer(phase != "frozen")
            m.enable_fake_quant(phase != "calib")
        x = (rng.standard_normal((4, 6)) * (1 + step)).astype(np.float32)
        x[0, 0] = 40.0  # out of range for later steps -> masked
        y = ours(x)
        tx = torch.from_numpy(x.copy()).requires_grad_(True)
        ty = theirs(tx)
        assert np.array_equal(bits(y), bits(ty.detach().numpy()))
        np.testing.assert_array_equal(ours.scale, theirs.scale.numpy())
        np.testing.assert_array_equal(ours.zero_point, theirs.zero_point.numpy())
        g = rng.standard_normal(x.shape).astype(np.float32)
        if phase == "calib":
            assert y is x and ours.ctx is None
            np.testing.assert_array_equal(ours.backward(g), g)
            continue
        ty.backward(torch.from_numpy(g))
        assert np.array_equal(bits(ours.backward(g)), bits(tx.grad.numpy()))


def test_ctx_per_call_for_time_steps(torch, rng):
    fq = nbqat.FakeQuantize(observer=nbqat.MinMaxObserver)
    xs = [(rng.standard_normal((3, 5)) * s).astype(np.float32) for s in (1.0, 4.0, 0.5)]
    ctxs = []
    for x in xs:
        fq(x)
        ctxs.append(fq.ctx)
    scale, zp = float(fq.scale[0]), int(fq.zero_point[0])
    g = np.ones((3, 5), np.float32)
    for x, ctx in zip(xs, ctxs):
        assert ctx.dtype == np.bool_ and ctx.shape == x.shape
        np.testing.assert_array_equal(fq.backward(g, ctx), g * ctx)
    # ctx=None is "fake quant was off" (identity), not "use the cached one"
    np.testing.assert_array_equal(fq.backward(g, None), g)
    # with the final qparams frozen, the mask is torch's cachemask mask
    fq.disable_observer()
    fq(xs[1])
    tx = torch.from_numpy(xs[1].copy()).requires_grad_(True)
    torch.fake_quantize_per_tensor_affine(tx, scale, zp, 0, 255).sum().backward()
    np.testing.assert_array_equal(fq.backward(g), tx.grad.numpy())


def test_backward_before_forward_raises():
    with pytest.raises(RuntimeError, match="forward first"):
        nbqat.FakeQuantize().backward(np.ones(3, np.float32))


def test_state_dict_roundtrip_and_torch_keys(torch, rng):
    ours, theirs = make_pair(torch, "channel0_symmetric_qint8")
    x = rng.standard_normal((4, 3)).astype(np.float32)
    ours(x)
    theirs(torch.from_numpy(x))
    sd = ours.state_dict()
    assert set(sd) == set(theirs.state_dict())
    fresh = nbqat.FakeQuantize(**CONFIGS["channel0_symmetric_qint8"])
    fresh.load_state_dict({k: v.numpy() for k, v in theirs.state_dict().items()})
    np.testing.assert_array_equal(fresh.scale, ours.scale)
    np.testing.assert_array_equal(fresh(x), ours(x))
    fresh.disable_observer()
    before = fresh.state_dict()
    for bad, exc in [
        ({k: v for k, v in sd.items() if k != "scale"}, KeyError),
        ({**sd, "scale": sd["scale"][:2]}, ValueError),
        ({**sd, "zero_point": sd["zero_point"].astype(np.float32)}, TypeError),  # a dtype
        ({**sd, "activation_post_process.min_val": np.zeros(2, np.float32)}, ValueError),
        ({**sd, "extra": np.zeros(1)}, ValueError),
    ]:
        with pytest.raises(exc):
            fresh.load_state_dict(bad)
        after = fresh.state_dict()
        assert all(np.array_equal(before[k], after[k]) for k in before)


@pytest.mark.parametrize("zp", [np.int64([2**32 + 3]), np.uint64([2**64 - 1])])
def test_load_state_dict_zero_point_range_checked_in_its_own_dtype(zp):
    # an int64 2**32 + 3 wrapped to 3 (and a uint64 2**64 - 1 to -1) in the int32 cast
    # before the range check, and loaded silently
    fq = nbqat.FakeQuantize(nbqat.MinMaxObserver, dtype="qint8", quant_min=-128, quant_max=127)
    before = fq.state_dict()
    with pytest.raises(ValueError, match="zero_point outside"):
        fq.load_state_dict({**before, "zero_point": zp})
    assert all(np.array_equal(before[k], v) for k, v in fq.state_dict().items())


def test_load_state_dict_refuses_a_scale_every_forward_refuses(rng):
    # a subnormal float32 scale (finite and > 0) was loaded, and every forward then raised
    fq = nbqat.FakeQuantize()
    fq(rng.standard_normal((3, 4)).astype(np.float32))
    before = fq.state_dict()
    with pytest.raises(ValueError, match="2.9e-39"):
        fq.load_state_dict({**before, "scale": np.array([1e-40], np.float32)})
    assert all(np.array_equal(before[k], v) for k, v in fq.state_dict().items())
    with pytest.raises(ValueError, match="2.9e-39"):  # the functions' rule, the same value
        nbqat.fake_quantize_per_tensor_affine(np.ones(2, np.float32), np.float32(1e-40), 0, 0, 255)


def test_with_args_and_qconfig():
    factory = nbqat.FakeQuantize.with_args(observer=nbqat.MinMaxObserver, quant_min=0, quant_max=15)
    a, b = factory(), factory()
    assert a is not b and a.activation_post_process is not b.activation_post_process
    assert (a.quant_min, a.quant_max) == (0, 15)
    qc = nbqat.QConfig(activation=factory, weight=nbqat.FakeQuantize)
    act, wt = qc
    assert act is factory and wt is nbqat.FakeQuantize
    with pytest.raises(TypeError, match="factory"):
        nbqat.QConfig(activation=factory(), weight=factory)
    with pytest.raises(TypeError, match="callable"):
        nbqat.QConfig(activation=factory, weight=3)
    with pytest.raises(TypeError, match="instance"):
        nbqat.FakeQuantize(observer=nbqat.MinMaxObserver())


def test_default_qat_qconfig_matches_torch_defaults(torch):
    act = nbqat.default_qat_qconfig.activation()
    wt = nbqat.default_qat_qconfig.weight()
    assert isinstance(act.activation_post_process, nbqat.MovingAverageMinMaxObserver)
    assert (act.quant_min, act.quant_max, act.qscheme, act.ch_axis) == (
        0,
        255,
        "per_tensor_affine",
        None,
    )
    assert isinstance(wt.activation_post_process, nbqat.MovingAveragePerChannelMinMaxObserver)
    assert (wt.quant_min, wt.quant_max, wt.qscheme, wt.ch_axis) == (
        -128,
        127,
        "per_channel_symmetric",
        0,
    )
    assert wt.is_per_channel and not act.is_per_channel
    tw = torch.ao.quantization.default_per_channel_weight_fake_quant()
    assert (tw.quant_min, tw.quant_max, tw.ch_axis) == (wt.quant_min, wt.quant_max, wt.ch_axis)
    assert str(tw.qscheme) == "torch." + wt.qscheme


def test_qat_config_defaults_and_validation():
    c = nbqat.QATConfig()
    assert c.calibration_batches == 100 and c.max_norm == 1.0
    assert c.qconfig is nbqat.default_qat_qconfig and not c.learnable_scales
    assert c.quantize_attention and not c.quantize_output_head
    assert nbqat.QATConfig(max_norm=None).max_norm is None
    for kw, exc in [
        ({"calibration_batches": -1}, ValueError),
        ({"calibration_batches": 2.5}, TypeError),
        ({"max_norm": 0.0}, ValueError),
        ({"max_norm": float("nan")}, ValueError),
        ({"qconfig": "default"}, TypeError),
        ({"learnable_scales": 1}, TypeError),
    ]:
        with pytest.raises(exc):
            nbqat.QATConfig(**kw)


def test_bad_fake_quantize_construction():
    with pytest.raises(ValueError, match="both"):
        nbqat.FakeQuantize(quant_min=0)
    with pytest.raises(ValueError, match="<= quant_max"):
        nbqat.FakeQuantize(quant_min=10, quant_max=0)
    with pytest.raises(ValueError, match="contain 0"):
        nbqat.FakeQuantize(quant_min=1, quant_max=10)


# ---------------------------------------------------------------------------------------------
# LearnableFakeQuantize (LSQ)
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("per_channel", [False, True])
def test_learnable_matches_torch(torch, rng, per_channel):
    from torch.ao.quantization._learnable_fake_quantize import _LearnableFakeQuantize as TL

    if per_channel:
        kw = per_channel_kwargs(1, qscheme="per_channel_affine", channel_len=5)
    else:
        kw = CONFIGS["tensor_affine_quint8"]
    tobs, tkw = torch_args(torch, kw)
    ours = nbqat.LearnableFakeQuantize(use_grad_scaling=True, **kw)
    theirs = TL(observer=tobs, use_grad_scaling=True, **tkw)
    theirs.enable_static_estimate()
    ours.enable_static_estimate()
    for step in range(4):
        if step == 2:
            ours.enable_param_learning()
            theirs.enable_param_learning()
        x = (rng.standard_normal((3, 5)) * 2).astype(np.float32)
        tx = torch.from_numpy(x.copy()).requires_grad_(True)
        ty = theirs(tx)
        y = ours(x)
        assert np.array_equal(bits(y), bits(ty.detach().numpy()))
        np.testing.assert_array_equal(ours.scale, theirs.scale.detach().numpy())
        np.testing.assert_array_equal(ours.zero_point, theirs.zero_point.detach().numpy())
        if step >= 2:
            g = rng.standard_normal(x.shape).astype(np.float32)
            ours.zero_grad()
            theirs.scale.grad = None
            theirs.zero_point.grad = None
            ty.backward(torch.from_numpy(g))
            gx = ours.backward(g)
            np.testing.assert_array_equal(gx, tx.grad.numpy())
            np.testing.assert_allclose(
                ours.grad_scale, theirs.scale.grad.numpy(), rtol=1e-5, atol=1e-7
            )
            np.testing.assert_allclose(
                ours.grad_zero_point, theirs.zero_point.grad.numpy(), rtol=1e-5, atol=1e-7
            )
            # the learned parameters move the same way (one SGD step on both)
            with torch.no_grad():
                theirs.scale -= 0.01 * theirs.scale.grad
                theirs.zero_point -= 0.01 * theirs.zero_point.grad
            ours.scale[...] = theirs.scale.detach().numpy()
            ours.zero_point[...] = theirs.zero_point.detach().numpy()


def test_learnable_accumulates_and_zero_grad(rng):
    lq = nbqat.LearnableFakeQuantize(observer=nbqat.MinMaxObserver, quant_min=0, quant_max=15)
    x = rng.standard_normal((4, 4)).astype(np.float32) * 3
    lq(x)
    g = np.ones_like(x)
    ctx = lq.ctx
    lq.backward(g, ctx)
    once = (lq.grad_scale.copy(), lq.grad_zero_point.copy())
    assert np.any(once[0] != 0)
    lq.backward(g, ctx)
    np.testing.assert_allclose(lq.grad_scale, 2 * once[0], rtol=1e-6)
    lq.zero_grad()
    assert not lq.grad_scale.any() and not lq.grad_zero_point.any()
    lq.disable_fake_quant()
    assert lq(x) is x and lq.ctx is None
    np.testing.assert_array_equal(lq.backward(g), g)
    sd = lq.state_dict()
    other = nbqat.LearnableFakeQuantize(observer=nbqat.MinMaxObserver, quant_min=0, quant_max=15)
    other.load_state_dict(sd)
    np.testing.assert_array_equal(other.scale, lq.scale)
    assert not other.fake_quant_enabled


def test_learnable_loads_torch_state_dict(torch, rng):
    # torch's state dict holds FakeQuantizeBase's observer_enabled too: a strict load refused it
    # as an unexpected key
    from torch.ao.quantization._learnable_fake_quantize import _LearnableFakeQuantize as TL

    tobs, tkw = torch_args(torch, CONFIGS["tensor_affine_quint8"])
    theirs = TL(observer=tobs, use_grad_scaling=True, **tkw)
    x = (rng.standard_normal((3, 5)) * 2).astype(np.float32)
    theirs(torch.from_numpy(x))
    theirs.enable_param_learning()
    ours = nbqat.LearnableFakeQuantize(use_grad_scaling=True, **CONFIGS["tensor_affine_quint8"])
    ours.load_state_dict({k: v.numpy() for k, v in theirs.state_dict().items()})
    assert (ours.observer_enabled, ours.learning_enabled) == (False, True)  # static_enabled 0
    y = ours(x)
    ty = theirs(torch.from_numpy(x))
    assert np.array_equal(bits(y), bits(ty.detach().numpy()))
    np.testing.assert_array_equal(ours.scale, theirs.scale.detach().numpy())


def test_fake_quantize_on_device_equals_host(cuda_sim, small_cuda_blocks, rng):
    host = nbqat.FakeQuantize(**CONFIGS["channel1_affine_quint8"])
    dev = nbqat.FakeQuantize(**CONFIGS["channel1_affine_quint8"])
    for _ in range(2):
        x = rng.standard_normal((3, 4)).astype(np.float32)
        yh = host(x)
        yd = dev(cuda_sim.to_device(x))
        np.testing.assert_array_equal(np.asarray(yd.copy_to_host()), yh)
    np.testing.assert_array_equal(dev.scale, host.scale)


# ---------------------------------------------------------------------------------------------
# the fused fast path (nbqat.kernels.qat_cpu) against the validated public path
# ---------------------------------------------------------------------------------------------
FUSED_CONFIGS = {
    "tensor_affine_quint8_moving": dict(
        observer=nbqat.MovingAverageMinMaxObserver, quant_min=0, quant_max=255
    ),
    "tensor_symmetric_qint8": dict(
        observer=nbqat.MinMaxObserver, dtype="qint8", qscheme="per_tensor_symmetric"
    ),
    "channel0_symmetric_qint8_moving": CONFIGS["channel0_symmetric_qint8"],
    "channel0_affine_quint8": dict(
        observer=nbqat.PerChannelMinMaxObserver, ch_axis=0, qscheme="per_channel_affine"
    ),
}


def _outcome(fq, x):
    """Everything a forward produces: output bits or the error, warnings, and the new state."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            y, err = fq(x), None
        except ValueError as e:
            y, err = None, str(e)
    obs = fq.activation_post_process
    state = [fq.scale, fq.zero_point, obs.min_val, obs.max_val, fq.ctx]
    return (
        None if y is None else (y is x, bits(y).tobytes()),
        err,
        [(w.category, str(w.message)) for w in caught],
        [
            None if a is None else (a.dtype, a.shape, np.ascontiguousarray(a).tobytes())
            for a in state
        ],
    )


@pytest.mark.parametrize("nonfinite", ["raise", "ignore", "propagate"])
@pytest.mark.parametrize("name", list(FUSED_CONFIGS))
def test_fused_fast_path_matches_public_path(monkeypatch, rng, name, nonfinite):
    from nbqat import _jit
    from nbqat.kernels import qat_cpu

    fused = []
    for kern in ("fq_tensor_fused", "fq_channel_fused"):
        f = getattr(qat_cpu, kern)
        monkeypatch.setattr(qat_cpu, kern, lambda *a, _f=f: fused.append(1) or _f(*a))
    fast = nbqat.FakeQuantize(nonfinite=nonfinite, **FUSED_CONFIGS[name])
    slow = nbqat.FakeQuantize(nonfinite=nonfinite, **FUSED_CONFIGS[name])
    # (observer on, fake quant on, non-finite values) per call: QAT steps with an evolving
    # moving average, NaN/Inf batches (the fast path must fall back), frozen, calibration
    plan = [(1, 1, 0), (1, 1, 0), (1, 1, 0), (1, 1, 1), (1, 1, 0), (0, 1, 0), (1, 0, 0)]
    plan += [(1, 1, 0), (1, 1, 1), (1, 1, 0), (0, 1, 0)]
    for step, (observe, fake, bad) in enumerate(plan):
        for m in (fast, slow):
            m.enable_observer(bool(observe))
            m.enable_fake_quant(bool(fake))
        x = (rng.standard_normal((6, 10)) * (0.5 + step) + rng.normal(0, 2)).astype(np.float32)
        x[step % 6, step % 10] = 60.0 - 15 * step  # out of range now and then: masked
        if bad:
            x[1, 2], x[4, 7], x[5, 0] = np.nan, np.inf, -np.inf
        before = len(fused)
        got = _outcome(fast, x)
        with monkeypatch.context() as mp:
            mp.setattr(_jit, "PARALLEL_MIN", 0)  # every call takes the public path
            n_fused = len(fused)
            want = _outcome(slow, x)
            assert len(fused) == n_fused
        assert got == want, (step, got[1], want[1])
        if not bad and nonfinite != "propagate":
            assert len(fused) > before  # the fast path ran (it is not what is compared)
        if got[0] is not None and fast.ctx is not None:
            g = rng.standard_normal(x.shape).astype(np.float32)
            g[0, 0] = np.nan  # NaN * 0 stays NaN: the STE multiplies
            gf = fast.backward(g)
            with monkeypatch.context() as mp:
                mp.setattr(_jit, "PARALLEL_MIN", 0)
                gs = slow.backward(g)
                g_slow = g.copy()
                assert slow.backward(g_slow, out=g_slow) is g_slow
            assert np.array_equal(bits(gf), bits(gs))
            g_fast = g.copy()
            assert fast.backward(g_fast, out=g_fast) is g_fast  # in place
            assert np.array_equal(bits(g_fast), bits(gs)) and np.array_equal(bits(g_slow), bits(gs))
        elif got[0] is not None:
            g = rng.standard_normal(x.shape).astype(np.float32)
            assert fast.backward(g) is not g and np.array_equal(fast.backward(g), g)
            assert fast.backward(g, out=g) is g
    assert fused


def _wide(rng):
    x = rng.standard_normal((3, 4)).astype(np.float32)
    x[:, 0], x[:, 1] = -3e38, 3e38  # max_pos - min_neg overflows float32 in every row
    return x


def _zeros(rng):
    return np.zeros((3, 4), np.float32)  # scale = eps


def _channel_unset_then_set(rng):
    x = rng.standard_normal((3, 4)).astype(np.float32)
    x[1] = np.nan  # with nonfinite="ignore" channel 1 stays unset (+inf, -inf)
    return x


EDGE_CASES = {
    # the observers' wide-range rescale: finite qparams on both paths (torch's scale is inf)
    "wide_affine": (dict(observer=nbqat.MinMaxObserver, quant_min=0, quant_max=255), _wide),
    "wide_channel": (FUSED_CONFIGS["channel0_affine_quint8"], _wide),
    # eps = 1e-45: the scale's reciprocal overflows, both paths refuse it (ValueError)
    "subnormal_eps": (dict(observer=nbqat.MinMaxObserver, eps=1e-45), _zeros),
    # a state with an unset channel, then a batch that sets it
    "unset_channel": (
        dict(FUSED_CONFIGS["channel0_affine_quint8"], nonfinite="ignore"),
        _channel_unset_then_set,
    ),
}


@pytest.mark.parametrize("fake", [True, False])
@pytest.mark.parametrize("name", list(EDGE_CASES))
def test_fused_fast_path_matches_public_path_at_the_edges(monkeypatch, rng, name, fake):
    """States the fused kernels once sent back to the public path (or computed on their own):
    both now run the one formula of nbqat.kernels.observer_formula."""
    from nbqat import _jit

    kwargs, make = EDGE_CASES[name]
    fast, slow = nbqat.FakeQuantize(**kwargs), nbqat.FakeQuantize(**kwargs)
    for m in (fast, slow):
        m.enable_fake_quant(fake)
    for step in range(3):
        x = make(rng) if step == 0 else rng.standard_normal((3, 4)).astype(np.float32) * 3
        got = _outcome(fast, x)
        with monkeypatch.context() as mp:
            mp.setattr(_jit, "PARALLEL_MIN", 0)  # the public path
            want = _outcome(slow, x)
        assert got == want, (step, got[1], want[1])
        if step == 0 and name.startswith("wide"):
            assert np.isfinite(fast.scale).all()


@pytest.mark.parametrize("x_dtype", [np.float32, np.float64])
def test_a_channel_axis_out_of_range_is_refused_on_every_path(torch, x_dtype):
    """The fused float32 path took any multiple of ``x.ndim`` for axis 0 (ch_axis=2 on a 2-D
    input quantized along axis 0; ch_axis=1 on a 1-D input per element); torch, the observer
    alone and the float64 path refuse it."""
    kw = dict(
        observer=nbqat.MovingAveragePerChannelMinMaxObserver,
        dtype="qint8",
        qscheme="per_channel_symmetric",
    )
    x = np.linspace(-1.0, 2.0, 12).reshape(4, 3).astype(x_dtype)
    tq = torch.ao.quantization.FakeQuantize(
        observer=torch.ao.quantization.MovingAveragePerChannelMinMaxObserver,
        quant_min=-128, quant_max=127, dtype=torch.qint8,
        qscheme=torch.per_channel_symmetric, ch_axis=2,
    )  # fmt: skip
    with pytest.raises((IndexError, RuntimeError)):
        tq(torch.from_numpy(x.astype(np.float32)))
    f = nbqat.FakeQuantize(ch_axis=2, **kw)
    with pytest.raises(ValueError, match=r"ch_axis=2 is out of range for x of shape \(4, 3\)"):
        f(x)
    assert f.scale.shape == (1,)  # nothing stored by the refused call
    with pytest.raises(ValueError, match=r"ch_axis=1 is out of range for x of shape \(3,\)"):
        nbqat.FakeQuantize(ch_axis=1, **kw)(x[0].copy())
    y = nbqat.FakeQuantize(ch_axis=-2, **kw)(x)  # the same axis as 0, spelled from the end
    np.testing.assert_array_equal(y, nbqat.FakeQuantize(ch_axis=0, **kw)(x))


@pytest.mark.parametrize("cls", [nbqat.FakeQuantize, nbqat.LearnableFakeQuantize])
def test_a_range_past_float32_exactness_is_refused_at_construction(torch, cls):
    """qint32's full range trained on the fused path, which adds the zero point in float32
    (torch adds it exactly: all 64 outputs of a Gaussian batch differed from torch's), while
    the float64 path and fake_quantize_per_tensor_affine refused that range."""
    x = np.random.default_rng(0).standard_normal(64).astype(np.float32)
    wide = dict(quant_min=-(2**31), quant_max=2**31 - 1, dtype="qint32")
    with pytest.raises(ValueError, match=r"\[-2147483648, 2147483647\] \(qint32\) is past"):
        cls(observer=nbqat.MinMaxObserver, **wide)
    with pytest.raises(ValueError, match=r"must lie in \[-2\*\*24, 2\*\*24\]"):
        obs = nbqat.MinMaxObserver(dtype="qint32")
        obs(x)
        s, z = obs.calculate_qparams()
        nbqat.fake_quantize_per_tensor_affine(x, s, z, obs.quant_min, obs.quant_max)
    # qint32 codes on a 16-bit range stay exact: torch's bits
    kw = dict(quant_min=-32768, quant_max=32767, dtype="qint32")
    f = nbqat.FakeQuantize(observer=nbqat.MinMaxObserver, **kw)
    t = torch.ao.quantization.FakeQuantize(
        observer=torch.ao.quantization.MinMaxObserver, quant_min=-32768, quant_max=32767,
        dtype=torch.qint32,
    )  # fmt: skip
    np.testing.assert_array_equal(f(x), t(torch.from_numpy(x)).numpy())


@pytest.mark.parametrize("x", [2.3, [0.5, -1.25, 3.0]])
def test_learnable_backward_after_a_host_array_like_forward(x):
    # forward takes any host array-like (a float, a list); backward then failed with
    # AttributeError: 'float' object has no attribute 'shape' (the ctx keeps x as given)
    ours, ref = nbqat.LearnableFakeQuantize(), nbqat.LearnableFakeQuantize()
    for q in (ours, ref):
        q.enable_param_learning()
    y = ours(x)
    g = np.ones(np.shape(x))
    gx = ours.backward(g)
    np.testing.assert_array_equal(y, ref(np.asarray(x)))
    np.testing.assert_array_equal(gx, ref.backward(g))
    np.testing.assert_array_equal(ours.grad_scale, ref.grad_scale)


def test_learnable_loads_torch_eps(torch, rng):
    # eps (the scale's floor at every forward) was ignored by load_state_dict: a torch state
    # with another eps clamped the scale elsewhere than torch
    from torch.ao.quantization._learnable_fake_quantize import _LearnableFakeQuantize as TL

    tobs, tkw = torch_args(torch, CONFIGS["tensor_affine_quint8"])
    theirs = TL(observer=tobs, use_grad_scaling=True, **tkw)
    theirs.enable_param_learning()
    sd = {k: v.numpy() for k, v in theirs.state_dict().items()}
    sd["eps"] = np.array([0.05], np.float32)
    sd["scale"] = np.array([0.01], np.float32)
    theirs.load_state_dict({k: torch.from_numpy(v) for k, v in sd.items()})
    ours = nbqat.LearnableFakeQuantize(use_grad_scaling=True, **CONFIGS["tensor_affine_quint8"])
    ours.load_state_dict(sd)
    x = (rng.standard_normal((3, 5)) * 2).astype(np.float32)
    assert np.array_equal(bits(ours(x)), bits(theirs(torch.from_numpy(x)).detach().numpy()))
    np.testing.assert_array_equal(ours.scale, np.float32([0.05]))
    with pytest.raises(ValueError, match="eps"):
        ours.load_state_dict({**sd, "eps": np.array([-1.0], np.float32)})
    assert ours.eps == np.float32(0.05)


@pytest.mark.parametrize(
    "zp, exc", [(float("nan"), ValueError), (1e39, ValueError), ("a", TypeError), (True, TypeError)]
)
def test_learnable_refuses_a_non_finite_initial_zero_point(zp, exc):
    # NaN / 1e39 (Inf in float32) were taken and every learning forward then failed; "a" gave
    # NumPy's "could not convert string to float"; True became 1.0
    with pytest.raises(exc, match="zero_point"):
        nbqat.LearnableFakeQuantize(zero_point=zp)
    lq = nbqat.LearnableFakeQuantize(zero_point=np.float64(3.0)).enable_param_learning()
    assert lq.zero_point.dtype == np.float32 and lq.zero_point[0] == 3.0
    lq(np.ones(3, np.float32))
