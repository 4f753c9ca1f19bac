"""Size of the Diebold-Mariano test under a true null, by Monte Carlo (not a pytest file).

The job's windows: each window's loss differential is the mean of its ``horizon`` steps' iid
(mean-zero) step differentials, consecutive windows ``stride`` steps apart, so ``overlap =
ceil(horizon / stride)`` windows share steps. Under this null a test at nominal 5 % should
reject 5 % of the time; the uncorrected statistic with the normal p-value (``p_value``) and
Harvey-Leybourne-Newbold's (``p_value_hln``) are counted over ``reps`` seeded draws.

Run: ``python benchmarks/dm_size.py [reps]`` (default 2000; prints a Markdown table).
"""

from __future__ import annotations

import sys

import numpy as np

from nbqat.train.metrics import diebold_mariano


def size(n: int, horizon: int, stride: int, reps: int, seed: int = 0) -> tuple[float, float, int]:
    """Rejection rates ``(normal p, HLN p)`` at 5 % and how many draws had no HLN p-value."""
    rng = np.random.default_rng(seed)
    overlap = -(-horizon // stride)
    rej, rej_hln, none = 0, 0, 0
    starts = np.arange(n) * stride
    for _ in range(reps):
        c = np.concatenate([[0.0], np.cumsum(rng.standard_normal(n * stride + horizon))])
        d = (c[starts + horizon] - c[starts]) / horizon  # each window's mean differential
        r = diebold_mariano(d, np.zeros(n), overlap)
        rej += r["p_value"] < 0.05
        if r["p_value_hln"] is None:
            none += 1
        else:
            rej_hln += r["p_value_hln"] < 0.05
    return rej / reps, rej_hln / reps, none


def main(reps: int = 2000) -> None:
    print("| n | horizon / stride (overlap) | size, normal p | size, HLN t p | no HLN p |")
    print("|---|---|---|---|---|")
    for horizon, stride in ((24, 6), (24, 1)):
        for n in (30, 100, 432):
            a, b, none = size(n, horizon, stride, reps)
            ov = -(-horizon // stride)
            print(f"| {n} | {horizon} / {stride} ({ov}) | {a:.3f} | {b:.3f} | {none} |")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 2000)
