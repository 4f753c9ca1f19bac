"""The reference engine's low-bit layers: grouped int4 weights (issue 30).

:func:`int_linear` / :func:`int_lstm` pick the integer twin of a fake-quantized matmul from its
quantizers: :class:`~nbqat.nn.int8.Int8Linear` for the int8 qconfigs, :class:`GroupedLinear`
for a :class:`~nbqat.quantization.lowbit_quantize.GroupFakeQuantize` weight, for per-token dynamic
activations (:class:`~nbqat.quantization.lowbit_quantize.PerTokenFakeQuantize`) or for float
activations (weight-only), and :class:`FakeQuantLinear` for float8 (no integer arithmetic: the
float8 weights dequantized once, the activations through their frozen float8 fake quantization).

:class:`GroupedLinear`'s arithmetic, for weight codes ``w_q`` (N, K) with one scale
``s_w[n, g]`` per group ``g`` of ``G`` input features (``G = K`` per channel) and activation
codes ``x_q`` with per-tensor or per-token qparams ``(s_x[m], zp_x[m])``::

    acc[m, n, g] = sum_{k in g} (x_q[m, k] - zp_x[m]) * (w_q[n, k] - zp_w[n, g])   # exact
    y[m, n]      = float32(sum_g acc[m, n, g] * (s_x[m] * s_w[n, g])) + bias[n]

The per-group sums are integers below ``G * 255 * 15`` computed in float64 (exact: every
product and partial sum is an integer below 2**53); the rescaled sum over the groups is one
float64 reduction rounded once to float32. The codes are those of the QAT forward
(``rint(fake_quantize_affine(w) / s_w) + zp_w``), so the engine differs from the fake-quant
model by float32 rounding only (the bound of :mod:`nbqat.nn.int8`: one output step).
Weight-only layers compute ``x @ dequant(w_q).T + b`` in float32, as the QAT forward does.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from nbqat.nn.int8_arith import quantize_per_tensor
from nbqat.nn.int8_layers import Int8Linear, Int8LSTM, _qparams
from nbqat.quantization._quantizer_base import check_observed
from nbqat.quantization.affine import fake_quantize_affine
from nbqat.quantization.lowbit_quantize import (
    Float8FakeQuantize,
    GroupFakeQuantize,
    PerTokenFakeQuantize,
)

__all__ = ["FakeQuantLinear", "GroupedLSTM", "GroupedLinear", "int_linear", "int_lstm"]


def _kind(fq: Any) -> str:
    if fq is None:
        return "float"
    if isinstance(fq, GroupFakeQuantize):
        return "group"
    if isinstance(fq, PerTokenFakeQuantize):
        return "per_token"
    if isinstance(fq, Float8FakeQuantize):
        return "float8"
    return "int8"


def int_linear(weight: np.ndarray, bias: Any, weight_fq: Any, input_fq: Any, name: str) -> Any:
    """The integer twin of one fake-quantized matmul, by its quantizers' kinds.

    Parameters
    ----------
    weight : ndarray (N, K) float
    bias : ndarray (N,) or None
    weight_fq, input_fq : quantizer or None
        The layer's weight and input quantizers (``input_fq`` None: float activations).
    name : str

    Returns
    -------
    Int8Linear, GroupedLinear or FakeQuantLinear
    """
    wk, xk = _kind(weight_fq), _kind(input_fq)
    if "float8" in (wk, xk):
        return FakeQuantLinear(weight, bias, weight_fq, input_fq, name)
    if wk == "int8" and xk == "int8":
        return Int8Linear(weight, bias, weight_fq, input_fq, name)
    return GroupedLinear(weight, bias, weight_fq, input_fq, name)


class GroupedLinear:
    """Grouped (int4) weight codes x per-tensor / per-token activation codes (module docstring).

    Parameters
    ----------
    weight : ndarray (N, K) float
    bias : ndarray (N,) float or None
    weight_fq : GroupFakeQuantize or FakeQuantize
        Observed; its current block size, scales and zero points are used.
    input_fq : FakeQuantize (per tensor), PerTokenFakeQuantize or None (float activations)
    name : str, default "linear"

    Attributes
    ----------
    weight_q : ndarray (N, K) int8
    weight_scale, weight_zero_point : ndarray (N, K // B)
        Per block (``B = block_size[-1]``: the group size, or K per channel).
    block_size : tuple of int
    input_mode : {"per_tensor", "per_token", "float"}
    input_scale, input_zero_point, input_quant_min, input_quant_max
        The per-tensor input qparams (per_tensor mode only; None otherwise).
    input_fq : PerTokenFakeQuantize or None
        The per-token input quantizer (per_token mode only; None otherwise).
    bias : ndarray (N,) float32
    """

    def __init__(
        self, weight: np.ndarray, bias: Any, weight_fq: Any, input_fq: Any, name: str = "linear"
    ) -> None:
        w = np.ascontiguousarray(weight, np.float32)
        self.out_features, self.in_features = w.shape
        self.name = name
        ws, wz, self.block_size = _weight_qparams(weight_fq, w, name)
        qmin, qmax = int(weight_fq.quant_min), int(weight_fq.quant_max)
        y = np.asarray(fake_quantize_affine(w, self.block_size, ws, wz, qmin, qmax))
        b = self.block_size[-1]
        s_full = np.repeat(ws, b, axis=1)
        codes = np.rint(y / s_full) + np.repeat(wz, b, axis=1)
        self.weight_q = codes.astype(np.int8 if qmin >= -128 and qmax <= 127 else np.int32)
        self.weight_scale, self.weight_zero_point = ws, wz
        self.weight_quant_min, self.weight_quant_max = qmin, qmax
        self._w_deq = y  # the QAT forward's weights, for weight-only layers
        self.bias = (
            np.zeros(self.out_features, np.float32)
            if bias is None
            else (np.asarray(bias, np.float32).copy())
        )
        ngroups = self.in_features // b
        wc = (codes - np.repeat(wz, b, axis=1)).astype(np.float64)
        self._wc = np.ascontiguousarray(
            wc.reshape(self.out_features, ngroups, b).transpose(1, 2, 0)
        )
        self._ws = ws.astype(np.float64).T  # (groups, N)
        self.input_mode = {"int8": "per_tensor", "per_token": "per_token", "float": "float"}.get(
            _kind(input_fq), "?"
        )
        if self.input_mode == "?":
            raise ValueError(f"{name}: unsupported input quantizer {type(input_fq).__name__}")
        self.input_fq: Any = input_fq if self.input_mode == "per_token" else None
        self.input_scale: Any = None
        self.input_zero_point: Any = None
        self.input_quant_min: Any = None
        self.input_quant_max: Any = None
        if self.input_mode == "per_tensor":
            xs, xz, self.input_quant_min, self.input_quant_max = _qparams(
                input_fq, name + ".input_fake_quant"
            )
            if xs.size != 1:
                raise ValueError(f"{name}: the input quantizer must be per tensor")
            self.input_scale, self.input_zero_point = np.float32(xs[0]), int(xz[0])

    def quantize_input(self, x: np.ndarray) -> Any:
        """``(x_q - zp_x float64 (M, K), s_x float64 (M, 1))``; float32 ``x`` (weight-only).

        Parameters
        ----------
        x : ndarray (M, K) float
        """
        x32 = np.ascontiguousarray(x, np.float32)
        if self.input_mode == "float":
            return x32
        if self.input_mode == "per_tensor":
            q = quantize_per_tensor(
                x32,
                self.input_scale,
                self.input_zero_point,
                self.input_quant_min,
                self.input_quant_max,
            )
            sx = np.full((x32.shape[0], 1), np.float64(self.input_scale))
            return (q - self.input_zero_point).astype(np.float64), sx
        if x32.shape[0] == 0:  # no token: no per-token qparams to choose
            return np.zeros(x32.shape, np.float64), np.zeros((0, 1), np.float64)
        fq = self.input_fq
        s, z, block = fq.qparams_of(x32)
        y = np.asarray(fake_quantize_affine(x32, block, s, z, fq.quant_min, fq.quant_max))
        qc = np.rint(y / s[:, None])  # the code minus its zero point, exactly
        return qc.astype(np.float64), s.astype(np.float64)[:, None]

    def matmul_codes(self, xq: Any, bias: np.ndarray | None = None) -> np.ndarray:
        """The grouped integer matmul of :meth:`quantize_input`'s result (module docstring).

        Returns
        -------
        ndarray (M, N) float32
        """
        b = self.bias if bias is None else bias
        if self.input_mode == "float":
            return (xq @ self._w_deq.T + b).astype(np.float32)
        xc, sx = xq
        m, ng, bs = xc.shape[0], self._wc.shape[0], self._wc.shape[1]
        xg = xc.reshape(m, ng, bs).transpose(1, 0, 2)  # (groups, M, B)
        acc = np.matmul(xg, self._wc)  # (groups, M, N): exact integers
        y = np.einsum("gmn,gn->mn", acc, self._ws) * sx
        return (y.astype(np.float32) + b).astype(np.float32)

    def forward(self, x: np.ndarray, add_bias: bool = True) -> np.ndarray:
        """Quantize ``x`` (..., K) and apply the grouped integer matmul (float32 out)."""
        lead = x.shape[:-1]
        xq = self.quantize_input(np.reshape(x, (-1, self.in_features)))
        b = None if add_bias else np.zeros(self.out_features, np.float32)
        return self.matmul_codes(xq, b).reshape(*lead, self.out_features)

    __call__ = forward


def _weight_qparams(fq: Any, w: np.ndarray, name: str) -> tuple[np.ndarray, np.ndarray, tuple]:
    """Per-block ``(scale (N, K // B), zero_point, block_size)`` of a weight quantizer."""
    if _kind(fq) == "group":
        check_observed({name + ".weight_fake_quant": fq})
        block = tuple(fq.block_size)
        s = np.asarray(fq.scale, np.float32).reshape(w.shape[0], -1)
        z = np.asarray(fq.zero_point).astype(np.int32).reshape(w.shape[0], -1)
        return s, z, block
    s, z, _, _ = _qparams(fq, name + ".weight_fake_quant")  # int8 per channel / per tensor
    s = np.broadcast_to(s, (w.shape[0],)).reshape(-1, 1).astype(np.float32)
    z = np.broadcast_to(z, (w.shape[0],)).reshape(-1, 1).astype(np.int32)
    return s, z, (1, w.shape[1])


class FakeQuantLinear:
    """A float8 layer: the float8-rounded weights, frozen float8 input fake quantization, a
    float32 matmul (the QAT forward with its observers off).

    Attributes
    ----------
    input_fq : quantizer or None
        A frozen copy of the input quantizer (observer off, fake quant on); None: float inputs.
    """

    def __init__(self, weight: np.ndarray, bias: Any, weight_fq: Any, input_fq: Any, name: str):
        import copy

        self.name = name
        self.out_features, self.in_features = np.shape(weight)
        wfq = copy.deepcopy(weight_fq)
        wfq.enable_observer(False)  # the QAT model's current (frozen) scales
        wfq.enable_fake_quant(True)
        self.weight_dequant = np.asarray(wfq.forward(np.ascontiguousarray(weight, np.float32)))
        self.weight_scale = np.asarray(wfq.scale, np.float32)
        self.weight_dtype = getattr(wfq, "dtype", "float8_e4m3fn")
        self.input_fq = None if input_fq is None else copy.deepcopy(input_fq)
        if self.input_fq is not None:
            self.input_fq.enable_observer(False)
            self.input_fq.enable_fake_quant(True)
        self.bias = (
            np.zeros(self.out_features, np.float32)
            if bias is None
            else (np.asarray(bias, np.float32).copy())
        )

    def quantize_input(self, x: np.ndarray) -> np.ndarray:
        """The frozen input fake quantization of ``x`` (float32)."""
        x32 = np.ascontiguousarray(x, np.float32)
        return x32 if self.input_fq is None else np.asarray(self.input_fq.forward(x32))

    def matmul_codes(self, xq: np.ndarray, bias: np.ndarray | None = None) -> np.ndarray:
        """``xq @ weight_dequant.T + bias`` in float32."""
        b = self.bias if bias is None else bias
        return (xq @ self.weight_dequant.T + b).astype(np.float32)

    forward = GroupedLinear.forward
    __call__ = forward


class GroupedLSTM(Int8LSTM):
    """:class:`~nbqat.nn.int8.Int8LSTM` whose two matmuls come from :func:`int_linear`."""

    def __init__(self, lstm: Any, name: str = "lstm") -> None:
        self.hidden_size = lstm.hidden_size
        self.input_size = lstm.input_size
        bias = np.asarray(lstm.bias_ih + lstm.bias_hh, np.float32)
        self.ih = int_linear(
            lstm.weight_ih, bias, lstm.weight_ih_fake_quant, lstm.input_fake_quant, name + ".ih"
        )
        self.hh = int_linear(
            lstm.weight_hh, None, lstm.weight_hh_fake_quant, lstm.hidden_fake_quant, name + ".hh"
        )


def int_lstm(lstm: Any, name: str) -> Any:
    """:class:`~nbqat.nn.int8.Int8LSTM` for int8 quantizers, :class:`GroupedLSTM` otherwise."""
    kinds = {
        _kind(getattr(lstm, h))
        for h in ("weight_ih_fake_quant", "weight_hh_fake_quant", "input_fake_quant")
    }
    kinds.add(_kind(lstm.hidden_fake_quant))
    return Int8LSTM(lstm, name) if kinds == {"int8"} else GroupedLSTM(lstm, name)
