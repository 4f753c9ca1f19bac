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
@pytest.mark.parametrize(
    "tq, dh, tk", [(19, 3, 21), (24, 4, 48), (5, 1, 32)]
)  # rows of 3 .. 21 visible keys; the job's rows (T a multiple of 16); one head dimension
def test_attn_scores_bit_for_bit(rng, dtype, tq, dh, tk):
    nb, nh = 2, 2
    qh = rng.normal(size=(nb, nh, tq, dh)).astype(dtype)
    kt = rng.normal(size=(nb, nh, dh, tk)).astype(dtype)
    qh[0, 0, 4, dh - 1] = np.nan  # a NaN row
    kt[0, 1, dh - 1, 5] = np.nan  # a NaN key: NaN scores that the maximum skips
    kt[1, 0, 0, 9] = np.inf
    kt[1, 1, :, :] = 0.0  # all-zero scores (a zero maximum) ...
    kt[1, 1, :, 1::2] = -0.0  # ... with signed zeros
    p = np.empty((nb, nh, tq, tk), dtype)
    attention_cpu.attn_scores(qh, kt, 2, p)
    with np.errstate(invalid="ignore", over="ignore"):
        ref = _reference(qh, kt, 2)
        np.testing.assert_array_equal(np.exp(p), np.exp(ref))


def _probs_backward_reference(dp, p, qh, kt, offset):
    """ds, dqh, dkt of the softmax and scores in float64, the masked keys left out."""
    nb, nh, tq, dh = qh.shape
    tk = kt.shape[3]
    ds = np.zeros(p.shape)
    dq = np.zeros(qh.shape)
    dk = np.zeros(kt.shape)
    for b in range(nb):
        for h in range(nh):
            for i in range(tq):
                lim = min(offset + i + 1, tk)
                pr, g = p[b, h, i, :lim].astype(float), dp[b, h, i, :lim].astype(float)
                s = pr * (g - (pr * g).sum()) / np.sqrt(dh)
                ds[b, h, i, :lim] = s
                dq[b, h, i] = kt[b, h, :, :lim] @ s
                dk[b, h, :, :lim] += np.outer(qh[b, h, i], s)
    return ds, dq, dk


@pytest.mark.parametrize("tq, dh, tk, offset", [(19, 3, 21, 2), (24, 4, 48, 24)])
def test_attn_probs_backward(rng, tq, dh, tk, offset):
    """Softmax and score backward against a float64 reference; masked entries exactly 0 (the
    kernel's sums are fastmath: their order is LLVM's, hence the tolerance)."""
    nb, nh = 2, 2
    qh = rng.normal(size=(nb, nh, tq, dh)).astype(np.float32)
    kt = rng.normal(size=(nb, nh, dh, tk)).astype(np.float32)
    p = np.empty((nb, nh, tq, tk), np.float32)
    attention_cpu.attn_scores(qh, kt, offset, p)
    np.exp(p, out=p)
    attention_cpu.attn_normalize(p, offset)
    visible = np.arange(tk)[None, :] <= offset + np.arange(tq)[:, None]
    dp = rng.normal(size=p.shape).astype(np.float32)
    dp[:, :, ~visible] = np.inf  # masked keys' incoming gradients never reach the outputs
    ref = _probs_backward_reference(dp, p, qh, kt, offset)
    dqh, dkt = np.empty_like(qh), np.empty_like(kt)
    attention_cpu.attn_probs_backward(dp, p, qh, kt, offset, dqh, dkt)
    for got, want in zip((dp, dqh, dkt), ref):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert np.all(dp[:, :, ~visible] == 0)
