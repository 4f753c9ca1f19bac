"""Observer update speed: nbqat vs ``torch.aminmax`` / torch's observers and the read roof.

Run: ``python -m pytest benchmarks/bench_observers.py --benchmark-enable -s``
(``NBQAT_BENCH_SMALL=1`` for a smoke run). Figures printed as ``[nbqat-bench] ...``:

* per tensor, 2^25 float32 and float16, on one thread (Numba, torch and the roof):
  ``vs_torch_aminmax`` = torch time / nbqat time on the same array (median of interleaved
  pairs, target >= 1.0) and ``roof_fraction`` = fastest read of the same bytes / nbqat time
  (interleaved too, target >= 0.9);
* per channel, (4096, 8192), ch_axis 0 and 1: ``vs_torch_observer`` = torch
  ``PerChannelMinMaxObserver.forward`` time / nbqat time (target >= 2).

Ratios are reported, never asserted.
"""

from __future__ import annotations

import numba
import numpy as np
import pytest
from _roof import _parallel_read, bench_median, median_time, paired_ratio, read_roof, report
from conftest import SMALL

import nbqat

N = 1 << 16 if SMALL else 1 << 25
SHAPE = (64, 128) if SMALL else (4096, 8192)


@pytest.fixture(scope="module")
def torch():
    t = pytest.importorskip("torch")
    return t


def _data(shape):
    return np.random.default_rng(0).standard_normal(shape).astype(np.float32)


@pytest.fixture
def one_thread(torch):
    """Numba, torch and the read roof on one thread (issue 32's convention), restored after."""
    old = numba.get_num_threads(), torch.get_num_threads()
    numba.set_num_threads(1)
    torch.set_num_threads(1)
    yield
    numba.set_num_threads(old[0])
    torch.set_num_threads(old[1])


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_per_tensor_update(benchmark, torch, one_thread, dtype):
    x = _data(N).astype(dtype)
    obs = nbqat.MinMaxObserver()
    obs(x)  # compile / warm up
    benchmark(obs, x)
    t_ours = bench_median(benchmark)
    if t_ours != t_ours:  # benchmark disabled
        t_ours = median_time(lambda: obs(x))
    tx = torch.from_numpy(x)
    words = x.view(np.uint64)
    vs_torch, _, _, _, _ = paired_ratio(lambda: torch.aminmax(tx), lambda: obs(x))
    roof, _, _, _, _ = paired_ratio(lambda: _parallel_read(words), lambda: obs(x))
    report(
        benchmark,
        seconds=t_ours,
        gbytes_per_s=x.nbytes / t_ours / 1e9,
        vs_torch_aminmax=vs_torch,
        roof_fraction=roof,
    )


@pytest.mark.parametrize("ch_axis", [0, 1])
def test_per_channel_update(benchmark, torch, ch_axis):
    x = _data(SHAPE)
    obs = nbqat.PerChannelMinMaxObserver(ch_axis=ch_axis)
    obs(x)
    benchmark(obs, x)
    t_ours = bench_median(benchmark)
    if t_ours != t_ours:
        t_ours = median_time(lambda: obs(x))
    tobs = torch.ao.quantization.PerChannelMinMaxObserver(ch_axis=ch_axis)
    tx = torch.from_numpy(x)
    t_torch = median_time(lambda: tobs(tx), repeat=5)
    t_roof = read_roof(x.nbytes)
    report(
        benchmark,
        seconds=t_ours,
        vs_torch_observer=t_torch / t_ours,
        roof_fraction=t_roof / t_ours,
    )
