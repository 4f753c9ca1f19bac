"""Single-layer LSTM over a sequence with backprop through time and fake-quantization hooks."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from nbqat import _validate as V
from nbqat.kernels import nn_cpu
from nbqat.nn.init import uniform_init
from nbqat.nn.layers.linear import _ones, hook_backward
from nbqat.nn.params import Module, layer_size


def lstm_step(
    xg: np.ndarray,
    hh: np.ndarray,
    c_prev: np.ndarray,
    gates: np.ndarray,
    c: np.ndarray,
    tc: np.ndarray,
    h: np.ndarray,
    o: np.ndarray,
) -> None:
    """One LSTM step exactly as :class:`LSTM` computes it (all arrays C-contiguous, one dtype).

    The inputs carry the pre-activations with the i, f, o blocks HALVED (exactly: the weights and
    biases are scaled by 0.5, see :meth:`LSTM.forward`): ``a' = xg + hh``; one SIMD ``tanh`` over
    all four blocks, then ``sigmoid(a) = 0.5 + 0.5 tanh(a / 2)`` for i, f, o and ``g = tanh(a)``
    (compiled kernel, which also forms ``c = f c_prev + i g``); ``tc = tanh(c)``, ``h = o tc``.
    Five calls per step instead of eleven with ``1 / (1 + exp(-a))``; the two forms differ by a
    few ulp. ``hh`` is overwritten.

    Parameters
    ----------
    xg : ndarray (B, 4d)
        Input projection of this step, ``(x_t W_ih^T + b_ih + b_hh) * s`` with ``s`` = 0.5 on
        the i, f, o blocks and 1 on g.
    hh : ndarray (B, 4d)
        Recurrent projection ``h_{t-1} (W_hh^T * s)``; overwritten with ``a'``.
    c_prev : ndarray (B, d)
        Cell state of the previous step.
    gates : ndarray (B, 4d)
        Output: the activated gates ``[i, f, g, o]`` (sigmoid, sigmoid, tanh, sigmoid).
    c : ndarray (B, d)
        Output: the new cell state.
    tc : ndarray (B, d)
        Output: ``tanh(c)``.
    h : ndarray (B, d)
        Output: the new hidden state.
    o : ndarray (B, d)
        Scratch: the output gate, contiguous (the multiply over it is 4x faster than over the
        strided block of ``gates``).
    """
    np.add(xg, hh, out=hh)  # (B, 4d) pre-activations, i/f/o halved
    np.tanh(hh, out=gates)
    # gates activated in place, c = f c_prev + i g, o = the output gate
    nn_cpu.lstm_gates_forward(gates, c_prev, c, o)
    np.tanh(c, out=tc)
    np.multiply(o, tc, out=h)  # h = o tanh(c)


def _gate_scale(d: int, dtype: np.dtype) -> np.ndarray:
    """(4d,) factors: 0.5 on the i, f, o blocks (sigmoid via tanh), 1 on g."""
    s = np.full(4 * d, 0.5, dtype=dtype)
    s[2 * d : 3 * d] = 1
    return s


def check_lstm_inputs(
    x: np.ndarray, h0: np.ndarray, c0: np.ndarray, input_size: int, hidden_size: int
) -> tuple[int, int]:
    """``(B, L)`` of an LSTM's inputs: ``x`` (B, L, input_size) with L >= 1 (torch's rule; B
    may be 0), ``h0`` and ``c0`` (B, hidden_size); else a ValueError naming the array. An
    integer or bool array is a TypeError naming it (torch refuses them too; the cast to the
    weights' dtype took them silently), before anything runs."""
    for name, a in (("x", x), ("h0", h0), ("c0", c0)):
        V.check_float_array(a, name)
    if x.ndim != 3 or x.shape[2] != input_size or x.shape[1] == 0:
        raise ValueError(
            f"LSTM input must be (B, L, {input_size}) with L >= 1 (torch's rule), got {x.shape}"
        )
    nb, nl = x.shape[0], x.shape[1]
    for name, s in (("h0", h0), ("c0", c0)):
        if np.shape(s) != (nb, hidden_size):
            raise ValueError(f"LSTM {name} must be ({nb}, {hidden_size}), got {np.shape(s)}")
    return nb, nl


class LSTM(Module):
    """One-layer, batch-first LSTM with explicit initial state (torch.nn.LSTM, batch_first=True).

    Gates ``[i, f, g, o] = x_t W_ih^T + b_ih + h_{t-1} W_hh^T + b_hh`` (torch's order and
    layout: ``weight_ih`` (4d, in), ``weight_hh`` (4d, d), ``bias_ih``, ``bias_hh`` (4d,)),
    ``c_t = f c_{t-1} + i g``, ``h_t = o tanh(c_t)``; init ``U(-1/sqrt(d), 1/sqrt(d))``.

    Quantization hooks (None = float path): ``weight_ih_fake_quant`` and ``weight_hh_fake_quant``
    (once per forward), ``input_fake_quant`` (once, on the whole input sequence) and
    ``hidden_fake_quant`` (on ``h_{t-1}`` before the recurrent product at EVERY step, the initial
    state included; one ctx per step is kept for backward).

    Backward (BPTT, backwards in time): ``dh = dh_out_t + dh_next``, ``do = dh tanh(c_t)``,
    ``dc = dc_next + dh o (1 - tanh^2 c_t)``, ``di = dc g``, ``dg = dc i``, ``df = dc c_{t-1}``,
    ``dc_next = dc f``, through the gate nonlinearities to ``da_t``; ``dh_next = da_t W_hh``.
    The weight gradients are two matmuls over all steps at the end. The gradients w.r.t. the
    initial state ``(h0, c0)`` are returned (they feed the static-context GRNs in the TFT), and
    gradients w.r.t. the final state can be fed in (the decoder's initial-state gradient seeds
    the encoder's last step).

    Parameters
    ----------
    input_size : int
        Size of the last axis of the input sequence.
    hidden_size : int
        d, the size of the hidden and cell states.

    Raises
    ------
    ValueError
        When a size is not a positive int.
    """

    def __init__(self, input_size: int, hidden_size: int) -> None:
        super().__init__()
        self.input_size = layer_size("LSTM", "input_size", input_size)
        self.hidden_size = layer_size("LSTM", "hidden_size", hidden_size)
        d, n_in = self.hidden_size, self.input_size
        init = uniform_init(1.0 / math.sqrt(d))
        self.declare("weight_ih", (4 * d, n_in), init)
        self.declare("weight_hh", (4 * d, d), init)
        self.declare("bias_ih", (4 * d,), init)
        self.declare("bias_hh", (4 * d,), init)
        self.weight_ih_fake_quant: Any = None
        self.weight_hh_fake_quant: Any = None
        self.input_fake_quant: Any = None
        self.hidden_fake_quant: Any = None

    def forward(
        self, x: np.ndarray, h0: np.ndarray, c0: np.ndarray
    ) -> tuple[np.ndarray, tuple[np.ndarray, np.ndarray]]:
        """Run the LSTM over the sequence from the initial state ``(h0, c0)``.

        Parameters
        ----------
        x : ndarray (B, L, input_size)
            Input sequence, batch first; cast to the dtype of the weights.
        h0, c0 : ndarray (B, hidden_size)
            Initial hidden and cell states.

        Returns
        -------
        out : ndarray (B, L, hidden_size)
            Hidden state of every step, in the dtype of the weights.
        final_state : tuple of (ndarray, ndarray)
            ``(h_L, c_L)``, the final hidden and cell state (B, hidden_size) (copies).

        Raises
        ------
        ValueError
            When ``x`` is not (B, L, input_size) with L >= 1 or ``h0`` / ``c0`` is not
            (B, hidden_size). B = 0 runs (empty outputs).
        TypeError
            When ``x``, ``h0`` or ``c0`` is not floating point (integer or bool), before anything
            is cached.
        """
        d = self.hidden_size
        dt = self.weight_ih.dtype
        nb, nl = check_lstm_inputs(x, h0, c0, self.input_size, d)
        x = np.ascontiguousarray(x, dtype=dt)
        ctx_x = None
        if self.input_fake_quant is not None:
            x = self.input_fake_quant.forward(x)  # (B, L, in)
            ctx_x = self.input_fake_quant.ctx
        w_ih, w_hh, ctx_wih, ctx_whh = self.weight_ih, self.weight_hh, None, None
        if self.weight_ih_fake_quant is not None:
            w_ih = self.weight_ih_fake_quant.forward(w_ih)
            ctx_wih = self.weight_ih_fake_quant.ctx
        if self.weight_hh_fake_quant is not None:
            w_hh = self.weight_hh_fake_quant.forward(w_hh)
            ctx_whh = self.weight_hh_fake_quant.ctx
        # i, f, o blocks halved (exact: powers of two) for lstm_step's sigmoid-by-tanh
        scale = _gate_scale(d, dt)
        xt = np.ascontiguousarray(x.transpose(1, 0, 2))  # (L, B, in) time-major
        xg2 = xt.reshape(nl * nb, xt.shape[2]) @ (w_ih.T * scale)  # (L*B, 4d)
        nn_cpu.bias_add(xg2, (self.bias_ih + self.bias_hh) * scale)
        xg = xg2.reshape(nl, nb, 4 * d)  # (L, B, 4d)
        # (d, 4d) C-contiguous: OpenBLAS's small-matrix path runs a transposed (F-ordered) operand
        # ~1.6x slower at (64, 32) x (32, 128)
        w_hh_t = np.ascontiguousarray(w_hh.T * scale)
        gates = np.empty((nl, nb, 4 * d), dtype=dt)  # activated i, f, g, o
        cs = np.empty((nl, nb, d), dtype=dt)  # c_t
        tcs = np.empty((nl, nb, d), dtype=dt)  # tanh(c_t)
        hs = np.empty((nl, nb, d), dtype=dt)  # h_t
        hprev = np.empty((nl, nb, d), dtype=dt)  # (quantized) h_{t-1} fed to W_hh
        hh = np.empty((nb, 4 * d), dtype=dt)
        og = np.empty((nb, d), dtype=dt)
        c0 = np.ascontiguousarray(c0, dtype=dt)
        h = np.ascontiguousarray(h0, dtype=dt)
        hfq = self.hidden_fake_quant
        ctx_h: list[Any] = []
        for t in range(nl):
            if hfq is not None:
                hprev[t] = hfq.forward(h)  # (B, d)
                ctx_h.append(hfq.ctx)
                h = hprev[t]
            np.matmul(h, w_hh_t, out=hh)  # (B, 4d)
            c_prev = c0 if t == 0 else cs[t - 1]
            lstm_step(xg[t], hh, c_prev, gates[t], cs[t], tcs[t], hs[t], og)
            h = hs[t]
        if hfq is None:  # the float path fills the h_{t-1} record in one go
            hprev[0] = h0
            hprev[1:] = hs[:-1]
        self._cache = (xt, w_ih, w_hh, ctx_x, ctx_wih, ctx_whh, ctx_h, gates, cs, tcs, hprev, c0)
        out = np.ascontiguousarray(hs.transpose(1, 0, 2))  # (B, L, d)
        return out, (hs[nl - 1].copy(), cs[nl - 1].copy())

    def backward(
        self,
        dout: np.ndarray,
        dh_n: np.ndarray | None = None,
        dc_n: np.ndarray | None = None,
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Backprop through time; accumulate the weight and bias gradients (``+=``).

        Parameters
        ----------
        dout : ndarray (B, L, hidden_size)
            Gradient w.r.t. ``out`` of the last :meth:`forward`.
        dh_n : ndarray (B, hidden_size), optional
            Gradient w.r.t. the final hidden state ``h_L`` (zero when None).
        dc_n : ndarray (B, hidden_size), optional
            Gradient w.r.t. the final cell state ``c_L`` (zero when None).

        Returns
        -------
        dx : ndarray (B, L, input_size)
            Gradient w.r.t. the input sequence.
        dh0 : ndarray (B, hidden_size)
            Gradient w.r.t. the initial hidden state.
        dc0 : ndarray (B, hidden_size)
            Gradient w.r.t. the initial cell state.

        Raises
        ------
        RuntimeError
            When called before :meth:`forward`.
        ValueError
            When ``dout`` is not (B, L, hidden_size) or ``dh_n`` / ``dc_n`` not (B, hidden_size).
        """
        (xt, w_ih, w_hh, ctx_x, ctx_wih, ctx_whh, ctx_h, gates, cs, tcs, hprev, c0) = (
            self._require_forward()
        )
        nl, nb, d = cs.shape
        dt = cs.dtype
        dout = self._grad_in(dout, (nb, nl, d), dt, "dout")
        dhs = np.ascontiguousarray(dout.transpose(1, 0, 2))  # (L, B, d)
        # copies: the kernel updates both in place
        zero = np.zeros((nb, d), dt)
        dh_next = zero.copy() if dh_n is None else self._grad_in(dh_n, (nb, d), dt, "dh_n").copy()
        dc_next = zero if dc_n is None else self._grad_in(dc_n, (nb, d), dt, "dc_n").copy()
        dg = np.empty((nl, nb, 4 * d), dtype=dt)  # pre-activation gate grads
        hfq = self.hidden_fake_quant
        dh_buf = np.empty((nb, d), dtype=dt)
        for t in range(nl - 1, -1, -1):
            c_prev = c0 if t == 0 else cs[t - 1]
            nn_cpu.lstm_cell_backward(dhs[t], dh_next, dc_next, gates[t], tcs[t], c_prev, dg[t])
            # (B, d) grad w.r.t. (quantized) h_{t-1}; the kernel has consumed the old dh_next
            dh_next = np.matmul(dg[t], w_hh, out=dh_buf)
            if hfq is not None:
                dh_next = hook_backward(hfq, dh_next, ctx_h[t])
        dg2 = dg.reshape(nl * nb, 4 * d)
        dw_ih = dg2.T @ xt.reshape(nl * nb, xt.shape[2])  # (4d, in)
        dw_hh = dg2.T @ hprev.reshape(nl * nb, d)  # (4d, d)
        if self.weight_ih_fake_quant is not None:
            dw_ih = hook_backward(self.weight_ih_fake_quant, dw_ih, ctx_wih)
        if self.weight_hh_fake_quant is not None:
            dw_hh = hook_backward(self.weight_hh_fake_quant, dw_hh, ctx_whh)
        np.add(self.weight_ih_grad, dw_ih, out=self.weight_ih_grad)
        np.add(self.weight_hh_grad, dw_hh, out=self.weight_hh_grad)
        db = _ones(nl * nb, dt) @ dg2  # column sum as a BLAS gemv
        np.add(self.bias_ih_grad, db, out=self.bias_ih_grad)
        np.add(self.bias_hh_grad, db, out=self.bias_hh_grad)
        dxt = (dg2 @ w_ih).reshape(nl, nb, w_ih.shape[1])  # (L, B, in)
        dx = np.ascontiguousarray(dxt.transpose(1, 0, 2))  # (B, L, in)
        if self.input_fake_quant is not None:
            dx = hook_backward(self.input_fake_quant, dx, ctx_x)
        return dx, np.ascontiguousarray(dh_next), dc_next
