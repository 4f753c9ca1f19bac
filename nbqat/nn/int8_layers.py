"""The integer layers of the int8 reference engine: :class:`Int8Linear` (one fake-quantized
matmul), :class:`Int8LSTM` and :class:`FrozenFakeQuantize` (fake quantization with frozen
qparams: the attention probabilities, and the quantizers of layers ``convert`` does not swap);
their arithmetic is in :mod:`nbqat.nn.int8`'s docstring and they are importable from there."""

from __future__ import annotations

from typing import Any

import numpy as np

from nbqat._jit import threads_for
from nbqat.kernels import nn_cpu
from nbqat.kernels.fake_quant_cpu import fq_tensor_kernel
from nbqat.kernels.int8_cpu import (
    F32_EXACT,
    lstm_steps_kernel,
    qlinear_f32_kernel,
    qlinear_kernel,
    tile_rows,
)
from nbqat.nn.int8_arith import (
    _code_dtype,
    accumulator_dtype,
    quantize_per_channel,
    quantize_per_tensor,
)
from nbqat.nn.layers.lstm import check_lstm_inputs
from nbqat.nn.phases import is_learnable
from nbqat.quantization._quantizer_base import check_observed
from nbqat.quantization.fake_quant import fake_quantize_per_channel_affine

__all__ = ["FrozenFakeQuantize", "Int8LSTM", "Int8Linear"]


def _qparams(fq: Any, name: str) -> tuple[np.ndarray, np.ndarray, int, int]:
    """``(scale (n,) float32, zero_point (n,) int32, quant_min, quant_max)`` of a calibrated
    int8-family quantizer (LSQ: its learned qparams); :class:`UncalibratedError
    <nbqat.quantization._quantizer_base.UncalibratedError>` when it has never observed data."""
    check_observed({name: fq})
    if is_learnable(fq):  # LSQ: the learned scale, zero point clamp(rint(zp))
        scale, zp = fq.calculate_qparams()
    else:
        scale, zp = fq.scale, fq.zero_point
    scale = np.asarray(scale, dtype=np.float32).reshape(-1)
    zp = np.asarray(zp).astype(np.int32).reshape(-1)
    return scale, zp, int(fq.quant_min), int(fq.quant_max)


