"""CUDA twins of the fake-quant kernels, under the simulator (tiny arrays, tiny blocks), against
the CPU kernels: identical element results; LSQ sums equal to float32 rounding."""

from __future__ import annotations

import numpy as np
import pytest

from nbqat.quantization import fake_quant as F

EDGE = np.array(
    [0.5, 1.5, 2.5, -0.5, 1.55, 12.75, -0.05, np.nan, np.inf, -np.inf, 1e38, -0.0, 0.3],
    np.float32,
)


def bits_equal(a, b):
    a = np.ascontiguousarray(a)
    b = np.ascontiguousarray(b)
    assert a.shape == b.shape and a.dtype == b.dtype, (a.shape, b.shape, a.dtype, b.dtype)
    u = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[a.dtype.itemsize]
    return np.array_equal(a.view(u), b.view(u))


@pytest.fixture
def dev(cuda_sim, small_cuda_blocks):
    return cuda_sim


def host(a):
    assert hasattr(a, "copy_to_host"), type(a)
    return a.copy_to_host()


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
@pytest.mark.parametrize("shape", [(), (0,), (13,), (3, 5)])
def test_per_tensor_matches_cpu(dev, rng, dtype, shape):
    n = int(np.prod(shape))
    x = np.resize(EDGE, n).reshape(shape).astype(dtype)
    if n > 4:
        x.reshape(-1)[:4] = (rng.standard_normal(4) * 5).astype(dtype)
    for qmin, qmax, zp, s in [(0, 127, 0, 0.1), (-8, 7, 7, 0.37), (-128, 127, -128, 1e-3)]:
        y, m = F.fake_quantize_per_tensor_affine_cachemask(dev.to_device(x), s, zp, qmin, qmax)
        ry, rm = F.fake_quantize_per_tensor_affine_cachemask(x, s, zp, qmin, qmax)
        assert bits_equal(host(y), ry) and np.array_equal(host(m), rm)
        y = F.fake_quantize_per_tensor_affine(dev.to_device(x), s, zp, qmin, qmax)
        assert bits_equal(host(y), ry)


def test_per_tensor_out_and_inplace(dev):
    x = EDGE.copy()
    ry, rm = F.fake_quantize_per_tensor_affine_cachemask(x, 0.1, 3, 0, 127)
    dx = dev.to_device(x)
    out = dev.device_array(x.shape, np.float32)
    mask = dev.device_array(x.shape, np.bool_)
    y, m = F.fake_quantize_per_tensor_affine_cachemask(dx, 0.1, 3, 0, 127, out=out, mask=mask)
    assert y is out and m is mask
    assert bits_equal(host(out), ry) and np.array_equal(host(mask), rm)
    F.fake_quantize_per_tensor_affine(dx, 0.1, 3, 0, 127, out=dx)
    assert bits_equal(host(dx), ry)


