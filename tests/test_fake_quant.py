"""Fake quantization (CPU kernels) against PyTorch 2.13 and the NumPy reference."""

from __future__ import annotations

import numba
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from ref_fake_quant import fake_quant_ref, lsq_ref

import nbqat
from nbqat.quantization import fake_quant as F

RANGES = {
    "int4": (-8, 7),
    "uint4": (0, 15),
    "int8": (-128, 127),
    "uint8": (0, 255),
    "int16": (-32768, 32767),
}


def bits_equal(a, b):
    """Bit-for-bit equality (distinguishes -0/+0 and NaN payloads)."""
    a = np.ascontiguousarray(a)
    b = np.ascontiguousarray(b)
    assert a.shape == b.shape and a.dtype == b.dtype, (a.shape, b.shape, a.dtype, b.dtype)
    u = {2: np.uint16, 4: np.uint32, 8: np.uint64}[a.dtype.itemsize]
    return np.array_equal(a.view(u), b.view(u))


def t_cachemask(torch, x, scale, zp, qmin, qmax):
    y, m = torch.ops.aten.fake_quantize_per_tensor_affine_cachemask(
        torch.from_numpy(np.ascontiguousarray(x)), float(scale), int(zp), qmin, qmax
    )
    return y.numpy(), m.numpy().reshape(np.shape(x))  # torch gives a 0-d input a (1,) mask


def t_channel(torch, x, scale, zp, axis, qmin, qmax):
    y, m = torch.ops.aten.fake_quantize_per_channel_affine_cachemask(
        torch.from_numpy(np.ascontiguousarray(x)),
        torch.from_numpy(scale),
        torch.from_numpy(zp),
        axis % x.ndim,
        qmin,
        qmax,
    )
    return y.numpy(), m.numpy()


def grid_data(rng, shape, scale, zp, qmin, qmax, dtype=np.float32):
    """Values covering the grid, 20% beyond both ends, plus exact ties (k + 0.5) * scale."""
    lo = (qmin - zp) * scale
    hi = (qmax - zp) * scale
    span = hi - lo
    x = rng.uniform(lo - 0.2 * span, hi + 0.2 * span, size=shape)
    flat = x.reshape(-1)
    k = rng.integers(qmin - zp - 2, qmax - zp + 2, size=flat.size)
    ties = rng.random(flat.size) < 0.25
    flat[ties] = (k[ties] + 0.5) * scale
    return x.astype(dtype)


# ----------------------------------------------------------------------------------------------
# per tensor: edge values, bit-exact with torch
# ----------------------------------------------------------------------------------------------
EDGE = [0.5, 1.5, 2.5, -0.5, 1.55, 12.75, -0.05, 0.0, -0.0, np.nan, np.inf, -np.inf, 1e38, -1e38]
EDGE += [3.4e38, -3.4e38, 1e-45, 12.7, 12.65, 25.45, -12.85, 0.25, 0.35]


@pytest.mark.parametrize("scale", [1.0, 0.1, 1e-7, 1e3, 0.3, 2.0**-10])
@pytest.mark.parametrize("rng_name", ["int8", "uint8", "int4", "int16", "u0_127"])
@pytest.mark.parametrize("zp_end", ["min", "max", "mid"])
def test_per_tensor_edge_values_bit_exact(torch, scale, rng_name, zp_end):
    qmin, qmax = (0, 127) if rng_name == "u0_127" else RANGES[rng_name]
    zp = {"min": qmin, "max": qmax, "mid": max(qmin, min(qmax, 0))}[zp_end]
    x = np.array(EDGE + [v * scale for v in EDGE[:8]], np.float32)
    y, m = F.fake_quantize_per_tensor_affine_cachemask(x, scale, zp, qmin, qmax)
    ty, tm = t_cachemask(torch, x, scale, zp, qmin, qmax)
    assert bits_equal(y, ty)
    assert np.array_equal(m, tm)
    y2 = nbqat.fake_quantize_per_tensor_affine(x, scale, zp, qmin, qmax)
    assert bits_equal(y2, ty)


def test_semantics_examples():
    """The worked examples of torch-semantics.md section 1 (independent of torch)."""
    f = F.fake_quantize_per_tensor_affine_cachemask
    y, _ = f(np.float32([1.55]), 0.1, 0, -128, 127)
    assert y[0] == np.float32(16) * np.float32(0.1)
    y, _ = f(np.float32([0.5, 1.5, 2.5, -0.5]), 1.0, 0, -128, 127)
    assert np.array_equal(y, np.float32([0, 2, 2, 0]))
    y, m = f(np.float32([12.75, -0.05]), 0.1, 0, 0, 127)
    assert y[0] == np.float32(127) * np.float32(0.1) and not m[0]
    assert y[1] == 0 and m[1]
    y, m = f(np.float32([np.nan, np.inf, -np.inf]), 0.1, 3, 0, 127)
    s = np.float32(0.1)
    assert np.array_equal(y, [np.float32(-3) * s, np.float32(124) * s, np.float32(-3) * s])
    assert not m.any()


