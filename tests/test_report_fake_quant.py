"""The report's fake quantization (``nbqat.train.report._fq_numpy``) is the library's own: the
float32
bits of the quantizer's forward, checked against torch's fake quantize (per tensor, per channel)
and against the low-bit quantizers' own forwards; the saturated count is the STE mask's zeros."""

from __future__ import annotations

import numpy as np
import pytest

import nbqat
from nbqat.quantization.lowbit_quantize import GroupFakeQuantize
from nbqat.train import report


def _ties(scale: np.float32, n: int) -> np.ndarray:
    """float32 values near the rounding midpoints ``(k + 0.5) * scale`` where the float32
    product ``x * (1 / scale)`` and the float64 quotient ``x / scale`` round to different codes
    (the report's former formula); at least one is found for the scales used here."""
    inv = np.float32(1.0) / scale
    k = np.arange(-n, n, dtype=np.float64)
    mid = ((k + 0.5) * np.float64(scale)).astype(np.float32)
    cand = np.concatenate([mid, np.nextafter(mid, np.float32(np.inf)), np.nextafter(mid, -np.inf)])
    cand = cand.astype(np.float32)
    old = np.rint(cand.astype(np.float64) / np.float64(scale))
    new = np.rint(cand * inv).astype(np.float64)
    return cand[old != new]


def _batch(rng, shape, scale):
    x = (rng.standard_normal(shape) * 3).astype(np.float32)
    x.reshape(-1)[:3] = (40.0, -40.0, 1e3)  # outside the range: saturated
    ties = _ties(np.float32(scale), 64)
    assert ties.size  # the inputs can tell the two formulas apart
    flat = x.reshape(-1)
    flat[3 : 3 + min(ties.size, flat.size - 3)] = ties[: flat.size - 3]
    return x


def _calibrated(rng, shape, **kwargs):
    fq = nbqat.FakeQuantize(**kwargs)
    fq(rng.standard_normal(shape).astype(np.float32) * 2)
    fq.disable_observer()
    return fq


def _check_against(fq, x, y_torch, mask_torch):
    y, sat = report._fq_numpy(fq, x)
    assert y.dtype == np.float64
    assert np.array_equal(y.astype(np.float32).view(np.int32), y_torch.view(np.int32))
    assert np.array_equal(y, y.astype(np.float32).astype(np.float64))  # float32 values
    assert sat == int(np.count_nonzero(~mask_torch)) and sat >= 3
    own = fq(x)  # the quantizer's forward: the same bits
    assert np.array_equal(np.asarray(own, np.float32).view(np.int32), y_torch.view(np.int32))


def test_per_tensor_is_torchs_fake_quantize(torch, rng):
    fq = _calibrated(rng, (6, 20), quant_min=0, quant_max=255)
    s, z = float(fq.scale[0]), int(fq.zero_point[0])
    x = _batch(rng, (6, 20), fq.scale[0])
    y_t, m_t = torch.ops.aten.fake_quantize_per_tensor_affine_cachemask(
        torch.from_numpy(x), s, z, 0, 255
    )
    _check_against(fq, x, y_t.numpy(), m_t.numpy())


def test_per_channel_is_torchs_fake_quantize(torch, rng):
    fq = _calibrated(
        rng,
        (4, 30),
        observer=nbqat.PerChannelMinMaxObserver,
        dtype="qint8",
        qscheme="per_channel_symmetric",
        ch_axis=0,
    )
    x = _batch(rng, (4, 30), fq.scale[0])
    y_t, m_t = torch.ops.aten.fake_quantize_per_channel_affine_cachemask(
        torch.from_numpy(x),
        torch.from_numpy(fq.scale.copy()),
        torch.from_numpy(fq.zero_point.astype(np.int32)),
        0,
        fq.quant_min,
        fq.quant_max,
    )
    _check_against(fq, x, y_t.numpy(), m_t.numpy())


def test_the_check_can_fail(torch, rng):
    """The former float64 formula (``rint(x / s)``) gives other bits on the same inputs."""
    fq = _calibrated(rng, (6, 20), quant_min=0, quant_max=255)
    s, z = np.float64(fq.scale[0]), int(fq.zero_point[0])
    x = _batch(rng, (6, 20), fq.scale[0])
    old = (np.clip(np.rint(x.astype(np.float64) / s) + z, 0, 255) - z) * s
    assert not np.array_equal(old, report._fq_numpy(fq, x)[0])


@pytest.mark.parametrize("mapping_type", ["symmetric", "asymmetric"])
def test_grouped_weights_use_their_forward(rng, mapping_type):
    fq = GroupFakeQuantize(8, mapping_type=mapping_type)
    w = rng.standard_normal((4, 16)).astype(np.float32)
    fq(w)
    fq.disable_observer()
    x = w * np.float32(1.7)  # beyond the observed range: some codes saturate
    y, sat = report._fq_numpy(fq, x)
    y32 = fq(x)
    assert np.array_equal(y.astype(np.float32).view(np.int32), y32.view(np.int32))
    assert sat == int(np.count_nonzero(~fq.ctx)) and sat > 0
