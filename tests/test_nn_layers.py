"""Finite-difference checks (float64) of every nbqat.nn layer's hand-written backward pass.

Each test builds one layer on its own flat buffer, takes the loss ``sum_i <R_i, y_i>`` with fixed
random ``R_i`` over the layer's outputs, and compares every parameter gradient and every input
gradient with a 4-point finite difference (tests/ref_nn.py): relative error < 1e-6 per tensor
(an absolute floor of 1e-9 only matters for gradients that are exactly zero, e.g. a key bias).
"""

from __future__ import annotations

import numpy as np
import pytest
from ref_nn import IdentityHook, NumpyFakeQuant, SquareHook, fd_grad, rel_err

from nbqat import nn

TOL = 1e-6
FLOOR_REL = 1e-5


def _check(module, fwd, bwd, inputs, seed=0, tol=TOL):
    """fwd() -> tuple of outputs; bwd(Rs) -> tuple of input grads aligned with ``inputs``."""
    rng = np.random.default_rng(seed)
    outs = fwd()
    rs = [rng.normal(size=o.shape) for o in outs]

    def loss():
        return sum(float(np.sum(r * o)) for r, o in zip(rs, fwd()))

    for _, g in module.named_grads():
        g[...] = 0
    fwd()
    dins = bwd(rs)
    grads = {n: g.copy() for n, g in module.named_grads()}
    gmax = max([float(np.max(np.abs(g))) for g in grads.values() if g.size] + [0.0])
    gmax = max([gmax] + [float(np.max(np.abs(d))) for d in dins])
    floor = FLOOR_REL * gmax
    checked = 0
    for name, p in module.named_parameters():
        fd = fd_grad(loss, p)
        err = rel_err(grads[name], fd, floor)
        assert err < tol, f"parameter {name}: relative error {err:.3g}"
        checked += 1
    for i, (x, dx) in enumerate(zip(inputs, dins)):
        assert dx.shape == x.shape
        fd = fd_grad(loss, x)
        err = rel_err(dx, fd, floor)
        assert err < tol, f"input {i}: relative error {err:.3g}"
    return checked


def _build(module, seed=3):
    return nn.ParameterBuffer(module, np.float64, seed)


@pytest.mark.parametrize("lead", [(5,), (2, 3)])
@pytest.mark.parametrize("bias", [True, False])
def test_linear(rng, lead, bias):
    lin = nn.Linear(4, 3, bias=bias)
    _build(lin)
    x = rng.normal(size=lead + (4,))
    n = _check(lin, lambda: (lin.forward(x),), lambda r: (lin.backward(r[0]),), [x])
    assert n == (2 if bias else 1)


def test_linear_matches_numpy(rng):
    lin = nn.Linear(4, 3)
    _build(lin)
    x = rng.normal(size=(2, 3, 4))
    np.testing.assert_allclose(lin.forward(x), x @ lin.weight.T + lin.bias, rtol=1e-14)


def test_linear_hooks(rng):
    lin = nn.Linear(4, 3)
    _build(lin)
    lin.weight_fake_quant = SquareHook(0.1)
    lin.input_fake_quant = SquareHook(-0.07)
    x = rng.normal(size=(2, 3, 4))
    _check(lin, lambda: (lin.forward(x),), lambda r: (lin.backward(r[0]),), [x])


def test_linear_ste_hook_against_reference(rng):
    lin = nn.Linear(6, 5)
    _build(lin)
    wq, xq = NumpyFakeQuant(0.05), NumpyFakeQuant(0.1, 3, -20, 20)
    lin.weight_fake_quant, lin.input_fake_quant = wq, xq
    x = rng.normal(size=(7, 6))
    dy = rng.normal(size=(7, 5))
    y = lin.forward(x)
    dx = lin.backward(dy)
    w_q = NumpyFakeQuant(0.05).forward(lin.weight)
    ref_x = NumpyFakeQuant(0.1, 3, -20, 20)
    x_q = ref_x.forward(x)
    np.testing.assert_allclose(y, x_q @ w_q.T + lin.bias, rtol=1e-13)
    mask_w = np.abs(np.rint(lin.weight / 0.05)) <= 127
    np.testing.assert_allclose(lin.weight_grad, np.where(mask_w, dy.T @ x_q, 0), rtol=1e-13)
    np.testing.assert_allclose(dx, np.where(ref_x.ctx, dy @ w_q, 0), rtol=1e-13)
    assert not ref_x.ctx.all()  # the mask really cut something


def test_identity_hooks_are_exactly_the_float_path(rng):
    x = rng.normal(size=(2, 5, 4)).astype(np.float32)
    res = []
    for hooked in (False, True):
        lstm = nn.LSTM(4, 3)
        buf = nn.ParameterBuffer(lstm, np.float32, 1)
        if hooked:
            for a in ("weight_ih", "weight_hh", "input", "hidden"):
                setattr(lstm, a + "_fake_quant", IdentityHook())
        h0 = np.full((2, 3), 0.1, np.float32)
        out, (h, c) = lstm.forward(x, h0, h0)
        dx, dh0, dc0 = lstm.backward(np.ones_like(out), h, c)
        res.append((out, h, c, dx, dh0, dc0, buf.grads.copy()))
    for a, b in zip(*res):
        np.testing.assert_array_equal(a, b)


def test_elu(rng):
    e = nn.ELU()
    x = rng.normal(size=(3, 4))
    x[0, 0] = 0.0  # the x > 0 branch choice at 0 is the left (exp) one
    x[np.abs(x) < 1e-3] = 0.5
    _check(e, lambda: (e.forward(x),), lambda r: (e.backward(r[0]),), [x])
    np.testing.assert_allclose(e.forward(x), np.where(x > 0, x, np.expm1(x)), rtol=1e-15)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_elu_fused_bias_and_context(rng, dtype):
    """ELU.forward(x, bias, context): one pass equal to ELU(x + bias + context[b]) (float64
    reference; float32 through nn_cpu.vexpm1, within 2 ulp); x keeps the pre-activation."""
    nb, steps, c = 3, 5, 32
    x = rng.normal(size=(nb, steps, c)).astype(dtype)
    x[0, 0, :8] = np.linspace(-1e-3, 1e-3, 8)  # expm1's small-argument branch
    bias = rng.normal(size=c).astype(dtype)
    ctx = rng.normal(size=(nb, c)).astype(dtype)
    pre = (x + bias) + ctx[:, None, :]  # in dtype, the kernel's order of the two additions
    p64 = pre.astype(np.float64)
    ref = np.where(p64 > 0, p64, np.expm1(p64))
    xin = x.copy()
    y = nn.ELU().forward(xin, bias=bias, context=ctx)
    tol = 2 * np.finfo(dtype).eps
    np.testing.assert_allclose(y, ref, rtol=tol, atol=tol * 1e-3)
    assert np.array_equal(xin, pre)  # the cached pre-activation, bit for bit
    with pytest.raises(ValueError, match="context must have shape"):
        nn.ELU().forward(x.copy(), context=ctx[:2])
    empty = np.zeros((0, steps, c), dtype)  # an empty batch, with and without the fused terms
    assert nn.ELU().forward(empty).shape == empty.shape
    assert nn.ELU().forward(empty, bias=bias, context=ctx[:0]).shape == empty.shape
    with pytest.raises(ValueError, match="C-contiguous"):
        nn.ELU().forward(np.asfortranarray(x[0]), bias=bias)


