"""nbqat.choose_scale_float8 / fake_quantize_float8(_cachemask) against torchao 0.18 and torch's
float8 casts, float32 bit for bit (NaN equal to NaN)."""

from __future__ import annotations

import numpy as np
import pytest
from numba import njit
from ref_lowbit import assert_same_bits, load_quant_primitives

import nbqat
from nbqat.kernels.lowbit_formula import E4M3FN, E5M2, round_float8

FORMATS = [("float8_e4m3fn", E4M3FN), ("float8_e5m2", E5M2)]


@pytest.fixture(scope="module")
def qp(torch):
    return load_quant_primitives()


@njit
def _cast(x, fmt):
    out = np.empty_like(x)
    for i in range(x.size):
        out[i] = round_float8(x[i], fmt)
    return out


def _near_codes(torch, dt):
    """Every float8 value, the midpoints between neighbours and +-1 ulp around each, past the
    largest value, subnormals, +-0, +-Inf and NaN, both signs."""
    codes = torch.arange(256, dtype=torch.uint8).view(dt).float().numpy()
    fin = np.unique(codes[np.isfinite(codes)])
    mid = ((fin[:-1].astype(np.float64) + fin[1:]) / 2).astype(np.float32)
    top = fin[-1]
    past = np.array([top * 1.0625, top * 1.125, top * 1.2, top * 2, 1e30, 3.4e38], np.float32)
    tiny = np.array([1e-45, 1e-40, 2.0**-20, 0.0, np.inf, np.nan], np.float32)
    v = np.concatenate([fin, mid, past, tiny])
    v = np.concatenate(
        [v, np.nextafter(v, np.float32(np.inf)), np.nextafter(v, np.float32(-np.inf))]
    )
    return np.concatenate([v, -v]).astype(np.float32)


@pytest.mark.parametrize(("name", "fmt"), FORMATS)
def test_cast_matches_torch(torch, name, fmt):
    dt = getattr(torch, name)
    rng = np.random.default_rng(7)
    rnd = rng.integers(0, 2**32, 1 << 18, dtype=np.uint64).astype(np.uint32).view(np.float32)
    x = np.concatenate([_near_codes(torch, dt), rnd])
    assert_same_bits(_cast(x, fmt), torch.from_numpy(x).to(dt).float().numpy(), name)


@pytest.mark.parametrize(("name", "fmt"), FORMATS)
def test_fake_quant_every_code_scale_one(torch, qp, name, fmt):
    dt = getattr(torch, name)
    x = _near_codes(torch, dt)
    s = np.ones(1, np.float32)
    y, mask = nbqat.fake_quantize_float8_cachemask(x, s, name)
    ts = torch.from_numpy(s)
    ty = qp._dequantize_affine_float8(qp._quantize_affine_float8(torch.from_numpy(x), ts, dt), ts)
    assert_same_bits(y, ty.numpy(), name)
    top = np.float32(448.0 if fmt == E4M3FN else 57344.0)
    np.testing.assert_array_equal(mask, np.abs(x) <= top)


LAYOUTS = [
    ((6, 64), (6, 64)),
    ((6, 64), (1, 64)),
    ((6, 64), (1, 32)),
    ((6, 64), (2, 16)),
    ((2, 3, 40), (1, 1, 40)),
    ((5, 72), (1, 24)),
]


@pytest.mark.parametrize(("shape", "bs"), LAYOUTS)
@pytest.mark.parametrize("name", ["float8_e4m3fn", "float8_e5m2"])
def test_matches_torchao(torch, qp, shape, bs, name):
    dt = getattr(torch, name)
    rng = np.random.default_rng(8)
    x = (rng.standard_normal(shape) * rng.choice([1e-6, 1.0, 1e4], shape)).astype(np.float32)
    x.reshape(-1)[:6] = [0.0, -0.0, 1e-42, -3e38, 2.0**-12, 448.0]
    s = nbqat.choose_scale_float8(x, bs, name)
    ts = qp._choose_scale_float8(torch.from_numpy(x), bs, dt)
    assert s.shape == tuple(ts.shape)
    assert_same_bits(s, ts.numpy(), "scale")
    y = nbqat.fake_quantize_float8(x, s, name)
    ty = qp._dequantize_affine_float8(qp._quantize_affine_float8(torch.from_numpy(x), ts, dt), ts)
    assert_same_bits(y, ty.numpy(), "y")


def test_nan_blocks_like_torchao(torch, qp):
    """Inf, NaN or all zeros in a block make the whole block NaN in torchao: reproduced."""
    x = np.random.default_rng(9).standard_normal((4, 8)).astype(np.float32)
    x[0, 2], x[1, :], x[2, 5] = np.inf, 0.0, np.nan
    dt = torch.float8_e4m3fn
    for lb in (None, 1e-12):
        s = nbqat.choose_scale_float8(x, (1, 8), "float8_e4m3fn", hp_value_lb=lb)
        ts = qp._choose_scale_float8(torch.from_numpy(x), [1, 8], dt, hp_value_lb=lb)
        assert_same_bits(s, ts.numpy(), "scale")
        y = nbqat.fake_quantize_float8(x, s, "float8_e4m3fn")
        tq = qp._quantize_affine_float8(torch.from_numpy(x), ts, dt)
        assert_same_bits(y, qp._dequantize_affine_float8(tq, ts).numpy(), "y")
    assert np.isnan(y[[0, 2]]).all() and not np.isnan(y[3]).any()


def test_hp_bounds(torch, qp):
    x = np.random.default_rng(10).standard_normal((4, 16)).astype(np.float32)
    s = nbqat.choose_scale_float8(x, (1, 16), "float8_e5m2", hp_value_lb=0.5, hp_value_ub=1.5)
    ts = qp._choose_scale_float8(
        torch.from_numpy(x), [1, 16], torch.float8_e5m2, hp_value_lb=0.5, hp_value_ub=1.5
    )
    assert_same_bits(s, ts.numpy(), "bounded scale")


def test_mask_is_autograd(torch, qp):
    x = np.random.default_rng(11).standard_normal((4, 16)).astype(np.float32) * 10
    s = np.full((4, 1), 0.01, np.float32)  # most values clip
    y, mask = nbqat.fake_quantize_float8_cachemask(x, s, "float8_e4m3fn")
    xt = torch.from_numpy(x).requires_grad_()
    q = qp._quantize_affine_float8(xt, torch.from_numpy(s), torch.float8_e4m3fn)
    qp._dequantize_affine_float8(q, torch.from_numpy(s)).sum().backward()
    np.testing.assert_array_equal(mask, xt.grad.numpy() != 0)
    assert mask.any() and not mask.all()


def test_errors():
    x = np.ones((4, 16), np.float32)
    with pytest.raises(ValueError, match="dtype"):
        nbqat.fake_quantize_float8(x, np.ones(1, np.float32), "float8_e4m3fnuz")
    with pytest.raises(ValueError, match="scale"):
        nbqat.fake_quantize_float8(x, np.ones((3, 1), np.float32), "float8_e4m3fn")
    with pytest.raises(ValueError, match="scale"):
        nbqat.fake_quantize_float8(x, np.ones((4,), np.float32), "float8_e4m3fn")
    with pytest.raises(ValueError, match="block_size"):
        nbqat.choose_scale_float8(x, (1, 3), "float8_e5m2")
    with pytest.raises(TypeError, match="x"):
        nbqat.choose_scale_float8(x.astype(np.float16), (1, 16), "float8_e5m2")
