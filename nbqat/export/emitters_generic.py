"""Old import path of the generic models' emitters, kept for existing imports: the emitters of
:class:`~nbqat.nn.QuantizedLinear`, :class:`~nbqat.nn.QuantizedLSTM` and
:class:`~nbqat.nn.LSTMForecaster` are in the one registry of :mod:`nbqat.export.emitters`, the
export view :func:`as_int8` in :mod:`nbqat.export.onnx_export`."""

from __future__ import annotations

from nbqat.export.emitters import emit_lstm_forecaster, emit_quantized_linear, emit_quantized_lstm
from nbqat.export.onnx_export import as_int8

__all__ = ["as_int8", "emit_lstm_forecaster", "emit_quantized_linear", "emit_quantized_lstm"]
