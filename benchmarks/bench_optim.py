"""Fused optimizer steps against PyTorch and the memory roof.

* ``AdamW.step`` on a 2**22-element float32 flat buffer vs ``torch.optim.AdamW`` (default
  options: the single-tensor path on CPU) on the same flat tensor, and vs the parallel-copy roof
  at 28 bytes per element (read p, g, m, v; write p, m, v);
* the same with the clipping coefficient folded in (``grad_scale``), which costs nothing extra;
* ``SGD`` with momentum vs ``torch.optim.SGD`` (roof at 20 bytes per element).

Ratios are reported, never asserted. ``NBQAT_BENCH_SMALL=1`` shrinks every size.
"""

from __future__ import annotations

import numpy as np
from _roof import copy_roof, median_time, ours_time, report, torch_or_none
from conftest import SMALL

import nbqat

N = 1 << 16 if SMALL else 1 << 22
REPEAT = 3 if SMALL else 9


def _ours_time(benchmark, fn) -> float:
    return ours_time(benchmark, fn, REPEAT)


def _bench(benchmark, name, kw, bytes_per_elem, grad_scale=1.0):
    rng = np.random.default_rng(0)
    p = rng.standard_normal(N).astype(np.float32)
    g = (rng.standard_normal(N) * 1e-3).astype(np.float32)
    opt = getattr(nbqat, name)(p, **kw)
    ours = _ours_time(benchmark, lambda: opt.step(g, grad_scale=grad_scale))
    roof = copy_roof(bytes_per_elem * N, repeat=REPEAT)
    figures = {"elements": N, "ms": ours * 1e3, "fraction_of_roof": roof / ours}
    torch = torch_or_none()
    if torch is not None:
        tp = torch.nn.Parameter(torch.from_numpy(p.copy()))
        tp.grad = torch.from_numpy(g.copy())
        topt = getattr(torch.optim, name)([tp], **kw)
        figures["torch_ms"] = median_time(topt.step, REPEAT) * 1e3
        figures["speedup_vs_torch"] = figures["torch_ms"] / figures["ms"]
    report(benchmark, **figures)


def test_adamw_step(benchmark):
    _bench(benchmark, "AdamW", dict(lr=1e-3), 28)


def test_adamw_step_with_clip_coefficient(benchmark):
    _bench(benchmark, "AdamW", dict(lr=1e-3), 28, grad_scale=0.5)


def test_sgd_momentum_step(benchmark):
    _bench(benchmark, "SGD", dict(lr=1e-2, momentum=0.9), 20)
