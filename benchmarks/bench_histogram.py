"""HistogramObserver update speed: nbqat vs torch's ``HistogramObserver.forward`` and the read roof.

Run: ``python -m pytest benchmarks/bench_histogram.py --benchmark-enable -s``
(``NBQAT_BENCH_SMALL=1`` for a smoke run). Figures printed as ``[nbqat-bench] ...``:

* steady state (the batch inside the running range: min/max pass + counting pass + add),
  2^25 float32: ``vs_torch_observer`` = torch time / nbqat time (goal >= 10) and
  ``roof_fraction`` = fastest parallel read of the same bytes / nbqat time (one fused pass
  reads the data once), ``one_thread_seconds`` (the same update on one Numba thread) and
  ``one_thread_vs_torch_observer`` (interleaved pairs, both on one thread; goal >= 4);
* growing range (each batch scaled up: the old histogram is re-binned too): the same ratio;
* ``calculate_qparams`` (the L2 search): torch time / nbqat time.

Ratios are reported, never asserted.
"""

from __future__ import annotations

import itertools

import numba
import numpy as np
import pytest
from _roof import bench_median, median_time, paired_ratio, read_roof, report
from conftest import SMALL

import nbqat

N = 1 << 16 if SMALL else 1 << 25


@pytest.fixture(scope="module")
def torch():
    return pytest.importorskip("torch")


def _data(n):
    return np.random.default_rng(0).standard_normal(n).astype(np.float32)


def _torch_obs(torch):
    return torch.ao.quantization.HistogramObserver()


def test_histogram_update(benchmark, torch):
    x = _data(N)
    obs = nbqat.HistogramObserver()
    obs(x)  # compile, and fix the range: later updates are steady state
    benchmark(obs, x)
    t_ours = bench_median(benchmark)
    if t_ours != t_ours:  # benchmark disabled
        t_ours = median_time(lambda: obs(x), repeat=3)
    tobs = _torch_obs(torch)
    tx = torch.from_numpy(x)
    tobs(tx)
    t_torch = median_time(lambda: tobs(tx), repeat=3)
    old = numba.get_num_threads(), torch.get_num_threads()
    try:  # one thread too (issue 32's convention; on a shared VM the second vCPU is often busy)
        numba.set_num_threads(1)
        torch.set_num_threads(1)
        t_one = median_time(lambda: obs(x), repeat=3)
        vs_one, _, _, _, _ = paired_ratio(lambda: tobs(tx), lambda: obs(x), rounds=7)
    finally:
        numba.set_num_threads(old[0])
        torch.set_num_threads(old[1])
    report(
        benchmark,
        seconds=t_ours,
        gbytes_per_s=x.nbytes / t_ours / 1e9,
        vs_torch_observer=t_torch / t_ours,
        roof_fraction=read_roof(x.nbytes) / t_ours,
        one_thread_seconds=t_one,
        one_thread_vs_torch_observer=vs_one,
    )


def test_histogram_update_growing_range(benchmark, torch):
    x = _data(N)
    scales = itertools.count(1)
    obs = nbqat.HistogramObserver()
    obs(x)
    benchmark(lambda: obs(x * np.float32(next(scales))))
    t_ours = bench_median(benchmark)
    if t_ours != t_ours:
        t_ours = median_time(lambda: obs(x * np.float32(next(scales))), repeat=3)
    tobs = _torch_obs(torch)
    tx = torch.from_numpy(x)
    tobs(tx)
    t_scales = itertools.count(1)
    t_torch = median_time(lambda: tobs(tx * float(next(t_scales))), repeat=3)
    report(benchmark, seconds=t_ours, vs_torch_observer=t_torch / t_ours)


def test_histogram_calculate_qparams(benchmark, torch):
    x = _data(min(N, 1 << 20))
    obs, tobs = nbqat.HistogramObserver(), _torch_obs(torch)
    obs(x)
    tobs(torch.from_numpy(x))
    obs.calculate_qparams()
    benchmark(obs.calculate_qparams)
    t_ours = bench_median(benchmark)
    if t_ours != t_ours:
        t_ours = median_time(obs.calculate_qparams, repeat=3)
    t_torch = median_time(tobs.calculate_qparams, repeat=3)
    report(benchmark, seconds=t_ours, vs_torch_observer=t_torch / t_ours)
