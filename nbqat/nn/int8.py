"""Integer-arithmetic (int8) reference inference for a QAT-trained TFT-like forecaster.

:meth:`QATTemporalFusionTransformer.to_int8() <nbqat.nn.qat.QATTemporalFusionTransformer.to_int8>`
returns an :class:`Int8TemporalFusionTransformer`: every matmul that QAT fake-quantized runs on
integers --

* weights as int8 codes with one float32 scale per output channel (``Int8Linear.weight_q``,
  ``weight_scale``; symmetric qint8, zero point 0 with the default qconfig),
* activations quantized to uint8 codes with the per-tensor qparams the QAT observers chose
  (``input_scale``, ``input_zero_point``), with PyTorch's fake-quantize arithmetic
  (``rint(x * (1/s)) + zp``, clamp) so the codes are exactly those of training,
* ``acc = sum_k (x_q - zp_x) * (w_q - zp_w)`` computed exactly -- in float32 through BLAS while
  every partial sum is an integer below 2**24 (``in_features <= 513`` for uint8 x int8), else
  in int32/int64 -- then requantized to float32 with the multiplier ``s_x * s_w[n]``
  (exact in float64, one rounding) and the float bias added;

and the rest of the network -- LayerNorm, ELU, sigmoid/tanh gates, softmax, the LSTM cell, the
attention score and ``P @ V`` products (``P`` fake-quantized with its frozen qparams), the
element-wise input embeddings -- runs in float32 exactly as in the fake-quant model (the same
compiled kernels). With ``QATConfig.quantize_output_head`` the head is integer too and the
output is requantized to uint8 with the output quantizer's qparams; otherwise the head is float.

Accuracy: the fake-quant model computes ``sum_k (q_x - zp) s_x * q_w s_w`` in float32 (BLAS)
where this path computes the same sum exactly in integers, so the two differ by float32
rounding only; a rounding difference can move an activation across a code boundary of the next
quantizer, so the documented (and tested) bound is one output quantization step
(``output_scale``), not bit equality.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from nbqat.kernels.int8_cpu import (
    F32_EXACT,
    lstm_steps_kernel,
    qlinear_kernel,
    quantize_per_row_kernel,
    quantize_per_tensor_kernel,
    quantize_rows_f32,
    requantize_rows,
    tile_rows,
)
from nbqat.quantization._quantizer_base import has_observed

if TYPE_CHECKING:  # resolved at run time by __getattr__ below (no import cycle)
    from nbqat.nn.int8_tft import FrozenFakeQuantize, Int8TemporalFusionTransformer
__all__ = [
    "Int8LSTM",
    "Int8Linear",
    "FrozenFakeQuantize",
    "Int8TemporalFusionTransformer",
    "accumulator_dtype",
    "qlinear",
    "quantize_per_channel",
    "quantize_per_tensor",
]


def _code_dtype(qmin: int, qmax: int) -> np.dtype:
    for dt in (np.int8, np.uint8, np.int16, np.uint16):
        info = np.iinfo(dt)
        if info.min <= qmin and qmax <= info.max:
            return np.dtype(dt)
    return np.dtype(np.int32)


_INT32_MAX = int(np.iinfo(np.int32).max)
_INT64_MAX = int(np.iinfo(np.int64).max)


def accumulator_dtype(in_features: int, x_span: int, w_span: int) -> np.dtype:
    """The integer type in which ``sum_k (x_q - zp_x) * (w_q - zp_w)`` is exact.

    Parameters
    ----------
    in_features : int
        K, the number of products summed.
    x_span : int
        Largest ``|x_q - zp_x|`` an activation code can have (from its quant range).
    w_span : int
        Largest ``|w_q - zp_w|`` over the weight codes.

    Returns
    -------
    numpy.dtype
        ``int32`` when ``K * x_span * w_span <= 2**31 - 1`` (every partial sum fits), else
        ``int64``.

    Raises
    ------
    ValueError
        When even an int64 sum could overflow (``K * x_span * w_span >= 2**63``).
    """
    bound = int(in_features) * int(x_span) * int(w_span)
    if bound <= _INT32_MAX:
        return np.dtype(np.int32)
    if bound <= _INT64_MAX:
        return np.dtype(np.int64)
    raise ValueError(
        f"in_features={in_features} with activation codes up to {x_span} and weight codes up "
        f"to {w_span} from their zero points could overflow even an int64 accumulator "
        f"(bound {bound}); use narrower quant ranges or split the layer"
    )


def quantize_per_tensor(
    x: np.ndarray, scale: float | np.floating, zero_point: int, quant_min: int, quant_max: int
) -> np.ndarray:
    """Integer codes of ``x`` with PyTorch's per-tensor fake-quantize arithmetic.

    Parameters
    ----------
    x : ndarray, float
        Any shape; computed in float32.
    scale : float
        > 0 (used as ``float32(1) / float32(scale)``).
    zero_point : int
        Code of the real value 0.
    quant_min, quant_max : int
        The code range, e.g. 0 and 255 for quint8.

    Returns
    -------
    ndarray of int32, shape of ``x``
        ``clamp(rint(x * (1/scale)) + zero_point, quant_min, quant_max)``; NaN -> quant_min.
        ``(codes - zero_point) * scale`` equals ``torch.fake_quantize_per_tensor_affine(x, ...)``
        for float32 ``x``.

    Raises
    ------
    ValueError
        When ``scale`` is not positive and finite or ``quant_min > quant_max``.
    """
    s = float(np.float32(scale))
    if not (np.isfinite(s) and s > 0):
        raise ValueError(f"scale must be positive and finite, got {scale}")
    if int(quant_min) > int(quant_max):
        raise ValueError(f"quant_min ({quant_min}) must be <= quant_max ({quant_max})")
    x32 = np.ascontiguousarray(x, dtype=np.float32)
    out = np.empty(x32.shape, np.int32)
    inv = np.float32(1.0) / np.float32(scale)
    quantize_per_tensor_kernel(
        x32.reshape(-1), inv, int(zero_point), int(quant_min), int(quant_max), out.reshape(-1)
    )
    return out


def quantize_per_channel(
    w: np.ndarray, scale: np.ndarray, zero_point: np.ndarray, quant_min: int, quant_max: int
) -> np.ndarray:
    """Integer codes of ``w`` per output channel (axis 0), PyTorch's per-channel arithmetic.

    Parameters
    ----------
    w : ndarray (C, ...) float
        Weights, output channels on axis 0; computed in float32.
    scale : ndarray (C,) float32, > 0
        One scale per output channel.
    zero_point : ndarray (C,) int
        One zero point per output channel (0 for symmetric weights).
    quant_min, quant_max : int
        The code range, e.g. -128 and 127 for qint8.

    Returns
    -------
    ndarray of int32, shape of ``w``
        ``clamp(rint(w[c] * (1/scale[c])) + zero_point[c], quant_min, quant_max)``.

    Raises
    ------
    ValueError
        On a scale/zero-point length other than ``w.shape[0]`` or a non-positive scale.
    """
    c = w.shape[0]
    scale = np.asarray(scale, dtype=np.float32).reshape(-1)
    zp = np.ascontiguousarray(np.asarray(zero_point).reshape(-1), dtype=np.int32)
    if scale.shape != (c,) or zp.shape != (c,):
        raise ValueError(
            f"per-channel scale and zero_point must have shape ({c},), got {scale.shape} and "
            f"{zp.shape}"
        )
    if not np.all(np.isfinite(scale) & (scale > 0)):
        raise ValueError("per-channel scales must be positive and finite")
    w32 = np.ascontiguousarray(w, dtype=np.float32).reshape(c, -1)
    out = np.empty(w32.shape, np.int32)
    inv = (np.float32(1.0) / scale).astype(np.float32)
    quantize_per_row_kernel(w32, inv, zp, int(quant_min), int(quant_max), out)
    return out.reshape(w.shape)


def qlinear(
    x_q: np.ndarray,
    x_scale: float,
    x_zero_point: int,
    w_q: np.ndarray,
    w_scale: np.ndarray,
    w_zero_point: np.ndarray | None = None,
    bias: np.ndarray | None = None,
) -> np.ndarray:
    """Integer linear layer: int32 accumulation of ``(x_q - zp_x) * (w_q - zp_w)``, requantize.

    Parameters
    ----------
    x_q : ndarray (M, K) int
        Activation codes.
    x_scale : float
        Per-tensor scale of the activations.
    x_zero_point : int
        Per-tensor zero point of the activations.
    w_q : ndarray (N, K) int
        Weight codes.
    w_scale : ndarray (N,) float32
        Per-output-channel weight scales.
    w_zero_point : ndarray (N,) int, optional
        Default zeros (symmetric weights).
    bias : ndarray (N,) float, optional
        Float bias added after requantization; default zeros.

    Returns
    -------
    ndarray (M, N) float32
        ``float32(acc * (float64(x_scale) * float64(w_scale[n]))) + bias[n]``.

    Raises
    ------
    ValueError
        On mismatched shapes, or when even an int64 accumulator could overflow
        (:func:`accumulator_dtype`; int64 is used where int32 could wrap).
    """
    x_q = np.asarray(x_q)
    w_q = np.asarray(w_q)
    if x_q.ndim != 2 or w_q.ndim != 2 or x_q.shape[1] != w_q.shape[1]:
        raise ValueError(f"x_q (M, K) and w_q (N, K) do not fit: {x_q.shape}, {w_q.shape}")
    m, k = x_q.shape
    n = w_q.shape[0]
    w_scale = np.asarray(w_scale, dtype=np.float32).reshape(-1)
    if w_scale.shape != (n,):
        raise ValueError(f"w_scale must have shape ({n},), got {w_scale.shape}")
    wz = np.zeros(n, np.int32) if w_zero_point is None else np.asarray(w_zero_point, np.int32)
    if wz.shape != (n,):
        raise ValueError(f"w_zero_point must have shape ({n},), got {wz.shape}")
    b = np.zeros(n, np.float32) if bias is None else np.asarray(bias, dtype=np.float32)
    if b.shape != (n,):
        raise ValueError(f"bias must have shape ({n},), got {b.shape}")
    mult = np.float64(np.float32(x_scale)) * w_scale.astype(np.float64)  # exact products
    wc = np.asarray(w_q, dtype=np.int64) - wz[:, None]
    zx = int(x_zero_point)
    x_span = max(abs(int(x_q.max()) - zx), abs(int(x_q.min()) - zx)) if x_q.size else 0
    w_span = int(np.abs(wc).max(initial=0))
    if max(x_span, w_span, abs(zx)) > _INT32_MAX:
        raise ValueError("x_q, w_q and their zero points must be codes that fit in int32")
    wide = accumulator_dtype(k, x_span, w_span) == np.int64
    out = np.empty((m, n), np.float32)
    qlinear_kernel(
        np.ascontiguousarray(x_q, dtype=np.int32),
        int(x_zero_point),
        np.ascontiguousarray(wc, dtype=np.int32),
        mult,
        np.ascontiguousarray(b),
        wide,
        out,
    )
    return out


def _qparams(fq: Any, name: str) -> tuple[np.ndarray, np.ndarray, int, int]:
    from nbqat.nn.phases import is_learnable

    if is_learnable(fq):  # LSQ: the learned scale, zero point clamp(rint(zp))
        scale, zp = fq.calculate_qparams()
    else:
        scale, zp = fq.scale, fq.zero_point
    scale = np.asarray(scale, dtype=np.float32).reshape(-1)
    zp = np.asarray(zp).astype(np.int32).reshape(-1)
    if not has_observed(fq):
        raise RuntimeError(
            f"quantizer {name} has never observed data: calibrate the QAT model (forward some "
            "batches) before to_int8() / convert()"
        )
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
        if self._fused:  # codes - zp in float32, exact integer sums (BLAS), requantize in place
            x2 = np.ascontiguousarray(np.reshape(x, (-1, self.in_features)), dtype=np.float32)
            xf = np.empty_like(x2)
            quantize_rows_f32(x2, *self._xq, xf)
            acc = np.matmul(xf, self._wt)  # numpy's BLAS: faster than Numba's np.dot at large M
            requantize_rows(acc, self._tiled[0], self._tiled[1 if add_bias else 2])
            return acc.reshape(*lead, self.out_features)
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
        from nbqat.kernels import nn_cpu

        d = self.hidden_size
        nb, nl, _ = x.shape
        xt = np.ascontiguousarray(np.transpose(x, (1, 0, 2)), dtype=np.float32)  # (L, B, in)
        xg = self.ih.forward(xt.reshape(nl * nb, -1)).reshape(nl, nb, 4 * d)  # (L, B, 4d)
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


def __getattr__(name: str) -> Any:
    """The names that live in :mod:`nbqat.nn.int8_tft`, resolved on first use (no cycle)."""
    if name in ("FrozenFakeQuantize", "Int8TemporalFusionTransformer"):
        from nbqat.nn import int8_tft

        return getattr(int8_tft, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    """The module's names, the lazily resolved ones included (PEP 562)."""
    return sorted(set(globals()) | set(__all__))
