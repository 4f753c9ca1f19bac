"""CUDA twins of the observer kernels (run on the simulator in CI) against the CPU kernels."""

from __future__ import annotations

import numpy as np
import pytest

import nbqat
from nbqat.quantization import _observer_stats as S


def _inject(rng, x, n_bad):
    flat = x.reshape(-1)
    for i in rng.choice(flat.size, size=n_bad, replace=False):
        flat[i] = [np.nan, np.inf, -np.inf][i % 3]
    return x


def _same(a, b):
    for u, v in zip(a, b):
        np.testing.assert_array_equal(np.asarray(u), np.asarray(v))


@pytest.mark.parametrize("n", [1, 5, 13, 40])
@pytest.mark.parametrize("n_bad", [0, 4])
def test_per_tensor_stats_match_cpu(cuda_sim, small_cuda_blocks, rng, n, n_bad):
    x = rng.standard_normal(n).astype(np.float32)
    if n_bad and n >= n_bad:
        _inject(rng, x, n_bad)
    got = S.stats_cuda(cuda_sim.to_device(x), None)
    _same(got, S.stats_cpu_tensor(x))


@pytest.mark.parametrize(("shape", "axis"), [((3, 5), 0), ((3, 5), 1), ((2, 3, 4), 1), ((7,), 0)])
@pytest.mark.parametrize("n_bad", [0, 3])
def test_per_channel_stats_match_cpu(cuda_sim, small_cuda_blocks, rng, shape, axis, n_bad):
    x = rng.standard_normal(shape).astype(np.float32)
    _inject(rng, x, n_bad)
    got = S.stats_cuda(cuda_sim.to_device(x), axis)
    _same(got, S.stats_cpu_channel(x, axis))


def test_float64_device_input_observed_as_float32(cuda_sim, small_cuda_blocks, rng):
    x = rng.standard_normal((4, 5)) * 1e3
    x[0, 0] = 1e-40  # underflows in float32
    _same(S.stats_cuda(cuda_sim.to_device(x), None), S.stats_cpu_tensor(x))
    _same(S.stats_cuda(cuda_sim.to_device(x), 1), S.stats_cpu_channel(x, 1))


@pytest.mark.parametrize(
    "cls",
    [
        nbqat.MovingAverageMinMaxObserver,
        nbqat.MinMaxObserver,
        nbqat.PerChannelMinMaxObserver,
        nbqat.MovingAveragePerChannelMinMaxObserver,
    ],
)
def test_observer_on_device_equals_host(cuda_sim, small_cuda_blocks, rng, cls):
    host, dev = cls(nonfinite="ignore"), cls(nonfinite="ignore")
    for _ in range(3):
        x = _inject(rng, rng.standard_normal((4, 6)).astype(np.float32), 2)
        host(x)
        d = cuda_sim.to_device(x)
        assert dev(d) is d
    np.testing.assert_array_equal(dev.min_val, host.min_val)
    np.testing.assert_array_equal(dev.max_val, host.max_val)
    for a, b in zip(dev.calculate_qparams(), host.calculate_qparams()):
        np.testing.assert_array_equal(a, b)


def test_device_nonfinite_raise_keeps_state(cuda_sim, small_cuda_blocks):
    obs = nbqat.MinMaxObserver()
    obs(cuda_sim.to_device(np.array([1.0, -2.0], np.float32)))
    with pytest.raises(ValueError, match="1 NaN"):
        obs(cuda_sim.to_device(np.array([np.nan, 5.0], np.float32)))
    assert obs.min_val == -2.0 and obs.max_val == 1.0


def test_device_integer_input_rejected(cuda_sim):
    with pytest.raises(TypeError, match="float"):
        nbqat.MinMaxObserver()(cuda_sim.to_device(np.arange(4, dtype=np.int32)))
