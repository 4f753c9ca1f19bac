"""CPU kernels of nbqat's integer-arithmetic (int8) reference inference path.

Compiled code only; the public entry points (validation, dispatch) live in :mod:`nbqat.nn.int8`.
The kernels are serial (``prange`` runs as ``range``): they are called per layer and per LSTM
step on small arrays, where waking Numba's OpenMP pool costs more than the work (see
:mod:`nbqat.kernels.nn_cpu`).

* :func:`quantize_per_tensor_kernel` -- float -> integer codes with PyTorch's fake-quantize
  arithmetic (``inv = 1/scale`` in float32, ``rint(x * inv) + zero_point``, clamp: the one
  :func:`nbqat.kernels.fake_quant_formula.quantize_code`), so the codes are exactly those the
  fake-quant model used.
* :func:`qlinear_kernel` -- ``acc[m, n] = sum_k (x_q[m, k] - zp_x) * w_q[n, k]`` accumulated in
  int32 (int64 where the codes' ranges could overflow int32), then requantized
  ``y = float32(acc * (s_x * s_w[n])) + b[n]`` (the multiplier is the
  exact float64 product of two float32 scales; one rounding to float32).
* :func:`quantize_rows_f32`, :func:`requantize_rows` -- the fast path: codes minus the zero
  point as float32, a float32 matmul (BLAS), requantized in place. float32 carries the integer
  sum exactly while ``K * max|x - zp_x| * max|w - zp_w| <= 2**24`` (:data:`F32_EXACT`: uint8 x
  int8 codes up to K = 513), so the result is :func:`qlinear_kernel`'s bit for bit;
  :func:`qlinear_f32_kernel` runs the three in one call over blocks of rows (no temporary of
  the input's size) and :func:`lstm_steps_kernel` a whole integer LSTM recurrence.
"""

from __future__ import annotations

import numpy as np
from numba import prange

from nbqat._jit import cpu_kernel
from nbqat.kernels.fake_quant_formula import quantize_code
from nbqat.kernels.lstm_cpu import lstm_cell_forward


@cpu_kernel(parallel=False)
def quantize_per_tensor_kernel(
    x, inv_scale, zero_point, quant_min, quant_max, out
):  # pragma: no cover
    """Quantize a float32 vector to integer codes (PyTorch's fake-quant arithmetic).

    Parameters
    ----------
    x : (n,) float32
    inv_scale : float32
        ``float32(1) / float32(scale)``.
    zero_point, quant_min, quant_max : int
    out : (n,) int32
        ``clamp(rint(x * inv_scale) + zero_point, quant_min, quant_max)``; NaN -> quant_min,
        like ``torch.fake_quantize_per_tensor_affine`` (``fmax(NaN, qmin) = qmin``).
    """
    zp = np.float32(zero_point)
    lo = np.float32(quant_min)
    hi = np.float32(quant_max)
    for i in prange(x.size):
        out[i] = np.int32(quantize_code(x[i], inv_scale, zp, lo, hi)[1])


@cpu_kernel(parallel=False, inline="always")
def requantize(acc, multiplier, bias):  # pragma: no cover
    """The requantize step of one output: ``float32(float64(acc) * multiplier) + bias`` (the
    exact integer sum times the float64 product of the two float32 scales, rounded once to
    float32, plus the float32 bias)."""
    return np.float32(np.float64(acc) * multiplier) + bias


