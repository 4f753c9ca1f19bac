"""Memory-bandwidth roofs and timing helpers shared by the benchmarks.

The roof of a kernel that moves ``B`` bytes is the time the machine's fastest parallel copy (or
read) of ``B`` bytes takes, measured in the same run; a kernel "at x% of the roof" takes
``roof_time / kernel_time``. Times are medians of several repetitions (machines are shared and
noisy), and every function is called once before timing (JIT compile, page faults).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

import numba
import numpy as np
from numba import njit, prange


@njit(parallel=True, cache=True, nogil=True)
def _parallel_copy(dst, src):  # (n,) uint64 <- (n,) uint64
    for i in prange(src.size):
        dst[i] = src[i]


@njit(parallel=True, cache=True, nogil=True)
def _parallel_copy_chunks(dst, src):  # (n,) uint64 <- (n,) uint64, 64 slices (memcpy-like)
    nchunk = 64
    chunk = (src.size + nchunk - 1) // nchunk
    for c in prange(nchunk):
        a = c * chunk
        b = min(src.size, a + chunk)
        dst[a:b] = src[a:b]


@njit(parallel=True, nogil=True)  # not cacheable (numba.get_num_threads is a dynamic global)
def _parallel_read(src):  # (n,) uint64 -> xor of all words (forces every load)
    nt = numba.get_num_threads()
    chunk = (src.size + nt - 1) // nt
    acc = np.zeros(nt, np.uint64)
    for t in prange(nt):
        a = np.uint64(0)
        # unsigned loop bounds: LLVM vectorises this loop only with an unsigned index
        for i in range(np.uint64(t * chunk), np.uint64(min(src.size, (t + 1) * chunk))):
            a ^= src[i]
        acc[t] = a
    r = np.uint64(0)
    for t in range(nt):
        r ^= acc[t]
    return r


def median_time(fn: Callable[[], Any], repeat: int = 7, warmup: int = 1) -> float:
    """Median wall time in seconds of ``fn()`` over ``repeat`` calls, after ``warmup`` calls."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def paired_ratio(
    fn_a: Callable[[], Any], fn_b: Callable[[], Any], rounds: int = 15
) -> tuple[float, float, float, float, float]:
    """Time ``fn_a`` and ``fn_b`` alternately (a, b, a, b, ...) after one warm-up call each.

    On a shared machine a noisy second hits both members of a pair alike, so the median of the
    per-pair ratios is steadier than a ratio of two medians taken one after the other.

    Returns
    -------
    tuple of float
        ``(median ratio a/b, first quartile, third quartile, median a seconds, median b
        seconds)``.
    """
    fn_a()
    fn_b()
    ta, tb = [], []
    for _ in range(rounds):
        t0 = time.perf_counter()
        fn_a()
        t1 = time.perf_counter()
        fn_b()
        t2 = time.perf_counter()
        ta.append(t1 - t0)
        tb.append(t2 - t1)
    r = np.asarray(ta) / np.asarray(tb)
    q1, med, q3 = (float(v) for v in np.percentile(r, [25, 50, 75]))
    return med, q1, q3, float(np.median(ta)), float(np.median(tb))


def copy_fn(nbytes: int, repeat: int = 7) -> Callable[[], Any]:
    """The faster of two parallel copies that move ``nbytes`` in total (``nbytes / 2`` read and
    ``nbytes / 2`` written), as a callable to time against a kernel (:func:`paired_ratio`).

    The two: an element loop over ``prange`` and a chunked slice copy (which LLVM turns into
    ``memcpy``, with non-temporal stores on large sizes, so it skips the read-for-ownership a
    kernel's ordinary stores pay). The source is written (``np.ones``): a ``np.zeros`` buffer's
    untouched pages all map to one zero page, whose reads hit the cache.
    """
    n = max(1, nbytes // 16)
    src = np.ones(n, np.uint64)
    dst = np.empty_like(src)

    def loop() -> None:
        _parallel_copy(dst, src)

    def chunks() -> None:
        _parallel_copy_chunks(dst, src)

    return min((loop, chunks), key=lambda fn: median_time(fn, repeat))


def copy_roof(nbytes: int, repeat: int = 7) -> float:
    """Median seconds of :func:`copy_fn`'s copy of ``nbytes``."""
    return median_time(copy_fn(nbytes, repeat), repeat)


def read_roof(nbytes: int, repeat: int = 7) -> float:
    """Median seconds of the fastest parallel read of ``nbytes``."""
    src = np.ones(max(1, nbytes // 8), np.uint64)
    return median_time(lambda: _parallel_read(src), repeat)


def bench_median(benchmark) -> float:
    """Median seconds from a finished pytest-benchmark fixture (falls back to NaN if disabled)."""
    stats = getattr(benchmark, "stats", None)
    if stats is None:
        return float("nan")
    return float(stats.stats.median)


def report(benchmark, **figures: float) -> None:
    """Attach figures (ratios, GB/s) to the pytest-benchmark record and print them."""
    for k, v in figures.items():
        benchmark.extra_info[k] = v
    name = getattr(benchmark, "name", "")
    print("\n[nbqat-bench] " + name + " " + " ".join(f"{k}={v:.4g}" for k, v in figures.items()))


def ours_time(benchmark, fn: Callable[[], Any], repeat: int) -> float:
    """Run ``fn`` under pytest-benchmark and return its median; under ``--benchmark-disable``
    (the CI smoke run) time it here instead (:func:`median_time`)."""
    benchmark(fn)
    t = bench_median(benchmark)
    if math.isnan(t):  # --benchmark-disable: time it ourselves
        t = median_time(fn, repeat=repeat)
    return t


def torch_or_none() -> Any:
    """The torch module, or None where it is not installed (the ratio is then left out)."""
    try:
        import torch
    except ImportError:
        return None
    return torch
