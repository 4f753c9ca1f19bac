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

The names live by concern -- the arithmetic in :mod:`nbqat.nn.int8_arith`, the integer layers in
:mod:`nbqat.nn.int8_layers`, the TFT's twin in :mod:`nbqat.nn.int8_tft` -- and are importable
from here.
"""

from __future__ import annotations

from nbqat.nn.int8_arith import (
    accumulator_dtype,
    qlinear,
    quantize_per_channel,
    quantize_per_tensor,
)
from nbqat.nn.int8_layers import FrozenFakeQuantize, Int8Linear, Int8LSTM
from nbqat.nn.int8_tft import Int8TemporalFusionTransformer
from nbqat.quantization._quantizer_base import UncalibratedError

__all__ = [
    "Int8LSTM",
    "Int8Linear",
    "FrozenFakeQuantize",
    "Int8TemporalFusionTransformer",
    "UncalibratedError",
    "accumulator_dtype",
    "qlinear",
    "quantize_per_channel",
    "quantize_per_tensor",
]
