"""Layers of nbqat's graph: each a forward / hand-written backward pair (see nbqat.nn)."""

from nbqat.nn.layers.activations import ELU
from nbqat.nn.layers.attention import InterpretableMultiHeadAttention
from nbqat.nn.layers.dropout import Dropout, set_dropout
from nbqat.nn.layers.gating import GateAddNorm, GatedLinearUnit, GatedResidualNetwork
from nbqat.nn.layers.linear import Linear
from nbqat.nn.layers.lstm import LSTM
from nbqat.nn.layers.norm import LayerNorm
from nbqat.nn.layers.selection import VariableEmbedding, VariableSelectionNetwork

__all__ = [
    "ELU",
    "Dropout",
    "GateAddNorm",
    "GatedLinearUnit",
    "GatedResidualNetwork",
    "InterpretableMultiHeadAttention",
    "LSTM",
    "LayerNorm",
    "Linear",
    "VariableEmbedding",
    "VariableSelectionNetwork",
    "set_dropout",
]
