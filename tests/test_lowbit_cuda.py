"""The @cuda.jit twins of the block-wise affine and float8 kernels against the CPU kernels, bit
for bit, under the simulator with tiny CUDA blocks and tiny units (pieces and partial blocks)."""

from __future__ import annotations

import numpy as np
import pytest
from ref_lowbit import assert_same_bits

import nbqat
from nbqat.quantization import _blocks


@pytest.fixture
def tiny(cuda_sim, small_cuda_blocks, monkeypatch):
    monkeypatch.setattr(_blocks, "UNIT", 5)
    return cuda_sim


def _x(shape, seed):
    x = np.random.default_rng(seed).standard_normal(shape).astype(np.float32) * 3
    x.reshape(-1)[:4] = [np.nan, 0.0, -0.0, np.inf]
    return x


@pytest.mark.parametrize("bs", [(3, 12), (1, 12), (1, 4), (3, 1)])
def test_affine_twins(tiny, bs):
    cuda = tiny
    x = _x((3, 12), 1)
    x[0, 0] = x[0, 3] = 1.0  # keep this test's first row finite
    for mt in ("symmetric", "asymmetric"):
        s, z = nbqat.choose_qparams_affine(x, mt, bs, 0, 15)
        ds, dz = nbqat.choose_qparams_affine(cuda.to_device(x), mt, bs, 0, 15)
        assert_same_bits(ds.copy_to_host(), s, "scale")
        np.testing.assert_array_equal(dz.copy_to_host(), z)
    s = np.abs(s) + np.float32(0.1)
    y, m = nbqat.fake_quantize_affine_cachemask(x, bs, s, z, 0, 15)
    dy, dm = nbqat.fake_quantize_affine_cachemask(cuda.to_device(x), bs, s, z, 0, 15)
    assert_same_bits(dy.copy_to_host(), y, "y")
    np.testing.assert_array_equal(dm.copy_to_host(), m)
    g = np.linspace(-1, 1, x.size, dtype=np.float32).reshape(x.shape)
    want = nbqat.fake_quantize_affine_backward(g, x, bs, s, z, 0, 15)
    got = nbqat.fake_quantize_affine_backward(cuda.to_device(g), cuda.to_device(x), bs, s, z, 0, 15)
    for a, b, name in zip(got, want, ("grad_x", "grad_scale", "grad_zero_point")):
        assert_same_bits(a.copy_to_host(), b, name)


@pytest.mark.parametrize("name", ["float8_e4m3fn", "float8_e5m2"])
def test_float8_twins(tiny, name):
    cuda = tiny
    x = _x((4, 6), 2)
    x[1] = [1e-42, -(2.0**-10), 460.0, -7e4, 0.3, 1.0]
    for bs in [(4, 6), (1, 3), (2, 1)]:
        s = nbqat.choose_scale_float8(x, bs, name)
        ds = nbqat.choose_scale_float8(cuda.to_device(x), bs, name)
        assert_same_bits(ds.copy_to_host(), s, "scale")
    s = np.full((4, 1), 1.0, np.float32)  # scale 1: the cast itself, subnormals and past max
    y, m = nbqat.fake_quantize_float8_cachemask(x, s, name)
    dy, dm = nbqat.fake_quantize_float8_cachemask(cuda.to_device(x), s, name)
    assert_same_bits(dy.copy_to_host(), y, "y")
    np.testing.assert_array_equal(dm.copy_to_host(), m)


def test_device_out_overlapping_the_input(tiny):
    # out= one row after x in one device buffer: each thread wrote out[i] over an x element
    # another thread had not read yet; the CPU twin computes through a temporary, so the device
    # must give its bits
    cuda = tiny
    x = _x((4, 6), 3)
    s = np.float32([0.5, 0.25, 1.0, 0.125])[:, None]
    z = np.zeros((4, 1), np.int32)
    for k in (6, -6):
        buf = cuda.to_device(
            np.concatenate([np.zeros(6, np.float32), x.ravel(), np.zeros(6, np.float32)])
        )
        xd, od = buf[6:30].reshape(4, 6), buf[6 + k : 30 + k].reshape(4, 6)
        got = nbqat.fake_quantize_affine(xd, (1, 6), s, z, -8, 7, out=od)
        want = nbqat.fake_quantize_affine(x, (1, 6), s, z, -8, 7)
        assert_same_bits(got.copy_to_host(), want, "affine y")
        buf = cuda.to_device(
            np.concatenate([np.zeros(6, np.float32), x.ravel(), np.zeros(6, np.float32)])
        )
        xd, od = buf[6:30].reshape(4, 6), buf[6 + k : 30 + k].reshape(4, 6)
        got = nbqat.fake_quantize_float8(xd, s, out=od)
        assert_same_bits(got.copy_to_host(), nbqat.fake_quantize_float8(x, s), "float8 y")