@pytest.mark.parametrize("residual", [False, True])
def test_glu(rng, residual):
    glu = nn.GatedLinearUnit(3, 4)
    _build(glu)
    x = rng.normal(size=(2, 3, 3))
    r = rng.normal(size=(2, 3, 4)) if residual else None
    if residual:
        inputs = [x, r]

        def bwd(rs):
            return glu.backward(rs[0]), rs[0]
    else:
        inputs = [x]

        def bwd(rs):
            return (glu.backward(rs[0]),)

    _check(glu, lambda: (glu.forward(x, r),), bwd, inputs)
    z = x @ glu.fc.weight.T + glu.fc.bias
    ref = z[..., :4] / (1 + np.exp(-z[..., 4:])) + (0 if r is None else r)
    np.testing.assert_allclose(glu.forward(x, r), ref, rtol=1e-13)


def test_glu_projected_rejects_malformed_arrays_before_the_kernel(rng):
    """The compiled GLU passes have no bounds checks: a wrong z, bias or dy must be refused in
    Python (these shapes corrupted the heap before the checks)."""
    glu = nn.GatedLinearUnit(3, 3)
    _build(glu)
    b6 = np.zeros(6)
    for z in (
        np.zeros((3, 4)),
        np.zeros((40, 3)),
        np.zeros((4, 12))[:, ::2],
        np.zeros((2, 6), int),
    ):
        with pytest.raises(ValueError, match="z must be"):
            glu.forward_projected(z, None, b6)
    with pytest.raises(ValueError, match="bias must have shape"):
        glu.forward_projected(np.zeros((2, 6)), None, np.zeros(3))
    with pytest.raises(ValueError, match="z must be"):
        nn.GateAddNorm(3, 3).forward_projected(np.zeros((4, 3)), np.zeros((4, 3)), b6)
    y = glu.forward(rng.normal(size=(2, 3)))
    for dy in (np.zeros((400, 3)), np.zeros((2, 4)), np.zeros((1, 3))):
        with pytest.raises(ValueError, match="dy must have"):
            glu.backward(dy)
    assert glu.backward(np.ones_like(y)).shape == (2, 3)


def test_grn_folds_fc2_only_with_enough_rows(rng):
    """The fc2 fold costs 6 C h^2 per call: below FOLD_MIN_ROWS_PER_OUTPUT * C rows the GRN runs
    fc2 and the GLU separately (bit-identical to fold_fc2=False), above it folds."""
    from nbqat.nn.layers.gating import FOLD_MIN_ROWS_PER_OUTPUT

    c = 3
    limit = FOLD_MIN_ROWS_PER_OUTPUT * c
    for rows, folded in ((limit - 1, False), (limit, True)):
        outs = []
        for fold in (True, False):
            grn = nn.GatedResidualNetwork(4, 5, c, fold_fc2=fold)
            _build(grn)
            a = np.random.default_rng(rows).normal(size=(rows, 4))
            outs.append(grn.forward(a))
            assert (grn._cache[3] is not None) == (fold and folded)
        if not folded:
            np.testing.assert_array_equal(outs[0], outs[1])
        else:
            np.testing.assert_allclose(outs[0], outs[1], rtol=1e-12, atol=1e-14)


def test_vsn_rejects_bad_input(rng):
    vsn = nn.VariableSelectionNetwork(3, 4)
    _build(vsn)
    for x in (np.zeros((2, 4)), [[0.0, 1.0, 2.0]]):
        with pytest.raises(ValueError, match="x must be"):
            vsn.forward(x)
    for x in (np.zeros((2, 3), int), np.zeros((2, 3), np.float16)):  # a dtype: as Linear's
        with pytest.raises(TypeError, match=r"`x` must be a floating-point array \(float32, f"):
            vsn.forward(x)


def test_layernorm(rng):
    ln = nn.LayerNorm(5)
    buf = _build(ln)
    buf.params[:] = rng.normal(size=buf.params.size)  # non-trivial gamma / beta
    x = rng.normal(size=(3, 300, 5))  # > ROW_CHUNK rows: several chunks
    dy = rng.normal(size=x.shape)
    y = ln.forward(x)
    mu = x.mean(-1, keepdims=True)
    ref = (x - mu) / np.sqrt(x.var(-1, keepdims=True) + 1e-5) * ln.weight + ln.bias
    np.testing.assert_allclose(y, ref, rtol=1e-12, atol=1e-12)
    x_small = rng.normal(size=(2, 3, 5))
    _check(ln, lambda: (ln.forward(x_small),), lambda r: (ln.backward(r[0]),), [x_small])
    # deterministic parameter gradient over many chunks: equal to a float64 reference
    buf.zero_grad()
    ln.forward(x)
    ln.backward(dy)
    xhat = (x - mu) / np.sqrt(x.var(-1, keepdims=True) + 1e-5)
    np.testing.assert_allclose(ln.weight_grad, (dy * xhat).sum((0, 1)), rtol=1e-12)
    np.testing.assert_allclose(ln.bias_grad, dy.sum((0, 1)), rtol=1e-12)


def test_layernorm_eps_must_be_finite_and_positive():
    """A negative eps was taken (torch too: it silently rescales every row, a constant row gave
    NaN), so were 0, NaN and inf; now a ValueError naming eps. A positive eps is used as given
    (torch's output as the oracle)."""
    torch = pytest.importorskip("torch")
    for eps in (0.0, -1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match=r"`LayerNorm eps` must be finite and > 0"):
            nn.LayerNorm(4, eps=eps)
    for eps in (True, "1e-5", None):
        with pytest.raises(TypeError, match=r"`LayerNorm eps` must be a real number"):
            nn.LayerNorm(4, eps=eps)
    ln = nn.LayerNorm(4, eps=np.float32(0.5))
    _build(ln)
    x = np.array([[1.0, 1.0, 1.0, 1.0], [1.0, 2.0, 3.0, 4.0]])
    ref = torch.nn.functional.layer_norm(torch.from_numpy(x), (4,), eps=0.5).numpy()
    np.testing.assert_allclose(ln.forward(x), ref, rtol=1e-12, atol=1e-12)


def test_layernorm_rows_whose_float32_variance_overflows_give_torchs_output():
    """float32 rows of magnitude 1e19-2e19 (the raw inputs' embedding reaches a variable GRN's
    LayerNorm through its skip): the sum of squares overflows float32, and fastmath's
    reciprocal square root estimate turned 1/sqrt(inf) into NaN rows (16 of 32 values at 1e19,
    every row at 2e19) where torch gives rstd 0 (the bias) or its finite result."""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(0)
    ln = nn.LayerNorm(8)
    nn.ParameterBuffer(ln, np.float32, 3).params[:] = rng.normal(size=16)
    base = rng.standard_normal((4, 8))
    for scale in (1e19, 2e19, 1e20, 1e30):
        x = (base * scale).astype(np.float32)
        y = ln.forward(x)
        assert np.isfinite(y).all(), scale
        w, b = torch.from_numpy(ln.weight.copy()), torch.from_numpy(ln.bias.copy())
        ref = torch.nn.functional.layer_norm(torch.from_numpy(x), (8,), w, b).numpy()
        ok = np.isfinite(ref)  # torch's own Welford update gives NaN from 1e20 on
        np.testing.assert_allclose(y[ok], ref[ok], rtol=1e-6, atol=1e-6, err_msg=str(scale))
        assert ok.any() or scale > 2e19


