"""Compiled CPU kernels of the interpretable multi-head attention (:mod:`nbqat.nn.layers`).

Layouts: the caller splits the heads once with NumPy so that every inner loop runs over
contiguous memory: queries ``qh`` (B, H, tq, dh), keys transposed ``kt`` (B, H, dh, T),
probabilities ``p`` (B, H, tq, T), shared values transposed ``vt`` (B, dv, T). Query ``i`` sits
at absolute position ``offset + i`` of the key sequence and sees the keys ``j <= offset + i``
(itself included); masked probabilities are exactly 0 and get no gradient.

All arrays are C-contiguous in one float dtype. Inner loops run over the key axis ``j`` of a row
view (``row = p[b, h, i]``, then ``row[j]`` with ``j`` from ``range``): LLVM then knows the index
is non-negative, drops Numba's negative-index wraparound and emits vector code; the same loops
over flat views with computed offsets (``pf[o + j]``) stayed scalar (measured 6x slower), and so
did loops over the short head axis (dh = 8). Serial kernels: a step calls each once on ~200k
elements, less than a parallel-region launch costs on a busy machine. The exponential is
NumPy's SIMD ``exp`` between :func:`attn_scores` and :func:`attn_normalize`.
"""

from __future__ import annotations

import numpy as np

from nbqat._jit import cpu_kernel


@cpu_kernel(parallel=False, inline="always")
def _attn_dims(qh, kt):  # pragma: no cover
    """``(B, H, tq, dh, T, sqrt(dh))`` of queries (B, H, tq, dh) and keys (B, H, dh, T); the
    root in the queries' dtype (the score scale)."""
    nb, nh, tq, dh = qh.shape
    return nb, nh, tq, dh, kt.shape[3], np.sqrt(qh.dtype.type(dh))


@cpu_kernel(parallel=False, inline="always")
def _row_max(row, lim, lanes):  # pragma: no cover
    """``max(row[:lim])`` as the scan ``m = s if s > m else m`` from ``-inf`` (NaN never
    taken), kept in the eight running maxima ``lanes`` (8,): one running maximum is a
    loop-carried compare that LLVM cannot vectorise without fastmath ``nnan``, eight are SIMD
    lanes (the scores' kernel 1.5-1.7 -> 1.1-1.3 ms at 192 keys). A maximum does not depend on
    the scan order except for the sign of a zero maximum, which ``row - max`` passes to ``exp``
    only as ``exp(+-0) = 1``: the probabilities are the same bits."""
    lanes[:] = -np.inf
    n8 = lim - lim % 8
    for j in range(0, n8, 8):
        for u in range(8):
            s = row[j + u]
            lanes[u] = s if s > lanes[u] else lanes[u]
    for j in range(n8, lim):
        s = row[j]
        lanes[0] = s if s > lanes[0] else lanes[0]
    mx = lanes[0]
    for u in range(1, 8):
        mx = lanes[u] if lanes[u] > mx else mx
    return mx


@cpu_kernel(parallel=False, error_model="numpy")
def attn_scores(qh, kt, offset, p):  # (B, H, tq, dh), (B, H, dh, T) -> (B, H, tq, T)
    """``p[b, h, i, j] = s_j - max_j s_j`` with ``s_j = <qh[b, h, i], kt[b, h, :, j]> /
    sqrt(dh)`` for ``j <= offset + i`` and ``-inf`` for the masked keys (``exp`` gives 0).

    The sums run over all T keys of a row (each element ``((0 + q_0 k_0) + q_1 k_1 ...) /
    sqrt(dh)`` in that order, masked keys included and then overwritten): loops of the whole
    row's length, where a loop over the ``offset + i + 1`` visible keys left a scalar tail in
    every row (at T = 48, 0.30 -> 0.15 ms for a (64, 4, 24, 48) block; the same bits)."""
    T = qh.dtype.type
    nb, nh, tq, dh, tk, sq = _attn_dims(qh, kt)
    zero = T(0.0)
    ninf = T(-np.inf)
    lanes = np.empty(8, p.dtype)
    for b in range(nb):
        for h in range(nh):
            kbh = kt[b, h]
            for i in range(tq):
                lim = min(offset + i + 1, tk)
                row = p[b, h, i]
                q = qh[b, h, i]
                qv = q[0]
                kr = kbh[0]
                for j in range(tk):
                    row[j] = zero + qv * kr[j]
                for e in range(1, dh):
                    qv = q[e]
                    kr = kbh[e]
                    for j in range(tk):
                        row[j] += qv * kr[j]
                for j in range(tk):
                    row[j] = row[j] / sq
                mx = _row_max(row, lim, lanes)
                for j in range(tk):
                    row[j] = row[j] - mx if j < lim else ninf


@cpu_kernel(parallel=False, fastmath=True, error_model="numpy")
def attn_normalize(p, offset):  # (B, H, tq, T) in place
    """On entry ``p`` holds ``exp(s - max)`` (0 on masked keys); divides each row by its sum
    over the visible keys (the softmax)."""
    T = p.dtype.type
    nb, nh, tq, tk = p.shape
    for b in range(nb):
        for h in range(nh):
            for i in range(tq):
                lim = min(offset + i + 1, tk)
                row = p[b, h, i]
                tot = T(0.0)
                for j in range(lim):
                    tot += row[j]
                inv = T(1.0) / tot
                for j in range(lim):
                    row[j] *= inv


