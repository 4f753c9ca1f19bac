"""nbqat.choose_qparams_affine / fake_quantize_affine(_cachemask, _backward) against torchao
0.18 (float32 bits) and torch autograd of torchao's formula."""

from __future__ import annotations

import numpy as np
import pytest
from ref_lowbit import assert_same_bits, load_quant_primitives

import nbqat
from nbqat.quantization import _blocks

RANGES = [
    ("symmetric", -8, 7),
    ("asymmetric", 0, 15),
    ("symmetric", 0, 15),
    ("asymmetric", -128, 127),
    ("symmetric", -128, 127),
]
# (shape, block_size): per tensor, per channel (rows), per column, per group 32, a
# non-power-of-2 group, 2-D tiles, per token on a 3-D tensor
LAYOUTS = [
    ((6, 64), (6, 64)),
    ((6, 64), (1, 64)),
    ((6, 64), (6, 1)),
    ((6, 64), (1, 32)),
    ((5, 72), (1, 24)),
    ((6, 64), (2, 16)),
    ((2, 3, 40), (1, 1, 40)),
]


@pytest.fixture(scope="module")
def qp(torch):
    return load_quant_primitives()


def _data(shape, seed=0):
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(shape) * rng.choice([1e-3, 1.0, 40.0], shape)).astype(np.float32)
    flat = x.reshape(-1)
    flat[:8] = [0.0, -0.0, 1e-30, -1e-38, 3e4, -7.5, 0.5, 1.5]  # zeros, tiny, huge, ties
    x[(0,) * (x.ndim - 1)] = 0.0  # an all-zero row
    return x


def _torch_qparams(torch, qp, x, mt, bs, qmin, qmax, eps=None):
    m = getattr(qp.MappingType, mt.upper())
    return qp.choose_qparams_affine(torch.from_numpy(x), m, bs, torch.int32, qmin, qmax, eps)


@pytest.mark.parametrize(("shape", "bs"), LAYOUTS)
@pytest.mark.parametrize(("mt", "qmin", "qmax"), RANGES)
def test_matches_torchao(torch, qp, shape, bs, mt, qmin, qmax):
    x = _data(shape)
    s, z = nbqat.choose_qparams_affine(x, mt, bs, qmin, qmax)
    ts, tz = _torch_qparams(torch, qp, x, mt, bs, qmin, qmax)
    assert s.shape == tuple(ts.shape) and s.dtype == np.float32 and z.dtype == np.int32
    assert_same_bits(s, ts.numpy(), "scale")
    np.testing.assert_array_equal(z, tz.numpy())
    y, mask = nbqat.fake_quantize_affine_cachemask(x, bs, s, z, qmin, qmax)
    ty = qp._fake_quantize_affine(torch.from_numpy(x), bs, ts, tz, torch.int32, qmin, qmax)
    assert_same_bits(y, ty.numpy(), "y")
    assert_same_bits(nbqat.fake_quantize_affine(x, bs, s, z, qmin, qmax), y, "y (no mask)")
    # the mask is autograd's: where the gradient of torchao's formula reaches x
    xt = torch.from_numpy(x).requires_grad_()
    qp._fake_quantize_affine(xt, bs, ts, tz, torch.int32, qmin, qmax).sum().backward()
    np.testing.assert_array_equal(mask, xt.grad.numpy() != 0)


def test_ties_round_half_even(torch, qp):
    s = np.full((4,), 0.25, np.float32)  # exact power of two: x * inv lands on .5 exactly
    x = (np.arange(-16, 16, dtype=np.float32).reshape(4, 8) + np.float32(0.5)) * np.float32(0.25)
    z = np.array([0, 3, -2, 8], np.int32)
    y = nbqat.fake_quantize_affine(x, (1, 8), s, z, -8, 7)
    ty = qp._fake_quantize_affine(
        torch.from_numpy(x), (1, 8), torch.from_numpy(s), torch.from_numpy(z), torch.int32, -8, 7
    )
    assert_same_bits(y, ty.numpy(), "ties")


def test_nan_inf(torch, qp):
    x = _data((4, 16), 1)
    x[1, 3], x[2, 0], x[2, 5], x[3, 7] = np.nan, np.inf, -np.inf, np.nan
    for mt in ("symmetric", "asymmetric"):
        s, z = nbqat.choose_qparams_affine(x, mt, (1, 8), -8, 7)
        ts, tz = _torch_qparams(torch, qp, x, mt, (1, 8), -8, 7)
        assert_same_bits(s, ts.numpy(), mt)
        np.testing.assert_array_equal(z, tz.numpy())  # NaN scale: zero point -2**31 (x86)
    s = np.linspace(0.01, 0.2, 8).astype(np.float32).reshape(4, 2)
    s[0, 1] = np.inf  # torchao's IEEE results for an infinite scale too
    z = np.zeros((4, 2), np.int32)
    y, mask = nbqat.fake_quantize_affine_cachemask(x, (1, 8), s, z, -8, 7)
    t = (torch.from_numpy(x), (1, 8), torch.from_numpy(s), torch.from_numpy(z), torch.int32)
    assert_same_bits(y, qp._fake_quantize_affine(*t, -8, 7).numpy(), "nan/inf")
    assert not mask[np.isnan(x) | np.isinf(x)].any()