def _refused_forwards_keep_the_last(mod, forward, dy, refused):
    """``forward(); mod.backward(dy)`` gives the reference gradients; then ``forward()``, the
    refused calls (``refused()`` asserts they raise) and ``mod.backward(dy)`` must give them
    again: a refused forward leaves the caches of the last good one."""
    forward()
    mod.backward(dy)
    ref = {n: g.copy() for n, g in mod.named_grads()}
    for _, g in mod.named_grads():
        g[...] = 0
    forward()
    refused()
    mod.backward(dy)
    for n, g in mod.named_grads():
        np.testing.assert_array_equal(g, ref[n], err_msg=n)


def test_linear_and_attention_refuse_non_float_input(rng):
    """Linear took an integer or bool x (a float64 y from a float32 layer: NumPy's promotion,
    where LayerNorm and ELU refuse it), so did the attention's query and key_value; an integer
    key_value came after q_proj had cached the new query. Now a TypeError naming the argument,
    before anything is cached; float input as before (plain NumPy as the oracle)."""
    lin = nn.Linear(3, 2)
    nn.ParameterBuffer(lin, np.float32, 0)
    for x in (np.arange(6).reshape(2, 3), np.ones((2, 3), bool)):
        with pytest.raises(TypeError, match=r"`x` must be a floating-point array.*astype"):
            lin.forward(x)
    x = rng.normal(size=(2, 3)).astype(np.float32)
    np.testing.assert_allclose(lin.forward(x), x @ lin.weight.T + lin.bias, rtol=1e-6)
    att = nn.InterpretableMultiHeadAttention(4, 2)
    _build(att)
    q, kv, dy = rng.normal(size=(2, 2, 4)), rng.normal(size=(2, 3, 4)), rng.normal(size=(2, 2, 4))

    def refused():
        qi = np.ones((2, 2, 4), np.int64)
        with pytest.raises(TypeError, match="`key_value` must be a floating-point array"):
            att.forward(rng.normal(size=(2, 2, 4)), qi[:, :1].repeat(3, 1), 0)
        with pytest.raises(TypeError, match="`query` must be a floating-point array"):
            att.forward(qi, kv, 0)

    _refused_forwards_keep_the_last(att, lambda: att.forward(q, kv, 1), dy, refused)


def test_glu_grn_vsn_lstm_refuse_non_float_input_before_any_cache(torch, rng):
    """The layers beside Linear and the attention: the LSTM cast an integer or bool x, h0 or
    c0 to its weights' dtype silently (torch refuses them), a GRN's integer context c was
    refused by its context Linear after fc1 had cached the new a (the next backward mixed two
    forwards), a VSN's integer c likewise after the embedding, its integer x was a ValueError,
    and a GLU's with an active dropout the dropout's own message. Now a TypeError naming the
    argument with the astype hint, before anything is cached (the gradients of the last good
    forward come back); float input as before."""
    f64 = rng.normal
    bad = (np.ones((2, 3), np.int64), np.ones((2, 3), bool))
    hint = r"must be a floating-point array.*astype"
    lt = torch.nn.LSTM(3, 4, batch_first=True)
    for b in bad:  # the oracle's rule: torch refuses integer and bool sequences and states
        with pytest.raises((ValueError, RuntimeError)):
            lt(torch.from_numpy(b[:, None]))
        with pytest.raises((ValueError, RuntimeError)):
            z = torch.zeros(1, 2, 4)
            lt(torch.ones(2, 1, 3), (torch.from_numpy(b[:, :1].repeat(4, 1)[None]), z))
    glu = nn.GatedLinearUnit(3, 4)
    _build(glu)
    glu.dropout = nn.Dropout(0.5)
    grn = nn.GatedResidualNetwork(3, 4, 5, context_size=2)
    _build(grn)
    vsn = nn.VariableSelectionNetwork(3, 4, context_size=2)
    _build(vsn)
    lstm = nn.LSTM(3, 4)
    _build(lstm)
    x, c, h0, c0 = f64(size=(2, 3)), f64(size=(2, 2)), f64(size=(2, 4)), f64(size=(2, 4))
    xs = f64(size=(2, 1, 3))
    cases = [
        (glu, lambda: glu.forward(x), f64(size=(2, 4)), [lambda b: glu.forward(b)], "x"),
        (grn, lambda: grn.forward(x, c), f64(size=(2, 5)), [lambda b: grn.forward(b, c)], "a"),
        (grn, lambda: grn.forward(x, c), f64(size=(2, 5)), [lambda b: grn.forward(x, b[:, :2])],
         "c"),
        (vsn, lambda: vsn.forward(x, c), f64(size=(2, 4)), [lambda b: vsn.forward(b, c)], "x"),
        (vsn, lambda: vsn.forward(x, c), f64(size=(2, 4)), [lambda b: vsn.forward(x, b[:, :2])],
         "c"),
        (lstm, lambda: lstm.forward(xs, h0, c0), f64(size=(2, 1, 4)),
         [lambda b: lstm.forward(b[:, None], h0, c0)], "x"),
        (lstm, lambda: lstm.forward(xs, h0, c0), f64(size=(2, 1, 4)),
         [lambda b: lstm.forward(xs, b[:, :1].repeat(4, 1), c0)], "h0"),
        (lstm, lambda: lstm.forward(xs, h0, c0), f64(size=(2, 1, 4)),
         [lambda b: lstm.forward(xs, h0, b[:, :1].repeat(4, 1))], "c0"),
    ]  # fmt: skip
    for mod, forward, dy, calls, name in cases:

        def refused(calls=calls, name=name):
            for call in calls:
                for b in bad:
                    with pytest.raises(TypeError, match=f"`{name}` {hint}"):
                        call(b)

        for _, g in mod.named_grads():  # the module's previous case accumulated into them
            g[...] = 0
        _refused_forwards_keep_the_last(mod, forward, dy, refused)
    glu.dropout = None
    _, ref = np.split(x @ glu.fc.weight.T + glu.fc.bias, 2, axis=-1)
    np.testing.assert_allclose(glu.forward(x), _ * (1 / (1 + np.exp(-ref))), rtol=1e-12)


def test_gate_add_norm_bad_skip_leaves_the_last_forward(rng):
    """A skip of another shape was refused inside the GLU after its Linear had cached the new
    input: the next backward paired the old forward's gate with the new input (a silently
    wrong GLU weight gradient). Now refused first; backward is the last good forward's."""
    gan = nn.GateAddNorm(3, 4)
    _build(gan)
    x, skip, dy = rng.normal(size=(2, 3)), rng.normal(size=(2, 4)), rng.normal(size=(2, 4))

    def refused():
        with pytest.raises(ValueError, match=r"residual must have shape \(2, 4\), got \(2, 5\)"):
            gan.forward(rng.normal(size=(2, 3)), rng.normal(size=(2, 5)))

    _refused_forwards_keep_the_last(gan, lambda: gan.forward(x, skip), dy, refused)


def test_gate_add_norm(rng):
    g = nn.GateAddNorm(3, 4)
    _build(g)
    x = rng.normal(size=(2, 3, 3))
    s = rng.normal(size=(2, 3, 4))
    _check(g, lambda: (g.forward(x, s),), lambda r: g.backward(r[0]), [x, s])