@pytest.mark.parametrize("shape, axis", [((3, 5), 0), ((3, 5), 1), ((2, 3, 4), 1), ((2, 3, 4), -1)])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
def test_per_channel_matches_cpu(dev, rng, shape, axis, dtype):
    n = int(np.prod(shape))
    x = np.resize(EDGE, n).reshape(shape).astype(dtype)
    x.reshape(-1)[::2] = (rng.standard_normal(x.size // 2 + x.size % 2) * 3).astype(dtype)
    C = shape[axis]
    scale = np.linspace(0.05, 0.6, C).astype(np.float32)
    zp = np.arange(C, dtype=np.int32) - 1
    y, m = F.fake_quantize_per_channel_affine_cachemask(dev.to_device(x), scale, zp, axis, -8, 7)
    ry, rm = F.fake_quantize_per_channel_affine_cachemask(x, scale, zp, axis, -8, 7)
    assert bits_equal(host(y), ry) and np.array_equal(host(m), rm)
    # qparams as device arrays too
    y = F.fake_quantize_per_channel_affine(
        dev.to_device(x), dev.to_device(scale), dev.to_device(zp), axis, -8, 7
    )
    assert bits_equal(host(y), ry)


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
def test_ste_backward_matches_cpu(dev, rng, dtype):
    g = rng.standard_normal(11).astype(dtype)
    g[:3] = [np.nan, -2.0, np.inf]
    mask = rng.random(11) < 0.5
    mask[:3] = False
    r = F.fake_quantize_backward(g, mask)
    out = F.fake_quantize_backward(dev.to_device(g), dev.to_device(mask))
    assert bits_equal(host(out), r)
    c = F.fake_quantize_backward(dev.to_device(g), None)
    assert bits_equal(host(c), g)


def test_lsq_per_tensor_matches_cpu(dev, rng):
    x = np.concatenate([EDGE, (rng.standard_normal(20) * 3).astype(np.float32)])
    g = rng.standard_normal(x.size).astype(np.float32)
    for qmin, qmax, zp in [(0, 15, 3.3), (-128, 127, -4.0)]:
        gx, ds, dz = F.fake_quantize_learnable_per_tensor_affine_backward(
            dev.to_device(g), dev.to_device(x), np.float32([0.2]), zp, qmin, qmax, 0.3
        )
        rx, rs, rz = F.fake_quantize_learnable_per_tensor_affine_backward(
            g, x, np.float32([0.2]), zp, qmin, qmax, 0.3
        )
        assert bits_equal(host(gx), rx)
        np.testing.assert_allclose(host(ds), rs, rtol=1e-6)
        np.testing.assert_allclose(host(dz), rz, rtol=1e-6)
        y = F.fake_quantize_learnable_per_tensor_affine(dev.to_device(x), 0.2, zp, qmin, qmax)
        ry = F.fake_quantize_learnable_per_tensor_affine(x, 0.2, zp, qmin, qmax)
        assert bits_equal(host(y), ry)


@pytest.mark.parametrize("shape, axis", [((4, 6), 0), ((4, 6), 1), ((2, 3, 4), 1)])
def test_lsq_per_channel_matches_cpu(dev, rng, shape, axis):
    x = (rng.standard_normal(shape) * 3).astype(np.float32)
    x.reshape(-1)[:3] = [np.nan, np.inf, -np.inf]
    g = rng.standard_normal(shape).astype(np.float32)
    C = shape[axis]
    scale = np.linspace(0.1, 0.5, C).astype(np.float32)
    zp = np.linspace(-3.2, 4.7, C).astype(np.float32)
    gx, ds, dz = F.fake_quantize_learnable_per_channel_affine_backward(
        dev.to_device(g), dev.to_device(x), scale, zp, axis, -8, 7, 0.25
    )
    rx, rs, rz = F.fake_quantize_learnable_per_channel_affine_backward(
        g, x, scale, zp, axis, -8, 7, 0.25
    )
    assert bits_equal(host(gx), rx)
    assert host(ds).shape == (C,)
    np.testing.assert_allclose(host(ds), rs, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(host(dz), rz, rtol=1e-6, atol=1e-7)
    y = F.fake_quantize_learnable_per_channel_affine(dev.to_device(x), scale, zp, axis, -8, 7)
    ry = F.fake_quantize_learnable_per_channel_affine(x, scale, zp, axis, -8, 7)
    assert bits_equal(host(y), ry)


def test_cuda_bad_input(dev):
    x = dev.to_device(np.ones((4, 6), np.float32))
    with pytest.raises(TypeError, match="mixing"):
        F.fake_quantize_per_tensor_affine(x, 0.1, 0, -8, 7, out=np.empty((4, 6), np.float32))
    out = dev.to_device(np.full((4, 6), 9.0, np.float32))
    with pytest.raises(ValueError, match="scale"):
        F.fake_quantize_per_tensor_affine(x, -0.1, 0, -8, 7, out=out)
    with pytest.raises(ValueError, match="C-contiguous"):
        F.fake_quantize_per_tensor_affine(x[:, ::2], 0.1, 0, -8, 7)
    with pytest.raises(TypeError, match="astype"):
        F.fake_quantize_per_tensor_affine(dev.to_device(np.ones(3, np.int32)), 0.1, 0, -8, 7)
    assert (host(out) == 9.0).all()


def _shifted(dev, x, k):
    """Device views ``(src, dst)`` of one buffer holding ``x``: ``dst`` starts ``k`` elements
    after ``src`` (before it for negative ``k``), so the two overlap without being one array."""
    n, a = x.size, abs(k)
    buf = dev.to_device(np.concatenate([np.zeros(a, x.dtype), x, np.zeros(a, x.dtype)]))
    return buf[a : a + n], buf[a + k : a + k + n]


@pytest.mark.parametrize("k", [1, -1, 5])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_outputs_overlapping_the_input_on_device(dev, rng, k, dtype):
    # an out= (or STE out=) shifted against the input it is computed from: each thread wrote
    # out[i] over an x element another thread had not read yet (the host path computes through
    # a temporary, and so must the device: the CPU results)
    x = np.concatenate([EDGE, (rng.standard_normal(29) * 3).astype(np.float32)]).astype(dtype)
    src, dst = _shifted(dev, x, k)
    y = F.fake_quantize_per_tensor_affine(src, 0.1, 3, -8, 7, out=dst)
    assert bits_equal(host(y), F.fake_quantize_per_tensor_affine(x, 0.1, 3, -8, 7))
    src, dst = _shifted(dev, x, k)
    scale, zp = np.float32([0.1, 0.3, 0.05]), np.int32([0, 2, -1])
    y = F.fake_quantize_per_channel_affine(
        src.reshape(3, 14), scale, zp, 0, -8, 7, out=dst.reshape(3, 14)
    )
    ref = F.fake_quantize_per_channel_affine(x.reshape(3, 14), scale, zp, 0, -8, 7)
    assert bits_equal(host(y), ref)
    src, dst = _shifted(dev, x, k)
    mask = x > 0
    g = F.fake_quantize_backward(src, dev.to_device(mask), out=dst)
    assert bits_equal(host(g), F.fake_quantize_backward(x, mask))


def test_mask_over_the_input_bytes_on_device(dev):
    # a mask written into x's bytes (x[8:12] as 16 bools) must not change what x reads
    x = np.resize(EDGE, 16)
    dx = dev.to_device(x)
    mask = dx.view(np.uint8)[32:48].view(np.bool_)
    y, m = F.fake_quantize_per_tensor_affine_cachemask(dx, 0.1, 3, 0, 127, mask=mask)
    ry, rm = F.fake_quantize_per_tensor_affine_cachemask(x, 0.1, 3, 0, 127)
    assert bits_equal(host(y), ry) and np.array_equal(host(m), rm)


def test_out_and_mask_sharing_bytes_on_device_refused(dev):
    dx = dev.to_device(np.resize(EDGE, 16))
    out = dev.to_device(np.full(16, 9.0, np.float32))
    mask = out.view(np.uint8)[:16].view(np.bool_)
    with pytest.raises(ValueError, match="share memory"):
        F.fake_quantize_per_tensor_affine_cachemask(dx, 0.1, 3, 0, 127, out=out, mask=mask)
    assert (host(out) == 9.0).all()


@pytest.mark.parametrize("shape", [(0, 3), (3, 0), (2, 0, 3)])
def test_lsq_backward_of_an_empty_batch_on_device(dev, shape):
    # an empty multi-dimensional batch raised "cannot reshape array of size 0 into shape (1,)"
    # on the device (its flat grad_x view); the host's result: empty grad_x, zero sums
    x = np.zeros(shape, np.float32)
    C = shape[-1]
    scale, zp = np.ones(C, np.float32), np.zeros(C, np.float32)
    for f, args in (
        (F.fake_quantize_learnable_per_tensor_affine_backward, (0.5, 1.0, -8, 7)),
        (F.fake_quantize_learnable_per_channel_affine_backward, (scale, zp, -1, -8, 7)),
    ):
        got = f(dev.to_device(x), dev.to_device(x), *args)
        for a, b in zip(got, f(x, x, *args)):
            assert bits_equal(host(a), b)
