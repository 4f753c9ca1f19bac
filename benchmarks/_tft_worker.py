"""Measure one TFT training step (forward + quantile loss + backward) in a fresh process.

Run as ``python benchmarks/_tft_worker.py {nbqat|torch|compile} SIZE`` (``compile``: the torch
network under ``torch.compile``, inductor, compiled during the warm-up steps) with the thread
count fixed by the caller through NUMBA_NUM_THREADS / OPENBLAS_NUM_THREADS / OMP_NUM_THREADS
(torch gets ``torch.set_num_threads`` with the same number). Prints one JSON line:

* ``median_s``: median wall time of ``STEPS`` steps (5 at the ``small`` smoke size) after
  ``WARMUP`` warm-up steps;
* ``rss_peak_delta_mb``: the peak resident set size during the timed steps minus the resident
  set size just before them (both implementations, same measure). The kernel's peak counter
  VmHWM is reset first (``/proc/self/clear_refs`` = 5); if that is not permitted, ``ru_maxrss``
  is used and the figure can include an earlier peak (``rss_peak_reset`` says which). Memory
  kept by an allocator's cache from the warm-up steps is not counted: a lower bound of a step's
  transient memory;
* ``tracemalloc_peak_mb`` (nbqat only): peak of NumPy's traced allocations during one step
  (NumPy reports its buffers to tracemalloc; torch's allocator does not, hence RSS for torch).
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time
import tracemalloc

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))

WARMUP = 5  # the first steps of a process run slower (allocator and caches still warming)
STEPS = 15
SIZES = {
    "full": dict(b=64, k=48, tau=12, d=32, heads=4),  # issue 5's size
    "small": dict(b=8, k=8, tau=4, d=8, heads=2),
    # issue 32's: the main job's default (history 24, horizon 24, hidden 16, 4 heads), its old
    # history of 168, and issue 5's size at hidden 128
    "job": dict(b=64, k=24, tau=24, d=16, heads=4),
    "job_k168": dict(b=64, k=168, tau=24, d=16, heads=4),
    "d128": dict(b=64, k=48, tau=12, d=128, heads=4),
}


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def _reset_peak() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _peak_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main() -> None:
    impl, size = sys.argv[1], sys.argv[2]
    nthreads = int(os.environ.get("NUMBA_NUM_THREADS", "0") or 0)
    sz = SIZES[size]
    from nbqat.nn import TemporalFusionTransformer, TFTConfig, quantile_loss, quantile_loss_grad

    cfg = TFTConfig(2, 4, 3, sz["d"], sz["k"], sz["tau"], num_heads=sz["heads"])
    rng = np.random.default_rng(0)
    b = sz["b"]
    s = rng.normal(size=(b, 2)).astype(np.float32)
    h = rng.normal(size=(b, cfg.sequence_length, 3)).astype(np.float32)
    f = rng.normal(size=(b, cfg.prediction_horizon, 4)).astype(np.float32)
    y = rng.normal(size=(b, cfg.prediction_horizon)).astype(np.float32)
    model = TemporalFusionTransformer(cfg, seed=0)
    out: dict = {"impl": impl, "size": size}
    if impl == "nbqat":

        def step():
            model.zero_grad()
            o = model.forward(s, h, f)
            loss = quantile_loss(o, y, cfg.quantiles)
            model.backward(quantile_loss_grad(o, y, cfg.quantiles))
            return loss

    else:
        import torch
        from ref_tft_torch import make_torch_tft

        if nthreads:
            torch.set_num_threads(nthreads)
        ref = make_torch_tft(torch, cfg, model.state_dict(), torch.float32)
        if impl == "compile":
            ref = torch.compile(ref)
        ts, th, tf, ty = (torch.from_numpy(a) for a in (s, h, f, y))
        q = torch.tensor(cfg.quantiles)

        def step():
            ref.zero_grad(set_to_none=False)
            o = ref(ts, th, tf)
            e = ty.unsqueeze(-1) - o
            loss = (q * torch.relu(e) + (1 - q) * torch.relu(-e)).mean()
            loss.backward()
            return float(loss.detach())

        out["torch_threads"] = torch.get_num_threads()
    for _ in range(WARMUP):
        step()
    rss0 = _rss_mb()
    out["rss_peak_reset"] = _reset_peak()
    times = []
    for _ in range(5 if size == "small" else STEPS):
        t0 = time.perf_counter()
        out.setdefault("loss", float(step()))
        times.append(time.perf_counter() - t0)
    out["median_s"] = float(np.median(times))
    out["rss_peak_delta_mb"] = _peak_mb() - rss0
    if impl == "nbqat":
        tracemalloc.start()
        step()
        out["tracemalloc_peak_mb"] = tracemalloc.get_traced_memory()[1] / 2**20
        tracemalloc.stop()
        import numba

        out["numba_threads"] = numba.get_num_threads()
    print(json.dumps(out))


if __name__ == "__main__":
    main()
