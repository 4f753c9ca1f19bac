"""nbqat.nn: the layer graph with hand-written backward passes and the TFT-like forecaster.

Every layer is a :class:`~nbqat.nn.params.Module` with ``forward`` (caching what backward
needs) and ``backward`` (accumulating into the flat gradient buffer, returning input
gradients). Parameters of a whole model live in one flat buffer (:class:`ParameterBuffer`).
"""

from nbqat.nn.convert import (
    QUANTIZED_MODULE_MAPPINGS,
    Int8Model,
    QuantizedLinear,
    QuantizedLSTM,
    convert,
    swap_modules,
)
from nbqat.nn.forecasters import build_forecaster, load_qat_forecaster, prepare_forecaster
from nbqat.nn.layers import (
    ELU,
    LSTM,
    Dropout,
    GateAddNorm,
    GatedLinearUnit,
    GatedResidualNetwork,
    InterpretableMultiHeadAttention,
    LayerNorm,
    Linear,
    VariableEmbedding,
    VariableSelectionNetwork,
    set_dropout,
)
from nbqat.nn.loss import q_risk, quantile_loss, quantile_loss_grad
from nbqat.nn.lstm_forecaster import LSTMForecaster, LSTMForecasterConfig
from nbqat.nn.params import Module, ModuleList, ParameterBuffer
from nbqat.nn.qat import QATTemporalFusionTransformer
from nbqat.nn.quantize import (
    QAT_MODULE_MAPPINGS,
    QATModel,
    prepare_qat,
    register_qat_module,
)
from nbqat.nn.sequential import Sequential
from nbqat.nn.step import train_step
from nbqat.nn.tft import TemporalFusionTransformer, TFTConfig

__all__ = [
    "ELU",
    "Dropout",
    "QAT_MODULE_MAPPINGS",
    "QUANTIZED_MODULE_MAPPINGS",
    "Int8Model",
    "QuantizedLSTM",
    "QuantizedLinear",
    "QATModel",
    "Sequential",
    "convert",
    "swap_modules",
    "prepare_qat",
    "register_qat_module",
    "GateAddNorm",
    "GatedLinearUnit",
    "GatedResidualNetwork",
    "InterpretableMultiHeadAttention",
    "LSTM",
    "LSTMForecaster",
    "LSTMForecasterConfig",
    "LayerNorm",
    "Linear",
    "Module",
    "ModuleList",
    "ParameterBuffer",
    "QATTemporalFusionTransformer",
    "TFTConfig",
    "TemporalFusionTransformer",
    "VariableEmbedding",
    "VariableSelectionNetwork",
    "build_forecaster",
    "load_qat_forecaster",
    "prepare_forecaster",
    "q_risk",
    "quantile_loss",
    "quantile_loss_grad",
    "set_dropout",
    "train_step",
]
