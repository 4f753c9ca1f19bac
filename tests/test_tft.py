"""Whole-model checks of TemporalFusionTransformer: finite differences (float64) of every
parameter tensor and input, the static -> LSTM-initial-state gradient path, quantization hook
plumbing, the public API (shapes, dtypes, errors, state_dict, named_modules).

Whole-model finite differences use one random direction per parameter tensor (4-point stencil,
h = 1e-4): ``|<g, u> - fd| <= 1e-6 * max(|fd|, 1e-3 * max_tensors |fd|)``. The floor only matters
for the static selection GRN, whose gradients are ~1e-5 of the largest ones: there float64 finite
differences cannot resolve 1e-6 relative; those tensors are checked per element in
tests/test_nn_layers.py. Inputs are checked per element.
"""

from __future__ import annotations

import numpy as np
import pytest
from ref_nn import (
    IdentityHook,
    SquareHook,
    fd_directional,
    fd_grad,
    forecast_batch,
    rel_err,
)

from nbqat.nn import (
    LSTM,
    InterpretableMultiHeadAttention,
    Linear,
    TemporalFusionTransformer,
    TFTConfig,
)

CFG = dict(
    num_static_features=2,
    num_known_features=3,
    num_unknown_features=2,
    hidden_dim=4,
    sequence_length=5,
    prediction_horizon=3,
    num_heads=2,
)


def _inputs(cfg, rng, b=2, dtype=np.float64):
    return forecast_batch(rng, cfg, b, dtype, target=False)


def _set_hooks(model, make):
    for _, mod in model.named_modules():
        if isinstance(mod, Linear):
            mod.weight_fake_quant, mod.input_fake_quant = make(), make()
        elif isinstance(mod, LSTM):
            mod.weight_ih_fake_quant, mod.weight_hh_fake_quant = make(), make()
            mod.input_fake_quant, mod.hidden_fake_quant = make(), make()
        elif isinstance(mod, InterpretableMultiHeadAttention):
            mod.attention_fake_quant = make()


def _fd_check_model(model, rng, b=2):
    cfg = model.config
    s, h, f = _inputs(cfg, rng, b)
    r = rng.normal(size=(b, cfg.prediction_horizon, cfg.num_quantiles))

    def loss():
        return float(np.sum(model.forward(s, h, f) * r))

    model.zero_grad()
    model.forward(s, h, f)
    ds, dh, df = model.backward(r)
    grads = {n: g.copy() for n, g in model.named_grads()}
    res = []
    for name, p in model.named_parameters():
        u = rng.normal(size=p.shape)
        res.append((name, float(np.sum(grads[name] * u)), fd_directional(loss, p, u)))
    scale = max(abs(fd) for _, _, fd in res)
    for name, an, fd in res:
        assert abs(an - fd) <= 1e-6 * max(abs(fd), 1e-3 * scale), (name, an, fd)
    for x, dx in ((s, ds), (h, dh), (f, df)):
        err = rel_err(dx, fd_grad(loss, x))
        assert err < 1e-6, err
    return len(res)


@pytest.mark.parametrize("fold", [True, False])
def test_tft_finite_differences(rng, fold):
    model = TemporalFusionTransformer(TFTConfig(**CFG), seed=1, dtype=np.float64)
    assert model.set_folding(fold) > 3
    n = _fd_check_model(model, rng)
    assert n == len(list(model.named_parameters())) > 100


@pytest.mark.parametrize("hooks", [False, True])
def test_tft_linear_skip_finite_differences(rng, hooks):
    model = TemporalFusionTransformer(TFTConfig(**CFG, linear_skip=True), seed=3, dtype=np.float64)
    assert model.linear_skip is not None
    if hooks:
        _set_hooks(model, lambda: SquareHook(0.05))
        assert model.linear_skip.input_fake_quant is not None
    names = [n for n, _ in model.named_parameters()]
    assert "linear_skip.weight" in names and "linear_skip.bias" in names
    assert _fd_check_model(model, rng) == len(names)