def _with_context(rng, layer, shape, ctx):
    """Input ``x`` of ``shape``, an optional context ``c`` (None or (shape[0], ctx)), the inputs
    to differentiate, and a backward returning the gradient of each of them."""
    x = rng.normal(size=shape)
    c = None if ctx is None else rng.normal(size=(shape[0], ctx))

    def bwd(rs):
        dx, dc = layer.backward(rs[0])
        return (dx,) if c is None else (dx, dc)

    return x, c, ([x] if c is None else [x, c]), bwd


@pytest.mark.parametrize(
    "in_size,out_size,ctx,lead",
    [(4, 4, None, (3,)), (6, 2, None, (2, 3)), (4, 4, 3, (2, 3)), (5, 3, 3, (2,))],
)
@pytest.mark.parametrize("fold", [True, False], ids=["fc2_folded", "fc2_separate"])
def test_grn(rng, in_size, out_size, ctx, lead, fold):
    grn = nn.GatedResidualNetwork(in_size, 4, out_size, ctx, fold_fc2=fold)
    _build(grn)
    a, c, inputs, bwd = _with_context(rng, grn, lead + (in_size,), ctx)
    _check(grn, lambda: (grn.forward(a, c),), bwd, inputs)


def test_grn_projected_pair_is_the_grn_after_its_projections(rng):
    """forward_projected / backward_projected with the caller's fc1 and skip products give the
    GRN's own output and gradients exactly; the plain backward refuses a projected forward."""
    grn = nn.GatedResidualNetwork(5, 4, 3, 2)
    _build(grn)
    a, c, dy = rng.normal(size=(2, 3, 5)), rng.normal(size=(2, 2)), rng.normal(size=(2, 3, 3))
    y = grn.forward(a, c)
    da, dc = grn.backward(dy)
    g_ref = {n: g.copy() for n, g in grn.named_grads()}
    for _, g in grn.named_grads():
        g[...] = 0
    z = a @ grn.fc1.weight.T
    skip = a @ grn.skip.weight.T + grn.skip.bias
    np.testing.assert_array_equal(grn.forward_projected(z, skip, c), y)
    dz, dskip, dc2 = grn.backward_projected(dy)
    np.testing.assert_array_equal(dc2, dc)
    np.testing.assert_array_equal(dz @ grn.fc1.weight + dskip @ grn.skip.weight, da)
    for name, g in grn.named_grads():
        if name.startswith(("fc1.", "skip.")):
            assert not g.any(), name  # the caller's projections: untouched
        else:
            np.testing.assert_array_equal(g, g_ref[name])
    with pytest.raises(RuntimeError, match="backward_projected"):
        grn.backward(dy)


def test_grn_context_errors(rng):
    grn = nn.GatedResidualNetwork(4, 4, 4, 3)
    _build(grn)
    with pytest.raises(ValueError, match="context"):
        grn.forward(rng.normal(size=(2, 4)))
    with pytest.raises(ValueError, match="context"):
        grn.forward(rng.normal(size=(2, 4)), rng.normal(size=(3, 3)))
    # a 4-D (or 1-D) input with a context: the forward ran, its backward then failed in the
    # context Linear after the gate's and fc2's gradients had accumulated (4-D), or the ELU
    # named a context shape the caller never passed (1-D)
    for a, c in ((rng.normal(size=(2, 3, 5, 4)), rng.normal(size=(2, 3))),
                 (rng.normal(size=(3,)), rng.normal(size=(3, 3)))):  # fmt: skip
        with pytest.raises(ValueError, match=r"the GRN input must be \(B, in\) or \(B, L, in\)"):
            grn.forward(a, c)


@pytest.mark.parametrize("fold", [True, False], ids=["folded", "materialised"])
@pytest.mark.parametrize("m,ctx,lead", [(3, None, (4,)), (2, 4, (2, 3)), (1, None, (3,))])
def test_vsn(rng, m, ctx, lead, fold):
    vsn = nn.VariableSelectionNetwork(m, 4, ctx, fold_embedding=fold)
    _build(vsn)
    x, c, inputs, bwd = _with_context(rng, vsn, lead + (m,), ctx)
    _check(vsn, lambda: (vsn.forward(x, c)[0],), bwd, inputs)
    out, w = vsn.forward(x, c)
    assert w.shape == lead + (m,)
    np.testing.assert_allclose(w.sum(-1), 1.0, rtol=1e-14)
    # reference combination from the layer's own sub-results
    emb = x[..., :, None] * vsn.embedding.weight + vsn.embedding.bias  # (..., m, d)
    per = np.stack([vsn.var_grns[j].forward(emb[..., j, :]) for j in range(m)], -2)
    np.testing.assert_allclose(out, (w[..., None] * per).sum(-2), rtol=1e-12, atol=1e-14)


def _lstm_ref(lstm, x, h, c):
    """Obvious NumPy LSTM (torch's equations)."""
    d = lstm.hidden_size
    outs = []
    for t in range(x.shape[1]):
        a = x[:, t] @ lstm.weight_ih.T + lstm.bias_ih + h @ lstm.weight_hh.T + lstm.bias_hh
        i, f, g, o = (a[:, k * d : (k + 1) * d] for k in range(4))
        sig = lambda v: 1 / (1 + np.exp(-v))  # noqa: E731
        c = sig(f) * c + sig(i) * np.tanh(g)
        h = sig(o) * np.tanh(c)
        outs.append(h)
    return np.stack(outs, 1), h, c


@pytest.mark.parametrize("hooks", [False, True])
def test_lstm(rng, hooks):
    lstm = nn.LSTM(3, 4)
    _build(lstm)
    x = rng.normal(size=(2, 5, 3))
    h0 = rng.normal(size=(2, 4))
    c0 = rng.normal(size=(2, 4))
    if not hooks:
        out, (h, c) = lstm.forward(x, h0, c0)
        ro, rh, rc = _lstm_ref(lstm, x, h0, c0)
        np.testing.assert_allclose(out, ro, rtol=1e-13, atol=1e-15)
        np.testing.assert_allclose(h, rh, rtol=1e-13, atol=1e-15)
        np.testing.assert_allclose(c, rc, rtol=1e-13, atol=1e-15)
    else:
        lstm.weight_ih_fake_quant = SquareHook(0.1)
        lstm.weight_hh_fake_quant = SquareHook(-0.1)
        lstm.input_fake_quant = SquareHook(0.05)
        lstm.hidden_fake_quant = SquareHook(0.2)  # per-step ctx: a stale ctx would fail

    def fwd():
        out, (h, c) = lstm.forward(x, h0, c0)
        return out, h, c

    def bwd(rs):
        return lstm.backward(rs[0], rs[1], rs[2])

    _check(lstm, fwd, bwd, [x, h0, c0])
    if hooks:
        assert lstm.hidden_fake_quant.calls > 5


@pytest.mark.parametrize("hook", [False, True])
def test_attention(rng, hook):
    att = nn.InterpretableMultiHeadAttention(4, 2)
    _build(att)
    if hook:
        att.attention_fake_quant = SquareHook(0.3)
    k, tau = 4, 3
    kv = rng.normal(size=(2, k + tau, 4))
    qin = rng.normal(size=(2, tau, 4))
    _check(
        att,
        lambda: (att.forward(qin, kv, offset=k),),
        lambda r: att.backward(r[0]),
        [qin, kv],
    )
    p = att.attention_probs
    assert p.shape == (2, 2, tau, k + tau)
    for i in range(tau):  # causal: decoder step i sees up to and including itself
        assert np.all(p[:, :, i, k + i + 1 :] == 0)
        assert np.all(p[:, :, i, : k + i + 1] > 0)
    np.testing.assert_allclose(p.sum(-1), 1.0, rtol=1e-14)


