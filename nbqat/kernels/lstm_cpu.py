"""Compiled CPU kernels of one LSTM time step (torch's gate order i, f, g, o), re-exported by
:mod:`nbqat.kernels.nn_cpu`; the threading, layout and dtype rules are that module's (serial,
row views so the inner loops vectorise, constants typed with the array's dtype)."""

from __future__ import annotations

import numpy as np

from nbqat._jit import cpu_kernel

__all__ = ["lstm_cell_backward", "lstm_cell_forward", "lstm_gates_forward"]


# ---------------------------------------------------------------------------------------------
# LSTM cell (torch gate order i, f, g, o); one time step, all arrays 2-D C-contiguous
# ---------------------------------------------------------------------------------------------
@cpu_kernel(parallel=False)
def lstm_cell_forward(xg, hh, c_prev, gates, c, tc, h):
    """One fused LSTM step (scalar libm sigmoid/tanh; kept for nbqat.nn.int8).

    ``a = xg + hh`` (B, 4d), ``i, f, o = sigmoid``, ``g = tanh``, ``c = f * c_prev + i * g``,
    ``h = o * tanh(c)``; writes ``gates`` (activated i, f, g, o), ``c``, ``tc`` = tanh(c), ``h``.
    Per row, one loop per operation (the sums and products vectorise, each libm loop holds one
    call), every element by the same float32 operations as a single fused loop.
    The float layer :class:`nbqat.nn.LSTM` uses :func:`nbqat.nn.layers.lstm.lstm_step` instead
    (NumPy's SIMD tanh for all four gates, equal to this to a few ulp).
    """
    T = xg.dtype.type
    one = T(1.0)
    nb, d = c.shape
    for b in range(nb):
        xr = xg[b]
        hr = hh[b]
        gr = gates[b]
        for j in range(4 * d):
            gr[j] = xr[j] + hr[j]
        gi, gf, gg, go = _gate_blocks(gr, d)
        for j in range(d):
            gi[j] = one / (one + np.exp(-gi[j]))
        for j in range(d):
            gf[j] = one / (one + np.exp(-gf[j]))
        for j in range(d):
            go[j] = one / (one + np.exp(-go[j]))
        for j in range(d):
            gg[j] = np.tanh(gg[j])
        cp = c_prev[b]
        cr = c[b]
        tr = tc[b]
        hrow = h[b]
        for j in range(d):
            cr[j] = gf[j] * cp[j] + gi[j] * gg[j]
        for j in range(d):
            tr[j] = np.tanh(cr[j])
        for j in range(d):
            hrow[j] = go[j] * tr[j]


@cpu_kernel(parallel=False, inline="always")
def _gate_blocks(row, d):  # pragma: no cover
    """The i, f, g, o blocks (views) of one (4d,) row in torch's gate order."""
    return row[:d], row[d : 2 * d], row[2 * d : 3 * d], row[3 * d :]


@cpu_kernel(parallel=False)
def lstm_gates_forward(tg, c_prev, c, o):  # (B, 4d) in place; (B, d) -> (B, d), (B, d)
    """Gates and cell state of one step from ``tg = tanh(a')`` (B, 4d), where ``a'`` is the
    pre-activation with the i, f, o blocks halved: ``sigmoid(a) = 0.5 + 0.5 tanh(a / 2)`` turns
    ``tg`` into the activated gates ``[i, f, g, o]`` in place (g = tanh(a) as is) and writes
    ``c = f * c_prev + i * g`` and a contiguous copy ``o`` (B, d) of the output gate (NumPy's
    ``o * tanh(c)`` over the strided block of ``tg`` took 3.5 us at B64 d16, 0.8 us over the
    copy)."""
    T = tg.dtype.type
    half = T(0.5)
    nb, d = c.shape
    for b in range(nb):
        ri, rf, rg, ro = _gate_blocks(tg[b], d)
        cp = c_prev[b]
        cr = c[b]
        orow = o[b]
        for j in range(d):
            i = half + half * ri[j]
            f = half + half * rf[j]
            og = half + half * ro[j]
            ri[j] = i
            rf[j] = f
            ro[j] = og
            orow[j] = og
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
        gi, gf, gg, go = _gate_blocks(gates[b], d)
        oi, of, og, oo = _gate_blocks(dg[b], d)
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
