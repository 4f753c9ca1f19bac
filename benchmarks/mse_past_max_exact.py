"""``MSEObserver`` past ``max_exact`` against an exact brute-force oracle (not a pytest file).

(64, 512) weights (Gaussian, Laplace, Student-t3), a fresh draw each step, observed for
``--batches`` steps (default 100: 51 200 values a channel, 3.3 M per tensor, past the default
``max_exact`` of 32 768 / 131 072), per channel (symmetric qint8) and per tensor (affine
quint8). The oracle evaluates every candidate ``alpha * [min, max]`` of the observer's own set
on all the data seen (NumPy, float64). Printed: channels worse than min/max, the worst gap of
the chosen range to the exact best candidate, the total error over min/max's, the median time
of one ``forward`` past ``max_exact`` and of ``calculate_qparams`` (one thread).

Run: ``python benchmarks/mse_past_max_exact.py [--batches N]`` (also under an older nbqat:
there the histogram estimate is measured).
"""

from __future__ import annotations

import argparse
import time

import numba
import numpy as np

import nbqat


def _sq_err(x: np.ndarray, s: np.ndarray, z: np.ndarray, qmin: int, qmax: int) -> np.ndarray:
    """(R,) exact squared fake-quant error of float64 rows ``x`` (R, n) under (R,) qparams."""
    s64 = np.asarray(s, np.float64).reshape(-1, 1)
    z64 = np.asarray(z, np.float64).reshape(-1, 1)
    q = np.clip(np.rint(x / s64) + z64, qmin, qmax)
    return np.sum(((q - z64) * s64 - x) ** 2, axis=1)


def oracle(obs: nbqat.MSEObserver, x: np.ndarray) -> np.ndarray:
    """(K, R) exact error of every candidate of each row of ``x``."""
    k = obs.num_candidates
    out = np.empty((k, len(x)))
    mn, mx = x.min(axis=1), x.max(axis=1)
    for i, a in enumerate(np.arange(1, k + 1, dtype=np.float64) / k):
        s, z = obs._qparams((a * mn).astype(np.float32), (a * mx).astype(np.float32))
        out[i] = _sq_err(x, s, z, obs.quant_min, obs.quant_max)
    return out


def case(dist: str, per_channel: bool, batches: int, rng: np.random.Generator) -> str:
    draw = {
        "Gaussian": lambda: rng.standard_normal((64, 512)),
        "Laplace": lambda: rng.laplace(size=(64, 512)),
        "Student-t3": lambda: rng.standard_t(3, size=(64, 512)),
    }[dist]
    ws = [draw().astype(np.float32) for _ in range(batches)]
    if per_channel:
        kw = {"dtype": "qint8", "qscheme": "per_channel_symmetric", "ch_axis": 0}
    else:
        kw = {"dtype": "quint8", "qscheme": "per_tensor_affine"}
    obs = nbqat.MSEObserver(**kw)
    times = []
    for w in ws:
        t0 = time.perf_counter()
        obs(w)
        times.append(time.perf_counter() - t0)
    tq = []
    for _ in range(3):
        t0 = time.perf_counter()
        s, z = obs.calculate_qparams()
        tq.append(time.perf_counter() - t0)
    x = np.concatenate(ws, axis=1) if per_channel else np.concatenate(ws, axis=None)[None, :]
    x = x.astype(np.float64)
    got = _sq_err(x, s, z, obs.quant_min, obs.quant_max)
    cand = oracle(obs, x)
    mm, best = cand[-1], cand.min(axis=0)
    past = times[-batches // 2 :]  # steps past max_exact
    mode = "per channel" if per_channel else "per tensor"
    return (
        f"| {dist} | {mode} | {int(np.sum(got > mm))} of {len(x)} "
        f"| {float(np.max(got / best - 1.0)) * 100:.3f} % | {got.sum() / mm.sum():.4f} "
        f"| {np.median(past) * 1e3:.2f} ms | {np.median(tq) * 1e3:.1f} ms |"
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batches", type=int, default=100)
    args = ap.parse_args()
    numba.set_num_threads(1)
    warm = nbqat.MSEObserver(max_exact=0)
    warm(np.ones(8, np.float32))
    warm.calculate_qparams()  # compile
    rng = np.random.default_rng(0)
    print(f"nbqat {nbqat.__file__}, {args.batches} steps of (64, 512)")
    head = "data | observer | worse than min/max | worst gap to best | total / min-max"
    print(f"| {head} | forward | qparams |")
    print("| --- " * 7 + "|")
    for per_channel in (True, False):
        for dist in ("Gaussian", "Laplace", "Student-t3"):
            print(case(dist, per_channel, args.batches, rng), flush=True)


if __name__ == "__main__":
    main()