def test_tft_linear_skip_is_the_documented_affine_map(rng):
    # oracle: the network without the skip (same weights) plus the plain affine map
    cfg = TFTConfig(**CFG, linear_skip=True)
    model = TemporalFusionTransformer(cfg, seed=4, dtype=np.float64)
    base = TemporalFusionTransformer(TFTConfig(**CFG), seed=4, dtype=np.float64)
    base.load_state_dict({k: v for k, v in model.state_dict().items() if "linear_skip" not in k})
    s, h, f = _inputs(cfg, rng, b=3)
    x = np.concatenate([h.reshape(3, -1), f.reshape(3, -1), s], axis=1)
    assert x.shape[1] == cfg.window_features == 5 * 2 + 3 * 3 + 2
    w, b = model.linear_skip.weight, model.linear_skip.bias
    want = base.forward(s, h, f) + (x @ w.T + b).reshape(3, 3, 3)
    np.testing.assert_allclose(model.forward(s, h, f), want, rtol=1e-12, atol=1e-12)
    with pytest.raises(TypeError, match="linear_skip"):
        TFTConfig(**CFG, linear_skip="yes")


def test_tft_dropout_finite_differences_with_a_fixed_mask(rng):
    from nbqat.nn import Dropout, set_dropout

    cfg = TFTConfig(**CFG, dropout=0.3, linear_skip=True)
    model = TemporalFusionTransformer(cfg, seed=5, dtype=np.float64)
    n = set_dropout(model, True, seed=(7, 1, 0))  # the same seed: the same mask every forward
    assert n == sum(isinstance(m, Dropout) for _, m in model.named_modules()) > 10
    walked = list(model.modules())  # named_modules' order without the names (dropout streams)
    assert len(walked) == len(list(model.named_modules()))
    assert all(a is b for a, (_, b) in zip(walked, model.named_modules()))
    _fd_check_model(model, rng)
    s, h, f = _inputs(cfg, rng)
    y1 = model.forward(s, h, f)
    assert np.array_equal(y1, model.forward(s, h, f))
    set_dropout(model, True, seed=(7, 1, 1))
    assert not np.array_equal(y1, model.forward(s, h, f))
    # evaluation mode: exactly the model without dropout layers
    set_dropout(model, False)
    plain = TemporalFusionTransformer(TFTConfig(**CFG, linear_skip=True), seed=5, dtype=np.float64)
    plain.params[...] = model.params
    assert np.array_equal(model.forward(s, h, f), plain.forward(s, h, f))
    # the kept list of dropout layers follows a change of the tree (a layer replaced)
    glu = model.static_enrichment.gate.glu
    old, glu.dropout = glu.dropout, Dropout(0.5)
    assert set_dropout(model, True) == n and glu.dropout.training and not old.training
    assert model.modules_of_type(Dropout) == tuple(
        m for _, m in model.named_modules() if isinstance(m, Dropout)
    )


def test_dropout_layer(rng):
    from nbqat.nn import Dropout

    d = Dropout(0.25)
    x = rng.normal(size=(200, 50)).astype(np.float32)
    assert d.forward(x) is x  # evaluation mode by default
    d.training, d.seed, d.stream = True, (1, 2), 3
    y = d.forward(x)
    keep = np.random.default_rng([1, 2, 3]).random(x.shape, dtype=np.float32) >= np.float32(0.25)
    np.testing.assert_array_equal(y, x * (keep.astype(np.float32) / np.float32(0.75)))
    assert y.dtype == np.float32 and abs(keep.mean() - 0.75) < 0.02
    dy = rng.normal(size=x.shape).astype(np.float32)
    np.testing.assert_array_equal(d.backward(dy), dy * d.mask)
    with pytest.raises(ValueError, match="dropout probability"):
        Dropout(1.0)
    with pytest.raises(RuntimeError, match="before forward"):
        Dropout(0.1).backward(dy)


def test_tft_finite_differences_with_hooks(rng):
    model = TemporalFusionTransformer(TFTConfig(**CFG), seed=2, dtype=np.float64)
    _set_hooks(model, lambda: SquareHook(0.05))
    _fd_check_model(model, rng)