@cpu_kernel(parallel=False)
def qlinear_kernel(xq, zp_x, wq, multiplier, bias, wide, out):  # pragma: no cover
    """Integer matmul with exact integer accumulation and float requantization.

    Parameters
    ----------
    xq : (M, K) int32
        Activation codes (e.g. quint8 values 0..255 stored as int32).
    zp_x : int
        Activation zero point.
    wq : (N, K) int32
        Weight codes minus their zero points (``w_q - zp_w``).
    multiplier : (N,) float64
        ``float64(s_x) * float64(s_w[n])`` (exact: the product of two float32 values).
    bias : (N,) float32
        Bias (all zeros when the layer has none).
    wide : bool
        Accumulate in int64 instead of int32. The caller chooses it from the codes' ranges
        (:func:`nbqat.nn.int8.accumulator_dtype`) so that the sum can never wrap.
    out : (M, N) float32
        ``float32(acc[m, n] * multiplier[n]) + bias[n]`` with
        ``acc[m, n] = sum_k (xq[m, k] - zp_x) * wq[n, k]``.
    """
    M, K = xq.shape
    N = wq.shape[0]
    for m in prange(M):
        for n in range(N):
            if wide:
                acc64 = np.int64(0)
                for k in range(K):
                    acc64 += np.int64(xq[m, k] - zp_x) * np.int64(wq[n, k])
                out[m, n] = requantize(acc64, multiplier[n], bias[n])
            else:
                acc = np.int32(0)
                for k in range(K):
                    acc = np.int32(acc + np.int32((xq[m, k] - zp_x) * wq[n, k]))
                out[m, n] = requantize(acc, multiplier[n], bias[n])


@cpu_kernel(parallel=False)
def quantize_per_row_kernel(
    x, inv_scale, zero_point, quant_min, quant_max, out
):  # pragma: no cover
    """The per-channel twin of :func:`quantize_per_tensor_kernel`: row ``c`` of the (C, inner)
    float32 matrix ``x`` with ``inv_scale[c] = float32(1) / scale[c]`` (float32) and
    ``zero_point[c]`` (int32), both (C,); ``quant_min``, ``quant_max`` int.

    Parameters
    ----------
    x, inv_scale, zero_point, quant_min, quant_max
        As above.
    out : (C, inner) int32
        ``clamp(rint(x[c, j] * inv_scale[c]) + zero_point[c], quant_min, quant_max)``
        (``torch.fake_quantize_per_channel_affine``'s arithmetic, clamped before the cast).
    """
    lo = np.float32(quant_min)
    hi = np.float32(quant_max)
    C, inner = x.shape
    for c in prange(C):
        inv = inv_scale[c]
        zp = np.float32(zero_point[c])
        for j in range(inner):
            out[c, j] = np.int32(quantize_code(x[c, j], inv, zp, lo, hi)[1])


@cpu_kernel(parallel=False)
def quantize_rows_f32(x, inv_scale, zero_point, quant_min, quant_max, out):  # pragma: no cover
    """``out = q - zero_point`` in float32 (exact), ``q`` the codes of
    :func:`quantize_per_tensor_kernel`, for C-contiguous float32 ``x`` and ``out`` of one shape
    (one flat loop: rows of 16 would leave the vector loop to its scalar remainder)."""
    zp = np.float32(zero_point)
    lo = np.float32(quant_min)
    hi = np.float32(quant_max)
    xr = x.reshape(-1)
    orow = out.reshape(-1)
    for i in range(np.uint64(xr.size)):
        orow[i] = quantize_code(xr[i], inv_scale, zp, lo, hi)[1] - zp


@cpu_kernel(parallel=False)
def requantize_rows(acc, multiplier_t, bias_t):  # pragma: no cover
    """In place, ``acc[m, n] = float32(acc[m, n] * multiplier[n]) + bias[n]`` (:func:`requantize`)
    for the C-contiguous (M, N) float32 integer sums ``acc``.

    ``multiplier_t`` (float64) and ``bias_t`` (float32) are the (N,) vectors tiled ``T`` times
    (:func:`tile_rows`): the kernel walks ``acc`` in flat blocks of ``T`` rows, so the loop is
    long enough to vectorise for any ``N``."""
    a = acc.reshape(-1)
    n = np.uint64(a.size)
    span = np.uint64(multiplier_t.size)
    for s in range(np.uint64(0), n, span):
        e = min(n, s + span) - s
        for j in range(np.uint64(0), e):
            a[s + j] = requantize(a[s + j], multiplier_t[j], bias_t[j])


