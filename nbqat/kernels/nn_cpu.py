"""Compiled CPU kernels of the layer graph (:mod:`nbqat.nn`).

Every kernel takes C-contiguous arrays of one floating dtype (float32 or float64) and writes its
results into caller-provided outputs; the Python layer classes validate and allocate. Matrix
products are not here: they go through NumPy's BLAS in the layers. Transcendentals: a scalar libm
call in a Numba loop is ~10x slower than NumPy's SIMD ufuncs, so the LSTM uses ``np.tanh`` between
compiled passes, while the GLU and the ELU call the vectorisable :func:`vsigmoid` / :func:`vexpm1`
(:mod:`nbqat.kernels.vmath_cpu`, re-exported here) inside their compiled passes. The LSTM cell
kernels are in :mod:`nbqat.kernels.lstm_cpu` (re-exported here).

Threading: every kernel here is compiled serial (``prange`` runs as ``range``; the loops keep the
per-row ownership that makes them safe to parallelise). A training step calls them hundreds of times
on small arrays, and every parallel-region launch wakes Numba's OpenMP pool, which then competes
with OpenBLAS's own threads for the cores: measured on a shared 2-core machine, parallel kernels
made a whole step 5-40x slower. The step's multi-threading therefore comes from one pool only, BLAS
(the matmuls are about a third of a step). Constants are typed with the array's own dtype (``T =
x.dtype.type``) so float32 stays float32. Reductions over rows are chunked by a fixed row count
(:data:`ROW_CHUNK`), never by the thread count, and the per-chunk partials are merged in order by
the caller, so results do not depend on the number of threads.

Vectorisation: inner loops index either a flat 1-D view (``a.reshape(-1)``, offsets computed per
row) or a row view (``row = a[r]``, then ``row[j]`` with ``j`` from ``range``), not ``a[r, j]``:
with several 2-D arrays read and written in one loop, LLVM gives up on the runtime alias checks of
2-D indexing and emits scalar code, while the same loops over flat or row views compile to
AVX2/AVX-512 code (measured 3-5x faster per kernel); LayerNorm keeps 2-D indexing, which vectorises
better there. Kernels that divide use ``error_model="numpy"`` (IEEE division, no ZeroDivisionError
check): Numba's default Python error model puts a branch on every division, which stops LLVM from
vectorising the loop (the divisors here are never zero: ``1 + exp(-x)``, ``sqrt(d_h)``, sums of
positive terms).
"""

from __future__ import annotations

import numpy as np
from numba import prange

from nbqat._jit import cpu_kernel
from nbqat.kernels.lstm_cpu import lstm_cell_backward, lstm_cell_forward, lstm_gates_forward
from nbqat.kernels.vmath_cpu import vexp, vexpm1, vsigmoid

__all__ = [
    "ROW_CHUNK",
    "bias_add",
    "bias_add_grouped",
    "elu_backward",
    "elu_forward",
    "elu_forward_grouped",
    "embed_backward",
    "embed_forward",
    "embed_var_backward",
    "embed_vars_backward",
    "embed_var_forward",
    "glu_backward",
    "glu_forward",
    "glu_forward_grouped",
    "layernorm_backward",
    "layernorm_backward_grouped",
    "layernorm_forward",
    "layernorm_forward_grouped",
    "lstm_cell_backward",
    "lstm_cell_forward",
    "lstm_gates_forward",
    "softmax_backward",
    "softmax_forward",
    "vexp",
    "vexpm1",
    "vsigmoid",
    "vsn_combine_backward",
    "vsn_combine_forward",
]

#: Rows per chunk of the deterministic row reductions (LayerNorm parameter gradients).
ROW_CHUNK = 128


# ---------------------------------------------------------------------------------------------
# Bias add (Linear, LSTM input projection)
# ---------------------------------------------------------------------------------------------
@cpu_kernel(parallel=False)
def bias_add(y, b):  # (N, C) in place, (C,)
    """``y[r] += b`` for every row (~3x faster than NumPy's broadcast add on these shapes)."""
    n, c = y.shape
    yf = y.reshape(-1)
    for r in prange(n):
        o = r * c
        for j in range(c):
            yf[o + j] += b[j]


