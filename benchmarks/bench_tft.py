"""One TFT training step (forward + quantile loss + backward), float32, nbqat vs torch eager and
torch.compile.

Issue 5's size: B=64, k=48, tau=12, hidden 32, 4 heads, 2 static / 4 known / 3 observed inputs
(``SMALL``: B=8, k=8, tau=4, hidden 8, 2 heads). pytest-benchmark times nbqat's step in this
process; the ratio against torch comes from fresh subprocesses (benchmarks/_tft_worker.py) with
the SAME thread count for every pool (Numba, OpenBLAS, OpenMP, torch), once with 1 thread and
once with this machine's core count. On a shared machine one pair of runs can land in a noisy
second for one side only, so the two sides alternate ``PAIRS`` times (nbqat, torch, nbqat,
torch, ...) and the figures are the median over the pairs of each side's median step and of the
per-pair ratio, with the lowest and highest ratio beside it. Peak memory: see the worker's
docstring (tracemalloc for nbqat's NumPy buffers, ``ru_maxrss`` growth for both).

``test_tft_train_step_vs_torch_compile``: issue 32's sizes (the main job's default B64 k24 tau24
d16, its old history k168, and issue 5's size at d128), one thread, against torch eager and
``torch.compile`` (inductor; compiled in the worker's warm-up steps, not timed), the three
alternating ``COMPILE_ROUNDS`` times; ratios are medians of the per-round ratios.

nbqat's model runs as it does by default, with its algebraic folds (``Module.set_folding``:
the variable-selection embeddings and each GRN's ``fc2`` folded into the neighbouring affine
map, same function); the torch network computes every Linear as written.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from _roof import report
from conftest import SMALL

HERE = os.path.dirname(os.path.abspath(__file__))
SIZE = "small" if SMALL else "full"
PAIRS = 1 if SMALL else 5


def _worker(impl: str, threads: int, size: str = SIZE) -> dict:
    env = dict(os.environ)
    for var in ("NUMBA_NUM_THREADS", "OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        env[var] = str(threads)
    env["PYTHONPATH"] = os.path.join(HERE, "..") + os.pathsep + env.get("PYTHONPATH", "")
    res = subprocess.run(
        [sys.executable, os.path.join(HERE, "_tft_worker.py"), impl, size],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(res.stdout.strip().splitlines()[-1])


def _nbqat_step(size: str):
    """nbqat's training step (forward, quantile loss, backward) at ``_tft_worker.SIZES[size]``,
    the worker's inputs."""
    sys.path.insert(0, os.path.join(HERE, "..", "tests"))
    from _tft_worker import SIZES

    from nbqat.nn import TemporalFusionTransformer, TFTConfig, quantile_loss, quantile_loss_grad

    sz = SIZES[size]
    b, k, tau = sz["b"], sz["k"], sz["tau"]
    cfg = TFTConfig(2, 4, 3, sz["d"], k, tau, num_heads=sz["heads"])
    rng = np.random.default_rng(0)
    s = rng.normal(size=(b, 2)).astype(np.float32)
    h = rng.normal(size=(b, k, 3)).astype(np.float32)
    f = rng.normal(size=(b, tau, 4)).astype(np.float32)
    y = rng.normal(size=(b, tau)).astype(np.float32)
    model = TemporalFusionTransformer(cfg, seed=0)

    def step():
        model.zero_grad()
        o = model.forward(s, h, f)
        model.backward(quantile_loss_grad(o, y, cfg.quantiles))
        return quantile_loss(o, y, cfg.quantiles)

    return step


def test_tft_train_step(benchmark):
    step = _nbqat_step(SIZE)
    step()  # compile / load the cached kernels
    benchmark(step)

    figures = {}
    cores = os.cpu_count() or 1
    for threads in sorted({1, cores}):
        nbs, trs = [], []
        for _ in range(PAIRS):
            nbs.append(_worker("nbqat", threads))
            trs.append(_worker("torch", threads))
        for nb, tr in zip(nbs, trs):
            assert abs(nb["loss"] - tr["loss"]) <= 1e-4 * max(1.0, abs(tr["loss"]))  # same net
        ratios = [tr["median_s"] / nb["median_s"] for nb, tr in zip(nbs, trs)]
        figures[f"speedup_vs_torch_{threads}t"] = float(np.median(ratios))
        figures[f"speedup_vs_torch_{threads}t_min"] = min(ratios)
        figures[f"speedup_vs_torch_{threads}t_max"] = max(ratios)
        figures[f"nbqat_ms_{threads}t"] = float(np.median([r["median_s"] for r in nbs])) * 1e3
        figures[f"torch_ms_{threads}t"] = float(np.median([r["median_s"] for r in trs])) * 1e3
        figures[f"nbqat_rss_peak_delta_mb_{threads}t"] = max(r["rss_peak_delta_mb"] for r in nbs)
        figures[f"torch_rss_peak_delta_mb_{threads}t"] = max(r["rss_peak_delta_mb"] for r in trs)
        figures["nbqat_tracemalloc_peak_mb"] = nbs[0]["tracemalloc_peak_mb"]
    report(benchmark, **figures)


COMPILE_SIZES = ["small"] if SMALL else ["job", "job_k168", "d128"]
COMPILE_ROUNDS = 1 if SMALL else 3


@pytest.mark.parametrize("size", COMPILE_SIZES)
def test_tft_train_step_vs_torch_compile(benchmark, size):
    step = _nbqat_step(size)
    step()
    benchmark(step)  # this process's threads; the ratios below are one thread on every side
    runs: dict[str, list[dict]] = {"nbqat": [], "torch": [], "compile": []}
    for _ in range(COMPILE_ROUNDS):
        for impl, rs in runs.items():
            rs.append(_worker(impl, 1, size))
    figures = {}
    for impl in ("torch", "compile"):
        for nb, tr in zip(runs["nbqat"], runs[impl]):
            assert abs(nb["loss"] - tr["loss"]) <= 1e-4 * max(1.0, abs(tr["loss"]))  # same net
        ratios = [tr["median_s"] / nb["median_s"] for nb, tr in zip(runs["nbqat"], runs[impl])]
        name = "eager" if impl == "torch" else "compile"
        figures[f"speedup_vs_{name}"] = float(np.median(ratios))
        figures[f"speedup_vs_{name}_min"] = min(ratios)
        figures[f"speedup_vs_{name}_max"] = max(ratios)
        figures[f"{name}_ms"] = float(np.median([r["median_s"] for r in runs[impl]])) * 1e3
    figures["nbqat_ms"] = float(np.median([r["median_s"] for r in runs["nbqat"]])) * 1e3
    report(benchmark, **figures)