def tile_rows(v, n_cols):
    """``v`` (N,) tiled to cover at least 256 elements (whole rows): :func:`requantize_rows`."""
    return np.tile(v, max(1, -(-256 // max(1, n_cols))))


#: Rows per block of :func:`qlinear_f32_kernel`: the block's codes stay in the L2 cache.
QLINEAR_BLOCK_ROWS = 256


@cpu_kernel(parallel=False)
def qlinear_f32_kernel(x, xq, wt, multiplier_t, bias_t, out):  # pragma: no cover
    """The fast integer linear layer in one pass over blocks of :data:`QLINEAR_BLOCK_ROWS` rows.

    Per block: the codes minus the zero point as float32 (:func:`quantize_rows_f32` with
    ``xq = (inv_scale, zero_point, quant_min, quant_max)``) in a block-sized scratch, the exact
    integer sums ``codes @ wt`` (float32 BLAS) into ``out``'s rows, requantized in place
    (:func:`requantize_rows`): the result of the whole-matrix passes bit for bit (the sums are
    exact in any order, :data:`F32_EXACT`), without a temporary of ``x``'s size.

    Parameters
    ----------
    x : (M, K) float32, C-contiguous
    xq : tuple (float32, int, int, int)
    wt : (K, N) float32, ``(w_q - zp_w).T``
    multiplier_t, bias_t : float64 and float32 tiled vectors (:func:`tile_rows`)
    out : (M, N) float32, C-contiguous, written
    """
    inv, zp, qmin, qmax = xq
    m = x.shape[0]
    rows = max(1, min(m, QLINEAR_BLOCK_ROWS))  # 1 for an empty x: no block runs
    xf = np.empty((rows, x.shape[1]), np.float32)
    for s in range(0, m, rows):
        e = min(m, s + rows)
        if e - s < rows:  # the last, shorter block
            xf = xf[: e - s]
        quantize_rows_f32(x[s:e], inv, zp, qmin, qmax, xf)
        acc = out[s:e]  # contiguous rows of the C-contiguous out
        np.dot(xf, wt, acc)
        requantize_rows(acc, multiplier_t, bias_t)


#: Bound on ``K * max|x_q - zp_x| * max|w_q - zp_w|`` up to which float32 carries the integer
#: sum exactly: every product and partial sum is then an integer of at most 2**24 in magnitude,
#: so any summation order (a BLAS sgemm with FMA included) gives the exact integer sum.
F32_EXACT = 1 << 24


@cpu_kernel(parallel=False)
def lstm_steps_kernel(xg, h0, c0, hq, wt, multiplier_t, zero_t, hs, cs, gates, tc, hf, hh):
    """The whole recurrence of :class:`nbqat.nn.int8.Int8LSTM` in one call.

    Per step ``t``: ``hf = codes(h_{t-1}) - zp`` (:func:`quantize_rows_f32` with the hidden
    qparams ``hq = (inv_scale, zero_point, quant_min, quant_max)``), ``hh = hf @ wt`` (the exact
    integer sums, float32 BLAS), requantized (:func:`requantize_rows`, tiled multiplier and zero
    bias: the step-by-step path adds its zero bias too), then :func:`lstm_cell_forward` writes
    ``gates``, ``cs[t]``, ``tc`` and ``hs[t]``; ``h_{-1} = h0``, ``c_{-1} = c0``.

    Parameters
    ----------
    xg : (L, B, 4d) float32, the input projection of every step
    h0, c0 : (B, d) float32
    hq : tuple (float32, int, int, int)
    wt : (d, 4d) float32, ``(w_q - zp_w).T``; multiplier_t float64, zero_t float32 zeros
    hs, cs : (L, B, d) float32, written
    gates : (B, 4d), tc : (B, d), hf : (B, d), hh : (B, 4d) float32 scratch
    """
    inv, zp, qmin, qmax = hq
    for t in range(xg.shape[0]):
        h = h0 if t == 0 else hs[t - 1]
        c_prev = c0 if t == 0 else cs[t - 1]
        quantize_rows_f32(h, inv, zp, qmin, qmax, hf)
        np.dot(hf, wt, hh)
        requantize_rows(hh, multiplier_t, zero_t)
        lstm_cell_forward(xg[t], hh, c_prev, gates, cs[t], tc, hs[t])
