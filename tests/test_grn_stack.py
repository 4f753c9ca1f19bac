"""GRNStack (the VSN's per-variable GRNs as one batched pass) against m per-GRN calls, bit for
bit, and the zero-copy stacked parameter views it reads through."""

import numpy as np
import pytest

from nbqat import nn
from nbqat.nn.layers.gating import FOLD_MIN_ROWS_PER_OUTPUT
from nbqat.nn.layers.grn_stack import GRNStack
from nbqat.nn.params import ModuleList, ParameterBuffer, stacked_view


class _IdentityHook:
    """A quantization hook that changes nothing (Linear's hook protocol)."""

    ctx = None

    def forward(self, x):
        return x

    def backward(self, grad, ctx):
        return grad


def _grns(m, d, dtype, dropout):
    grns = ModuleList([nn.GatedResidualNetwork(d, d, d) for _ in range(m)])
    if dropout:
        for j, g in enumerate(grns):
            g.gate.glu.dropout = nn.Dropout(dropout)
            g.gate.glu.dropout.stream = 7 + j
    buf = ParameterBuffer(grns, dtype, seed=3)
    nn.set_dropout(grns, True, (5, 1, 2))
    return grns, buf


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("fold_rows", [False, True], ids=["fc2_separate", "fc2_folded"])
@pytest.mark.parametrize("dropout", [0.0, 0.3], ids=["no_dropout", "dropout"])
def test_stack_is_per_grn_bit_for_bit(rng, dtype, fold_rows, dropout):
    m, d = 3, 4
    n = FOLD_MIN_ROWS_PER_OUTPUT * d + (5 if fold_rows else -1)  # fold needs 4 C rows
    grns, buf = _grns(m, d, dtype, dropout)
    z = rng.normal(size=(m, n, d)).astype(dtype)
    skip = rng.normal(size=(m, n, d)).astype(dtype)
    bias = rng.normal(size=(m, d)).astype(dtype)
    dy = rng.normal(size=(m, n, d)).astype(dtype)
    # the oracle: each GRN's own forward_projected / backward_projected
    z_ref = z.copy()
    out_ref = np.stack(
        [g.forward_projected(z_ref[j], skip[j], bias=bias[j]) for j, g in enumerate(grns)]
    )
    back = [g.backward_projected(dy[j]) for j, g in enumerate(grns)]
    folded = grns[0]._cache[3] is not None
    assert folded == (fold_rows and not dropout)
    grads_ref = buf.grads.copy()
    stack = GRNStack(list(grns))
    for _ in range(2):  # a second step reuses the work buffers
        buf.zero_grad()
        zs = z.copy()
        out = np.empty_like(skip)
        assert stack.forward(zs, skip, bias, out) is out
        dz, dskip = stack.backward(dy)
        np.testing.assert_array_equal(out, out_ref)
        np.testing.assert_array_equal(zs, z_ref)  # the pre-activation, as forward_projected
        np.testing.assert_array_equal(dz, np.stack([b[0] for b in back]))
        np.testing.assert_array_equal(dskip, np.stack([b[1] for b in back]))
        np.testing.assert_array_equal(buf.grads, grads_ref)
    for name, g in grns.named_grads():
        if ".fc1." in "." + name:
            assert not g.any(), name  # fc1 is the caller's (the VSN folds it)


@pytest.mark.parametrize("fold_rows", [False, True], ids=["fc2_separate", "fc2_folded"])
@pytest.mark.parametrize("dropout", [0.0, 0.3], ids=["no_dropout", "dropout"])
def test_stack_on_a_shared_input_is_per_grn_bit_for_bit(rng, fold_rows, dropout):
    """forward_shared / backward_shared (the TFT's static contexts) against grns[j].forward(a)
    and .backward(dy[j]), fc1 included, float32."""
    m, d = 4, 4
    n = FOLD_MIN_ROWS_PER_OUTPUT * d + (3 if fold_rows else -2)
    grns, buf = _grns(m, d, np.float32, dropout)
    a = rng.normal(size=(n, d)).astype(np.float32)
    dy = rng.normal(size=(m, n, d)).astype(np.float32)
    out_ref = np.stack([g.forward(a) for g in grns])
    da_ref = np.stack([g.backward(dy[j])[0] for j, g in enumerate(grns)])
    grads_ref = buf.grads.copy()
    stack = GRNStack(list(grns))
    for _ in range(2):
        buf.zero_grad()
        np.testing.assert_array_equal(stack.forward_shared(a), out_ref)
        np.testing.assert_array_equal(stack.backward_shared(dy), da_ref)
        np.testing.assert_array_equal(buf.grads, grads_ref)
    ones, zeros = np.ones((m, n, d), np.float32), np.zeros((m, d), np.float32)
    stack.forward(ones, a[None].repeat(m, 0), zeros, np.empty((m, n, d), np.float32))
    with pytest.raises(RuntimeError, match="before forward_shared"):
        stack.backward_shared(dy)  # the last forward had no shared input


def test_tft_runs_its_static_contexts_as_a_stack_while_plain(rng):
    """The TFT's four static-context GRNs run stacked in the float model and one by one once
    a hook is attached; with the folds off both give the same bits."""
    cfg = nn.TFTConfig(2, 3, 2, 4, 5, 3, num_heads=2)
    stacked, single = (nn.TemporalFusionTransformer(cfg, seed=1) for _ in range(2))
    for model in (stacked, single):
        model.set_folding(False)
    single.static_context_enrichment.fc2.weight_fake_quant = _IdentityHook()
    x = (rng.normal(size=(3, 2)), rng.normal(size=(3, 5, 2)), rng.normal(size=(3, 3, 3)))
    x = tuple(v.astype(np.float32) for v in x)
    outs = []
    for model in (stacked, single):
        model.zero_grad()
        y = model.forward(*x)
        dx = model.backward(np.ones_like(y))
        outs.append((y, dx, model.grads.copy()))
    assert stacked._contexts_stacked and not single._contexts_stacked
    for u, v in zip(outs[0], outs[1]):
        for a, b in zip(u if isinstance(u, tuple) else (u,), v if isinstance(v, tuple) else (v,)):
            np.testing.assert_array_equal(a, b)


