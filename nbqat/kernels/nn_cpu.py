"""Compiled CPU kernels of the layer graph (:mod:`nbqat.nn`).

Every kernel takes C-contiguous arrays of one floating dtype (float32 or float64) and writes its
results into caller-provided outputs; the Python layer classes validate and allocate. Matrix
products are not here: they go through NumPy's BLAS in the layers. Transcendentals: a scalar libm
call in a Numba loop is ~10x slower than NumPy's SIMD ufuncs, so the LSTM uses ``np.tanh`` between
compiled passes, while the GLU and the ELU call the vectorisable :func:`vsigmoid` / :func:`vexpm1`
defined below inside their one pass.

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
from llvmlite import ir
from numba import prange
from numba.core import types
from numba.extending import intrinsic, overload

from nbqat._jit import cpu_kernel

#: Rows per chunk of the deterministic row reductions (LayerNorm parameter gradients).
ROW_CHUNK = 128


# ---------------------------------------------------------------------------------------------
# Vectorisable transcendentals (vexp, vsigmoid, vexpm1). They live in this module on purpose:
# Numba's on-disk cache checks only the source file of the kernel it caches, so helpers that a
# kernel inlines from ANOTHER module would stay stale in its cache after an edit there.
# ---------------------------------------------------------------------------------------------
# Inside a Numba loop ``np.exp`` on float32 is a call into the C library per element, which LLVM
# cannot turn into vector code (~2.5 ns per element here, against ~0.5 ns for the loops below).
# :func:`vexp` is a float32 exponential built only from arithmetic, ``rint`` and a bit cast, so a
# loop that calls it compiles to AVX2/AVX-512 code and can fuse the exponential with the
# surrounding arithmetic (one pass over memory instead of NumPy's pass per ufunc).
#
# * float32: Cephes' ``expf`` (S. L. Moshier): ``x = n ln2 + r``, a degree-6 polynomial for
#   ``exp(r)`` on ``|r| <= ln2 / 2``, and ``2^n`` assembled in the exponent bits. Measured maximum
#   relative error 1.1 float32 ulp against float64 ``exp`` on [-87, 88]. Inputs above 88.72 give
#   ``inf`` and below -87.34 give 0 (no subnormal results), so ``sigmoid(-inf) = 0`` and a GLU
#   turns ``inf * sigmoid(-inf)`` into NaN as PyTorch does; between 88.38 and 88.72 the result
#   stays at 2.4e38 (the exponent is clamped to a normal float). NaN propagates.
# * float64: ``np.exp`` (the C library's, correctly rounded in practice): the float64 build is the
#   checking build, where accuracy matters more than speed.
#
# :func:`vsigmoid` is built on it (the GLU gate, :func:`glu_forward`), and
# :func:`vexpm1` (ELU) on it and a degree-9 Taylor polynomial for ``|x| <= 0.5``, where
# ``exp(x) - 1`` would cancel (measured within 1.5 float32 ulp).
#
# Whether a calling loop vectorises is LLVM's decision: the GLU's loop did (measured 1.5-2x
# faster than NumPy's ``exp`` plus a compiled pass); an LSTM cell written the same way (four
# gate blocks of 32 per row, seven arrays) did not and ran 6x slower than NumPy's SIMD ``tanh``
# over the whole (B, 4d) block, so the LSTM keeps NumPy's ufuncs (not investigated further).


@intrinsic
def _f32_from_bits(typingctx, bits):  # pragma: no cover - compiled
    """Reinterpret an int32 as float32 (LLVM ``bitcast``; vectorises)."""
    sig = types.float32(types.int32)

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.FloatType())

    return sig, codegen


def vexp(x):  # pragma: no cover - replaced by the overload inside compiled code
    """``e**x`` (float32: see the comment above for accuracy and range)."""
    return np.exp(x)


def vsigmoid(x):  # pragma: no cover - replaced by the overload inside compiled code
    """``1 / (1 + e**-x)``."""
    return 1.0 / (1.0 + np.exp(-x))


def vexpm1(x):  # pragma: no cover - replaced by the overload inside compiled code
    """``e**x - 1``."""
    return np.expm1(x)


def _expf(x):  # pragma: no cover - compiled
    T = np.float32
    xc = min(max(x, T(-87.33654)), T(88.3762626647949))  # 2**n stays a normal float32
    n = np.rint(xc * T(1.44269504088896341))
    r = xc - n * T(0.693359375)
    r = r - n * T(-2.12194440e-4)
    p = T(1.9875691500e-4)
    p = p * r + T(1.3981999507e-3)
    p = p * r + T(8.3334519073e-3)
    p = p * r + T(4.1665795894e-2)
    p = p * r + T(1.6666665459e-1)
    p = p * r + T(5.0000001201e-1)
    p = p * r * r + r + T(1.0)
    e = _f32_from_bits((np.int32(n) + np.int32(127)) << np.int32(23))
    y = p * e
    y = T(np.inf) if x > T(88.72283905206835) else y  # overflow, as expf
    y = T(0.0) if x < T(-87.33654) else y  # no subnormal results: 0 below the normal range
    return y if x == x else x  # NaN in, NaN out


@overload(vexp)
def _exp_ov(x):  # pragma: no cover - compiled
    if x == types.float32:
        return _expf
    if isinstance(x, types.Float):
        return lambda x: np.exp(x)
    return None


@overload(vsigmoid)
def _sigmoid_ov(x):  # pragma: no cover - compiled
    if isinstance(x, types.Float):
        one = np.float32(1.0) if x == types.float32 else np.float64(1.0)

        def impl(x):
            return one / (one + vexp(-x))

        return impl
    return None


def _expm1f(x):  # pragma: no cover - compiled
    T = np.float32
    # |x| <= 0.5: Taylor series to x**9 / 9! (truncation below 2e-9 relative), no cancellation;
    # elsewhere exp(x) - 1, whose rounding error is below 1 ulp of a result >= 0.39 in size
    p = T(1.0 / 362880.0)
    p = p * x + T(1.0 / 40320.0)
    p = p * x + T(1.0 / 5040.0)
    p = p * x + T(1.0 / 720.0)
    p = p * x + T(1.0 / 120.0)
    p = p * x + T(1.0 / 24.0)
    p = p * x + T(1.0 / 6.0)
    p = p * x + T(0.5)
    small = x * (T(1.0) + p * x)  # x * (...) keeps the sign of -0.0
    big = vexp(x) - T(1.0)
    return small if abs(x) <= T(0.5) else big


@overload(vexpm1)
def _expm1_ov(x):  # pragma: no cover - compiled
    if x == types.float32:
        return _expm1f
    if isinstance(x, types.Float):
        return lambda x: np.expm1(x)
    return None


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
    """ELU's forward in one pass, with the preceding additions fused in:
    ``x[r] += bias`` (if ``has_bias``) ``+ ctx[r // steps]`` (if ``has_ctx``; a (B, C) static
    context broadcast over ``steps`` rows per batch element), then ``y = x if x > 0 else
    expm1(x)`` (:func:`vexpm1`, vectorised). ``x`` keeps the pre-activation
    for backward."""
    n, c = x.shape
    for r in range(n):
        xr = x[r]
        if has_bias:
            for j in range(c):
                xr[j] += bias[j]
        if has_ctx:
            cr = ctx[r // steps]
            for j in range(c):
                xr[j] += cr[j]
        yr = y[r]
        for j in range(c):
            v = xr[j]
            yr[j] = v if v > 0 else vexpm1(v)


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
    """The GLU in one pass: ``z[r] += bias`` (in place: backward reads the biased value half),
    ``sig = sigmoid(z[:, C:])`` (:func:`vsigmoid`, vectorised), ``out =
    z[:, :C] * sig (+ skip if has_skip)``."""
    n, c = out.shape
    bv = bias[:c]
    bg = bias[c:]
    for r in range(n):
        zr = z[r]
        val = zr[:c]
        gate = zr[c:]
        o = out[r]
        sr = sig[r]
        for j in range(c):
            val[j] += bv[j]
            gate[j] += bg[j]
        if has_skip:
            k = skip[r]
            for j in range(c):
                s = vsigmoid(gate[j])
                sr[j] = s
                o[j] = k[j] + val[j] * s
        else:
            for j in range(c):
                s = vsigmoid(gate[j])
                sr[j] = s
                o[j] = val[j] * s


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
        rs = T(1.0) / np.sqrt(v * inv_c + e)
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
    for j in range(m):
        for e in range(d):
            dw[j, e] = T(0.0)
            db[j, e] = T(0.0)
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


# ---------------------------------------------------------------------------------------------
# LSTM cell (torch gate order i, f, g, o); one time step, all arrays 2-D C-contiguous
# ---------------------------------------------------------------------------------------------
@cpu_kernel(parallel=False)
def lstm_cell_forward(xg, hh, c_prev, gates, c, tc, h):
    """One fused LSTM step (scalar libm sigmoid/tanh; kept for nbqat.nn.int8).

    ``a = xg + hh`` (B, 4d), ``i, f, o = sigmoid``, ``g = tanh``, ``c = f * c_prev + i * g``,
    ``h = o * tanh(c)``; writes ``gates`` (activated i, f, g, o), ``c``, ``tc`` = tanh(c), ``h``.
    The float layer :class:`nbqat.nn.LSTM` uses :func:`nbqat.nn.layers.lstm.lstm_step` instead
    (NumPy's SIMD tanh for all four gates, equal to this to a few ulp).
    """
    T = xg.dtype.type
    one = T(1.0)
    nb, d = c.shape
    for b in range(nb):
        for j in range(d):
            gi = one / (one + np.exp(-(xg[b, j] + hh[b, j])))
            gf = one / (one + np.exp(-(xg[b, d + j] + hh[b, d + j])))
            gg = np.tanh(xg[b, 2 * d + j] + hh[b, 2 * d + j])
            go = one / (one + np.exp(-(xg[b, 3 * d + j] + hh[b, 3 * d + j])))
            cc = gf * c_prev[b, j] + gi * gg
            t = np.tanh(cc)
            gates[b, j] = gi
            gates[b, d + j] = gf
            gates[b, 2 * d + j] = gg
            gates[b, 3 * d + j] = go
            c[b, j] = cc
            tc[b, j] = t
            h[b, j] = go * t


@cpu_kernel(parallel=False)
def lstm_gates_forward(tg, c_prev, c):  # (B, 4d) in place; (B, d) -> (B, d)
    """Gates and cell state of one step from ``tg = tanh(a')`` (B, 4d), where ``a'`` is the
    pre-activation with the i, f, o blocks halved: ``sigmoid(a) = 0.5 + 0.5 tanh(a / 2)`` turns
    ``tg`` into the activated gates ``[i, f, g, o]`` in place (g = tanh(a) as is) and writes
    ``c = f * c_prev + i * g``."""
    T = tg.dtype.type
    half = T(0.5)
    nb, d = c.shape
    for b in range(nb):
        r = tg[b]
        ri = r[:d]
        rf = r[d : 2 * d]
        rg = r[2 * d : 3 * d]
        ro = r[3 * d :]
        cp = c_prev[b]
        cr = c[b]
        for j in range(d):
            i = half + half * ri[j]
            f = half + half * rf[j]
            ri[j] = i
            rf[j] = f
            ro[j] = half + half * ro[j]
            cr[j] = f * cp[j] + i * rg[j]


@cpu_kernel(parallel=False)
def lstm_cell_backward(dh_out, dh_next, dc_next, gates, tc, c_prev, dg):
    """Backward of one LSTM step.

    ``dh = dh_out + dh_next``; ``do = dh * tanh(c)``; ``dc = dc_next + dh * o * (1 - tanh^2 c)``;
    ``di = dc * g``, ``dg = dc * i``, ``df = dc * c_prev``; through the nonlinearities into the
    pre-activation gradient ``dg`` (B, 4d, written). ``dc_next`` (B, d) is updated in place to
    ``dc * f``, the cell gradient for the previous step.
    """
    T = gates.dtype.type
    one = T(1.0)
    nb, d = tc.shape
    for b in range(nb):  # row views: the j loop vectorises (module docstring)
        dho = dh_out[b]
        dhn = dh_next[b]
        dcn = dc_next[b]
        tcr = tc[b]
        cpr = c_prev[b]
        g = gates[b]
        gi = g[:d]
        gf = g[d : 2 * d]
        gg = g[2 * d : 3 * d]
        go = g[3 * d :]
        o = dg[b]
        oi = o[:d]
        of = o[d : 2 * d]
        og = o[2 * d : 3 * d]
        oo = o[3 * d :]
        for j in range(d):
            dh = dho[j] + dhn[j]
            i = gi[j]
            f = gf[j]
            gv = gg[j]
            ov = go[j]
            t = tcr[j]
            do = dh * t
            dc = dcn[j] + dh * ov * (one - t * t)
            dcn[j] = dc * f
            oi[j] = dc * gv * i * (one - i)
            of[j] = dc * cpr[j] * f * (one - f)
            og[j] = dc * i * (one - gv * gv)
            oo[j] = do * ov * (one - ov)