def test_identity_hooks_reproduce_float_path_exactly(rng):
    cfg = TFTConfig(**CFG)
    s, h, f = _inputs(cfg, rng, 3, np.float32)
    res = []
    for hooked in (False, True):
        model = TemporalFusionTransformer(cfg, seed=4)
        if hooked:  # hooked Linears are never folded ...
            _set_hooks(model, IdentityHook)
        else:  # ... so compare with the unfolded float path
            model.set_folding(False)
        y = model.forward(s, h, f)
        dins = model.backward(np.ones_like(y))
        res.append((y, *dins, model.grads.copy()))
    for a, b in zip(*res):
        np.testing.assert_array_equal(a, b)


def test_static_gradient_reaches_lstm_initial_state_encoders(rng):
    """Only the static input changes; the output moves, and the gradients of the c_h / c_c
    GRNs (which reach the output only through the encoder LSTM's initial state) are non-zero and
    match finite differences element by element."""
    cfg = TFTConfig(**CFG)
    model = TemporalFusionTransformer(cfg, seed=5, dtype=np.float64)
    s, h, f = _inputs(cfg, rng)
    y1 = model.forward(s, h, f)
    y2 = model.forward(s + 0.5, h, f)
    assert np.max(np.abs(y1 - y2)) > 1e-6
    r = rng.normal(size=y1.shape)

    def loss():
        return float(np.sum(model.forward(s, h, f) * r))

    model.zero_grad()
    model.forward(s, h, f)
    ds, _, _ = model.backward(r)
    for prefix in ("static_context_initial_hidden", "static_context_initial_cell"):
        for name, p in model.named_parameters():
            if not name.startswith(prefix):
                continue
            g = dict(model.named_grads())[name].copy()
            assert np.max(np.abs(g)) > 1e-8, name
            assert rel_err(g, fd_grad(loss, p), 1e-12) < 1e-6, name
    assert rel_err(ds, fd_grad(loss, s)) < 1e-6


def test_lstm_initial_state_path_is_the_only_route_for_c_h(rng):
    """Cutting the encoder's initial-state gradient (the classic bug) changes the c_h grads."""
    cfg = TFTConfig(**CFG)
    model = TemporalFusionTransformer(cfg, seed=6, dtype=np.float64)
    s, h, f = _inputs(cfg, rng)
    y = model.forward(s, h, f)
    model.backward(np.ones_like(y))
    g_ok = model.static_context_initial_hidden.fc1.weight_grad.copy()
    enc = model.lstm_encoder
    orig = enc.backward

    def broken(*a, **k):
        dx, dh0, dc0 = orig(*a, **k)
        return dx, np.zeros_like(dh0), dc0

    enc.backward = broken
    model.zero_grad()
    model.forward(s, h, f)
    model.backward(np.ones_like(y))
    assert np.all(model.static_context_initial_hidden.fc1.weight_grad == 0)
    assert np.max(np.abs(g_ok)) > 0


def test_shapes_dtypes_and_interpretation(rng):
    cfg = TFTConfig(**CFG)
    model = TemporalFusionTransformer(cfg)
    assert model.params.dtype == np.float32 and model.grads.shape == model.params.shape
    s, h, f = _inputs(cfg, rng, 4, np.float32)
    y = model.forward(s, h, f)
    k, tau = cfg.sequence_length, cfg.prediction_horizon
    assert y.shape == (4, tau, 3) and y.dtype == np.float32
    assert model.attention_weights.shape == (4, tau, k + tau)
    np.testing.assert_allclose(model.attention_weights.sum(-1), 1, rtol=1e-5)
    assert model.static_weights.shape == (4, 2)
    assert model.encoder_weights.shape == (4, k, 2)
    assert model.decoder_weights.shape == (4, tau, 3)
    np.testing.assert_allclose(model.decoder_weights.sum(-1), 1, rtol=1e-5)
    dins = model.backward(np.ones_like(y))
    assert [d.shape for d in dins] == [s.shape, h.shape, f.shape]
    assert all(d.dtype == np.float32 for d in dins)
    assert np.any(model.grads != 0)
    model.zero_grad()
    assert not np.any(model.grads)
    # float64 inputs are cast to the model's dtype
    assert model.forward(s.astype(np.float64), h, f).dtype == np.float32