@pytest.mark.parametrize("offset", [0, 9, 40])
def test_attention_float32_matches_float64(rng, offset):
    """The float32 kernels (vector code over the key rows, partial last vectors) at a realistic
    size against the float64 build of the same layer: output and every gradient."""
    nb, tq, tk, d = 3, 11, 37, 32
    q = rng.normal(size=(nb, tq, d))
    kv = rng.normal(size=(nb, tk, d))
    dy = rng.normal(size=(nb, tq, d))
    res = {}
    for dt in (np.float64, np.float32):
        att = nn.InterpretableMultiHeadAttention(d, 4)
        buf = nn.ParameterBuffer(att, dt, 3)  # same seed: the same weights, cast
        out = att.forward(q.astype(dt), kv.astype(dt), offset=offset)
        dq, dkv = att.backward(dy.astype(dt))
        res[dt] = (out, dq, dkv, buf.grads.copy(), att.attention_weights)
    for a, b in zip(res[np.float32], res[np.float64]):
        assert a.dtype == np.float32
        np.testing.assert_allclose(a, b, rtol=2e-4, atol=2e-5 * np.abs(b).max())
    w = res[np.float32][4]  # (B, tq, T): row i sums to 1 over keys j <= offset + i
    for i in range(tq):
        lim = min(offset + i + 1, tk)
        assert np.all(w[:, i, lim:] == 0) and np.all(w[:, i, :lim] > 0)


def test_attention_rejects_negative_offset(rng):
    att = nn.InterpretableMultiHeadAttention(4, 2)
    _build(att)
    x = rng.normal(size=(1, 2, 4))
    with pytest.raises(ValueError, match="offset must be an int >= 0"):
        att.forward(x, x, offset=-1)


def test_attention_checks_d_model_before_any_projection(rng):
    """A key_value of another last dimension was refused by k_proj only after q_proj had
    cached the new query: the next backward then paired the old forward's gradients with the
    new query (a silently wrong q_proj gradient). Now refused first; backward is the old
    forward's, as finite differences give."""
    att = nn.InterpretableMultiHeadAttention(4, 2)
    _build(att)
    q, kv = rng.normal(size=(2, 2, 4)), rng.normal(size=(2, 3, 4))
    _check(att, lambda: (att.forward(q, kv, 1),), lambda r: att.backward(r[0]), [q, kv])
    dy = rng.normal(size=(2, 2, 4))

    def refused():
        for qb, kvb in ((rng.normal(size=(2, 2, 4)), rng.normal(size=(2, 3, 5))),
                        (rng.normal(size=(2, 2, 3)), kv)):  # fmt: skip
            with pytest.raises(ValueError, match=r"must be \(B, tq, 4\) and \(B, T, 4\)"):
                att.forward(qb, kvb, 1)

    for _, g in att.named_grads():
        g[...] = 0
    _refused_forwards_keep_the_last(att, lambda: att.forward(q, kv, 1), dy, refused)


def test_attention_matches_reference(rng):
    att = nn.InterpretableMultiHeadAttention(6, 3)
    _build(att)
    k, tau, dh = 3, 2, 2
    kv = rng.normal(size=(2, k + tau, 6))
    qin = rng.normal(size=(2, tau, 6))
    out = att.forward(qin, kv, offset=k)
    q = qin @ att.q_proj.weight.T + att.q_proj.bias
    kk = kv @ att.k_proj.weight.T + att.k_proj.bias
    v = kv @ att.v_proj.weight.T + att.v_proj.bias
    heads = []
    mask = np.arange(k + tau)[None, :] > (k + np.arange(tau))[:, None]
    for h in range(3):
        s = q[..., h * dh : (h + 1) * dh] @ kk[..., h * dh : (h + 1) * dh].transpose(0, 2, 1)
        s = np.where(mask, -np.inf, s / np.sqrt(dh))
        e = np.exp(s - s.max(-1, keepdims=True))
        heads.append((e / e.sum(-1, keepdims=True)) @ v)
    ref = np.mean(heads, 0) @ att.out_proj.weight.T + att.out_proj.bias
    np.testing.assert_allclose(out, ref, rtol=1e-12, atol=1e-14)


def test_backward_before_forward_raises():
    lin = nn.Linear(2, 2)
    _build(lin)
    with pytest.raises(RuntimeError, match="before forward"):
        lin.backward(np.zeros((1, 2)))


def test_quantile_loss_and_grad(rng):
    q = (0.1, 0.5, 0.9)
    yhat = rng.normal(size=(3, 4, 3))
    y = rng.normal(size=(3, 4))
    e = y[..., None] - yhat
    qq = np.array(q)
    ref = np.mean(qq * np.maximum(e, 0) + (1 - qq) * np.maximum(-e, 0))
    assert nn.quantile_loss(yhat, y, q) == pytest.approx(ref, rel=1e-14)
    g = nn.quantile_loss_grad(yhat, y, q)
    fd = fd_grad(lambda: nn.quantile_loss(yhat, y, q), yhat, eps=1e-7)
    assert rel_err(g, fd) < 1e-6
    # tie: zero subgradient
    y2 = yhat[..., 1].copy()
    assert np.all(nn.quantile_loss_grad(yhat, y2, q)[..., 1] == 0)
    with pytest.raises(ValueError, match="shape"):
        nn.quantile_loss(yhat, y[:, :2], q)
    with pytest.raises(ValueError, match="quantiles"):
        nn.quantile_loss(yhat, y, (0.1, 0.5, 1.0))
    for f in (nn.quantile_loss, nn.quantile_loss_grad, nn.q_risk):  # NaN passed the range test
        with pytest.raises(ValueError, match="quantiles must be"):
            f(yhat, y, (0.1, float("nan"), 0.9))
    for f in (nn.quantile_loss, nn.quantile_loss_grad):  # NaN / ZeroDivisionError before
        with pytest.raises(ValueError, match=r"target is empty \(0, 4\)"):
            f(yhat[:0], y[:0], q)


def test_q_risk(rng):
    q = (0.5, 0.9)
    yhat = rng.normal(size=(5, 3, 2))
    y = rng.normal(size=(5, 3)) + 3
    r = nn.q_risk(yhat, y, q)
    for j, qj in enumerate(q):
        e = y - yhat[..., j]
        ref = 2 * np.sum(np.maximum(qj * e, (qj - 1) * e)) / np.sum(np.abs(y))
        assert r[j] == pytest.approx(ref, rel=1e-13)


