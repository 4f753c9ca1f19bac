"""Emitters for models of the generic QAT API (``nbqat.nn.prepare_qat`` / ``convert``): the
converted layers (:class:`~nbqat.nn.QuantizedLinear`, :class:`~nbqat.nn.QuantizedLSTM`) and
:class:`~nbqat.nn.LSTMForecaster`. Another prepared network is exported once its type has an
emitter (``@register(MyNet)``: its forward's data flow over :func:`~nbqat.export.emitters.emit`).
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np

from nbqat.export._graph import GraphBuilder
from nbqat.export.emitters import emit, emit_lstm, qlinear, register
from nbqat.nn.convert import QuantizedLinear, QuantizedLSTM
from nbqat.nn.lstm_forecaster import LSTMForecaster

register(QuantizedLSTM)(emit_lstm)


@register(QuantizedLinear)
def emit_quantized_linear(
    g: GraphBuilder, name: str, mod: QuantizedLinear, x: str, add_bias: bool = True
) -> str:
    """A converted Linear: ``DQ(Q(x)) @ DQ(W_q) + b`` (no Add for a layer without bias)."""
    lin = mod.int8
    return qlinear(g, name, lin, x, lin.bias if add_bias and np.any(lin.bias) else None)


def _zeros(g: GraphBuilder, like: str, width: int, hint: str) -> str:
    """A float32 (B, width) zero tensor, B the batch of ``like``."""
    from onnx import TensorProto, helper

    batch = g.node(
        "Slice",
        [
            g.node("Shape", [like], hint),
            g.const([0], np.int64),
            g.const([1], np.int64),
        ],
        hint,
    )
    shape = g.node("Concat", [batch, g.const([width], np.int64)], hint, axis=0)
    zero = helper.make_tensor("value", TensorProto.FLOAT, [1], [0.0])
    return g.node("ConstantOfShape", [shape], hint, value=zero)


@register(LSTMForecaster)
def emit_lstm_forecaster(
    g: GraphBuilder, name: str, m: LSTMForecaster, static: str, hist: str, fut: str
) -> str:
    """LSTM encoder from a zero state; its final ``h_k`` and the static inputs repeated over
    the tau steps, concatenated with the known inputs, -> ``fc`` -> ELU -> ``head``."""
    cfg = m.config
    d, tau = cfg.hidden_dim, cfg.prediction_horizon
    zeros = _zeros(g, static, d, "state0")
    _, h_k, _ = emit(g, "encoder", m.encoder, hist, zeros, zeros, cfg.sequence_length)
    rep = g.const([1, tau, 1], np.int64)
    hk = g.node("Expand", [g.unsqueeze(h_k, 1, "z"), rep], "z")
    sx = g.node("Expand", [g.unsqueeze(static, 1, "z"), rep], "z")
    z = g.node("Concat", [hk, fut, sx], "z", axis=2)
    y = g.node("Elu", [emit(g, "fc", m.fc, z)], "act", alpha=1.0)
    return emit(g, "head", m.head, y)


def as_int8(model: Any) -> Any:
    """An export view of a ``convert()`` result (``Int8Model``): the network, the integer
    layers by path, and no output quantizer."""
    return SimpleNamespace(
        model=model.model,
        layers={n: getattr(m, "int8", m) for n, m in model.layers.items()},
        quantized_output=False,
        output_scale=None,
        output_zero_point=0,
        output_quant_min=0,
        output_quant_max=255,
        forward=model.forward,
    )
