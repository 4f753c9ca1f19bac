"""attn_scores (+ NumPy's exp) against an obvious NumPy reference, bit for bit: the scores
summed over the head dimension in order, scaled, the row maximum subtracted, the masked keys
-inf; rows of every length mod 8 (the maximum's eight lanes and their tail) and NaN, Inf and
signed zeros."""

import numpy as np
import pytest

from nbqat.kernels import attention_cpu


def _reference(qh, kt, offset):
    nb, nh, tq, dh = qh.shape
    tk = kt.shape[3]
    t = qh.dtype.type
    p = np.full((nb, nh, tq, tk), -np.inf, qh.dtype)
    for b in range(nb):
        for h in range(nh):
            for i in range(tq):
                lim = min(offset + i + 1, tk)
                s = np.zeros(lim, qh.dtype)
                for e in range(dh):  # in order, each product and sum rounded (no FMA)
                    s = s + qh[b, h, i, e] * kt[b, h, e, :lim]
                s = s / np.sqrt(t(dh))
                finite = s[~np.isnan(s)]
                mx = finite.max() if finite.size else t(-np.inf)
                p[b, h, i, :lim] = s - mx
    return p


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_attn_scores_bit_for_bit(rng, dtype):
    nb, nh, tq, dh, tk = 2, 2, 19, 3, 21  # rows of 3 .. 21 visible keys
    qh = rng.normal(size=(nb, nh, tq, dh)).astype(dtype)
    kt = rng.normal(size=(nb, nh, dh, tk)).astype(dtype)
    qh[0, 0, 4, 1] = np.nan  # a NaN row
    kt[0, 1, 2, 5] = np.nan  # a NaN key: NaN scores that the maximum skips
    kt[1, 0, 0, 9] = np.inf
    kt[1, 1, :, :] = 0.0  # all-zero scores (a zero maximum) ...
    kt[1, 1, :, 1::2] = -0.0  # ... with signed zeros
    p = np.empty((nb, nh, tq, tk), dtype)
    attention_cpu.attn_scores(qh, kt, 2, p)
    with np.errstate(invalid="ignore", over="ignore"):
        ref = _reference(qh, kt, 2)
        np.testing.assert_array_equal(np.exp(p), np.exp(ref))