class Int8Linear:
    """The integer twin of one fake-quantized matmul ``y = x @ W.T + b``.

    Parameters
    ----------
    weight : ndarray (N, K) float
        The float (shadow) weights, quantized here with ``weight_fq``'s qparams.
    bias : ndarray (N,) float or None
        The float bias (copied as float32); None for zeros.
    weight_fq : FakeQuantize or LearnableFakeQuantize
        The weight quantizer of the QAT layer: per-channel qparams (N,) or per-tensor
        qparams (broadcast over the N channels).
    input_fq : FakeQuantize or LearnableFakeQuantize
        The per-tensor input quantizer of the QAT layer.
    name : str, default "linear"
        Layer name used in error messages.

    Raises
    ------
    RuntimeError
        When a quantizer has never observed data.
    ValueError
        When ``input_fq`` is not per tensor, or even an int64 accumulator could overflow.

    Attributes
    ----------
    weight_q : ndarray (N, K) int8
        Weight codes (int16/int32 for wider custom ranges).
    weight_scale : ndarray (N,) float32
    weight_zero_point : ndarray (N,) int32
    bias : ndarray (N,) float32
    input_scale : float32
    input_zero_point : int
    input_quant_min, input_quant_max : int
    accumulator_dtype : numpy.dtype
        int32, or int64 where the codes' ranges could overflow int32 (:func:`accumulator_dtype`).
    """

    def __init__(
        self,
        weight: np.ndarray,
        bias: np.ndarray | None,
        weight_fq: Any,
        input_fq: Any,
        name: str = "linear",
    ) -> None:
        ws, wz, wmin, wmax = _qparams(weight_fq, name + ".weight_fake_quant")
        xs, xz, xmin, xmax = _qparams(input_fq, name + ".input_fake_quant")
        if xs.size != 1:
            raise ValueError(f"{name}: the input quantizer must be per tensor")
        axis = getattr(weight_fq, "ch_axis", None) if weight_fq.is_per_channel else None
        if axis is not None and axis not in (0, -np.ndim(weight)):
            raise ValueError(
                f"{name}.weight_fake_quant is per channel along axis {axis}; integer matmuls "
                "need one scale per output channel (ch_axis=0, torch's default for weights)"
            )
        if ws.size == 1 and weight.shape[0] != 1:  # per-tensor weights: broadcast
            ws = np.full(weight.shape[0], ws[0], np.float32)
            wz = np.full(weight.shape[0], wz[0], np.int32)
        codes = quantize_per_channel(weight, ws, wz, wmin, wmax)
        self.out_features, self.in_features = weight.shape
        self.weight_q = codes.astype(_code_dtype(wmin, wmax))
        self.weight_scale = ws
        self.weight_zero_point = wz
        self.bias = (
            np.zeros(self.out_features, np.float32)
            if bias is None
            else np.asarray(bias, np.float32).copy()
        )
        self.input_scale = np.float32(xs[0])
        self.input_zero_point = int(xz[0])
        self.input_quant_min, self.input_quant_max = xmin, xmax
        self._wc = np.ascontiguousarray(codes.astype(np.int32) - wz[:, None])
        self._mult = np.float64(self.input_scale) * ws.astype(np.float64)
        x_span = max(abs(xmax - self.input_zero_point), abs(xmin - self.input_zero_point))
        w_span = int(np.abs(self._wc.astype(np.int64)).max(initial=0))
        #: int32 or int64: the accumulator in which this layer's integer sums are exact
        self.accumulator_dtype = accumulator_dtype(self.in_features, x_span, w_span)
        self._fused = self.in_features * x_span * w_span <= F32_EXACT
        self._wt = np.ascontiguousarray(self._wc.T, dtype=np.float32)
        self._xq = (np.float32(1.0) / self.input_scale, self.input_zero_point, xmin, xmax)
        self._zero_b = np.zeros(self.out_features, np.float32)
        vecs = (self._mult, self.bias, self._zero_b)  # fused path: float32 sums, tiled vectors
        self._tiled = tuple(tile_rows(v, self.out_features) for v in vecs)

    def quantize_input(self, x: np.ndarray) -> np.ndarray:
        """int32 codes (shape of ``x``, in ``[input_quant_min, input_quant_max]``) of float ``x``
        (computed in float32) with this layer's input qparams (:func:`quantize_per_tensor`)."""
        return quantize_per_tensor(
            x, self.input_scale, self.input_zero_point, self.input_quant_min, self.input_quant_max
        )

    def matmul_codes(self, x_q: np.ndarray, bias: np.ndarray | None = None) -> np.ndarray:
        """Integer matmul of activation codes with the weight codes, then requantize.

        Parameters
        ----------
        x_q : ndarray (M, K) int32
            C-contiguous activation codes (from :meth:`quantize_input`).
        bias : ndarray (N,) float32, optional
            C-contiguous bias added after requantization; default the layer's ``bias``.

        Returns
        -------
        ndarray (M, N) float32
            ``float32(acc * (input_scale * weight_scale[n])) + bias[n]``, ``acc`` the exact
            ``sum_k (x_q - input_zero_point) * (weight_q - weight_zero_point)``.
        """
        out = np.empty((x_q.shape[0], self.out_features), np.float32)
        b = self.bias if bias is None else bias
        wide = self.accumulator_dtype == np.int64
        qlinear_kernel(x_q, self.input_zero_point, self._wc, self._mult, b, wide, out)
        return out

    def forward(self, x: np.ndarray, add_bias: bool = True) -> np.ndarray:
        """Quantize ``x`` (..., K) float with the input qparams and apply the integer matmul:
        (..., N) float32. ``add_bias=False`` leaves the bias out (the float
        :class:`~nbqat.nn.Linear`'s option, used by the GRN, which adds it in its ELU pass)."""
        lead = x.shape[:-1]
        if self._fused:  # codes - zp in float32, exact integer sums (BLAS), by row blocks
            x2 = np.ascontiguousarray(np.reshape(x, (-1, self.in_features)), dtype=np.float32)
            out = np.empty((x2.shape[0], self.out_features), np.float32)
            b = self._tiled[1 if add_bias else 2]
            qlinear_f32_kernel(x2, self._xq, self._wt, self._tiled[0], b, out)
            return out.reshape(*lead, self.out_features)
        b = self.bias if add_bias else self._zero_b
        xq = self.quantize_input(np.reshape(x, (-1, self.in_features)))
        return self.matmul_codes(xq, b).reshape(*lead, self.out_features)

    __call__ = forward