def test_backward_refuses_a_gradient_of_another_shape(rng):
    """The compiled backward passes index by the forward's sizes: ELU wrote 256 values into a
    4-element buffer (heap corruption), LayerNorm read rows past a shorter dy (garbage in
    dx and the parameter gradients), the LSTM read dh_n rows it did not have, Linear and the
    VSN took a dy of another leading shape."""
    elu = nn.ELU()
    elu.forward(np.array([[-1.0, 2.0, -3.0, 4.0]], np.float32))
    for dy in (np.ones((64, 4), np.float32), np.float32(1.0), np.ones(4, np.float32)):
        with pytest.raises(ValueError, match=r"ELU.backward: dy must have shape \(1, 4\)"):
            elu.backward(dy)
    ln = nn.LayerNorm(4)
    _build(ln)
    ln.forward(np.arange(12.0).reshape(3, 4))
    with pytest.raises(ValueError, match=r"LayerNorm.backward: dy must have shape \(3, 4\)"):
        ln.backward(np.ones((1, 4)))
    assert not ln.weight_grad.any() and not ln.bias_grad.any()  # nothing accumulated
    lstm = nn.LSTM(3, 4)
    _build(lstm)
    x, h0 = rng.normal(size=(2, 5, 3)), rng.normal(size=(2, 4))
    out, _ = lstm.forward(x, h0, h0)
    for name in ("dh_n", "dc_n"):
        for bad in (np.ones((1, 4)), np.ones(4)):
            with pytest.raises(
                ValueError, match=rf"LSTM.backward: {name} must have shape \(2, 4\)"
            ):
                lstm.backward(np.zeros_like(out), **{name: bad})
    with pytest.raises(ValueError, match=r"dout must have shape \(2, 5, 4\)"):
        lstm.backward(np.zeros((2, 4, 4)))
    assert not lstm.weight_ih_grad.any()
    # Linear took any dy of as many rows: a (L, B, out) gradient for a (B, L, in) input paired
    # its rows with the wrong inputs (silently wrong weight gradient and dx)
    lin = nn.Linear(3, 2)
    _build(lin)
    lin.forward(rng.normal(size=(2, 5, 3)))
    for bad in (np.ones((5, 2, 2)), np.ones((10, 2)), np.ones((1, 2, 5, 2))):
        with pytest.raises(ValueError, match=r"Linear.backward: dy must have shape \(2, 5, 2\)"):
            lin.backward(bad)
    assert not lin.weight_grad.any() and not lin.bias_grad.any()
    # the VSN reshaped any dy of as many values to (N, d): a (L, B, d) dy was taken
    for fold in (True, False):
        vsn = nn.VariableSelectionNetwork(2, 3, fold_embedding=fold)
        _build(vsn)
        vsn.forward(rng.normal(size=(2, 5, 2)))
        for bad in (np.ones((5, 2, 3)), np.ones((10, 3)), np.ones(30)):
            with pytest.raises(
                ValueError,
                match=r"VariableSelectionNetwork.backward: dy must have shape \(2, 5, 3\)",
            ):
                vsn.backward(bad)
        assert not any(g.any() for _, g in vsn.named_grads())


def test_dropout_layers_of_a_model_draw_different_masks():
    """Every Dropout of a user's model had stream 0: identical masks in every layer (only the
    TFT numbered its own); ParameterBuffer, model.train() and set_dropout number them."""
    model = nn.Sequential(nn.Linear(6, 6), nn.Dropout(0.5), nn.ELU(), nn.Dropout(0.5))
    nn.ParameterBuffer(model, seed=0)
    assert [model[1].stream, model[3].stream] == [0, 1]
    nn.set_dropout(model, True, seed=(0, 1))
    x = np.ones((16, 6), np.float32)
    model.forward(x)
    assert not np.array_equal(model[1].mask, model[3].mask)  # 96 draws each at p = 0.5
    setattr(model, "3", nn.Dropout(0.5))  # a replaced layer gets its place's stream back
    model.train()
    assert [model[1].stream, model[3].stream] == [0, 1]
    # each mask is NumPy's stream (seed..., stream): the documented oracle
    nn.set_dropout(model, True, seed=(0, 1))
    model.forward(x)
    for layer, stream in ((model[1], 0), (model[3], 1)):
        keep = np.random.default_rng([0, 1, stream]).random(layer.mask.shape, np.float32) >= 0.5
        np.testing.assert_array_equal(layer.mask != 0, keep)


def test_vsn_casts_its_input_to_the_parameters_dtype_on_both_paths(rng):
    """With float64 parameters and float32 input the folded path computed in float64 and the
    unfolded one in float32 (dtype and precision depended on a fold switch)."""
    x = rng.normal(size=(5, 3)).astype(np.float32)
    outs = []
    for fold in (True, False):
        v = nn.VariableSelectionNetwork(3, 4, fold_embedding=fold)
        nn.ParameterBuffer(v, dtype=np.float64, seed=4)
        y, w = v.forward(x)
        assert y.dtype == w.dtype == np.float64
        y64, _ = v.forward(x.astype(np.float64))  # the float64 input: the same computation
        np.testing.assert_array_equal(y, y64)
        outs.append(y)
    np.testing.assert_allclose(outs[0], outs[1], rtol=1e-13, atol=1e-15)  # the folds' rounding


def test_layers_name_bad_sizes_dtypes_and_shapes(rng):
    """Unhelpful errors before: LayerNorm normalised integers in integers, ELU raised Numba's
    typing error (both a bare NotImplementedError 'float16' for float16), Linear(0, 2) a
    ZeroDivisionError, the attention 'not enough values to unpack' / a reshape error (and
    truncated a float offset), a GRN inside a Sequential an AttributeError on its (dx, None)
    gradient."""
    ln = nn.LayerNorm(4)
    _build(ln)
    with pytest.raises(TypeError, match="LayerNorm input must be float32 or float64, got int64"):
        ln.forward(np.arange(8).reshape(2, 4))
    with pytest.raises(TypeError, match="ELU: x must be float32 or float64, got int64"):
        nn.ELU().forward(np.array([-2, -1, 0, 3]))
    # float16 passed the float-kind checks and reached Numba: NotImplementedError 'float16'
    x16 = rng.normal(size=(2, 4)).astype(np.float16)
    with pytest.raises(TypeError, match="LayerNorm input must be float32 or float64, got float16"):
        ln.forward(x16)
    with pytest.raises(TypeError, match="ELU: x must be float32 or float64, got float16"):
        nn.ELU().forward(x16)
    for args in ((0, 2), (-1, 2), (2, 1.5)):
        with pytest.raises(ValueError, match="Linear: .*_features must be a positive int"):
            nn.Linear(*args)
    # the other layers took int(size): 2.7 made a layer of size 2, LSTM(3, 0) raised a
    # ZeroDivisionError, LayerNorm(0) was built
    for make, match in (
        (lambda: nn.LayerNorm(2.7), "LayerNorm: normalized_shape must be a positive int, got 2.7"),
        (lambda: nn.LayerNorm(0), "LayerNorm: normalized_shape must be a positive int, got 0"),
        (lambda: nn.LSTM(3, 0), "LSTM: hidden_size must be a positive int, got 0"),
        (lambda: nn.LSTM(2.5, 3), "LSTM: input_size must be a positive int, got 2.5"),
        (lambda: nn.InterpretableMultiHeadAttention(4.5, 2), "d_model must be a positive int"),
        (lambda: nn.InterpretableMultiHeadAttention(4, 0), "n_head must be a positive int"),
        (lambda: nn.GatedLinearUnit(3, 1.5), "GatedLinearUnit: output_size must be a positive"),
        (lambda: nn.GatedResidualNetwork(3, 4, 3, 2.2), "GatedResidualNetwork: context_size"),
        (lambda: nn.GatedResidualNetwork(3, True, 3), "GatedResidualNetwork: hidden_size"),
        (lambda: nn.VariableSelectionNetwork(2.9, 4), "VariableSelectionNetwork: num_vars"),
        (lambda: nn.VariableEmbedding(2, -1), "VariableEmbedding: d must be a positive int"),
    ):
        with pytest.raises(ValueError, match=match):
            make()
    assert nn.LSTM(np.int64(3), np.int32(2)).hidden_size == 2  # NumPy integers are sizes
    att = nn.InterpretableMultiHeadAttention(4, 2)
    _build(att)
    kv = rng.normal(size=(2, 3, 4))
    for q, off, match in (
        (rng.normal(size=(2, 4)), 1, r"must be \(B, tq, 4\).*got \(2, 4\) and \(2, 3, 4\)"),
        (rng.normal(size=(1, 2, 4)), 1, r"with one B, got \(1, 2, 4\) and \(2, 3, 4\)"),
        (rng.normal(size=(2, 2, 4)), 1.7, r"offset must be an int >= 0.*got 1.7"),
    ):
        with pytest.raises(ValueError, match=match):
            att.forward(q, kv, off)
    # a GRN (no context) chains in a Sequential: its backward's (dx, None) is dx
    seq = nn.Sequential(nn.Linear(3, 4), nn.GatedResidualNetwork(4, 4, 4))
    _build(seq)
    x = rng.normal(size=(5, 3))
    _check(seq, lambda: (seq.forward(x),), lambda r: (seq.backward(r[0]),), [x])
    vsn = nn.Sequential(nn.VariableSelectionNetwork(3, 4))
    _build(vsn)
    with pytest.raises(TypeError, match=r"layer 0 \(VariableSelectionNetwork\) returned a tuple"):
        vsn.forward(x)