@pytest.mark.parametrize(
    "which,bad,match",
    [
        (0, lambda s: s[:, :1], r"static must have shape \(B, 2\)"),
        (1, lambda h: h[:, :4], r"historical must have shape \(B, 5, 2\)"),
        (2, lambda f: f[..., :2], r"future must have shape \(B, 3, 3\)"),
        (1, lambda h: h.astype(np.int64), "historical must be float32 or float64"),
        (0, lambda s: s.tolist(), "static must be a NumPy array"),
        (2, lambda f: f[:1], "share the batch size"),
    ],
)
def test_input_errors(rng, which, bad, match):
    cfg = TFTConfig(**CFG)
    model = TemporalFusionTransformer(cfg)
    ins = list(_inputs(cfg, rng, 2, np.float32))
    ins[which] = bad(ins[which])
    with pytest.raises(ValueError, match=match):
        model.forward(*ins)


def test_backward_errors(rng):
    cfg = TFTConfig(**CFG)
    model = TemporalFusionTransformer(cfg)
    with pytest.raises(RuntimeError, match="before forward"):
        model.backward(np.zeros((2, 3, 3), np.float32))
    model.forward(*_inputs(cfg, rng, 2, np.float32))
    before = model.grads.copy()
    with pytest.raises(ValueError, match="grad_out"):
        model.backward(np.zeros((2, 3, 2), np.float32))
    np.testing.assert_array_equal(model.grads, before)


def test_config_validation():
    cfg = TFTConfig(**CFG)
    assert cfg.num_quantiles == 3 and cfg.input_dim == 7
    with pytest.raises(ValueError, match="divisible"):
        TFTConfig(**{**CFG, "hidden_dim": 5})
    with pytest.raises(ValueError, match="dropout"):
        TFTConfig(**CFG, dropout=1.0)
    assert TFTConfig(**CFG, dropout=0.1).dropout == 0.1
    with pytest.raises(ValueError, match="quantiles"):
        TFTConfig(**CFG, quantiles=(0.5, 0.1))
    with pytest.raises(ValueError, match="sequence_length"):
        TFTConfig(**{**CFG, "sequence_length": 0})
    with pytest.raises(ValueError, match="dtype"):
        TemporalFusionTransformer(cfg, dtype=np.float16)


def test_state_dict_round_trip_and_named_views(rng):
    cfg = TFTConfig(**CFG)
    a = TemporalFusionTransformer(cfg, seed=1)
    b = TemporalFusionTransformer(cfg, seed=2)
    assert not np.array_equal(a.params, b.params)
    sd = a.state_dict()
    assert "lstm_encoder.weight_ih" in sd and sd["lstm_encoder.weight_ih"].shape == (16, 4)
    assert sd["output_layer.weight"].shape == (3, 4)
    buf = b.params
    b.load_state_dict(sd)
    assert b.params is buf
    np.testing.assert_array_equal(a.params, b.params)
    s, h, f = _inputs(cfg, rng, 2, np.float32)
    np.testing.assert_array_equal(a.forward(s, h, f), b.forward(s, h, f))
    # views share memory with the flat buffers
    for (n, p), (n2, g) in zip(a.named_parameters(), a.named_grads()):
        assert n == n2 and np.shares_memory(p, a.params) and np.shares_memory(g, a.grads)
    assert sum(p.size for _, p in a.named_parameters()) == a.params.size
    with pytest.raises(ValueError, match="missing"):
        b.load_state_dict({k: v for k, v in sd.items() if k != "output_layer.bias"})
    sd["output_layer.bias"] = np.zeros(5)
    with pytest.raises(ValueError, match="shape"):
        b.load_state_dict(sd)
    # a value that is no real number is refused before the first write (the earlier keys
    # were already copied when the cast failed on a later one)
    before = b.params.copy()
    bad = {k: v + 1 for k, v in a.state_dict().items()}
    bad["output_layer.bias"] = np.full(3, "x", dtype=object)
    with pytest.raises(TypeError, match=r"'output_layer.bias'\] has dtype object"):
        b.load_state_dict(bad)
    bad["output_layer.bias"] = np.zeros(3, np.complex64)
    with pytest.raises(TypeError, match="has dtype complex64"):
        b.load_state_dict(bad)
    np.testing.assert_array_equal(b.params, before)


