"""The integer-arithmetic twin of a QAT-trained TFT (:class:`Int8TemporalFusionTransformer`) and
the frozen per-tensor fake quantization of its attention probabilities.

Built by :meth:`QATTemporalFusionTransformer.to_int8()
<nbqat.nn.qat.QATTemporalFusionTransformer.to_int8>` from the integer layers of
:mod:`nbqat.nn.int8` (whose module docstring gives the arithmetic and the accuracy bound);
importable from there too.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from nbqat._docs import FORECAST_IO, fill_doc
from nbqat.nn.int8 import _qparams, quantize_per_tensor

__all__ = ["FrozenFakeQuantize", "Int8TemporalFusionTransformer"]


class FrozenFakeQuantize:
    """Per-tensor fake quantization with fixed qparams (the attention probabilities).

    Parameters
    ----------
    fq : FakeQuantize
        A calibrated per-tensor quantizer; its current qparams are copied.
    name : str
        Its path, for error messages.
    """

    def __init__(self, fq: Any, name: str) -> None:
        s, z, self.quant_min, self.quant_max = _qparams(fq, name)
        self.scale, self.zero_point = np.float32(s[0]), int(z[0])
        self.ctx = None

    def forward(self, x: np.ndarray) -> np.ndarray:
        """``(clamp(rint(x / scale) + zp) - zp) * scale`` with the frozen qparams, float32."""
        q = quantize_per_tensor(x, self.scale, self.zero_point, self.quant_min, self.quant_max)
        return ((q - self.zero_point).astype(np.float32) * self.scale).astype(np.float32)


_FrozenFakeQuantize = FrozenFakeQuantize  # the earlier private name


class Int8TemporalFusionTransformer:
    """Integer-arithmetic inference twin of a :class:`~nbqat.nn.qat.QATTemporalFusionTransformer`.

    Build it with ``qat.to_int8()``. ``forward(static, historical, future)`` returns float32
    forecasts (B, tau, Q).

    Attributes
    ----------
    layers : dict[str, Int8Linear | Int8LSTM]
        The integer layers by the float model's module names (weights, scales, qparams).
    output_scale : float32
        The output quantization step (the QAT output observer's scale).
    output_zero_point : int
    quantized_output : bool
        Whether the head is integer and the output requantized to uint8 codes.
    """

    def __init__(self) -> None:  # use from_qat
        self.layers: dict[str, Any] = {}
        self.model: Any = None
        self.output_scale = np.float32(1.0)
        self.output_zero_point = 0
        self.output_quant_min, self.output_quant_max = 0, 255
        self.quantized_output = False

    @classmethod
    def from_qat(cls, qat: Any) -> Int8TemporalFusionTransformer:
        """Convert a calibrated QAT model (its current weights and qparams).

        Parameters
        ----------
        qat : QATTemporalFusionTransformer
            The source model, calibrated; it is not changed (its weights are copied as
            float32).

        Returns
        -------
        Int8TemporalFusionTransformer

        Raises
        ------
        RuntimeError
            When a quantizer has never observed data.
        """
        from nbqat.nn.int4 import int_linear, int_lstm  # int8, or low-bit twins (issue 30)
        from nbqat.nn.layers import LSTM, InterpretableMultiHeadAttention, Linear
        from nbqat.nn.tft import TemporalFusionTransformer

        src = qat.model
        self = cls()
        model = TemporalFusionTransformer(src.config, dtype=np.float32)
        model.params[...] = src.params.astype(np.float32)
        src_mods = dict(src.named_modules())
        for name, mod in model.named_modules():
            s = src_mods[name]
            if isinstance(mod, Linear) and s.weight_fake_quant is not None:
                lin = int_linear(
                    mod.weight,
                    mod.bias if mod.has_bias else None,
                    s.weight_fake_quant,
                    s.input_fake_quant,
                    name,
                )
                self.layers[name] = lin
                mod.forward = lin.forward  # type: ignore[method-assign]  # the float graph calls the int matmul
            elif isinstance(mod, LSTM) and s.weight_ih_fake_quant is not None:
                # Int8LSTM reads the quantizers from the source layer, weights from the copy
                tmp = _LSTMView(mod, s)
                lstm = int_lstm(tmp, name)
                self.layers[name] = lstm
                mod.forward = lstm.forward  # type: ignore[method-assign]
            elif (
                isinstance(mod, InterpretableMultiHeadAttention)
                and s.attention_fake_quant is not None
            ):
                mod.attention_fake_quant = _FrozenFakeQuantize(
                    s.attention_fake_quant, name + ".attention_fake_quant"
                )
        ofq = qat.output_fake_quant
        s, z, self.output_quant_min, self.output_quant_max = _qparams(ofq, "output_fake_quant")
        self.output_scale, self.output_zero_point = np.float32(s[0]), int(z[0])
        self.quantized_output = bool(qat.config.quantize_output_head)
        self.model = model
        return self

    @fill_doc(forecast_io=FORECAST_IO.format(cast="cast to float32", out=" float32"))
    def forward(self, static: np.ndarray, historical: np.ndarray, future: np.ndarray) -> np.ndarray:
        """Forecasts (B, tau, Q) float32 through the integer matmuls.

        {forecast_io}
            Dequantized from the uint8 output codes when ``quantized_output``.
        """
        out = self.model.forward(static, historical, future)
        if self.quantized_output:
            q = self.quantize_output(out)
            out = ((q - self.output_zero_point).astype(np.float32) * self.output_scale).astype(
                np.float32
            )
        return out

    __call__ = forward

    def quantize_output(self, y: np.ndarray) -> np.ndarray:
        """uint8-range output codes of ``y`` with the output qparams.

        Parameters
        ----------
        y : ndarray float
            Network outputs (any shape, normally (B, tau, Q)); computed in float32.

        Returns
        -------
        ndarray of int32, shape of ``y``
            Codes in ``[output_quant_min, output_quant_max]``.
        """
        return quantize_per_tensor(
            y,
            self.output_scale,
            self.output_zero_point,
            self.output_quant_min,
            self.output_quant_max,
        )


class _LSTMView:
    """Weights of the float copy, quantizers of the QAT source layer."""

    def __init__(self, mod: Any, src: Any) -> None:
        self.hidden_size, self.input_size = mod.hidden_size, mod.input_size
        self.weight_ih, self.weight_hh = mod.weight_ih, mod.weight_hh
        self.bias_ih, self.bias_hh = mod.bias_ih, mod.bias_hh
        self.weight_ih_fake_quant = src.weight_ih_fake_quant
        self.weight_hh_fake_quant = src.weight_hh_fake_quant
        self.input_fake_quant = src.input_fake_quant
        self.hidden_fake_quant = src.hidden_fake_quant
