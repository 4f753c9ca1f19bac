"""The integer-arithmetic twin of a QAT-trained TFT (:class:`Int8TemporalFusionTransformer`).

Built by :meth:`QATTemporalFusionTransformer.to_int8()
<nbqat.nn.qat.QATTemporalFusionTransformer.to_int8>` through :func:`nbqat.nn.convert.swap_modules`
and its layer mapping (the integer modules of :mod:`nbqat.nn.int8`, whose module docstring gives
the arithmetic and the accuracy bound); importable from :mod:`nbqat.nn.int8` too.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from nbqat._docs import FORECAST_IO, fill_doc
from nbqat.nn.convert import InferenceOnly, swap_modules
from nbqat.nn.int8_arith import quantize_per_tensor
from nbqat.nn.int8_layers import FrozenFakeQuantize, _qparams
from nbqat.nn.qat_mappings import hooks_for
from nbqat.nn.tft import TemporalFusionTransformer
from nbqat.quantization._quantizer_base import check_observed

__all__ = ["FrozenFakeQuantize", "Int8TemporalFusionTransformer"]


_FrozenFakeQuantize = FrozenFakeQuantize  # the earlier private name


class Int8TemporalFusionTransformer(InferenceOnly):
    """Integer-arithmetic inference twin of a :class:`~nbqat.nn.qat.QATTemporalFusionTransformer`.

    Build it with ``qat.to_int8()``. ``forward(static, historical, future)`` returns float32
    forecasts (B, tau, Q). Inference-only: ``backward`` / ``train_step`` are AttributeErrors
    naming the fix (train the QAT model before ``to_int8``).

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
        UncalibratedError
            When a quantizer has never observed data (a RuntimeError and a ValueError).
        """
        check_observed(qat.fake_quants)  # every quantizer named at once (as the export does)
        self = cls()
        model = _float32_prepared(qat.model)
        model, layers = swap_modules(model)
        self.layers = {name: mod.int8 for name, mod in layers.items()}  # type: ignore[attr-defined]
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


def _float32_prepared(src: Any) -> Any:
    """A float32 copy of the prepared QAT network ``src`` (a new TFT, its parameters cast to
    float32) holding ``src``'s own quantizers (shared, only read) in the same hooks
    (:func:`~nbqat.nn.qat_mappings.hooks_for`): what :func:`~nbqat.nn.convert.swap_modules`
    converts, as the generic :func:`~nbqat.nn.convert.convert_model` converts a deep copy."""
    model = TemporalFusionTransformer(src.config, dtype=np.float32)
    model.params[...] = src.params.astype(np.float32)
    src_mods = dict(src.named_modules())
    for name, mod in model.named_modules():
        for hook in hooks_for(mod) or ():
            fq = getattr(src_mods[name], hook, None)
            if fq is not None:
                setattr(mod, hook, fq)
    return model
