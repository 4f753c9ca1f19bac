"""Tolerances for results that pass through code whose operation order nbqat does not fix.

nbqat's own compiled kernels (fake quantization, observers, clipping, the fused optimizers, the
deterministic reductions) fix the order of every operation, so tests assert their results bit
for bit. A product computed by NumPy's ``matmul`` is summed in an order the BLAS library picks:
OpenBLAS chooses a kernel for the CPU (``OPENBLAS_CORETYPE``: Haswell, SkylakeX, Sandybridge,
...), for the thread count and for the matrix shape (a shard of 3 rows and a batch of 6, or
batches of 5 and of 432 rows, take different code paths). torch uses its own BLAS; onnxruntime
its own kernels; libm's ``exp``/``tanh`` differ by an ulp between builds. Tests of such results
compare within the bounds below (run the suite with ``OPENBLAS_CORETYPE`` set to a few kernels
and 1 and 2 threads to see them needed).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

#: float32 machine epsilon (2 u, u the unit roundoff)
EPS32 = float(np.finfo(np.float32).eps)


def dot_bound(k: int, abs_dot: float | np.ndarray) -> float | np.ndarray:
    """Bound on the difference of two float32 evaluations of a k-term dot product in any order.

    Each evaluation is within ``gamma_k * sum|a||b|`` of the exact value (Higham, "Accuracy and
    Stability of Numerical Algorithms", 3.1), ``gamma_k = k u / (1 - k u) <= k eps / 2`` for
    ``k u < 1/2``; two evaluations are within twice that: ``k * eps * sum|a||b|``.
    """
    return k * EPS32 * abs_dot


def chain_rtol(fan_in: int, depth: int) -> float:
    """Relative bound on a float32 value after ``depth`` chained ``fan_in``-term dot products
    (each layer's rounding ``fan_in * eps`` relative to its accumulated magnitude, added up
    through the chain; a first-order bound that holds while it is small)."""
    return depth * fan_in * EPS32


def q_risk_bound(
    pa: np.ndarray, pb: np.ndarray, y: np.ndarray, quantiles: Sequence[float]
) -> dict[str, float]:
    """Largest difference of two q-risks whose (unscaled) predictions are ``pa`` and ``pb``.

    ``q-risk_q = 2 sum QL_q(y, p) / sum |y|`` and the pinball loss ``QL_q`` is
    ``max(q, 1 - q)``-Lipschitz in ``p``, so the q-risks differ by at most
    ``2 max(q, 1 - q) sum |pa - pb| / sum |y|`` (plus the float64 sums' rounding, ``n eps64``
    relative).
    """
    d = np.abs(np.asarray(pa, np.float64) - np.asarray(pb, np.float64))
    ysum = float(np.abs(np.asarray(y, np.float64)).sum())
    out = {}
    for j, q in enumerate(quantiles):
        n = d[..., j].size
        out[f"P{round(100 * q)}"] = 2 * max(q, 1 - q) * float(d[..., j].sum()) / ysum + (
            n * float(np.finfo(np.float64).eps)
        )
    return out
