"""convert(): the integer model of a prepared (calibrated) model, by a public layer mapping.

:data:`QUANTIZED_MODULE_MAPPINGS` maps each QAT layer type to its integer module type (torch.ao's
static quantized module mappings): :func:`swap_modules` REPLACES every quantized ``Linear`` (in
its parent, by name) with a :class:`QuantizedLinear` and every ``LSTM`` with a
:class:`QuantizedLSTM` (integer matmuls with int32/int64 accumulation, :mod:`nbqat.nn.int8`);
the int8 quantizers left in the other layers' hooks (the attention probabilities) get their
frozen fake quantization (:class:`~nbqat.nn.int8.FrozenFakeQuantize`); the rest runs the float
layers. No method is patched: a converted layer is a module of another type. Both forecasters
convert this way: the generic :func:`convert_model` (the LSTM forecaster, any prepared
network) and the TFT's :meth:`Int8TemporalFusionTransformer.from_qat
<nbqat.nn.int8.Int8TemporalFusionTransformer.from_qat>`.
"""

from __future__ import annotations

import copy
from typing import Any

import numpy as np

from nbqat._docs import INT8_RESULT, fill_doc
from nbqat.nn.int4 import int_linear, int_lstm
from nbqat.nn.int8_layers import FrozenFakeQuantize
from nbqat.nn.layers import LSTM, Linear
from nbqat.nn.params import Module
from nbqat.nn.phases import QATPhases
from nbqat.nn.qat_mappings import hooks_for
from nbqat.quantization._quantizer_base import check_observed
from nbqat.quantization.fake_quantize import FakeQuantize, LearnableFakeQuantize

__all__ = [
    "QUANTIZED_MODULE_MAPPINGS",
    "TRAINING_NAMES",
    "InferenceOnly",
    "Int8Model",
    "QuantizedLSTM",
    "QuantizedLinear",
    "convert",
    "swap_modules",
]

#: The docstring of every integer type's ``from_float`` (the contract of
#: :data:`QUANTIZED_MODULE_MAPPINGS`), filled in with the layer's parameter line.
_FROM_FLOAT = """\
Parameters
----------
{arg}
    A layer of a calibrated prepared network (its {which}quantizers are read).
name : str
    Its path, for error messages.

Returns
-------
{cls} or None
    None when the layer has no weight quantizer (it stays float)."""


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
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.has_bias = bool(linear.has_bias)
        bias = linear.bias if linear.has_bias else None
        self.int8 = int_linear(
            linear.weight,  # its own dtype: float64 weights get the float64 QAT forward's codes
            bias,
            linear.weight_fake_quant,
            linear.input_fake_quant,
            name,
        )  # Int8Linear, or the low-bit twin (issue 30)

    @classmethod
    @fill_doc(from_float=_FROM_FLOAT.format(arg="linear : Linear", which="", cls="QuantizedLinear"))
    def from_float(cls, linear: Any, name: str) -> QuantizedLinear | None:
        """The integer module of a QAT ``Linear`` (torch's ``from_float``).

        {from_float}
        """
        return None if linear.weight_fake_quant is None else cls(linear, name)

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
        super().__init__()
        self.input_size, self.hidden_size = lstm.input_size, lstm.hidden_size
        self.int8 = int_lstm(lstm, name)  # Int8LSTM, or GroupedLSTM (issue 30)

    @classmethod
    @fill_doc(from_float=_FROM_FLOAT.format(arg="lstm : LSTM", which="four ", cls="QuantizedLSTM"))
    def from_float(cls, lstm: Any, name: str) -> QuantizedLSTM | None:
        """The integer module of a QAT ``LSTM``.

        {from_float}
        """
        return None if lstm.weight_ih_fake_quant is None else cls(lstm, name)

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


#: QAT layer type -> its integer module type (exact type match; public and extensible: the
#: integer type's ``from_float(module, name)`` returns the replacement, or None to keep the
#: layer float).
QUANTIZED_MODULE_MAPPINGS: dict[type, type] = {Linear: QuantizedLinear, LSTM: QuantizedLSTM}


#: The training entry points of a QAT model, which an integer model refuses by name.
TRAINING_NAMES = ("backward", "train_step", "zero_grad", "params", "grads")