# ---------------------------------------------------------------------------------------------
# ELU (alpha = 1), elementwise over flat 1-D views (the exponential is NumPy's SIMD expm1)
# ---------------------------------------------------------------------------------------------
@cpu_kernel(parallel=False)
def elu_forward(x, bias, has_bias, ctx, has_ctx, steps, y):  # (N, C) in place -> y (N, C)
    """ELU's forward with the preceding additions fused in: ``x[r] += bias`` (if ``has_bias``)
    ``+ ctx[r // steps]`` (if ``has_ctx``; a (B, C) static context broadcast over ``steps`` rows
    per batch element), then ``y = x if x > 0 else expm1(x)`` (:func:`vexpm1`) in one flat loop,
    which vectorises for any C (a row of 16 would leave it to the scalar remainder; the
    element results do not depend on the path). ``x`` keeps the pre-activation for backward."""
    n, c = x.shape
    if has_bias or has_ctx:
        for r in range(n):
            xr = x[r]
            if has_bias:
                for j in range(c):
                    xr[j] += bias[j]
            if has_ctx:
                cr = ctx[r // steps]
                for j in range(c):
                    xr[j] += cr[j]
    xf = x.reshape(-1)
    yf = y.reshape(-1)
    for i in range(np.uint64(xf.size)):
        v = xf[i]
        yf[i] = v if v > 0 else vexpm1(v)


@cpu_kernel(parallel=False)
def elu_backward(dy, x, y, dx):  # (n,) x3 -> (n,)
    """``dx = dy if x > 0 else dy * (y + 1)`` (y + 1 = exp(x) on the negative side)."""
    T = dy.dtype.type
    one = T(1.0)
    for i in prange(dy.size):
        dx[i] = dy[i] if x[i] > 0 else dy[i] * (y[i] + one)


# ---------------------------------------------------------------------------------------------
# GLU with optional residual: out = skip + z[:, :C] * sigmoid(z[:, C:])  (torch F.glu layout)
# ---------------------------------------------------------------------------------------------
@cpu_kernel(parallel=False, error_model="numpy")
def glu_forward(z, bias, skip, has_skip, out, sig):  # (N, 2C), (2C,), (N, C) -> (N, C), (N, C)
    """The GLU, one pass per row: ``z[r] += bias`` (in place: backward reads the biased value
    half), ``sig = sigmoid(z[:, C:])`` (:func:`vsigmoid`), ``out = z[:, :C] * sig (+ skip if
    has_skip)``; the bias of the value and the gate column ``j`` is added in the same iteration
    that reads them (one loop of C per row, no separate bias loop of 2C: about twice as fast
    at C = 16, level at 32-128; the same bits)."""
    n, c = out.shape
    for r in range(n):
        zr = z[r]
        o = out[r]
        sr = sig[r]
        k = skip[r]  # ``out`` itself without a skip: then never read
        for j in range(c):
            v = zr[j] + bias[j]
            g = zr[c + j] + bias[c + j]
            zr[j] = v
            zr[c + j] = g
            s = vsigmoid(g)
            sr[j] = s
            vs = v * s
            o[j] = k[j] + vs if has_skip else vs


@cpu_kernel(parallel=False)
def glu_backward(dout, z, sig, dz):  # (N, C), (N, 2C), (N, C) -> (N, 2C)
    """``dz_value = dout * s``, ``dz_gate = dout * value * s * (1 - s)``, s = sigmoid(gate)
    as stored by :func:`glu_forward`."""
    T = z.dtype.type
    one = T(1.0)
    n, c = dout.shape
    df = dout.reshape(-1)
    zf = z.reshape(-1)
    sf = sig.reshape(-1)
    dzf = dz.reshape(-1)
    for r in prange(n):
        o = r * c
        o2 = 2 * o
        for j in range(c):
            s = sf[o + j]
            g = df[o + j]
            dzf[o2 + j] = g * s
            dzf[o2 + c + j] = g * zf[o2 + j] * s * (one - s)


# ---------------------------------------------------------------------------------------------
# LayerNorm over the last axis
# ---------------------------------------------------------------------------------------------
@cpu_kernel(parallel=False, fastmath=True, error_model="numpy")
def layernorm_forward(x, w, b, eps, out, mean, rstd):  # (N, C), (C,), (C,) -> (N, C), (N,), (N,)
    """Two-pass mean / biased variance per row, ``out = (x - mean) * rstd * w + b``
    (torch.nn.functional.layer_norm)."""
    T = x.dtype.type
    e = T(eps)
    n, c = x.shape
    inv_c = T(1.0) / T(c)
    for r in prange(n):
        s = T(0.0)
        for j in range(c):
            s += x[r, j]
        m = s * inv_c
        v = T(0.0)
        for j in range(c):
            d = x[r, j] - m
            v += d * d
        t = v * inv_c + e
        # a variance that overflowed float32: rstd 0 as torch's 1/sqrt(inf) (fastmath's
        # reciprocal square root estimate turns inf into NaN)
        rs = T(1.0) / np.sqrt(t) if t < T(np.inf) else T(0.0)
        mean[r] = m
        rstd[r] = rs
        for j in range(c):
            out[r, j] = (x[r, j] - m) * rs * w[j] + b[j]


@cpu_kernel(parallel=False, fastmath=True)
def layernorm_backward(dy, x, w, mean, rstd, dx, dw_part, db_part):
    """LayerNorm backward.

    ``g = dy * w``, ``dx = rstd * (g - mean(g) - xhat * mean(g * xhat))``; ``dw_part[k]`` and
    ``db_part[k]`` receive the sums of ``dy * xhat`` and ``dy`` over the rows of chunk ``k``
    (:data:`ROW_CHUNK` rows each), to be merged in order by the caller.
    Shapes: dy, x, dx (N, C); w (C,); mean, rstd (N,); dw_part, db_part (nchunks, C).
    """
    T = x.dtype.type
    n, c = x.shape
    inv_c = T(1.0) / T(c)
    nchunks = dw_part.shape[0]
    for k in prange(nchunks):
        for j in range(c):
            dw_part[k, j] = T(0.0)
            db_part[k, j] = T(0.0)
        for r in range(k * ROW_CHUNK, min(n, (k + 1) * ROW_CHUNK)):
            m = mean[r]
            rs = rstd[r]
            sg = T(0.0)
            sgx = T(0.0)
            for j in range(c):
                xh = (x[r, j] - m) * rs
                g = dy[r, j] * w[j]
                sg += g
                sgx += g * xh
                dw_part[k, j] += dy[r, j] * xh
                db_part[k, j] += dy[r, j]
            mg = sg * inv_c
            mgx = sgx * inv_c
            for j in range(c):
                xh = (x[r, j] - m) * rs
                dx[r, j] = rs * (dy[r, j] * w[j] - mg - xh * mgx)


# ---------------------------------------------------------------------------------------------
# Row softmax
# ---------------------------------------------------------------------------------------------
@cpu_kernel(parallel=False)
def softmax_forward(z, p):  # (N, m) -> (N, m)
    """Numerically stable softmax over the last axis."""
    T = z.dtype.type
    n, m = z.shape
    for r in prange(n):
        mx = z[r, 0]
        for j in range(1, m):
            if z[r, j] > mx:
                mx = z[r, j]
        s = T(0.0)
        for j in range(m):
            e = np.exp(z[r, j] - mx)
            p[r, j] = e
            s += e
        inv = T(1.0) / s
        for j in range(m):
            p[r, j] *= inv


@cpu_kernel(parallel=False, fastmath=True)
def softmax_backward(dp, p, dz):  # (N, m) x2 -> (N, m)
    """``dz = p * (dp - sum_j p_j dp_j)``."""
    T = p.dtype.type
    n, m = p.shape
    for r in prange(n):
        s = T(0.0)
        for j in range(m):
            s += p[r, j] * dp[r, j]
        for j in range(m):
            dz[r, j] = p[r, j] * (dp[r, j] - s)


# ---------------------------------------------------------------------------------------------
# Variable selection: per-variable embedding and the weighted combination
# ---------------------------------------------------------------------------------------------
@cpu_kernel(parallel=False)
def embed_forward(x, w, b, flat, pervar):  # (N, m), (m, d), (m, d) -> (N, m*d), (m, N, d)
    """``e[n, j, :] = x[n, j] * w[j] + b[j]`` written twice: flattened per row (for the
    selection GRN) and variable-major (for the per-variable GRNs)."""
    n, m = x.shape
    d = w.shape[1]
    for r in prange(n):
        for j in range(m):
            xv = x[r, j]
            for e in range(d):
                v = xv * w[j, e] + b[j, e]
                flat[r, j * d + e] = v
                pervar[j, r, e] = v


@cpu_kernel(parallel=False, fastmath=True)
def embed_backward(x, w, dflat, dpervar, dx, dw, db):
    """Backward of :func:`embed_forward`; the two layouts' gradients are summed (fan-out).

    ``dw[j, e] = sum_n x[n, j] * g[n, j, e]``, ``db[j, e] = sum_n g[n, j, e]`` (written, serial
    over n per column), ``dx[n, j] = sum_e w[j, e] * g[n, j, e]`` (written), with
    ``g = dflat + dpervar``. Shapes: x, dx (N, m); w, dw, db (m, d); dflat (N, m*d);
    dpervar (m, N, d).
    """
    T = x.dtype.type
    n, m = x.shape
    d = w.shape[1]
    dw[:, :] = T(0.0)
    db[:, :] = T(0.0)
    g = np.empty(d, x.dtype)
    for r in range(n):  # rows in order: each column's sums run over n serially, as before
        for j in range(m):
            xv = x[r, j]
            for e in range(d):
                g[e] = dflat[r, j * d + e] + dpervar[j, r, e]
            s = T(0.0)
            for e in range(d):
                dw[j, e] += xv * g[e]
                db[j, e] += g[e]
                s += w[j, e] * g[e]
            dx[r, j] = s


@cpu_kernel(parallel=False)
def embed_var_forward(x, w, b, a, pervar, zs):
    """The per-variable embeddings and their ``fc1`` products in one pass (the embedding folded
    into the per-variable GRNs' first Linear, which is affine in the scalar ``x[n, j]``).

    ``pervar[j, n] = x[n, j] * w[j] + b[j]`` and ``zs[j, n] = x[n, j] * a[j]`` (``a[j] =
    fc1_j.weight @ w[j]``; the ``fc1_j.weight @ b[j]`` part is a constant the caller adds with
    the bias). Shapes: x (N, m); w, b (m, d); a (m, h); pervar (m, N, d); zs (m, N, h).
    """
    n, m = x.shape
    for j in range(m):
        wj = w[j]
        bj = b[j]
        aj = a[j]
        for r in prange(n):
            xv = x[r, j]
            prow = pervar[j, r]
            zrow = zs[j, r]
            for e in range(wj.shape[0]):
                prow[e] = xv * wj[e] + bj[e]
            for e in range(aj.shape[0]):
                zrow[e] = xv * aj[e]


@cpu_kernel(parallel=False, fastmath=True)
def embed_var_backward(x, j, w, a, dz, dskip, gz, gz0, gs, gs0, dx):
    """The sums the folded per-variable ``fc1`` and embedding need from one variable's GRN
    gradients, in one pass over the rows (in order, serial).

    With ``xj = x[:, j]``: ``gz = dz^T xj``, ``gz0 = sum_n dz[n]`` (h,); ``gs = dskip^T xj``,
    ``gs0 = sum_n dskip[n]`` (d,) (all written); ``dx[n, j] += dz[n] . a + dskip[n] . w``
    (accumulated). Shapes: x, dx (N, m); w, dskip rows (d,); a, dz rows (h,).
    """
    T = x.dtype.type
    n = x.shape[0]
    for e in range(gz.shape[0]):
        gz[e] = T(0.0)
        gz0[e] = T(0.0)
    for e in range(gs.shape[0]):
        gs[e] = T(0.0)
        gs0[e] = T(0.0)
    for r in range(n):
        xv = x[r, j]
        zrow = dz[r]
        srow = dskip[r]
        acc = T(0.0)
        for e in range(gz.shape[0]):
            g = zrow[e]
            gz[e] += xv * g
            gz0[e] += g
            acc += g * a[e]
        for e in range(gs.shape[0]):
            g = srow[e]
            gs[e] += xv * g
            gs0[e] += g
            acc += g * w[e]
        dx[r, j] += acc


@cpu_kernel(parallel=False)
def embed_vars_backward(x, w, a, dz, dskip, gz, gz0, gs, gs0, dx):
    """:func:`embed_var_backward` for every variable ``j`` in order, one call (the shapes
    gain a leading variable axis: w (m, d), a (m, h), dz (m, N, h), dskip (m, N, d), gz and
    gz0 (m, h), gs and gs0 (m, d); x, dx (N, m)). The same bits as m calls."""
    for j in range(x.shape[1]):
        embed_var_backward(x, j, w[j], a[j], dz[j], dskip[j], gz[j], gz0[j], gs[j], gs0[j], dx)


# ---------------------------------------------------------------------------------------------
# Grouped forms: G layers of one shape, each with its own parameters, over a leading axis G
# (:class:`nbqat.nn.layers.GRNStack`). Each runs the per-layer kernel above on group g's 2-D
# views, so a group's results are those kernel's bits; one call replaces G dispatches.
# ---------------------------------------------------------------------------------------------
@cpu_kernel(parallel=False)
def bias_add_grouped(y, b):  # (G, N, C) in place, (G, C)
    """:func:`bias_add` per group: ``y[g, r] += b[g]``."""
    for g in range(y.shape[0]):
        bias_add(y[g], b[g])


@cpu_kernel(parallel=False)
def elu_forward_grouped(x, bias, y):  # (G, N, C) in place, (G, C) -> y (G, N, C)
    """:func:`elu_forward` per group with the group's bias (no context): ``x[g] += bias[g]``,
    ``y[g] = ELU(x[g])``."""
    for g in range(x.shape[0]):
        xg = x[g]
        elu_forward(xg, bias[g], True, xg[:1], False, 1, y[g])


@cpu_kernel(parallel=False, error_model="numpy")
def glu_forward_grouped(z, bias, skip, out, sig):  # (G, N, 2C), (G, 2C), (G, N, C) x3
    """:func:`glu_forward` per group with the group's bias and a residual ``skip[g]``."""
    for g in range(z.shape[0]):
        glu_forward(z[g], bias[g], skip[g], True, out[g], sig[g])


@cpu_kernel(parallel=False, fastmath=True, error_model="numpy")
def layernorm_forward_grouped(x, w, b, eps, out, mean, rstd):  # (G, N, C), (G, C) x2, (G, N) x2
    """:func:`layernorm_forward` per group with the group's weight and bias."""
    for g in range(x.shape[0]):
        layernorm_forward(x[g], w[g], b[g], eps, out[g], mean[g], rstd[g])


@cpu_kernel(parallel=False, fastmath=True)
def layernorm_backward_grouped(dy, x, w, mean, rstd, dx, dw_part, db_part):
    """:func:`layernorm_backward` per group: dy, x, dx (G, N, C); w (G, C); mean, rstd (G, N);
    dw_part, db_part (G, nchunks, C)."""
    for g in range(x.shape[0]):
        layernorm_backward(dy[g], x[g], w[g], mean[g], rstd[g], dx[g], dw_part[g], db_part[g])


@cpu_kernel(parallel=False, fastmath=True)
def vsn_combine_forward(v, xs, out):  # (N, m), (m, N, d) -> (N, d)
    """``out[n] = sum_j v[n, j] * xs[j, n]`` (j outer, the contiguous d axis inner)."""
    T = v.dtype.type
    n, m = v.shape
    d = out.shape[1]
    for r in prange(n):
        for e in range(d):
            out[r, e] = T(0.0)
        for j in range(m):
            vj = v[r, j]
            for e in range(d):
                out[r, e] += vj * xs[j, r, e]


@cpu_kernel(parallel=False, fastmath=True)
def vsn_combine_backward(dout, v, xs, dv, dxs):  # (N, d), (N, m), (m, N, d) -> (N, m), (m, N, d)
    """``dv[n, j] = <dout[n], xs[j, n]>``, ``dxs[j, n] = v[n, j] * dout[n]``."""
    T = v.dtype.type
    n, m = v.shape
    d = dout.shape[1]
    for r in prange(n):
        for j in range(m):
            s = T(0.0)
            vj = v[r, j]
            for e in range(d):
                g = dout[r, e]
                s += g * xs[j, r, e]
                dxs[j, r, e] = vj * g
            dv[r, j] = s
