"""CUDA twins of the histogram counting kernels (simulator in CI) against the CPU kernels."""

from __future__ import annotations

import numpy as np
import pytest

import nbqat
from nbqat.kernels import histogram_cpu as hk
from nbqat.kernels import keygrid_cpu as kg


@pytest.mark.parametrize("n", [1, 7, 13, 50])
@pytest.mark.parametrize("wide", [False, True])
def test_histc_counts_match_cpu(cuda_sim, small_cuda_blocks, rng, n, wide):
    from nbqat.kernels import histogram_cuda as hc

    x = rng.standard_normal(n).astype(np.float32)
    x[0] = np.nan if n > 1 else x[0]
    lo, hi = np.float32(-1.5), np.float32(2.0)
    got = hc.histc_counts(cuda_sim.to_device(x), lo, hi, 9, wide)
    np.testing.assert_array_equal(got, hk.histc_counts(x, lo, hi, 9, wide))


@pytest.mark.parametrize("n", [3, 17, 41])
def test_key_counts_match_cpu(cuda_sim, small_cuda_blocks, rng, n):
    from nbqat.kernels import histogram_cuda as hc

    x = (rng.standard_normal(n) * 10.0 ** rng.integers(-30, 30, n)).astype(np.float32)
    x[:3] = [np.inf, -0.0, np.nan]
    b = x.view(np.int32)
    np.testing.assert_array_equal(hc.key_counts(cuda_sim.to_device(b), 20), kg.key_counts(b, 20))


@pytest.mark.parametrize(
    "make",
    [
        lambda: nbqat.HistogramObserver(bins=32, nonfinite="ignore"),
        lambda: nbqat.PercentileObserver(percentile=99.0, nonfinite="ignore"),
        lambda: nbqat.MSEObserver(num_candidates=10, nonfinite="ignore"),
        lambda: nbqat.MSEObserver(qscheme="per_channel_affine", ch_axis=1, nonfinite="ignore"),
    ],
)
def test_observer_on_device_equals_host(cuda_sim, small_cuda_blocks, rng, make):
    host, dev = make(), make()
    for scale in (1.0, 3.0):
        x = (rng.standard_normal((5, 6)) * scale).astype(np.float32)
        x[1, 2] = np.inf
        host(x)
        dev(cuda_sim.to_device(x))
    np.testing.assert_array_equal(dev.histogram, host.histogram)
    for a, b in zip(dev.calculate_qparams(), host.calculate_qparams()):
        np.testing.assert_array_equal(a, b)


def test_float64_device_input_observed_as_float32(cuda_sim, small_cuda_blocks, rng):
    x = rng.standard_normal(23) * 1e3
    host, dev = nbqat.HistogramObserver(bins=16), nbqat.HistogramObserver(bins=16)
    host(x)
    dev(cuda_sim.to_device(x))
    np.testing.assert_array_equal(dev.histogram, host.histogram)