@cpu_kernel(parallel=False, inline="always")
def _head_dims(p, vt):  # pragma: no cover
    """``(B, H, tq, T, dv, 1 / H)`` of probabilities (B, H, tq, T) and values (B, dv, T); the
    head average's factor in the values' dtype."""
    nb, nh, tq, tk = p.shape
    one = vt.dtype.type(1.0)
    return nb, nh, tq, tk, vt.shape[1], one / vt.dtype.type(nh)


@cpu_kernel(parallel=False, fastmath=True)
def attn_apply_forward(p, vt, pbar, out):  # (B, H, tq, T), (B, dv, T) -> (B, tq, T), (B, tq, dv)
    """Heads averaged, then one shared value projection: ``pbar[b, i, j] = (1 / H) sum_h
    p[b, h, i, j]`` and ``out[b, i, e] = sum_j pbar[b, i, j] vt[b, e, j]`` (``vt`` holds the
    values transposed)."""
    T = vt.dtype.type
    nb, nh, tq, tk, dv, inv_h = _head_dims(p, vt)
    for b in range(nb):
        vb = vt[b]
        for i in range(tq):
            w = pbar[b, i]
            for j in range(tk):
                w[j] = T(0.0)
            for h in range(nh):
                ph = p[b, h, i]
                for j in range(tk):
                    w[j] += ph[j]
            for j in range(tk):
                w[j] *= inv_h
            o = out[b, i]
            for e in range(dv):
                vr = vb[e]
                acc = T(0.0)
                for j in range(tk):
                    acc += w[j] * vr[j]
                o[e] = acc


@cpu_kernel(parallel=False, fastmath=True)
def attn_apply_backward(dout, pbar, vt, dp, dvt):
    """Backward of :func:`attn_apply_forward`: ``dp[b, h, i, j] = sum_e dout[b, i, e]
    vt[b, e, j] / H`` (the same for every head) and ``dvt[b, e, j] = sum_i pbar[b, i, j]
    dout[b, i, e]``; both written. Shapes: dout (B, tq, dv), pbar (B, tq, T), vt, dvt
    (B, dv, T), dp (B, H, tq, T)."""
    T = vt.dtype.type
    nb, nh, tq, tk, de, inv_h = _head_dims(dp, vt)
    for b in range(nb):
        vb = vt[b]
        dvb = dvt[b]
        for e in range(de):
            r = dvb[e]
            for j in range(tk):
                r[j] = T(0.0)
        for i in range(tq):
            d = dout[b, i]
            w = pbar[b, i]
            d0 = dp[b, 0, i]
            for j in range(tk):
                d0[j] = T(0.0)
            for e in range(de):
                de_ = d[e]
                vr = vb[e]
                r = dvb[e]
                for j in range(tk):
                    d0[j] += de_ * vr[j]
                    r[j] += w[j] * de_
            for j in range(tk):
                d0[j] *= inv_h
            for h in range(1, nh):
                dh_row = dp[b, h, i]
                for j in range(tk):
                    dh_row[j] = d0[j]


@cpu_kernel(parallel=False, fastmath=True)
def attn_probs_backward(dp, p, qh, kt, offset, dqh, dkt):
    """Softmax and score backward: ``ds = p * (dp - sum_j p dp) / sqrt(dh)`` (masked entries 0),
    ``dqh[b, h, i] = sum_j ds_j kt[b, h, :, j]``, ``dkt[b, h, :, j] = sum_i ds_j qh[b, h, i]``.
    dqh (B, H, tq, dh) and dkt (B, H, dh, T) are written; ``ds`` is left in ``dp``. ``ds`` is
    one select over the whole row (no scalar tail of the visible keys; the same bits)."""
    T = qh.dtype.type
    nb, nh, tq, dh, tk, sq = _attn_dims(qh, kt)
    zero = T(0.0)
    for b in range(nb):
        for h in range(nh):
            kbh = kt[b, h]
            dkbh = dkt[b, h]
            for e in range(dh):
                r = dkbh[e]
                for j in range(tk):
                    r[j] = T(0.0)
            for i in range(tq):
                lim = min(offset + i + 1, tk)
                pr = p[b, h, i]
                g = dp[b, h, i]
                q = qh[b, h, i]
                dq = dqh[b, h, i]
                s = T(0.0)
                for j in range(lim):
                    s += pr[j] * g[j]
                for j in range(tk):
                    g[j] = pr[j] * (g[j] - s) / sq if j < lim else zero
                for e in range(dh):
                    kr = kbh[e]
                    dkr = dkbh[e]
                    qv = q[e]
                    acc = T(0.0)
                    for j in range(lim):
                        acc += g[j] * kr[j]
                        dkr[j] += g[j] * qv
                    dq[e] = acc