@pytest.mark.parametrize("shape", [(), (0,), (1,), (7,), (3, 5), (2, 3, 4), (4099,)])
@pytest.mark.parametrize("rng_name", list(RANGES))
@pytest.mark.parametrize("scale", [1e-7, 3e-3, 0.1, 1e3])
def test_per_tensor_random_bit_exact(torch, rng, shape, rng_name, scale):
    qmin, qmax = RANGES[rng_name]
    for zp in (qmin, qmax, (qmin + qmax) // 2):
        x = grid_data(rng, shape, scale, zp, qmin, qmax)
        y, m = F.fake_quantize_per_tensor_affine_cachemask(x, scale, zp, qmin, qmax)
        ty, tm = t_cachemask(torch, x, scale, zp, qmin, qmax)
        assert y.shape == x.shape and m.shape == x.shape and m.dtype == np.bool_
        assert bits_equal(y, ty)
        assert np.array_equal(m, tm)


def test_per_tensor_float16_equals_torch(torch, rng):
    for qmin, qmax in RANGES.values():
        x = grid_data(rng, (257,), 0.05, qmin, qmin, qmax, np.float16)
        x[:3] = [np.nan, np.inf, -np.inf]
        y, m = F.fake_quantize_per_tensor_affine_cachemask(x, 0.05, qmin, qmin, qmax)
        ty, tm = t_cachemask(torch, x, 0.05, qmin, qmin, qmax)
        assert y.dtype == np.float16
        assert bits_equal(y, ty) and np.array_equal(m, tm)


def test_per_tensor_float64_close_to_torch(torch, rng):
    for qmin, qmax in RANGES.values():
        for scale in (1e-7, 0.1, 1e3):
            x = grid_data(rng, (513,), scale, 0 if qmin == 0 else -1, qmin, qmax, np.float64)
            zp = 0 if qmin == 0 else -1
            y, m = F.fake_quantize_per_tensor_affine_cachemask(x, scale, zp, qmin, qmax)
            ty, tm = t_cachemask(torch, x, scale, zp, qmin, qmax)
            assert y.dtype == np.float64
            assert np.array_equal(m, tm)
            np.testing.assert_allclose(y, ty, rtol=1e-7, atol=0)
            # nbqat's float64 grid points are exact multiples of the float32 scale
            ry, rm = fake_quant_ref(x, scale, zp, qmin, qmax)
            assert bits_equal(y, ry) and np.array_equal(m, rm)


# ----------------------------------------------------------------------------------------------
# per channel
# ----------------------------------------------------------------------------------------------
def channel_qparams(rng, C, qmin, qmax, lo=1e-3, hi=0.5):
    scale = np.exp(rng.uniform(np.log(lo), np.log(hi), C)).astype(np.float32)
    zp = rng.integers(qmin, qmax + 1, C).astype(np.int32)
    zp[0] = qmin
    zp[-1] = qmax
    return scale, zp


@pytest.mark.parametrize("shape", [(5,), (4, 6), (3, 5, 7), (2, 3, 4, 5), (300, 3), (3, 300)])
@pytest.mark.parametrize("rng_name", ["int4", "int8", "uint8", "int16"])
def test_per_channel_every_axis_bit_exact(torch, rng, shape, rng_name):
    qmin, qmax = RANGES[rng_name]
    for axis in range(-len(shape), len(shape)):
        C = shape[axis]
        scale, zp = channel_qparams(rng, C, qmin, qmax)
        x = (rng.standard_normal(shape) * 40 * np.float32(scale.max())).astype(np.float32)
        x.reshape(-1)[::3] = (np.round(x.reshape(-1)[::3] / 0.5) * 0.5).astype(np.float32)
        y, m = F.fake_quantize_per_channel_affine_cachemask(x, scale, zp, axis, qmin, qmax)
        ty, tm = t_channel(torch, x, scale, zp, axis, qmin, qmax)
        assert bits_equal(y, ty), axis
        assert np.array_equal(m, tm), axis
        assert bits_equal(
            nbqat.fake_quantize_per_channel_affine(x, scale, zp, axis, qmin, qmax), ty
        )


def test_per_channel_ties_and_tiny_large_scales(torch):
    x = np.array([[0.5, 1.5, 2.5, -0.5, 1.55, 12.75, -0.05, 3.0]] * 4, np.float32).T.copy()
    x = x * np.float32([1.0, 0.1, 1e-7, 1e3])
    scale = np.float32([1.0, 0.1, 1e-7, 1e3])
    for qmin, qmax in [(0, 127), (-128, 127), (-8, 7)]:
        zp = np.int32([qmin, qmax, 0 if qmin < 0 else qmin, qmin])
        y, m = F.fake_quantize_per_channel_affine_cachemask(x, scale, zp, 1, qmin, qmax)
        ty, tm = t_channel(torch, x, scale, zp, 1, qmin, qmax)
        assert bits_equal(y, ty) and np.array_equal(m, tm)


def test_per_channel_nonfinite_clamps_first():
    """torch's per-channel CPU kernel is undefined here (int64 cast before clamp); nbqat
    follows the per-tensor arithmetic: check against the NumPy reference."""
    x = np.array([[np.nan, np.inf, -np.inf, 1e38, -1e38, 3.4e38, 0.3]] * 3, np.float32)
    scale = np.float32([0.1, 1e-7, 2.0])
    zp = np.int32([0, 5, -3])
    y, m = F.fake_quantize_per_channel_affine_cachemask(x, scale, zp, 0, -8, 7)
    ry, rm = fake_quant_ref(x, scale, zp, -8, 7, axis=0)
    assert bits_equal(y, ry) and np.array_equal(m, rm)
    assert y[0, 1] == np.float32(7) * np.float32(0.1)  # +Inf -> top of the grid


def test_per_channel_float16_float64(torch, rng):
    scale, zp = channel_qparams(rng, 6, -128, 127)
    x = (rng.standard_normal((6, 40)) * 10).astype(np.float64)
    y, m = F.fake_quantize_per_channel_affine_cachemask(x, scale, zp, 0, -128, 127)
    ty, tm = t_channel(torch, x, scale, zp, 0, -128, 127)
    assert y.dtype == np.float64 and np.array_equal(m, tm)
    np.testing.assert_allclose(y, ty, rtol=1e-7, atol=0)
    x16 = x.astype(np.float16)
    y, m = F.fake_quantize_per_channel_affine_cachemask(x16, scale, zp, 0, -128, 127)
    ty, tm = t_channel(torch, x16, scale, zp, 0, -128, 127)
    assert y.dtype == np.float16 and bits_equal(y, ty) and np.array_equal(m, tm)


def test_per_channel_large_by_outer_path(torch, rng):
    """inner == 1 with many rows takes the parallel-over-rows path."""
    scale, zp = channel_qparams(rng, 33, 0, 255)
    x = (rng.standard_normal((257, 33)) * 20).astype(np.float32)
    y, m = F.fake_quantize_per_channel_affine_cachemask(x, scale, zp, -1, 0, 255)
    ty, tm = t_channel(torch, x, scale, zp, 1, 0, 255)
    assert bits_equal(y, ty) and np.array_equal(m, tm)


# ----------------------------------------------------------------------------------------------
# layouts: views, out=, 0-d, empty
# ----------------------------------------------------------------------------------------------
def test_noncontiguous_and_negative_stride(torch, rng):
    base = (rng.standard_normal((8, 10)) * 5).astype(np.float32)
    for view in (base[::2, ::-1], base.T, base[:, 3], base[::-1]):
        y, m = F.fake_quantize_per_tensor_affine_cachemask(view, 0.07, 3, -128, 127)
        ty, tm = t_cachemask(torch, view, 0.07, 3, -128, 127)
        assert bits_equal(y, ty) and np.array_equal(m, tm)
        C = view.shape[0]
        scale, zp = channel_qparams(rng, C, -128, 127)
        y = F.fake_quantize_per_channel_affine(view, scale, zp, 0, -128, 127)
        ty, _ = t_channel(torch, view, scale, zp, 0, -128, 127)
        assert bits_equal(y, ty)


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_out_and_inplace(rng, dtype):
    x = (rng.standard_normal((6, 9)) * 5).astype(dtype)
    ref_y, ref_m = F.fake_quantize_per_tensor_affine_cachemask(x, 0.1, 0, -128, 127)
    # preallocated out and mask
    out = np.empty_like(x)
    mask = np.empty(x.shape, bool)
    y, m = F.fake_quantize_per_tensor_affine_cachemask(x, 0.1, 0, -128, 127, out=out, mask=mask)
    assert y is out and m is mask and bits_equal(out, ref_y) and np.array_equal(mask, ref_m)
    # out = x in place, contiguous and strided
    xi = x.copy()
    y = F.fake_quantize_per_tensor_affine(xi, 0.1, 0, -128, 127, out=xi)
    assert y is xi and bits_equal(xi, ref_y)
    big = np.zeros((12, 9), dtype)
    view = big[::2]
    view[...] = x
    y = F.fake_quantize_per_tensor_affine(view, 0.1, 0, -128, 127, out=view)
    assert bits_equal(big[::2], ref_y) and not big[1::2].any()
    # strided out for contiguous x, and a reversed view of x as out (overlapping)
    o2 = np.zeros((6, 18), dtype)[:, ::2]
    F.fake_quantize_per_tensor_affine(x, 0.1, 0, -128, 127, out=o2)
    assert bits_equal(o2, ref_y)
    xr = x.copy()
    F.fake_quantize_per_tensor_affine(xr, 0.1, 0, -128, 127, out=xr[::-1])
    assert bits_equal(xr[::-1], ref_y)
    # per channel in place
    scale, zp = channel_qparams(rng, 9, -128, 127)
    ref_c = F.fake_quantize_per_channel_affine(x, scale, zp, 1, -128, 127)
    xc = x.copy()
    F.fake_quantize_per_channel_affine_cachemask(xc, scale, zp, 1, -128, 127, out=xc)
    assert bits_equal(xc, ref_c)


def test_out_and_mask_sharing_memory_are_refused(rng):
    """Overlapping ``out`` and ``mask`` were both written (the mask from a temporary, after
    ``out``), so ``out`` silently held mask bytes (values like 2.4e-38)."""
    x = (rng.standard_normal((5, 4)) * 5).astype(np.float32)
    buf = np.zeros(100, np.uint8)
    o = buf[:80].view(np.float32).reshape(5, 4)
    mk = buf[4:24].view(bool).reshape(5, 4)
    for f, args in (
        (F.fake_quantize_per_tensor_affine_cachemask, (0.1, 0, -128, 127)),
        (F.fake_quantize_per_channel_affine_cachemask, (np.full(4, 0.1, np.float32),
                                                        np.zeros(4, np.int32), 1, -128, 127)),
        (nbqat.fake_quantize_affine_cachemask, ((1, 4), np.full(5, 0.1, np.float32), None,
                                                -128, 127)),
    ):  # fmt: skip
        with pytest.raises(ValueError, match="out and mask share memory"):
            f(x, *args, out=o, mask=mk)
        assert not buf.any()  # nothing written
    m2 = buf[80:100].view(bool).reshape(5, 4)  # beside out, not on it: accepted
    y, m = F.fake_quantize_per_tensor_affine_cachemask(x, 0.1, 0, -128, 127, out=o, mask=m2)
    assert bits_equal(y, fake_quant_ref(x, 0.1, 0, -128, 127)[0])


def test_out_over_the_qparams():
    """A per-channel / per-block scale (or zero point) stored in ``out``'s first row: the
    kernel read the caller's array while writing ``out``, so rows after the first were computed
    with the overwritten values (per channel, -0.5 came out 4.0); the qparams as given."""
    x = np.linspace(-1, 1, 12, dtype=np.float32).reshape(4, 3)
    s, z = np.float32([0.1, 0.2, 0.3]), np.float32([0.0, 1.0, -1.0])
    s4, z4 = np.float32([[0.1], [0.2], [0.3], [0.05]]), np.float32([[0], [1], [-1], [2]])

    def per_channel(s, z, out):
        return F.fake_quantize_per_channel_affine(x, s, z, 1, -8, 7, out=out)

    def affine(s, z, out):
        return nbqat.fake_quantize_affine(x, (1, 3), s, z, -8, 7, out=out)

    def float8(s, z, out):
        return nbqat.fake_quantize_float8(x, s, out=out)

    cases = ((per_channel, s, z, "s"), (affine, s4, z4, "s"), (affine, s4, z4, "z"),
             (float8, s4, z4, "s"))  # fmt: skip
    for f, sv, zv, where in cases:
        want = f(sv, zv, None)
        out = np.zeros(12, np.float32)
        n = sv.size
        out[:n] = (sv if where == "s" else zv).ravel()
        view = out[:n].reshape(sv.shape)
        args = (view, zv) if where == "s" else (sv, view)
        assert bits_equal(f(*args, out.reshape(4, 3)), want)


def test_zero_d_and_empty(torch):
    x0 = np.array(1.55, np.float32)
    y, m = F.fake_quantize_per_tensor_affine_cachemask(x0, 0.1, 0, -128, 127)
    assert y.shape == () and m.shape == () and y == np.float32(16) * np.float32(0.1) and m
    for shape in [(0,), (3, 0), (0, 4)]:
        x = np.empty(shape, np.float32)
        y, m = F.fake_quantize_per_tensor_affine_cachemask(x, 0.1, 0, -128, 127)
        assert y.shape == shape and m.shape == shape and m.dtype == np.bool_
        if len(shape) == 2:
            for ax in (0, 1):
                C = shape[ax]
                y = F.fake_quantize_per_channel_affine(
                    x, np.ones(C, np.float32), np.zeros(C, np.int32), ax, -128, 127
                )
                assert y.shape == shape
        g = F.fake_quantize_backward(x, m)
        assert g.shape == shape
    gx, ds, dz = F.fake_quantize_learnable_per_tensor_affine_backward(
        np.empty(0, np.float32), np.empty(0, np.float32), 0.1, 0.0, -128, 127
    )
    assert gx.shape == (0,) and ds.tolist() == [0.0] and dz.tolist() == [0.0]


def test_scale_and_zero_point_forms(torch):
    x = np.float32([0.3, -2.0, 7.7, 100.0])
    ty, tm = t_cachemask(torch, x, 0.25, 4, 0, 15)
    for s in (0.25, np.float32(0.25), np.float64(0.25), np.float32([0.25]), np.array(0.25)):
        for z in (4, np.int32(4), np.int64(4), np.int32([4]), 4.0, np.float32([4.0])):
            y, m = F.fake_quantize_per_tensor_affine_cachemask(x, s, z, 0, 15)
            assert bits_equal(y, ty) and np.array_equal(m, tm)


# ----------------------------------------------------------------------------------------------
# bad input: clear errors, raised before anything is written
# ----------------------------------------------------------------------------------------------
X = np.float32([0.1, 0.2, 0.3])


@pytest.mark.parametrize(
    "kwargs, exc, word",
    [
        (dict(scale=0.0), ValueError, "scale"),
        (dict(scale=-1.0), ValueError, "scale"),
        (dict(scale=np.nan), ValueError, "scale"),
        (dict(scale=np.inf), ValueError, "scale"),
        (dict(scale=1e-45), ValueError, "scale"),
        (dict(scale="a"), TypeError, "scale"),
        (dict(scale=np.float32([0.1, 0.2])), ValueError, "scale"),
        (dict(quant_min=5, quant_max=5), ValueError, "quant_min"),
        (dict(quant_min=10, quant_max=5), ValueError, "quant_min"),
        (dict(quant_min=1.5), TypeError, "quant_min"),
        (dict(zero_point=200), ValueError, "zero_point"),
        (dict(zero_point=-129), ValueError, "zero_point"),
        (dict(zero_point=1.5), TypeError, "zero_point"),
        (dict(zero_point=np.int32([1, 2])), ValueError, "zero_point"),
        (dict(x=np.int32([1, 2, 3])), TypeError, "astype(np.float32)"),
        (dict(x=np.complex64([1, 2, 3])), TypeError, "astype(np.float32)"),
        (dict(x=np.bool_([1, 0, 1])), TypeError, "x"),
        (dict(out=np.zeros(3, np.float64)), TypeError, "out"),
        (dict(out=np.zeros(4, np.float32)), ValueError, "out"),
        (dict(mask=np.zeros(3, np.uint8)), TypeError, "mask"),
        (dict(mask=np.zeros(2, bool)), ValueError, "mask"),
    ],
)
def test_per_tensor_bad_input(kwargs, exc, word):
    args = dict(x=X, scale=0.1, zero_point=0, quant_min=-128, quant_max=127)
    args.update(kwargs)
    out = args.pop("out", np.full(3, 7.0, np.float32))
    mask = args.pop("mask", np.ones(3, bool))
    out_before, mask_before = out.copy(), mask.copy()
    with pytest.raises(exc, match=word.replace("(", r"\(").replace(")", r"\)")):
        F.fake_quantize_per_tensor_affine_cachemask(**args, out=out, mask=mask)
    assert np.array_equal(out, out_before) and np.array_equal(mask, mask_before)


@pytest.mark.parametrize(
    "kwargs, exc, word",
    [
        (dict(axis=2), ValueError, "axis"),
        (dict(axis=-3), ValueError, "axis"),
        (dict(axis=0.5), TypeError, "axis"),
        (dict(scale=np.float32([0.1, 0.2])), ValueError, "scale"),
        (dict(zero_point=np.int32([0, 0])), ValueError, "zero_point"),
        (dict(scale=np.float32([0.1, 0.0, 0.1])), ValueError, "scale"),
        (dict(scale=np.float32([0.1, np.nan, 0.1])), ValueError, "scale"),
        (dict(scale=np.int32([1, 1, 1])), TypeError, "scale"),
        (dict(zero_point=np.int32([0, 300, 0])), ValueError, "zero_point"),
        (dict(zero_point=np.float32([0, 0.5, 0])), TypeError, "zero_point"),
        # checked in their own dtype: no wrap of 2**64 - 1 to -1, no cast of 2.0**64 to INT64_MIN
        (
            dict(zero_point=np.uint64([0, 2**64 - 1, 0])),
            ValueError,
            r"zero_point\[1\] = 18446744073709551615",
        ),
        (
            dict(zero_point=np.float64([0, 2.0**64, 0])),
            ValueError,
            r"zero_point\[1\] = 1.8446744073709552e\+19",
        ),
        (dict(quant_min=127, quant_max=-128), ValueError, "quant_min"),
        (dict(x=np.zeros((2, 3), np.int8)), TypeError, "astype"),
        (dict(out=np.zeros((3, 2), np.float32)), ValueError, "out"),
        (dict(mask=np.zeros((2, 3), np.int8)), TypeError, "mask"),
    ],
)
def test_per_channel_bad_input(kwargs, exc, word):
    args = dict(
        x=np.ones((2, 3), np.float32),
        scale=np.float32([0.1, 0.1, 0.1]),
        zero_point=np.int32([0, 0, 0]),
        axis=1,
        quant_min=-128,
        quant_max=127,
    )
    args.update(kwargs)
    out = args.pop("out", np.full((2, 3), 7.0, np.float32))
    mask = args.pop("mask", np.ones((2, 3), bool))
    out_before, mask_before = out.copy(), mask.copy()
    with pytest.raises(exc, match=word):
        F.fake_quantize_per_channel_affine_cachemask(**args, out=out, mask=mask)
    assert np.array_equal(out, out_before) and np.array_equal(mask, mask_before)


def test_per_channel_zero_d_rejected():
    with pytest.raises(ValueError, match="axis"):
        F.fake_quantize_per_channel_affine(
            np.float32(1.0).reshape(()), np.float32([1]), np.int32([0]), 0, 0, 255
        )


def test_backward_bad_input():
    g = np.ones(3, np.float32)
    out = np.full(3, 5.0, np.float32)
    with pytest.raises(ValueError, match="mask"):
        F.fake_quantize_backward(g, np.ones(4, bool), out=out)
    with pytest.raises(TypeError, match="mask"):
        F.fake_quantize_backward(g, np.ones(3, np.float32), out=out)
    with pytest.raises(TypeError, match="grad_y"):
        F.fake_quantize_backward(np.ones(3, np.int64), np.ones(3, bool), out=out)
    with pytest.raises(TypeError, match="out"):
        F.fake_quantize_backward(g, np.ones(3, bool), out=np.zeros(3, np.float64))
    assert (out == 5.0).all()


def test_cuda_array_without_cuda_raises(monkeypatch):
    """A CUDA array when CUDA is unavailable: RuntimeError that says so."""
    from nbqat import _cuda

    class FakeDev:
        __cuda_array_interface__ = {"shape": (3,), "typestr": "<f4", "data": (0, False)}
        shape = (3,)
        dtype = np.dtype(np.float32)
        ndim = 1
        size = 3

    monkeypatch.setattr(_cuda, "cuda_available", lambda: False)
    with pytest.raises(RuntimeError, match="CUDA"):
        F.fake_quantize_per_tensor_affine(FakeDev(), 0.1, 0, -128, 127)
    with pytest.raises(RuntimeError, match="CUDA"):
        F.fake_quantize_backward(FakeDev(), None)


# ----------------------------------------------------------------------------------------------
# STE backward (the Rust seed's checks and torch's multiply)
# ----------------------------------------------------------------------------------------------
def test_ste_in_range_gradient_is_exactly_one():
    x = np.float32([-10.0, 0.0, 10.0, 50.0])
    _, m = F.fake_quantize_per_tensor_affine_cachemask(x, 1.0, 0, -128, 127)
    g = F.fake_quantize_backward(np.ones(4, np.float32), m)
    assert np.array_equal(g, np.ones(4, np.float32))


def test_ste_out_of_range_gradient_is_exactly_zero():
    x = np.float32([-5.0, -1.0, 0.0, 1.0, 5.0, 100.0])
    _, m = F.fake_quantize_per_tensor_affine_cachemask(x, 0.01, 0, -128, 127)
    g = F.fake_quantize_backward(np.ones(6, np.float32), m)
    assert g.tolist() == [0.0, 1.0, 1.0, 1.0, 0.0, 0.0]


def test_ste_chained_with_relu_multiplies():
    x = np.float32([-2.0, -0.5, 0.5, 2.0])
    y, m = F.fake_quantize_per_tensor_affine_cachemask(x, 0.01, 0, -128, 127)
    relu_mask = y > 0
    dy = np.ones(4, np.float32) * relu_mask  # d sum(relu(y)) / dy
    g = F.fake_quantize_backward(dy.astype(np.float32), m)
    assert g.tolist() == [0.0, 0.0, 1.0, 0.0]
    assert np.array_equal(g, m * relu_mask)


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_ste_backward_matches_torch(torch, rng, dtype):
    x = (rng.standard_normal((5, 7)) * 3).astype(dtype)
    gy = rng.standard_normal((5, 7)).astype(dtype)
    gy[0, :3] = [np.nan, -np.inf, -2.0]
    x[0, :3] = 1e6  # out of range
    tx = torch.from_numpy(x).requires_grad_(True)
    ty = torch.fake_quantize_per_tensor_affine(tx, 0.1, 0, -128, 127)
    ty.backward(torch.from_numpy(gy))
    _, m = F.fake_quantize_per_tensor_affine_cachemask(x, 0.1, 0, -128, 127)
    g = F.fake_quantize_backward(gy, m)
    assert bits_equal(g, tx.grad.numpy())
    assert np.isnan(g[0, 0])  # NaN * 0 stays NaN, as torch
    # contiguous out=grad_y: the in-place kernel
    gin = gy.copy()
    assert F.fake_quantize_backward(gin, m, out=gin) is gin
    assert bits_equal(gin, tx.grad.numpy())
    # strided grad_y and out=grad_y in place
    gbig = np.zeros((5, 14), dtype)
    gbig[:, ::2] = gy
    F.fake_quantize_backward(gbig[:, ::2], m, out=gbig[:, ::2])
    assert bits_equal(gbig[:, ::2], tx.grad.numpy())
    # mask None: identity (copy)
    c = F.fake_quantize_backward(gy, None)
    assert bits_equal(c, gy) and c is not gy


@pytest.mark.parametrize("in_place", [False, True])
def test_ste_backward_parallel_build(torch, rng, force_parallel, in_place):
    """The parallel STE kernels (out-of-place and in place) under the forced parallel builds."""
    x = (rng.standard_normal(1000) * 20).astype(np.float32)
    gy = rng.standard_normal(1000).astype(np.float32)
    tx = torch.from_numpy(x).requires_grad_(True)
    torch.fake_quantize_per_tensor_affine(tx, 0.1, 0, -128, 127).backward(torch.from_numpy(gy))
    _, m = F.fake_quantize_per_tensor_affine_cachemask(x, 0.1, 0, -128, 127)
    assert 0 < m.sum() < m.size
    g = F.fake_quantize_backward(gy, m, out=gy) if in_place else F.fake_quantize_backward(gy, m)
    assert bits_equal(g, tx.grad.numpy())


def test_ste_per_channel_matches_torch(torch, rng):
    x = (rng.standard_normal((4, 6)) * 3).astype(np.float32)
    scale, zp = channel_qparams(rng, 6, -8, 7, 0.05, 0.5)
    tx = torch.from_numpy(x).requires_grad_(True)
    gy = rng.standard_normal((4, 6)).astype(np.float32)
    torch.fake_quantize_per_channel_affine(
        tx, torch.from_numpy(scale), torch.from_numpy(zp), 1, -8, 7
    ).backward(torch.from_numpy(gy))
    _, m = F.fake_quantize_per_channel_affine_cachemask(x, scale, zp, -1, -8, 7)
    assert bits_equal(F.fake_quantize_backward(gy, m), tx.grad.numpy())


# ----------------------------------------------------------------------------------------------
# LSQ
# ----------------------------------------------------------------------------------------------
def _agree_add_first(x, scale, zp):
    """Elements where torch's backward rounding rint(z + x*inv) equals rint(x*inv) + z.

    torch's x86 build contracts z + x*inv into an FMA (one rounding of the exact value),
    modelled here in float64 (the float32 product is exact there)."""
    inv = np.float32(1) / np.float32(scale)
    with np.errstate(over="ignore", invalid="ignore"):
        a = np.rint((np.float64(zp) + x.astype(np.float64) * np.float64(inv)).astype(np.float32))
        b = np.rint(x * inv) + np.float32(zp)
    return a == b


@pytest.mark.parametrize("rng_name", ["int8", "uint8", "int4"])
@pytest.mark.parametrize("scale", [1e-3, 0.1, 3.0])
def test_lsq_per_tensor_matches_torch(torch, rng, rng_name, scale):
    qmin, qmax = RANGES[rng_name]
    # torch's per-tensor backward rounds the zero point as int64(zp + 0.5) (truncation): it
    # agrees with the forward's rint only for non-negative, non-tie zero points (-49 -> -48)
    zi = round(qmax * 0.31)
    zpf = np.float32(zi + 0.2)
    zr = float(np.clip(np.rint(zpf), qmin, qmax))
    x = grid_data(rng, (200,), scale, zr, qmin, qmax)
    x = x[_agree_add_first(x, scale, zr)]
    gy = rng.standard_normal(x.shape).astype(np.float32)
    gf = 1.0 / np.sqrt(x.size * qmax)
    ts = torch.tensor([scale], dtype=torch.float32)
    tz = torch.tensor([zpf], dtype=torch.float32)
    ty = torch._fake_quantize_learnable_per_tensor_affine(
        torch.from_numpy(x), ts, tz, qmin, qmax, gf
    )
    y = F.fake_quantize_learnable_per_tensor_affine(x, np.float32([scale]), zpf, qmin, qmax, gf)
    assert bits_equal(y, ty.numpy())
    tdx, tds, tdz = torch.ops.aten._fake_quantize_learnable_per_tensor_affine_backward(
        torch.from_numpy(gy), torch.from_numpy(x), ts, tz, qmin, qmax, gf
    )
    gx, ds, dz = F.fake_quantize_learnable_per_tensor_affine_backward(
        gy, x, np.float32([scale]), np.float32([zpf]), qmin, qmax, gf
    )
    assert bits_equal(gx, tdx.numpy())
    assert ds.shape == (1,) and dz.shape == (1,) and ds.dtype == np.float32
    tol = 1e-5 * (np.abs(gy).sum() * max(scale, 1) * (qmax - qmin) * gf + 1e-30)
    np.testing.assert_allclose(ds, tds.numpy(), rtol=1e-5, atol=tol)
    np.testing.assert_allclose(dz, tdz.numpy(), rtol=1e-5, atol=tol)
    rx, rs, rz = lsq_ref(gy, x, scale, zpf, qmin, qmax, gf)
    assert bits_equal(gx, rx)
    np.testing.assert_allclose(ds, rs, rtol=2e-7, atol=1e-30)
    np.testing.assert_allclose(dz, rz, rtol=2e-7, atol=1e-30)


@pytest.mark.parametrize("axis", [0, 1, -1, 2])
def test_lsq_per_channel_matches_torch(torch, rng, axis):
    shape = (4, 5, 6)
    qmin, qmax = -128, 127
    C = shape[axis]
    scale = np.exp(rng.uniform(np.log(0.01), np.log(0.2), C)).astype(np.float32)
    zpf = rng.uniform(-20, 20, C).astype(np.float32)
    zpf[np.abs(zpf - np.floor(zpf) - 0.5) < 0.05] += 0.2  # avoid .5 ties
    x = (rng.standard_normal(shape) * 8).astype(np.float32)
    gy = rng.standard_normal(shape).astype(np.float32)
    gf = 0.37
    tx = torch.from_numpy(x)
    ts, tz = torch.from_numpy(scale), torch.from_numpy(zpf)
    ax = axis % 3
    ty = torch._fake_quantize_learnable_per_channel_affine(tx, ts, tz, ax, qmin, qmax, gf)
    y = F.fake_quantize_learnable_per_channel_affine(x, scale, zpf, axis, qmin, qmax, gf)
    assert bits_equal(y, ty.numpy())
    tdx, tds, tdz = torch.ops.aten._fake_quantize_learnable_per_channel_affine_backward(
        torch.from_numpy(gy), tx, ts, tz, ax, qmin, qmax, gf
    )
    gx, ds, dz = F.fake_quantize_learnable_per_channel_affine_backward(
        gy, x, scale, zpf, axis, qmin, qmax, gf
    )
    bshape = [1, 1, 1]
    bshape[ax] = C
    agree = _agree_add_first(x, scale.reshape(bshape), np.rint(zpf).reshape(bshape))
    assert agree.mean() > 0.9
    assert bits_equal(gx[agree], tdx.numpy()[agree])
    rx, rs, rz = lsq_ref(gy, x, scale, zpf, qmin, qmax, gf, axis=ax)
    assert bits_equal(gx, rx)
    np.testing.assert_allclose(ds, rs, rtol=2e-7, atol=1e-30)
    np.testing.assert_allclose(dz, rz, rtol=2e-7, atol=1e-30)
    if agree.all():
        np.testing.assert_allclose(ds, tds.numpy(), rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(dz, tdz.numpy(), rtol=1e-5, atol=1e-5)


def test_lsq_per_channel_chunked_path_and_thread_independence(rng, force_parallel):
    """inner == 1 with many rows uses the chunked reduction; results must not depend on the
    number of threads."""
    x = (rng.standard_normal((700, 5)) * 3).astype(np.float32)
    gy = rng.standard_normal(x.shape).astype(np.float32)
    scale = np.float32([0.02, 0.05, 0.1, 0.2, 0.5])
    zp = np.float32([0, 3, -4, 10, -128])
    res = []
    old = numba.get_num_threads()
    try:
        for nt in sorted({1, old}):
            numba.set_num_threads(nt)
            res.append(
                F.fake_quantize_learnable_per_channel_affine_backward(
                    gy, x, scale, zp, 1, -128, 127, 0.5
                )
            )
            res.append(
                F.fake_quantize_learnable_per_tensor_affine_backward(
                    gy, x, 0.05, 2.0, -128, 127, 0.5
                )
            )
    finally:
        numba.set_num_threads(old)
    for a, b in zip(res[0], res[-2]):
        assert bits_equal(a, b)
    for a, b in zip(res[1], res[-1]):
        assert bits_equal(a, b)
    rx, rs, rz = lsq_ref(gy, x, scale, zp, -128, 127, 0.5, axis=1)
    assert bits_equal(res[0][0], rx)
    np.testing.assert_allclose(res[0][1], rs, rtol=2e-7)
    np.testing.assert_allclose(res[0][2], rz, rtol=2e-7)


def test_lsq_negative_zero_point_uses_forward_rounding(torch, rng):
    """torch's per-tensor CPU backward uses int64(zp + 0.5) = -48 for zp = -49 (a quirk nbqat
    does not copy); nbqat's backward uses the forward's zero point (the reference)."""
    x = (rng.standard_normal(50) * 0.1).astype(np.float32)
    gy = rng.standard_normal(50).astype(np.float32)
    gx, ds, dz = F.fake_quantize_learnable_per_tensor_affine_backward(
        gy, x, 1e-3, -49.0, -128, 127, 0.1
    )
    rx, rs, rz = lsq_ref(gy, x, 1e-3, -49.0, -128, 127, 0.1)
    assert bits_equal(gx, rx)
    np.testing.assert_allclose(ds, rs, rtol=2e-7)
    np.testing.assert_allclose(dz, rz, rtol=2e-7)
    # torch with zp = -48 in its backward equals nbqat's backward of zp = -48 on the
    # elements where the add-first rounding agrees
    keep = _agree_add_first(x, 1e-3, -48.0)
    tdx, tds, _ = torch.ops.aten._fake_quantize_learnable_per_tensor_affine_backward(
        torch.from_numpy(gy[keep]),
        torch.from_numpy(x[keep]),
        torch.tensor([1e-3]),
        torch.tensor([-49.0]),
        -128,
        127,
        0.1,
    )
    gx48, ds48, _ = F.fake_quantize_learnable_per_tensor_affine_backward(
        gy[keep], x[keep], 1e-3, -48.0, -128, 127, 0.1
    )
    assert bits_equal(gx48, tdx.numpy())
    np.testing.assert_allclose(ds48, tds.numpy(), rtol=1e-5, atol=1e-6)


def test_lsq_nonfinite_and_bad_input():
    x = np.float32([np.nan, np.inf, -np.inf, 0.3])
    gy = np.float32([1.0, 1.0, 1.0, 1.0])
    gx, ds, dz = F.fake_quantize_learnable_per_tensor_affine_backward(gy, x, 0.1, 0.0, -8, 7, 1.0)
    rx, rs, rz = lsq_ref(gy, x, 0.1, 0.0, -8, 7, 1.0)
    assert bits_equal(gx, rx) and gx.tolist() == [0.0, 0.0, 0.0, 1.0]
    np.testing.assert_allclose(ds, rs, rtol=1e-7)
    np.testing.assert_allclose(dz, rz, rtol=1e-7)
    with pytest.raises(ValueError, match="grad_y"):
        F.fake_quantize_learnable_per_tensor_affine_backward(gy[:3], x, 0.1, 0.0, -8, 7)
    with pytest.raises(TypeError, match="grad_y"):
        F.fake_quantize_learnable_per_tensor_affine_backward(
            gy.astype(np.float64), x, 0.1, 0.0, -8, 7
        )
    with pytest.raises(ValueError, match="zero_point"):
        F.fake_quantize_learnable_per_tensor_affine(x, 0.1, np.nan, -8, 7)
    with pytest.raises(ValueError, match="grad_factor"):
        F.fake_quantize_learnable_per_tensor_affine(x, 0.1, 0.0, -8, 7, np.inf)
    with pytest.raises(ValueError, match="scale"):
        F.fake_quantize_learnable_per_channel_affine_backward(
            gy, x, np.float32([0.0]), np.float32([0]), 0, -8, 7
        )


# ----------------------------------------------------------------------------------------------
# hypothesis properties
# ----------------------------------------------------------------------------------------------
finite32 = st.floats(-1e6, 1e6, width=32, allow_nan=False, allow_infinity=False)
any32 = st.floats(width=32)
qranges = st.sampled_from(list(RANGES.values()) + [(0, 127), (-64, 63)])
scales = st.floats(float(np.float32(1e-6)), 1e3, width=32)


@settings(max_examples=50, deadline=None)
@given(st.lists(any32, min_size=1, max_size=40), scales, qranges, st.floats(0, 1))
def test_property_idempotent_on_grid_and_mask(xs, scale, qr, zfrac):
    qmin, qmax = qr
    zp = int(round(qmin + zfrac * (qmax - qmin)))
    x = np.array(xs, np.float32)
    y, m = F.fake_quantize_per_tensor_affine_cachemask(x, scale, zp, qmin, qmax)
    # fq(fq(x)) == fq(x)
    y2 = F.fake_quantize_per_tensor_affine(y, scale, zp, qmin, qmax)
    assert bits_equal(y2, y)
    # outputs lie on the grid: y == (k - zp) * scale for an integer k in [qmin, qmax]
    s = np.float32(scale)
    k = np.rint(y * (np.float32(1) / s)) + np.float32(zp)
    assert ((k >= qmin) & (k <= qmax)).all()
    assert bits_equal(((k - np.float32(zp)) * s).astype(np.float32), y)
    # mask true exactly when the unclamped rounded value is in range
    with np.errstate(over="ignore", invalid="ignore"):
        r = np.rint(x * (np.float32(1) / s)) + np.float32(zp)
    assert np.array_equal(m, (r >= qmin) & (r <= qmax))


@settings(max_examples=30, deadline=None)
@given(
    st.lists(finite32, min_size=6, max_size=36).filter(lambda v: len(v) % 6 == 0),
    st.lists(scales, min_size=6, max_size=6),
    qranges,
    st.integers(-2, 1),
)
def test_property_per_channel_equals_per_tensor_slices(xs, sc, qr, axis):
    qmin, qmax = qr
    x = np.array(xs, np.float32).reshape(-1, 6)
    if axis in (0, -2):
        C = x.shape[0]
        sc = (sc * C)[:C]
    scale = np.array(sc, np.float32)
    zp = np.full(scale.size, (qmin + qmax) // 2, np.int32)
    y, m = F.fake_quantize_per_channel_affine_cachemask(x, scale, zp, axis, qmin, qmax)
    xm = np.moveaxis(x, axis, 0)
    ym, mm = np.moveaxis(y, axis, 0), np.moveaxis(m, axis, 0)
    for c in range(scale.size):
        yc, mc = F.fake_quantize_per_tensor_affine_cachemask(
            xm[c], scale[c], int(zp[c]), qmin, qmax
        )
        assert bits_equal(ym[c], yc) and np.array_equal(mm[c], mc)


@settings(max_examples=30, deadline=None)
@given(st.lists(any32, min_size=1, max_size=30), scales, qranges)
def test_property_matches_torch(torch, xs, scale, qr):
    qmin, qmax = qr
    x = np.array(xs, np.float32)
    y, m = F.fake_quantize_per_tensor_affine_cachemask(x, scale, qmin, qmin, qmax)
    ty, tm = t_cachemask(torch, x, scale, qmin, qmin, qmax)
    assert bits_equal(y, ty) and np.array_equal(m, tm)