def test_eps_and_qparam_shapes(torch, qp):
    x = _data((4, 32), 2)
    s, z = nbqat.choose_qparams_affine(x, "asymmetric", (1, 32), 0, 15, eps=1e-2)
    ts, tz = _torch_qparams(torch, qp, x, "asymmetric", (1, 32), 0, 15, eps=1e-2)
    assert_same_bits(s, ts.numpy(), "eps")
    y = nbqat.fake_quantize_affine(x, (1, 32), s, z, 0, 15)
    for shape in [(4, 1), (1, 4, 1), (4,)]:  # x.shape // block_size and keepdim forms
        y2 = nbqat.fake_quantize_affine(x, (1, 32), s.reshape(shape), z.reshape(shape), 0, 15)
        assert_same_bits(y2, y, str(shape))
    s0, _ = nbqat.choose_qparams_affine(x, "symmetric", x.shape, -8, 7)
    assert s0.shape == ()


def test_backward_matches_autograd(torch, qp):
    x = _data((6, 48), 3)
    x[2, 4] = 90.0  # far outside the grid: masked
    s, z = nbqat.choose_qparams_affine(x, "asymmetric", (1, 16), 0, 15)
    s = s * np.float32(0.7)  # so that some values clip
    g = np.random.default_rng(4).standard_normal(x.shape).astype(np.float32)
    dx, ds, dz = nbqat.fake_quantize_affine_backward(g, x, (1, 16), s, z, 0, 15)
    xt = torch.from_numpy(x).requires_grad_()
    st = torch.from_numpy(s).requires_grad_()
    zt = torch.from_numpy(z.astype(np.float32)).requires_grad_()
    y = qp._fake_quantize_affine(xt, (1, 16), st, zt, torch.int32, 0, 15)
    y.backward(torch.from_numpy(g))
    assert_same_bits(dx, xt.grad.numpy(), "grad_x")
    assert ds.shape == s.shape and dz.shape == z.shape
    np.testing.assert_allclose(ds, st.grad.numpy(), rtol=2e-5, atol=1e-4)
    np.testing.assert_allclose(dz, zt.grad.numpy(), rtol=2e-5, atol=1e-5)
    assert (dz != 0).any() and (dx == 0).any()


def test_pieces_and_threads_deterministic(torch, qp, monkeypatch, force_parallel):
    monkeypatch.setattr(_blocks, "UNIT", 24)  # segments cut into pieces, several per item
    x = _data((3, 200), 5)
    for bs in [(3, 200), (1, 100), (1, 8)]:
        s, z = nbqat.choose_qparams_affine(x, "asymmetric", bs, -8, 7)
        ts, tz = _torch_qparams(torch, qp, x, "asymmetric", bs, -8, 7)
        assert_same_bits(s, ts.numpy(), str(bs))
        np.testing.assert_array_equal(z, tz.numpy())
        y = nbqat.fake_quantize_affine(x, bs, s, z, -8, 7)
        ty = qp._fake_quantize_affine(torch.from_numpy(x), bs, ts, tz, torch.int32, -8, 7)
        assert_same_bits(y, ty.numpy(), str(bs))
        g = np.ones_like(x)
        r1 = nbqat.fake_quantize_affine_backward(g, x, bs, s, z, -8, 7)
        monkeypatch.setattr(_blocks, "UNIT", 1 << 14)
        r2 = nbqat.fake_quantize_affine_backward(g, x, bs, s, z, -8, 7)
        monkeypatch.setattr(_blocks, "UNIT", 24)
        for a, b in zip(r1, r2):
            np.testing.assert_allclose(a, b, rtol=1e-6)


def test_out_in_place_and_mask_buffer():
    x = _data((4, 16), 6)
    s, z = nbqat.choose_qparams_affine(x, "symmetric", (1, 8), -8, 7)
    want, wmask = nbqat.fake_quantize_affine_cachemask(x, (1, 8), s, z, -8, 7)
    mask = np.zeros(x.shape, bool)
    y, m = nbqat.fake_quantize_affine_cachemask(x, (1, 8), s, z, -8, 7, out=x, mask=mask)
    assert y is x and m is mask
    assert_same_bits(x, want, "in place")
    np.testing.assert_array_equal(mask, wmask)


@pytest.mark.parametrize(
    ("kwargs", "err", "word"),
    [
        ({"block_size": (1, 8, 1)}, ValueError, "block_size"),
        ({"block_size": (1, 5)}, ValueError, "block_size"),
        ({"block_size": (1, 0)}, ValueError, "block_size"),
        ({"block_size": "ab"}, TypeError, "block_size"),
        ({"scale": np.ones((2, 4), np.float32)}, ValueError, "scale"),
        ({"scale": np.ones((4, 2), np.int32)}, TypeError, "scale"),
        ({"zero_point": np.zeros((8,), np.int32)}, ValueError, "zero_point"),
        ({"x": np.zeros((4, 16), np.float64)}, TypeError, "x"),
        ({"quant_min": 7}, ValueError, "quant_min"),
    ],
)
def test_errors_before_any_write(kwargs, err, word):
    args = {
        "x": np.ones((4, 16), np.float32),
        "block_size": (1, 8),
        "scale": np.ones((4, 2), np.float32),
        "zero_point": np.zeros((4, 2), np.int32),
        "quant_min": -8,
        "quant_max": 7,
    }
    args.update(kwargs)
    out = np.full((4, 16), 5.0, np.float32)
    with pytest.raises(err, match=word):
        nbqat.fake_quantize_affine(**args, out=out)
    assert (out == 5.0).all()


def test_choose_errors():
    x = np.ones((4, 16), np.float32)
    with pytest.raises(ValueError, match="mapping_type"):
        nbqat.choose_qparams_affine(x, "sym", (1, 8), -8, 7)
    with pytest.raises(ValueError, match="empty"):
        nbqat.choose_qparams_affine(np.ones((0, 8), np.float32), "symmetric", (1, 8), -8, 7)
    with pytest.raises(ValueError, match="eps"):
        nbqat.choose_qparams_affine(x, "symmetric", (1, 8), -8, 7, eps=-1.0)