def test_out_arrays_are_checked_before_the_kernel_writes(rng):
    """LayerNorm.forward and Dropout.forward wrote their result through a flat view of
    ``out`` unchecked: a smaller ``out`` (a view into a larger buffer) had the rows past its
    end written (memory outside the view), a non-contiguous one was written as a copy and
    returned unwritten. Now a clear error first; a correct ``out`` gives the result."""
    ln = nn.LayerNorm(3)
    _build(ln)
    drop = nn.Dropout(0.5)
    x = rng.normal(size=(2, 3))
    for layer in (ln, drop):
        name = type(layer).__name__
        ref = layer.forward(x).copy()
        buf = np.zeros(8)
        with pytest.raises(ValueError, match=rf"`{name} out` must have shape \(2, 3\)"):
            layer.forward(x, out=buf[:3].reshape(1, 3))
        np.testing.assert_array_equal(buf, 0.0)  # nothing written past the view
        with pytest.raises(ValueError, match=rf"`{name} out` must be C-contiguous"):
            layer.forward(x, out=np.zeros((2, 6))[:, ::2])
        with pytest.raises(TypeError, match=rf"`{name} out` must have dtype float64"):
            layer.forward(x, out=np.zeros((2, 3), np.float32))
        out = np.empty((2, 3))
        assert layer.forward(x, out=out) is out
        np.testing.assert_array_equal(out, ref)


def test_sequential_backward_after_a_failed_forward_raises(rng):
    """A Sequential whose forward raised in a later layer kept the earlier forward's flag: its
    backward ran the failing layer's old cache and the earlier layers' new ones (here Linear's
    weight gradient accumulated, then ELU refused the mixed-up dy). Now RuntimeError, nothing
    accumulated; a good forward after it works as before."""
    seq = nn.Sequential(nn.ELU(), nn.Linear(3, 2))
    _build(seq)
    x = rng.normal(size=(4, 3))
    seq.forward(x)
    with pytest.raises(ValueError, match="Linear input must have last dimension 3"):
        seq.forward(rng.normal(size=(4, 5)))  # ELU ran (new cache), Linear raised
    with pytest.raises(RuntimeError, match="Sequential.backward called before forward"):
        seq.backward(np.ones((4, 2)))
    assert not seq[1].weight_grad.any() and not seq[1].bias_grad.any()
    _check(seq, lambda: (seq.forward(x),), lambda r: (seq.backward(r[0]),), [x])


def test_selection_and_attention_weights_are_read_only_views(rng):
    """The VSN's returned ``weights`` and the attention's ``attention_weights`` /
    ``attention_probs`` were the very arrays backward reads: an in-place edit by the caller
    (``w *= 100`` for percents) silently changed every gradient. Now read-only views (the
    values and the gradients unchanged; the cache itself stays writeable)."""
    vsn = nn.VariableSelectionNetwork(3, 4)
    _build(vsn)
    x = rng.normal(size=(2, 5, 3))
    _, w = vsn.forward(x)
    assert w is vsn.weights and not w.flags.writeable
    with pytest.raises(ValueError, match="read-only"):
        w *= 100.0
    np.testing.assert_allclose(w.sum(axis=-1), 1.0)
    _check(vsn, lambda: (vsn.forward(x)[0],), lambda r: (vsn.backward(r[0])[0],), [x])
    att = nn.InterpretableMultiHeadAttention(4, 2)
    _build(att)
    q, kv = rng.normal(size=(2, 2, 4)), rng.normal(size=(2, 3, 4))
    att.forward(q, kv, 1)
    for name in ("attention_weights", "attention_probs"):
        with pytest.raises(ValueError, match="read-only"):
            getattr(att, name)[...] = 0.5
    _check(att, lambda: (att.forward(q, kv, 1),), lambda r: att.backward(r[0]), [q, kv])


def test_variable_embedding_checks_its_arrays(rng):
    """VariableEmbedding embedded an integer x in integers (truncated values), reshaped an x of
    another last dimension into rows of num_vars, and its compiled backward read a smaller
    dflat / dpervar out of bounds (garbage, NaN gradients). Now ValueErrors naming the array
    (a TypeError naming the cast for a wrong dtype, as the other layers); a good call matches
    finite differences."""
    emb = nn.VariableEmbedding(2, 3)
    _build(emb)
    for bad in (np.ones((3, 4)), [[1.0, 2.0]]):
        with pytest.raises(ValueError, match=r"VariableEmbedding: x must be a float32/float64"):
            emb.forward(bad)
    # a wrong dtype is a TypeError naming x and the cast, as every other layer's (Linear's)
    for bad in (np.array([[1, 2]]), np.array([[True, False]]), np.ones((3, 2), np.float16)):
        with pytest.raises(
            TypeError, match=r"`x` must be a floating-point.*x\.astype\(np\.float32\)"
        ):
            emb.forward(bad)
        if bad.dtype != np.float16:  # Linear takes float16
            with pytest.raises(TypeError, match=r"x\.astype\(np\.float32\)"):
                nn.Linear(2, 3).forward(bad)
    x = rng.normal(size=(5, 2))
    emb.forward(x)
    for dflat, dpervar, name in (
        (np.ones((1, 6)), np.ones((2, 5, 3)), r"dflat must have shape \(5, 6\)"),
        (np.ones((5, 6)), np.ones((5, 2, 3)), r"dpervar must have shape \(2, 5, 3\)"),
    ):
        with pytest.raises(ValueError, match=name):
            emb.backward(dflat, dpervar)
    assert not emb.weight_grad.any() and not emb.bias_grad.any()
    _check(emb, lambda: emb.forward(x), lambda r: (emb.backward(*r),), [x])


