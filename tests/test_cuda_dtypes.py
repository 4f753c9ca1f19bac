"""Every float dtype the public API accepts, through the CUDA kernels (simulator), against the
CPU twins: fake quantization (per tensor / per channel, out= and in place), the STE and LSQ
backwards, observers, histogram observers and the optimizers.

Besides checking the results, these launches are what ``tests/cuda_launches.json`` records, so
each (kernel, dtype) the public API can send is compiled by ``test_cuda_compile.py``.
"""

from __future__ import annotations

import numpy as np
import pytest

import nbqat
from nbqat.quantization import fake_quant as F

DTYPES = [np.float16, np.float32, np.float64]


def _bits(a):
    a = np.ascontiguousarray(a)
    return a.view({2: np.uint16, 4: np.uint32, 8: np.uint64}[a.dtype.itemsize])


def _same_bits(dev_array, ref):
    got = dev_array.copy_to_host()
    assert got.dtype == ref.dtype and got.shape == ref.shape
    np.testing.assert_array_equal(_bits(got), _bits(ref))


@pytest.fixture
def dev(cuda_sim, small_cuda_blocks):
    return cuda_sim


def _data(rng, shape, dtype):
    x = (rng.standard_normal(shape) * 4).astype(dtype)
    flat = x.reshape(-1)
    flat[:4] = [0.5, 2.5, -1.5, np.nan]  # ties round half to even; NaN -> quant_min
    return x


@pytest.mark.parametrize("dtype", DTYPES)
def test_per_channel_out_and_inplace(dev, rng, dtype):
    x = _data(rng, (3, 4), dtype)
    scale = np.float32([0.1, 0.25, 0.5, 1.0])
    zp = np.int32([0, 3, -2, 1])
    ry, rm = F.fake_quantize_per_channel_affine_cachemask(x, scale, zp, 1, -8, 7)
    dx = dev.to_device(x)
    out = dev.device_array(x.shape, dtype)
    mask = dev.device_array(x.shape, np.bool_)
    y, m = F.fake_quantize_per_channel_affine_cachemask(dx, scale, zp, 1, -8, 7, out=out, mask=mask)
    assert y is out and m is mask
    _same_bits(out, ry)
    np.testing.assert_array_equal(mask.copy_to_host(), rm)
    F.fake_quantize_per_channel_affine(dx, scale, zp, 1, -8, 7, out=dx)
    _same_bits(dx, ry)


@pytest.mark.parametrize("dtype", DTYPES)
def test_ste_backward(dev, rng, dtype):
    x = _data(rng, (11,), dtype)
    g = rng.standard_normal(11).astype(dtype)
    _, rm = F.fake_quantize_per_tensor_affine_cachemask(x, 0.3, 1, -4, 3)
    r = F.fake_quantize_backward(g, rm)
    _same_bits(F.fake_quantize_backward(dev.to_device(g), dev.to_device(rm)), r)


@pytest.mark.parametrize("dtype", DTYPES)
def test_lsq_backward(dev, rng, dtype):
    x = _data(rng, (3, 5), dtype)
    g = rng.standard_normal(x.shape).astype(dtype)
    s1 = np.float32([0.3])
    rx, rs, rz = F.fake_quantize_learnable_per_tensor_affine_backward(g, x, s1, 1.0, -8, 7, 0.5)
    gx, ds, dz = F.fake_quantize_learnable_per_tensor_affine_backward(
        dev.to_device(g), dev.to_device(x), s1, 1.0, -8, 7, 0.5
    )
    _same_bits(gx, rx)
    np.testing.assert_allclose(ds.copy_to_host(), rs, rtol=1e-6)
    np.testing.assert_allclose(dz.copy_to_host(), rz, rtol=1e-6)
    sc = np.float32([0.2, 0.4, 0.5])
    zc = np.float32([0.0, 2.0, -1.0])
    rx, rs, rz = F.fake_quantize_learnable_per_channel_affine_backward(g, x, sc, zc, 0, -8, 7)
    gx, ds, dz = F.fake_quantize_learnable_per_channel_affine_backward(
        dev.to_device(g), dev.to_device(x), sc, zc, 0, -8, 7
    )
    _same_bits(gx, rx)
    np.testing.assert_allclose(ds.copy_to_host(), rs, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(dz.copy_to_host(), rz, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "make",
    [
        lambda: nbqat.MinMaxObserver(nonfinite="ignore"),
        lambda: nbqat.PerChannelMinMaxObserver(ch_axis=1, nonfinite="ignore"),
        lambda: nbqat.HistogramObserver(bins=16, nonfinite="ignore"),
    ],
)
def test_observers(dev, rng, dtype, make):
    host, on_dev = make(), make()
    x = _data(rng, (4, 6), dtype)
    host(x)
    on_dev(dev.to_device(x))
    for a, b in zip(on_dev.calculate_qparams(), host.calculate_qparams()):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("name,kw", [("SGD", dict(lr=0.1, momentum=0.9)), ("Adam", dict(lr=1e-2))])
def test_optimizers(dev, rng, dtype, name, kw):
    p0 = rng.standard_normal(13).astype(dtype)
    g = rng.standard_normal(13).astype(dtype)
    hp, dp = p0.copy(), dev.to_device(p0)
    ho, do = getattr(nbqat, name)(hp, **kw), getattr(nbqat, name)(dp, **kw)
    for _ in range(2):
        ho.step(g)
        do.step(dev.to_device(g))
    np.testing.assert_allclose(dp.copy_to_host(), hp, rtol=0, atol=4 * np.spacing(np.abs(hp).max()))