class Int8LSTM:
    """The integer twin of a fake-quantized :class:`~nbqat.nn.LSTM`.

    The input projection of all steps is one integer matmul (codes of the whole sequence with
    the layer's input qparams, ``weight_ih`` codes, bias ``b_ih + b_hh``); at every step
    ``h_{t-1}`` is quantized with the hidden qparams and multiplied by the ``weight_hh`` codes
    in integers; the cell (sigmoid/tanh, ``c``, ``h``) is the float model's compiled kernel.

    Parameters
    ----------
    lstm : LSTM
        A fake-quantized :class:`~nbqat.nn.LSTM` (or an object with its attributes): weights,
        biases and the four quantizers ``weight_ih_fake_quant``, ``weight_hh_fake_quant``,
        ``input_fake_quant`` and ``hidden_fake_quant``, all of which have observed data.
    name : str, default "lstm"
        Layer name used in error messages.
    """

    def __init__(self, lstm: Any, name: str = "lstm") -> None:
        self.hidden_size = lstm.hidden_size
        self.input_size = lstm.input_size
        bias = np.asarray(lstm.bias_ih + lstm.bias_hh, np.float32)  # the float path's sum
        self.ih = Int8Linear(
            lstm.weight_ih, bias, lstm.weight_ih_fake_quant, lstm.input_fake_quant, name + ".ih"
        )
        self.hh = Int8Linear(
            lstm.weight_hh, None, lstm.weight_hh_fake_quant, lstm.hidden_fake_quant, name + ".hh"
        )

    def forward(
        self, x: np.ndarray, h0: np.ndarray, c0: np.ndarray
    ) -> tuple[np.ndarray, tuple[np.ndarray, np.ndarray]]:
        """Run the LSTM over the sequence from ``(h0, c0)`` with integer matmuls.

        Parameters
        ----------
        x : ndarray (B, L, input_size) float
            Input sequence, batch first (computed in float32).
        h0 : ndarray (B, hidden_size)
            Initial hidden state.
        c0 : ndarray (B, hidden_size)
            Initial cell state.

        Returns
        -------
        out : ndarray (B, L, hidden_size) float32
            Hidden state of every step.
        final_state : tuple of (ndarray, ndarray)
            ``(h_L, c_L)``, the final hidden and cell state (B, hidden_size) float32 (copies).
        """
        d = self.hidden_size
        nb, nl = check_lstm_inputs(x, h0, c0, self.input_size, d)
        xt = np.ascontiguousarray(np.transpose(x, (1, 0, 2)), dtype=np.float32)  # (L, B, in)
        xg = self.ih.forward(xt.reshape(nl * nb, xt.shape[2])).reshape(nl, nb, 4 * d)
        gates = np.empty((nb, 4 * d), np.float32)
        cs = np.empty((nl, nb, d), np.float32)
        tcs = np.empty((nb, d), np.float32)
        hs = np.empty((nl, nb, d), np.float32)
        c_prev = np.ascontiguousarray(c0, dtype=np.float32)
        h = np.ascontiguousarray(h0, dtype=np.float32)
        hh = self.hh
        fused = isinstance(hh, Int8Linear) and hh._fused  # else (int4, float8) step by step
        if fused:
            st = (h, c_prev, hh._xq, hh._wt, hh._tiled[0], hh._tiled[2], hs, cs, gates, tcs)
            lstm_steps_kernel(xg, *st, np.empty((nb, d), np.float32), np.empty_like(gates))
        for t in range(0 if fused else nl):
            h_mm = hh.matmul_codes(hh.quantize_input(h), np.zeros(4 * d, np.float32))
            nn_cpu.lstm_cell_forward(xg[t], h_mm, c_prev, gates, cs[t], tcs, hs[t])
            h, c_prev = hs[t], cs[t]
        out = np.ascontiguousarray(hs.transpose(1, 0, 2))  # (B, L, d)
        return out, (hs[nl - 1].copy(), cs[nl - 1].copy())


_NO_MASK = np.zeros(1, np.bool_)  # fq_tensor_kernel's dummy mask


class FrozenFakeQuantize:
    """Fake quantization with fixed qparams: the attention probabilities of the int8 TFT, and
    every int8-family quantizer that :func:`~nbqat.nn.convert` leaves in a layer it does not
    swap (a user's registered layer).

    Parameters
    ----------
    fq : FakeQuantize or LearnableFakeQuantize
        A calibrated quantizer, per tensor or per channel; its current qparams are copied.
    name : str
        Its path, for error messages.

    Attributes
    ----------
    scale, zero_point : float32 and int (per tensor), or (C,) float32 and int32 (per channel)
    ch_axis : int or None
        The channel axis of a per-channel quantizer (None per tensor).
    """

    def __init__(self, fq: Any, name: str) -> None:
        s, z, self.quant_min, self.quant_max = _qparams(fq, name)
        self.ch_axis: int | None = int(fq.ch_axis) if fq.is_per_channel else None
        self.scale: Any = np.float32(s[0]) if self.ch_axis is None else s
        self.zero_point: Any = int(z[0]) if self.ch_axis is None else z
        self.ctx = None

    def forward(self, x: np.ndarray) -> np.ndarray:
        """``(clamp(rint(x / scale) + zp) - zp) * scale`` with the frozen qparams, float32
        (per channel: :func:`~nbqat.fake_quantize_per_channel_affine` along ``ch_axis``, the
        QAT forward's arithmetic)."""
        x32 = np.ascontiguousarray(x, dtype=np.float32)
        if self.ch_axis is not None:
            return fake_quantize_per_channel_affine(
                x32, self.scale, self.zero_point, self.ch_axis, self.quant_min, self.quant_max
            )
        out = np.empty(x32.shape, np.float32)
        T = np.float32
        s, z, lo, hi = T(self.scale), T(self.zero_point), T(self.quant_min), T(self.quant_max)
        with threads_for(x32.size):  # the public per-tensor kernel (one thread on small inputs)
            fq_tensor_kernel(
                x32.reshape(-1), out.reshape(-1), _NO_MASK, s, T(1) / s, z, lo, hi, False
            )
        return out

    __call__ = forward
