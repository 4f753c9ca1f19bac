"""CUDA twins of the clipping kernels under the simulator (tiny arrays, tiny blocks) against the
CPU kernels and torch."""

from __future__ import annotations

import math

import numpy as np
import pytest

import nbqat
from nbqat.kernels import norm_cpu as K

NORMS = [2.0, 1.0, 3.5, math.inf]


@pytest.fixture
def dev(cuda_sim, small_cuda_blocks):
    return cuda_sim


def host_set(rng, dtype):
    shapes = [(4, 5), (1,), (7,), (3, 2, 2), (0,), (9,)]
    return [rng.standard_normal(s).astype(dtype) for s in shapes]


def device_views(dev, arrays):
    """Device views of one flat device buffer (the one-launch fast path)."""
    flat = np.concatenate([a.ravel() for a in arrays])
    d = dev.to_device(flat)
    out, o = [], 0
    for a in arrays:
        out.append(d[o : o + a.size].reshape(a.shape))
        o += a.size
    return d, out


def close(a, b, dtype):
    if dtype == np.float64:
        return a == pytest.approx(b, rel=1e-14)
    return a == pytest.approx(b, rel=1e-7)  # float64 sums in another order, then rounded


@pytest.mark.parametrize("p", NORMS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
@pytest.mark.parametrize("layout", ["views", "separate"])
def test_norm_and_clip_match_cpu(dev, rng, dtype, p, layout):
    arrays = host_set(rng, dtype)
    if layout == "views":
        _, darr = device_views(dev, arrays)
    else:
        darr = [dev.to_device(a) for a in arrays]
    cpu_total = nbqat.get_total_norm(arrays, p)
    assert close(nbqat.get_total_norm(darr, p), cpu_total, dtype)
    hc = [a.copy() for a in arrays]
    t_cpu = nbqat.clip_grad_norm_(hc, 0.5, p)
    t_gpu = nbqat.clip_grad_norm_(darr, 0.5, p)
    assert close(t_gpu, t_cpu, dtype)
    for d, h in zip(darr, hc):
        got = d.copy_to_host()
        assert got.dtype == h.dtype and got.shape == h.shape
        if t_gpu == t_cpu:
            assert np.array_equal(got, h)
        else:
            np.testing.assert_allclose(got, h, rtol=2e-7 if dtype != np.float16 else 1e-3)


def test_multi_chunk_views_match_cpu(dev, rng):
    # a few work items per array even with tiny blocks (grid-stride over items)
    arrays = [rng.standard_normal(K.CHUNK + 5).astype(np.float32), rng.standard_normal(3)]
    arrays[1] = arrays[1].astype(np.float32)
    _, darr = device_views(dev, arrays)
    assert close(nbqat.get_total_norm(darr), nbqat.get_total_norm(arrays), np.float32)


def test_nonfinite_and_errors(dev, rng):
    arrays = host_set(rng, np.float32)
    arrays[0][1, 1] = np.nan
    _, darr = device_views(dev, arrays)
    with pytest.raises(RuntimeError, match="order 2.0"):
        nbqat.clip_grad_norm_(darr, 1.0, error_if_nonfinite=True)
    assert np.isnan(darr[0].copy_to_host()[1, 1]) and not np.isnan(darr[1].copy_to_host()).any()
    assert math.isnan(nbqat.clip_grad_norm_(darr, 1.0))
    assert all(np.isnan(d.copy_to_host()).all() for d in darr)
    inf = [
        dev.to_device(np.array([np.inf, 1.0], np.float32)),
        dev.to_device(np.ones(3, np.float32)),
    ]
    assert nbqat.clip_grad_norm_(inf, 1.0) == math.inf
    assert (inf[1].copy_to_host() == 0).all()


def test_clip_grad_value_and_with_norm_match_cpu(dev, rng):
    for dtype in (np.float32, np.float16, np.float64):
        arrays = host_set(rng, dtype)
        arrays[0][0, 0] = np.nan
        _, darr = device_views(dev, arrays)
        hc = [a.copy() for a in arrays]
        nbqat.clip_grad_value_(darr, 0.4)
        nbqat.clip_grad_value_(hc, 0.4)
        assert all(np.array_equal(d.copy_to_host(), h, equal_nan=True) for d, h in zip(darr, hc))
        nbqat.clip_grads_with_norm_(darr, 0.3, 2.5)
        nbqat.clip_grads_with_norm_(hc, 0.3, 2.5)
        assert all(np.array_equal(d.copy_to_host(), h, equal_nan=True) for d, h in zip(darr, hc))


def test_deterministic_repeat(dev, rng):
    arrays = host_set(rng, np.float32)
    _, darr = device_views(dev, arrays)
    assert len({nbqat.get_total_norm(darr, 3.5) for _ in range(3)}) == 1


def test_cuda_validation(dev, rng):
    d = dev.to_device(np.arange(6, dtype=np.int32))
    with pytest.raises(TypeError, match="dtype"):
        nbqat.get_total_norm([d])
    base = dev.to_device(np.ones((4, 4), np.float32))
    with pytest.raises(ValueError, match="contiguous"):
        nbqat.get_total_norm([base[:, ::2]])
    assert nbqat.get_total_norm([]) == 0.0


def test_device_shared_memory_rejected_before_anything_written(dev, rng):
    # the host's refusal on the device too: [d, d] or overlapping views were counted and scaled
    # twice (norm sqrt(2) times too large, gradients scaled by its square); adjacent views clip
    buf = rng.standard_normal(12).astype(np.float32) * 100
    d = dev.to_device(buf)
    other = dev.to_device(buf[:3])
    for grads, pair in (([d, d], "grads\\[0\\] and grads\\[1\\]"),
                        ([d[:6], other, d[4:]], "grads\\[0\\] and grads\\[2\\]")):  # fmt: skip
        for clip in (lambda g: nbqat.clip_grad_norm_(g, 1.0),
                     lambda g: nbqat.clip_grads_with_norm_(g, 1.0, 1e3),
                     lambda g: nbqat.clip_grad_value_(g, 0.1)):  # fmt: skip
            with pytest.raises(ValueError, match=pair + " share memory"):
                clip(grads)
            assert np.array_equal(d.copy_to_host(), buf)
    want = np.sqrt(np.sum(buf.astype(np.float64) ** 2))
    assert nbqat.clip_grad_norm_([d[:5], d[5:]], 1.0) == pytest.approx(want, rel=1e-6)