def test_stack_bad_input_is_a_clear_error_before_anything_is_written(rng):
    grns, buf = _grns(2, 3, np.float32, 0.0)
    stack = GRNStack(list(grns))
    z, skip, bias = (np.ones((2, 5, 3), np.float32) for _ in range(3))
    out = np.zeros((2, 5, 3), np.float32)
    bad = [
        ("z", (np.ones((2, 5, 4), np.float32), skip, bias[:, 0], out)),
        ("skip", (z, np.ones((2, 5, 3)), bias[:, 0], out)),  # float64
        ("out", (z, skip, bias[:, 0], np.zeros((2, 5, 3), np.float32)[:, ::-1])),
        ("bias", (z, skip, np.ones((3, 3), np.float32), out)),
    ]
    for name, args in bad:
        with pytest.raises(ValueError, match=f"forward: {name} must be"):
            stack.forward(*args)
        assert not out.any() and (z == 1).all()  # nothing written
    with pytest.raises(ValueError, match="a must be"):
        stack.forward_shared(np.ones((5, 4), np.float32))
    stack.forward(z, skip, bias[:, 0], out)
    with pytest.raises(ValueError, match="dy must be"):
        stack.backward(np.ones((2, 4, 3), np.float32))
    assert not buf.grads.any()


def test_stack_backward_before_forward():
    grns, _ = _grns(2, 3, np.float64, 0.0)
    with pytest.raises(RuntimeError, match="before forward"):
        GRNStack(list(grns)).backward(np.zeros((2, 4, 3)))


def test_stack_supports_only_plain_context_free_grns():
    grns, _ = _grns(2, 3, np.float64, 0.0)
    assert GRNStack.supports(list(grns))
    assert not GRNStack.supports([])
    ctx = ModuleList([nn.GatedResidualNetwork(3, 3, 3, context_size=2) for _ in range(2)])
    ParameterBuffer(ctx)
    assert not GRNStack.supports(list(ctx))
    wide = ModuleList([nn.GatedResidualNetwork(2, 3, 3) for _ in range(2)])
    ParameterBuffer(wide)
    assert not GRNStack.supports(list(wide))  # a Linear skip
    apart = [nn.GatedResidualNetwork(3, 3, 3) for _ in range(2)]
    for g in apart:
        ParameterBuffer(g)  # two buffers: no stacked view
    assert not GRNStack.supports(apart)
    with pytest.raises(ValueError, match="plain"):
        GRNStack(apart)
    stack = GRNStack(list(grns))
    assert stack.ready()
    grns[1].fc2.weight_fake_quant = _IdentityHook()  # the GRN is no longer plain
    assert not stack.ready()


def test_vsn_runs_its_var_grns_as_a_stack_until_a_hook_is_attached(rng):
    vsn = nn.VariableSelectionNetwork(3, 4)
    ParameterBuffer(vsn, np.float64)
    x = rng.normal(size=(5, 3))
    folded, _ = vsn.forward(x)
    assert vsn._stack is not None and vsn._stack.ready()
    ref = nn.VariableSelectionNetwork(3, 4, fold_embedding=False)
    ParameterBuffer(ref, np.float64)
    np.testing.assert_allclose(folded, ref.forward(x)[0], rtol=1e-12, atol=1e-14)
    vsn.var_grns[2].fc2.weight_fake_quant = _IdentityHook()
    np.testing.assert_allclose(vsn.forward(x)[0], folded, rtol=1e-12, atol=1e-14)
    assert vsn._stack is None  # the materialised path ran


def test_vsn_follows_a_replaced_var_grn(rng):
    vsn = nn.VariableSelectionNetwork(3, 4)
    ParameterBuffer(vsn, np.float64)
    x = rng.normal(size=(5, 3))
    vsn.forward(x)
    new = nn.GatedResidualNetwork(4, 4, 4)
    ParameterBuffer(new, np.float64, seed=9)  # its own buffer: no stacked view
    setattr(vsn.var_grns, "1", new)
    out = vsn.forward(x)[0]
    assert vsn._stack is None  # the per-GRN (materialised) path ran, with the new GRN
    vsn.fold_embedding = False
    np.testing.assert_allclose(out, vsn.forward(x)[0], rtol=1e-12, atol=1e-14)


def test_stacked_view_writes_through_and_refuses_uneven_arrays():
    buf = np.arange(20.0)
    parts = [buf[2 + 6 * j : 6 + 6 * j].reshape(2, 2) for j in range(3)]  # every 6, size 4
    v = stacked_view(parts)
    assert v is not None and v.shape == (3, 2, 2)
    np.testing.assert_array_equal(v, np.stack(parts))
    v[1] += 100.0
    assert parts[1][0, 0] == 108.0 and buf[8] == 108.0
    assert stacked_view(parts[:1]).shape == (1, 2, 2)
    assert stacked_view([parts[0], parts[2]]) is not None  # evenly spaced, every 12
    assert stacked_view([parts[0], parts[1], parts[1]]) is None  # uneven
    assert stacked_view([parts[1], parts[0]]) is None  # reversed
    assert stacked_view([parts[0], parts[1].copy()]) is None  # another buffer
    assert stacked_view([buf[0:4], buf[2:6]]) is None  # overlapping
    assert stacked_view([buf[0:4].reshape(2, 2), buf[4:8]]) is None  # another shape