def test_named_modules_and_seed_reproducibility():
    cfg = TFTConfig(**CFG)
    model = TemporalFusionTransformer(cfg, seed=3)
    names = dict(model.named_modules())
    assert names[""] is model
    lin = [n for n, m in names.items() if isinstance(m, Linear)]
    assert "multihead_attn.q_proj" in lin and "output_layer" in lin
    assert {n for n, m in names.items() if isinstance(m, LSTM)} == {
        "lstm_encoder",
        "lstm_decoder",
    }
    m64 = TemporalFusionTransformer(cfg, seed=3, dtype=np.float64)
    np.testing.assert_array_equal(model.params, m64.params.astype(np.float32))


def test_float32_close_to_float64(rng):
    cfg = TFTConfig(**CFG)
    m32 = TemporalFusionTransformer(cfg, seed=1)
    m64 = TemporalFusionTransformer(cfg, seed=1, dtype=np.float64)
    m64.load_state_dict(m32.state_dict())
    s, h, f = _inputs(cfg, rng, 3)
    y32 = m32.forward(s, h, f)
    y64 = m64.forward(s, h, f)
    assert rel_err(y32, y64) < 1e-5
    m32.backward(np.ones_like(y32))
    m64.backward(np.ones_like(y64))
    assert rel_err(m32.grads, m64.grads) < 1e-4


def test_deterministic(rng):
    cfg = TFTConfig(**CFG)
    model = TemporalFusionTransformer(cfg, seed=1)
    s, h, f = _inputs(cfg, rng, 3, np.float32)
    out = []
    for _ in range(2):
        model.zero_grad()
        y = model.forward(s, h, f)
        model.backward(y)
        out.append((y, model.grads.copy()))
    np.testing.assert_array_equal(out[0][0], out[1][0])
    np.testing.assert_array_equal(out[0][1], out[1][1])


def test_folded_path_as_accurate_as_unfolded(rng):
    """The algebraic folds (VSN embedding, GRN fc2; the default) against the unfolded float
    path in float32: each is compared with the float64 truth, and the folded path must be as
    accurate as the unfolded one (within a factor 4, or 1e-3 relative): the selection GRN's
    small gradients come out of a cancelling softmax backward, so both carry float32 noise
    whose size depends on the BLAS kernel's summation order (static_vsn.flat_grn.fc1.bias:
    1.5e-4 folded vs 3.1e-5 unfolded under OPENBLAS_CORETYPE=Sandybridge, within 4x under
    Haswell/SkylakeX). A fold defect changes a gradient by O(1) relative, so the 1e-3 floor
    (still ~8000x float32's epsilon) keeps the test able to fail."""
    cfg = TFTConfig(**CFG)
    s, h, f = _inputs(cfg, rng, 4, np.float32)
    res = []
    for fold, dt in ((True, np.float32), (False, np.float32), (False, np.float64)):
        model = TemporalFusionTransformer(cfg, seed=5, dtype=dt)
        model.set_folding(fold)
        y = model.forward(s, h, f)
        dins = model.backward(np.cos(np.arange(y.size, dtype=dt)).reshape(y.shape))
        res.append([y, *dins] + [g for _, g in model.named_grads()])
    names = ["output", "dstatic", "dhistorical", "dfuture"] + [n for n, _ in model.named_grads()]
    for name, a, b, truth in zip(names, *res):
        err_fold, err_mat = rel_err(a, truth), rel_err(b, truth)
        assert err_fold <= max(4 * err_mat, 1e-3), (name, err_fold, err_mat)
