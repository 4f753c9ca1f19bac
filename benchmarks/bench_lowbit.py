"""Block-wise low-bit fake quantization against torchao 0.18 and the memory roof (issue 30).

* grouped int4 (asymmetric 0..15) fake quant of a (4096, 8192) float32 matrix, G = 16, 32, 128,
  with precomputed qparams: vs ``torchao...._fake_quantize_affine`` and vs the parallel-copy
  roof at 8 B/element (read 4, write 4; the qparams are 1/G of that);
* float8 e4m3fn fake quant of the same matrix, one scale per row: vs torchao's
  ``_dequantize_affine_float8(_quantize_affine_float8(...))`` and the same roof.

Ratios are reported (``[nbqat-bench]`` lines and ``extra_info``), never asserted.
``NBQAT_BENCH_SMALL=1`` shrinks every size.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
from _roof import bench_median, copy_fn, median_time, paired_ratio, report
from conftest import SMALL

import nbqat

SHAPE = (64, 256) if SMALL else (4096, 8192)
REPEAT = 3 if SMALL else 7
BYTES_PER_ELEM = 8


def _qp():
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            import torch
            from torchao.quantization import quant_primitives
    except ImportError:
        return None, None
    return torch, quant_primitives


def _time(benchmark, fn) -> float:
    benchmark(fn)
    t = bench_median(benchmark)
    return median_time(fn, repeat=REPEAT) if math.isnan(t) else t


def _figures(t: float, n: int, fn, torch_fn) -> dict:
    """GB/s, and the roof and torchao ratios as medians of interleaved pairs (``paired_ratio``:
    a noisy second hits both sides of a pair)."""
    rounds = max(3, 2 * REPEAT)
    roof, _, _, _, _ = paired_ratio(copy_fn(BYTES_PER_ELEM * n, REPEAT), fn, rounds)
    f = {"seconds": t, "GBps": BYTES_PER_ELEM * n / t / 1e9, "roof_ratio": roof}
    if torch_fn is not None:
        vs, _, _, tt, _ = paired_ratio(torch_fn, fn, max(3, REPEAT // 2))
        f["torchao_seconds"] = tt
        f["speedup_vs_torchao"] = vs
    return f


@pytest.mark.parametrize("group", [16, 32, 128])
def test_int4_grouped(benchmark, group):
    x = np.random.default_rng(0).standard_normal(SHAPE).astype(np.float32)
    bs = (1, group)
    s, z = nbqat.choose_qparams_affine(x, "asymmetric", bs, 0, 15)
    out = np.empty_like(x)

    def fn():
        return nbqat.fake_quantize_affine(x, bs, s, z, 0, 15, out=out)

    fn()
    t = _time(benchmark, fn)
    torch, qp = _qp()
    torch_fn = None
    if qp is not None:
        tx, ts, tz = torch.from_numpy(x), torch.from_numpy(s), torch.from_numpy(z)

        def torch_fn():
            return qp._fake_quantize_affine(tx, bs, ts, tz, torch.int32, 0, 15)

    report(benchmark, **_figures(t, x.size, fn, torch_fn))


@pytest.mark.parametrize("dtype", ["float8_e4m3fn"])
def test_float8_rowwise(benchmark, dtype):
    x = np.random.default_rng(1).standard_normal(SHAPE).astype(np.float32)
    s = nbqat.choose_scale_float8(x, (1, SHAPE[1]), dtype)
    out = np.empty_like(x)

    def fn():
        return nbqat.fake_quantize_float8(x, s, dtype, out=out)

    fn()
    t = _time(benchmark, fn)
    torch, qp = _qp()
    torch_fn = None
    if qp is not None:
        tx, ts, dt = torch.from_numpy(x), torch.from_numpy(s), getattr(torch, dtype)

        def torch_fn():
            return qp._dequantize_affine_float8(qp._quantize_affine_float8(tx, ts, dt), ts)

    report(benchmark, **_figures(t, x.size, fn, torch_fn))