class InferenceOnly:
    """Base of the integer models (:class:`Int8Model`, the TFT's twin): reading a training
    entry point of a QAT model (:data:`TRAINING_NAMES`: ``backward``, ``train_step``, ...)
    raises an AttributeError that says the model is inference-only and names the fix (so
    ``hasattr`` stays False)."""

    def __getattr__(self, name: str) -> Any:
        if name in TRAINING_NAMES:
            raise AttributeError(
                f"{type(self).__name__}.{name}: the integer model that convert() returns is "
                "inference-only (integer weights, no gradients); train the QAT model "
                "(qat.backward, qat.train_step) before convert(qat), then convert it again"
            )
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")


class Int8Model(InferenceOnly):
    """The integer model :func:`convert` returns; ``int8(*inputs)`` runs it (float32 out).
    Inference-only: ``backward`` / ``train_step`` are AttributeErrors naming the fix.

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


def _freeze_hooks(mod: Module, name: str) -> None:
    """Replace the int8-family quantizers (FakeQuantize, LSQ) in ``mod``'s mapped hooks by
    their frozen fake quantization (its current qparams, no observer); a low-bit quantizer
    (float8, grouped int4, per token) keeps its current qparams with its observer off, as the
    QAT model's in evaluation mode (a per-token one stays dynamic)."""
    for hook in hooks_for(mod) or ():
        fq = getattr(mod, hook, None)
        if isinstance(fq, FakeQuantize | LearnableFakeQuantize):
            setattr(mod, hook, FrozenFakeQuantize(fq, f"{name}.{hook}" if name else hook))
        elif fq is not None and hasattr(fq, "enable_observer"):
            fq.enable_observer(False)
            fq.enable_fake_quant(True)


def swap_modules(
    net: Module, mapping: dict[type, type] | None = None
) -> tuple[Module, dict[str, Module]]:
    """Convert ``net`` IN PLACE: each layer whose type is in ``mapping`` and that is quantized
    is replaced in its parent by its integer module; the other layers' int8 quantizers are
    frozen (:class:`~nbqat.nn.int8.FrozenFakeQuantize`).

    Parameters
    ----------
    net : Module
        A prepared network, calibrated (its quantizers are read, not changed); its layers are
        replaced, so pass a copy.
    mapping : dict of type to type, optional
        Default :data:`QUANTIZED_MODULE_MAPPINGS`.

    Returns
    -------
    (net, layers) : (Module, dict[str, Module])
        The converted network (the integer module itself when ``net`` is one quantized layer)
        and the integer modules by path.

    Raises
    ------
    UncalibratedError
        A quantizer has never observed data
        (:func:`~nbqat.quantization._quantizer_base.check_observed`).
    """
    mapping = QUANTIZED_MODULE_MAPPINGS if mapping is None else mapping
    layers: dict[str, Module] = {}
    for name, mod in list(net.named_modules()):
        cls = mapping.get(type(mod))
        new = None if cls is None else cls.from_float(mod, name)  # type: ignore[attr-defined]
        if new is None:
            _freeze_hooks(mod, name)
            continue
        parent, _, attr = name.rpartition(".")
        if not name:  # the model is one quantized layer
            net = new
        else:
            setattr(dict(net.named_modules())[parent], attr, new)  # replace it in its parent
        layers[name] = new
    return net, layers


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
    UncalibratedError
        A quantizer has never observed data (a RuntimeError and a ValueError).
    """
    if not isinstance(qat_model, QATPhases) and not hasattr(qat_model, "to_int8"):
        raise TypeError(
            f"convert: expects the result of prepare_qat, got {type(qat_model).__name__} "
            "(prepare and calibrate it first: qat = prepare_qat(model))"
        )
    return qat_model.to_int8()


@fill_doc(int8_result=INT8_RESULT)
def convert_model(qat_model: Any) -> Int8Model:
    """:func:`convert` of a generic prepared model (:meth:`QATModel.to_int8
    <nbqat.nn.quantize.QATModel.to_int8>`): a deep copy of its network whose quantized
    ``Linear`` / ``LSTM`` layers become :class:`QuantizedLinear` / :class:`QuantizedLSTM` and
    whose other quantizers are frozen. The copy is in evaluation mode (an inference model: a
    :class:`~nbqat.nn.Dropout` is the identity, as in the TFT's integer twin and the ONNX
    graph), whatever the QAT model's mode.

    Parameters
    ----------
    qat_model : QATModel
        Calibrated; not changed.

    {int8_result}
    """
    check_observed(qat_model.fake_quants)  # every quantizer named at once, before any copy
    net, layers = swap_modules(copy.deepcopy(qat_model.model).eval())
    return Int8Model(net, layers)
