"""Layers of nbqat's graph: each a forward / hand-written backward pair (see nbqat.nn).

A layer keeps its forward input for backward by reference, not as a copy (``Linear`` and
``LayerNorm`` read it back for their gradients, ``ELU`` for its mask): an input edited in place
between ``forward`` and ``backward`` silently changes the gradients, where torch's autograd
raises an error. Pass a copy (``layer.forward(x.copy())``) when you reuse the array; nbqat's
models never do (a copy per layer call would slow every training step).
"""

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
