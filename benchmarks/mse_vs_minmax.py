"""Per-channel (and per-tensor) ``MSEObserver`` against min/max and the exact best of its own
candidate set, on the exact fake-quant MSE of the data (not a pytest file).

For (64, 512) weights (Gaussian, Laplace, Student-t3) per-channel symmetric qint8, and a
(20 000,) per-tensor affine quint8 tensor: the total squared error of the observer's qparams
over the min/max observer's, how many channels are worse than min/max, the worst gap to the
exact best candidate of each channel, and the time of ``calculate_qparams`` and of the
observer's ``forward``.

``max_exact=0`` is the fine grid from the first batch (before issue 29's fine grid it was the
histogram estimate alone: run this under an older nbqat for those rows).

Run: ``python benchmarks/mse_vs_minmax.py`` (prints a Markdown table).
"""

from __future__ import annotations

import time

import numpy as np

import nbqat


def _sq_err(x: np.ndarray, s: np.ndarray, z: np.ndarray, qmin: int, qmax: int) -> np.ndarray:
    """Per-row exact squared fake-quant error of float64 rows ``x`` (R, n) (NumPy, float64)."""
    s64 = s.astype(np.float64)[:, None]
    z64 = z.astype(np.float64)[:, None]
    q = np.clip(np.rint(x / s64) + z64, qmin, qmax)
    return np.sum(((q - z64) * s64 - x) ** 2, axis=1)


def exact_candidates(obs: nbqat.MSEObserver, rows: np.ndarray) -> np.ndarray:
    """(K, R) exact error of every candidate ``alpha * [min, max]`` of each row."""
    x = rows.astype(np.float64)
    k = obs.num_candidates
    out = np.empty((k, len(rows)))
    for i, a in enumerate(np.arange(1, k + 1, dtype=np.float64) / k):
        lo = (a * x.min(axis=1)).astype(np.float32)
        hi = (a * x.max(axis=1)).astype(np.float32)
        s, z = obs._qparams(lo, hi) if obs._per_channel else _per_row(obs, lo, hi)
        out[i] = _sq_err(x, s, z, obs.quant_min, obs.quant_max)
    return out


def _per_row(obs, lo, hi):
    s, z = zip(*(obs._qparams(np.asarray(a), np.asarray(b)) for a, b in zip(lo, hi)))
    return np.concatenate(s), np.concatenate(z)


def case(name: str, w: np.ndarray, **kw) -> str:
    obs = nbqat.MSEObserver(**kw)
    t0 = time.perf_counter()
    obs(w)
    t1 = time.perf_counter()
    s, z = obs.calculate_qparams()
    t2 = time.perf_counter()
    rows = w if obs._per_channel else w.reshape(1, -1)
    if not obs._per_channel:
        s, z = s.reshape(1), z.reshape(1)
    got = _sq_err(rows.astype(np.float64), s, z, obs.quant_min, obs.quant_max)
    cand = exact_candidates(obs, rows)
    mm, best = cand[-1], cand.min(axis=0)
    worse = int(np.sum(got > mm))
    gap = float(np.max(got / best - 1.0))
    return (
        f"| {name} | {kw.get('max_exact', 'default')} | {got.sum() / mm.sum():.4f} "
        f"| {worse} of {len(rows)} | {gap * 100:.2f} % | {(t1 - t0) * 1e3:.1f} ms "
        f"| {(t2 - t1) * 1e3:.1f} ms | {obs.exact_values.nbytes / 2**10:.0f} KiB "
        f"| {obs.histogram.nbytes / 2**10:.0f} KiB |"
    )


def main() -> None:
    rng = np.random.default_rng(0)
    pc = {"dtype": "qint8", "qscheme": "per_channel_symmetric", "ch_axis": 0}
    data = {
        "Gaussian": rng.standard_normal((64, 512)),
        "Laplace": rng.laplace(size=(64, 512)),
        "Student-t3": rng.standard_t(3, size=(64, 512)),
    }
    for kw in (pc, {"max_exact": 0}, {}):  # compile
        warm = nbqat.MSEObserver(**kw)
        warm(np.ones((2, 2), np.float32))
        warm.calculate_qparams()
    head = "data | max_exact | total MSE / min-max | channels worse | worst gap to best"
    print(f"| {head} | forward | qparams | values | counts |")
    print("| --- " * 9 + "|")
    for name, w in data.items():
        for extra in ({"max_exact": 0}, {}):  # 0: the fine grid from the start
            print(case(name + " (64, 512)", w.astype(np.float32), **pc, **extra))
    x = np.concatenate([rng.standard_normal(20_000), [40.0, -35.0]]).astype(np.float32)
    for extra in ({"max_exact": 0}, {}):
        print(case("Gaussian + 2 outliers, per tensor", x, **extra))


if __name__ == "__main__":
    main()
