"""Fake-quantize kernels against the memory roof and PyTorch (issue 2's speed targets).

* per-tensor cachemask on 2**25 float32 elements: vs the parallel-copy roof at 9 B/element
  (read 4, write 4 + 1 mask byte) and vs ``torch.fake_quantize_per_tensor_affine``;
* per-channel cachemask on a (4096, 8192) float32 matrix, axis 0 and axis 1, vs the same roof;
* the first call's compile time in a fresh process with an empty cache, and a second process's
  first call loading the ``cache=True`` machine code.

Ratios are reported (``[nbqat-bench]`` lines and pytest-benchmark ``extra_info``), never
asserted. ``NBQAT_BENCH_SMALL=1`` shrinks every size.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

import numpy as np
import pytest
from _roof import copy_roof, median_time, ours_time, report, torch_or_none
from conftest import SMALL

import nbqat

N_TENSOR = 1 << 16 if SMALL else 1 << 25
SHAPE_CHANNEL = (64, 128) if SMALL else (4096, 8192)
REPEAT = 3 if SMALL else 7
BYTES_PER_ELEM = 9  # float32 in, float32 out, bool mask out


def _ours_time(benchmark, fn) -> float:
    return ours_time(benchmark, fn, REPEAT)


def test_per_tensor_cachemask(benchmark):
    n = N_TENSOR
    x = np.random.default_rng(0).standard_normal(n).astype(np.float32)
    out = np.empty_like(x)
    mask = np.empty(n, np.bool_)

    def fn():
        return nbqat.fake_quantize_per_tensor_affine_cachemask(
            x, 0.05, 3, -128, 127, out=out, mask=mask
        )

    fn()  # compile / page-in
    t = _ours_time(benchmark, fn)
    roof = copy_roof(BYTES_PER_ELEM * n, repeat=REPEAT)
    figures = {
        "seconds": t,
        "GBps": BYTES_PER_ELEM * n / t / 1e9,
        "roof_ratio": roof / t,
    }
    torch = torch_or_none()
    if torch is not None:
        tx = torch.from_numpy(x)
        tt = median_time(
            lambda: torch.fake_quantize_per_tensor_affine(tx, 0.05, 3, -128, 127), REPEAT
        )
        figures["torch_seconds"] = tt
        figures["speedup_vs_torch"] = tt / t
    report(benchmark, **figures)


@pytest.mark.parametrize("axis", [0, 1])
def test_per_channel_cachemask(benchmark, axis):
    x = np.random.default_rng(1).standard_normal(SHAPE_CHANNEL).astype(np.float32)
    n = x.size
    C = x.shape[axis]
    scale = np.linspace(0.01, 0.1, C).astype(np.float32)
    zp = np.zeros(C, np.int32)
    out = np.empty_like(x)
    mask = np.empty(x.shape, np.bool_)

    def fn():
        return nbqat.fake_quantize_per_channel_affine_cachemask(
            x, scale, zp, axis, -128, 127, out=out, mask=mask
        )

    fn()
    t = _ours_time(benchmark, fn)
    roof = copy_roof(BYTES_PER_ELEM * n, repeat=REPEAT)
    figures = {"seconds": t, "GBps": BYTES_PER_ELEM * n / t / 1e9, "roof_ratio": roof / t}
    torch = torch_or_none()
    if torch is not None:
        tx, ts, tz = torch.from_numpy(x), torch.from_numpy(scale), torch.from_numpy(zp)
        tt = median_time(
            lambda: torch.fake_quantize_per_channel_affine(tx, ts, tz, axis, -128, 127), REPEAT
        )
        figures["speedup_vs_torch"] = tt / t
    report(benchmark, **figures)


_FIRST_CALL = """
import json, time
t0 = time.perf_counter()
import numpy as np
import nbqat
t1 = time.perf_counter()
x = np.linspace(-3, 3, 1000, dtype=np.float32)
nbqat.fake_quantize_per_tensor_affine_cachemask(x, 0.05, 0, -128, 127)
t2 = time.perf_counter()
nbqat.fake_quantize_per_channel_affine_cachemask(
    x.reshape(10, 100), np.full(10, 0.05, np.float32), np.zeros(10, np.int32), 0, -128, 127
)
t3 = time.perf_counter()
_, m = nbqat.fake_quantize_per_tensor_affine_cachemask(x, 0.05, 0, -128, 127)
nbqat.fake_quantize_backward(x, m)
t4 = time.perf_counter()
print(json.dumps({"import": t1 - t0, "per_tensor": t2 - t1, "per_channel": t3 - t2,
                  "backward": t4 - t3}))
"""


def _run_fresh(cache_dir: str) -> dict:
    env = dict(os.environ)
    env["NUMBA_CACHE_DIR"] = cache_dir
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    res = subprocess.run(
        [sys.executable, "-c", _FIRST_CALL], env=env, capture_output=True, text=True, check=True
    )
    return json.loads(res.stdout.strip().splitlines()[-1])


def test_first_call_compile_and_cache(benchmark):
    """First call in a fresh process with an empty Numba cache (compiles), then a second
    process's first call (loads the cache=True machine code)."""
    with tempfile.TemporaryDirectory() as cache_dir:
        first = _run_fresh(cache_dir)
        second = benchmark.pedantic(_run_fresh, args=(cache_dir,), rounds=1, iterations=1)
    report(
        benchmark,
        compile_per_tensor_s=first["per_tensor"],
        compile_per_channel_s=first["per_channel"],
        compile_backward_s=first["backward"],
        cached_per_tensor_s=second["per_tensor"],
        cached_per_channel_s=second["per_channel"],
        cached_backward_s=second["backward"],
        import_s=second["import"],
    )
