"""convert(): the integer model of a prepared (calibrated) model, from Int8 module classes.

Every quantized ``Linear`` is REPLACED (in its parent, by name) with a :class:`QuantizedLinear`
and every ``LSTM`` with a :class:`QuantizedLSTM` (integer matmuls with int32/int64
accumulation, :mod:`nbqat.nn.int8`); attention probabilities keep their frozen fake
quantization (:class:`~nbqat.nn.int8.FrozenFakeQuantize`); the rest runs the float layers. No
instance method is patched.
"""

from __future__ import annotations

import copy
from typing import Any

import numpy as np

from nbqat._docs import INT8_RESULT, fill_doc
from nbqat.nn.params import Module
from nbqat.nn.quantize import QATModel, hooks_for

__all__ = ["Int8Model", "QuantizedLSTM", "QuantizedLinear", "convert"]


class QuantizedLinear(Module):
    """The integer twin of a fake-quantized :class:`~nbqat.nn.Linear` (a Module, so it
    replaces the float layer in its parent).

    Parameters
    ----------
    linear : Linear
        A layer whose ``weight_fake_quant`` and ``input_fake_quant`` have observed data.
    name : str
        Its path, for error messages.
    """

    def __init__(self, linear: Any, name: str) -> None:
        from nbqat.nn.int4 import int_linear  # Int8Linear, or the low-bit twin (issue 30)

        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        bias = linear.bias if linear.has_bias else None
        self.int8 = int_linear(
            np.asarray(linear.weight, np.float32),
            bias,
            linear.weight_fake_quant,
            linear.input_fake_quant,
            name,
        )

    @property
    def bias(self) -> np.ndarray | None:
        """The float32 bias (None without one): layers that add it themselves (the GRN adds
        ``fc1``'s with its ELU) call ``forward(x, add_bias=False)`` and read it here."""
        return self.int8.bias

    def is_plain(self) -> bool:
        """False: an integer matmul is never folded into a neighbouring affine map."""
        return False

    def forward(self, x: np.ndarray, add_bias: bool = True) -> np.ndarray:
        """Integer matmul (:meth:`nbqat.nn.int8.Int8Linear.forward`).

        Parameters
        ----------
        x : ndarray (..., in_features) float
        add_bias : bool, default True

        Returns
        -------
        ndarray (..., out_features) float32
        """
        return self.int8.forward(x, add_bias)


class QuantizedLSTM(Module):
    """The integer twin of a fake-quantized :class:`~nbqat.nn.LSTM`
    (:class:`nbqat.nn.int8.Int8LSTM`).

    Parameters
    ----------
    lstm : LSTM
        A layer whose four quantizers have observed data.
    name : str
        Its path, for error messages.
    """

    def __init__(self, lstm: Any, name: str) -> None:
        from nbqat.nn.int4 import int_lstm  # Int8LSTM, or GroupedLSTM (issue 30)

        super().__init__()
        self.input_size, self.hidden_size = lstm.input_size, lstm.hidden_size
        self.int8 = int_lstm(lstm, name)

    def forward(self, x: np.ndarray, h0: np.ndarray, c0: np.ndarray) -> Any:
        """Run the LSTM with integer matmuls.

        Parameters
        ----------
        x : ndarray (B, L, input_size)
        h0, c0 : ndarray (B, hidden_size)

        Returns
        -------
        ``(out (B, L, hidden_size), (h_L, c_L))``, float32.
        """
        return self.int8.forward(x, h0, c0)


class Int8Model:
    """The integer model :func:`convert` returns; ``int8(*inputs)`` runs it (float32 out).

    Parameters
    ----------
    model : Module
        The converted network.
    layers : dict[str, Module]
        Its Quantized* modules by path.

    Attributes
    ----------
    model : Module
        The converted network: Quantized* modules in place of the quantized layers.
    layers : dict[str, Module]
        The Quantized* modules by path.
    """

    def __init__(self, model: Module, layers: dict[str, Module]) -> None:
        self.model = model
        self.layers = layers

    def forward(self, *inputs: Any) -> Any:
        """Run the converted network (no gradient, no observer).

        Parameters
        ----------
        *inputs : ndarray
            The model's inputs (cast to float32).

        Returns
        -------
        The output, float32.
        """
        return self.model.forward(*(np.asarray(a, np.float32) for a in inputs))

    __call__ = forward


def convert(qat_model: Any) -> Any:
    """The integer model of a calibrated QAT model.

    Parameters
    ----------
    qat_model : QATModel or QATTemporalFusionTransformer
        Calibrated (every quantizer has observed data); not changed.

    Returns
    -------
    Int8Model or Int8TemporalFusionTransformer
        ``qat_model.to_int8()``: :func:`convert_model` for a generic prepared model, the TFT's
        own integer twin for a QATTemporalFusionTransformer.

    Raises
    ------
    TypeError
        ``qat_model`` was not prepared (a float Module or anything else).
    RuntimeError
        A quantizer has never observed data.
    """
    if not isinstance(qat_model, QATModel) and not hasattr(qat_model, "to_int8"):
        raise TypeError(
            f"convert: expects the result of prepare_qat, got {type(qat_model).__name__} "
            "(prepare and calibrate it first: qat = prepare_qat(model))"
        )
    return qat_model.to_int8()


@fill_doc(int8_result=INT8_RESULT)
def convert_model(qat_model: QATModel) -> Int8Model:
    """:func:`convert` of a generic prepared model (:meth:`QATModel.to_int8
    <nbqat.nn.quantize.QATModel.to_int8>`): a deep copy of its network whose quantized
    ``Linear`` / ``LSTM`` layers become :class:`QuantizedLinear` / :class:`QuantizedLSTM` and
    whose other quantizers are frozen.

    Parameters
    ----------
    qat_model : QATModel
        Calibrated; not changed.

    {int8_result}
    """
    from nbqat.nn.int8 import FrozenFakeQuantize
    from nbqat.nn.layers import LSTM, Linear
    from nbqat.quantization.fake_quantize import FakeQuantize

    net = copy.deepcopy(qat_model.model)
    layers: dict[str, Module] = {}
    for name, mod in list(net.named_modules()):
        parent, _, attr = name.rpartition(".")
        new: Module | None = None
        if type(mod) is Linear and mod.weight_fake_quant is not None:
            new = QuantizedLinear(mod, name)
        elif type(mod) is LSTM and mod.weight_ih_fake_quant is not None:
            new = QuantizedLSTM(mod, name)
        else:
            for hook in hooks_for(mod) or ():
                fq = getattr(mod, hook, None)
                if isinstance(fq, FakeQuantize):  # frozen qparams, no observer
                    setattr(mod, hook, FrozenFakeQuantize(fq, f"{name}.{hook}"))
        if new is None:
            continue
        if not name:  # the model is one quantized layer
            net = new
        else:
            setattr(dict(net.named_modules())[parent], attr, new)  # replace it in its parent
        layers[name] = new
    return Int8Model(net, layers)
