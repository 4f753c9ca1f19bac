"""Gradient clipping against PyTorch and the memory roof (issue 4's speed targets).

* a forecaster-sized set of 150 float32 arrays (60 of (64, 64), 80 of (64,), 10 of (256, 64)),
  views of one flat buffer (the layer graph's layout): ``clip_grad_norm_`` vs
  ``torch.nn.utils.clip_grad_norm_`` (default foreach), target >= 5x;
* one 2**25-element float32 array: ``clip_grad_norm_`` vs the parallel-copy roof at 12 bytes per
  element (read for the norm, read and write for the scale), target >= 85%, and vs torch.

Every call must really scale (nbqat skips the multiply when the coefficient is exactly 1, which
is bit-identical to torch's multiply): ``max_norm`` starts at half the total norm and shrinks by
0.1 % per call (:class:`_Shrinking`), so each call's coefficient is about 0.999 on both sides.
Ratios are reported, never asserted.
``NBQAT_BENCH_SMALL=1`` shrinks every size.
"""

from __future__ import annotations

import numpy as np
from _roof import copy_roof, median_time, ours_time, report, torch_or_none
from conftest import SMALL

import nbqat

SHAPES = [(64, 64)] * 60 + [(64,)] * 80 + [(256, 64)] * 10
if SMALL:
    SHAPES = [(16, 16)] * 6 + [(16,)] * 8 + [(64, 16)]
N_BIG = 1 << 18 if SMALL else 1 << 25
REPEAT = 3 if SMALL else 9


class _Shrinking:
    """A ``max_norm`` that starts at half the gradients' norm and shrinks 0.1 % per call."""

    def __init__(self, total: float) -> None:
        self.value = 0.5 * total

    def __call__(self) -> float:
        self.value *= 0.999
        return self.value


def _ours_time(benchmark, fn) -> float:
    return ours_time(benchmark, fn, REPEAT)


def _flat_views(rng):
    sizes = [int(np.prod(s)) for s in SHAPES]
    flat = rng.standard_normal(sum(sizes)).astype(np.float32)
    views, o = [], 0
    for s, n in zip(SHAPES, sizes):
        views.append(flat[o : o + n].reshape(s))
        o += n
    return flat, views


def test_clip_grad_norm_150_arrays(benchmark):
    rng = np.random.default_rng(0)
    flat, views = _flat_views(rng)

    max_norm = _Shrinking(nbqat.get_total_norm(views))

    def fn():
        return nbqat.clip_grad_norm_(views, max_norm())

    ours = _ours_time(benchmark, fn)
    figures = {"n_arrays": len(views), "elements": flat.size, "us": ours * 1e6}
    torch = torch_or_none()
    if torch is not None:
        params = []
        for v in views:
            q = torch.nn.Parameter(torch.zeros(v.shape))
            q.grad = torch.from_numpy(v.copy())
            params.append(q)
        t_max = _Shrinking(float(torch.nn.utils.get_total_norm([q.grad for q in params])))
        t_torch = median_time(lambda: torch.nn.utils.clip_grad_norm_(params, t_max()), REPEAT)
        figures["torch_us"] = t_torch * 1e6
        figures["speedup_vs_torch"] = t_torch / ours  # target >= 5
    report(benchmark, **figures)


def test_clip_grad_norm_one_big_array(benchmark):
    g = np.random.default_rng(1).standard_normal(N_BIG).astype(np.float32)

    max_norm = _Shrinking(nbqat.get_total_norm(g))

    def fn():
        return nbqat.clip_grad_norm_(g, max_norm())

    ours = _ours_time(benchmark, fn)
    roof = copy_roof(12 * N_BIG, repeat=REPEAT)
    figures = {"elements": N_BIG, "ms": ours * 1e3, "fraction_of_roof": roof / ours}  # >= 0.85
    norm_only = median_time(lambda: nbqat.get_total_norm(g), REPEAT)
    figures["norm_only_ms"] = norm_only * 1e3
    torch = torch_or_none()
    if torch is not None:
        q = torch.nn.Parameter(torch.zeros(N_BIG))
        q.grad = torch.from_numpy(g.copy())
        t_max = _Shrinking(float(torch.linalg.vector_norm(q.grad)))
        t_torch = median_time(lambda: torch.nn.utils.clip_grad_norm_([q], t_max()), REPEAT)
        figures["speedup_vs_torch"] = t_torch / ours
    report(benchmark, **figures)