@pytest.mark.parametrize("layer", ["gan", "grn", "grn_ctx"])
def test_bad_out_is_refused_before_the_sub_layers_run(rng, layer):
    """GateAddNorm / GRN passed ``out`` to their final LayerNorm only: a bad ``out`` was
    refused there, after the GLU (and fc1, fc2, ELU) had cached this call's arrays, so the
    next backward mixed two forwards (silently wrong gradients). Now refused first."""
    mod = {
        "gan": lambda: nn.GateAddNorm(3, 4),
        "grn": lambda: nn.GatedResidualNetwork(3, 5, 4),
        "grn_ctx": lambda: nn.GatedResidualNetwork(3, 5, 4, 2),
    }[layer]()
    _build(mod)
    args = [rng.normal(size=(2, 6, 3))]
    args.append(rng.normal(size=(2, 6, 4)) if layer == "gan" else None)
    if layer == "grn_ctx":
        args[1] = rng.normal(size=(2, 2))
    dy = rng.normal(size=(2, 6, 4))
    new = [rng.normal(size=a.shape) if a is not None else None for a in args]

    def refused():
        for bad, err in ((np.empty((2, 6, 4), np.float32), TypeError),
                         (np.empty((2, 6, 5)), ValueError),
                         (np.empty((2, 6, 8))[..., ::2], ValueError)):  # fmt: skip
            with pytest.raises(err, match="LayerNorm out"):
                mod.forward(*new, out=bad)

    _refused_forwards_keep_the_last(mod, lambda: mod.forward(*args), dy, refused)
    out = np.empty((2, 6, 4))
    assert mod.forward(*args, out=out) is out


@pytest.mark.parametrize("fold", [True, False])
def test_vsn_bad_context_leaves_the_last_forward(rng, fold):
    """The VSN checked its context only inside flat_grn, after the embedding had cached the new
    x (unfolded path): the next backward paired the old forward with the new x (a silently
    wrong embedding gradient). Now the context is checked first."""
    vsn = nn.VariableSelectionNetwork(3, 4, 2, fold_embedding=fold)
    _build(vsn)
    x, c, dy = rng.normal(size=(2, 5, 3)), rng.normal(size=(2, 2)), rng.normal(size=(2, 5, 4))

    def refused():
        for bad in (rng.normal(size=(3, 2)), None):
            with pytest.raises(ValueError, match="context"):
                vsn.forward(rng.normal(size=(2, 5, 3)), bad)

    _refused_forwards_keep_the_last(vsn, lambda: vsn.forward(x, c), dy, refused)


def test_assigning_a_parameter_attribute_is_refused(rng):
    """``layer.weight = w`` (torch's habit) rebound the attribute to a new array: forward read
    it while the optimizer kept updating the flat buffer, so the layer silently never trained
    (and gradients went to the buffer's view). Now an AttributeError naming the in-place
    spelling, which works; ``+=`` on the view (every backward) still works."""
    from nbqat import SGD

    lin = nn.Linear(2, 1)
    buf = _build(lin)
    for name in ("weight", "bias", "weight_grad"):
        with pytest.raises(AttributeError, match=rf"Linear.{name} is a view .* {name}\[\.\.\.\]"):
            setattr(lin, name, np.ones(getattr(lin, name).shape))
    with pytest.raises(AttributeError, match="LSTM.weight_hh is a view"):
        nn.LSTM(2, 3).weight_hh = np.zeros((12, 3))  # before any buffer too
    lin.weight[...] = 1.0
    assert np.shares_memory(lin.weight, buf.params)
    opt = SGD(buf.params, lr=0.5)
    x = rng.normal(size=(4, 2))
    buf.zero_grad()
    lin.backward(np.ones((4, 1)) + 0 * lin.forward(x))
    opt.step(buf.grads)
    np.testing.assert_allclose(lin.weight, 1.0 - 0.5 * x.sum(axis=0)[None, :])


def test_named_parameters_recurse_false_gives_a_modules_own_parameters(torch):
    """The public accessor of a module's own parameters (prepare_qat read the private
    ``Module._param_specs``); oracle: torch's named_parameters(recurse=False) on the same tree."""
    model = nn.Sequential(nn.Linear(3, 4), nn.ELU(), nn.LayerNorm(4))
    nn.ParameterBuffer(model)
    ref = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ELU(), torch.nn.LayerNorm(4))
    for (name, mod), (tname, tmod) in zip(model.named_modules(), ref.named_modules()):
        own = [(n, p.shape) for n, p in mod.named_parameters(recurse=False)]
        want = [(n, tuple(p.shape)) for n, p in tmod.named_parameters(recurse=False)]
        assert name == tname and own == want, name
        with_prefix = [n for n, _ in mod.named_parameters("m", recurse=False)]
        assert with_prefix == [f"m.{n}" for n, _ in want]
    assert [n for n, _ in model.named_parameters()] == [n for n, _ in ref.named_parameters()]


def test_any_model_has_torchs_state_dict_and_load_state_dict(torch, rng):
    """Module.state_dict / load_state_dict on a Sequential (the TFT had the only pair): the
    keys and shapes of torch's state_dict of the same tree; torch's own state_dict, converted,
    loads and gives torch's output; strict=False returns torch's (missing, unexpected) keys;
    a refused load writes nothing."""
    from nbqat.npz_state import CheckpointError

    model = nn.Sequential(nn.Linear(3, 4), nn.ELU(), nn.LayerNorm(4), nn.Linear(4, 2))
    buf = nn.ParameterBuffer(model, seed=0)
    ref = torch.nn.Sequential(
        torch.nn.Linear(3, 4), torch.nn.ELU(), torch.nn.LayerNorm(4), torch.nn.Linear(4, 2)
    )
    sd = model.state_dict()
    tsd = {k: v.detach().numpy() for k, v in ref.state_dict().items()}
    assert [(k, v.shape) for k, v in sd.items()] == [(k, v.shape) for k, v in tsd.items()]
    sd["0.weight"][...] = 7.0  # copies, not views
    assert not np.any(model[0].weight == 7.0)
    params = buf.params
    assert model.load_state_dict(tsd) == ([], [])
    assert buf.params is params
    x = rng.standard_normal((5, 3)).astype(np.float32)
    want = ref(torch.from_numpy(x)).detach().numpy()
    np.testing.assert_allclose(model(x), want, rtol=1e-5, atol=1e-6)
    partial = {k: v for k, v in tsd.items() if k != "3.bias"}
    partial["extra"] = np.zeros(1)
    t_keys = ref.load_state_dict(
        {k: torch.from_numpy(np.array(v)) for k, v in partial.items()}, strict=False
    )
    assert model.load_state_dict(partial, strict=False) == (
        t_keys.missing_keys,
        t_keys.unexpected_keys,
    )
    before = buf.params.copy()
    with pytest.raises(CheckpointError, match="missing key"):
        model.load_state_dict(partial)
    bad = {**tsd, "0.weight": tsd["0.weight"] + 1, "3.bias": np.zeros(3)}
    with pytest.raises(CheckpointError, match="size mismatch for 3.bias"):
        model.load_state_dict(bad)
    with pytest.raises(TypeError, match="expected real numbers"):
        model.load_state_dict({**bad, "3.bias": np.zeros(2, complex)})
    np.testing.assert_array_equal(buf.params, before)
