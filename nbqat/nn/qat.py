"""Quantization-aware training (QAT) of the TFT-like forecaster.

:class:`QATTemporalFusionTransformer` is :func:`~nbqat.nn.prepare_qat` applied to a
:class:`~nbqat.nn.TemporalFusionTransformer` (a copy of it: the float model is left untouched
and its weights carry over bit for bit): the quantizers go into the layers' hooks through the
public mapping :data:`~nbqat.nn.quantize.QAT_MODULE_MAPPINGS`, with the qconfig mapping
:func:`tft_qconfig_mapping` derived from the :class:`~nbqat.QATConfig` switches, plus one
quantizer on the network output. It is a :class:`~nbqat.nn.quantize.QATModel` with the TFT's
entry points (:meth:`~QATTemporalFusionTransformer.from_float`, ``new_from_fp32``,
:meth:`~QATTemporalFusionTransformer.from_checkpoint`,
:meth:`~QATTemporalFusionTransformer.to_int8`).

Which tensors are quantized
---------------------------

| tensor | fake quantization (``default_qat_qconfig``) |
| --- | --- |
| weight of every ``Linear`` (GRNs, GLUs, VSNs, static contexts, attention Q/K/V/out) | \
per output channel, symmetric qint8 [-128, 127], moving-average per-channel min/max observer |
| ``LSTM`` ``weight_ih`` and ``weight_hh`` | same (per gate row), one FakeQuantize each |
| input of each of those matmuls (``Linear`` input, LSTM input sequence, LSTM ``h_{t-1}`` \
at every step) | per tensor, affine quint8 [0, 255], moving-average min/max observer (the \
LSTM hidden state uses ONE quantizer for all steps) |
| attention probabilities (B, H, tau, T) | per tensor affine quint8 when \
``QATConfig.quantize_attention`` (default on; Brevitas does this: they feed the P @ V matmul) |
| quantile head (Linear d -> Q) | float by default (``QATConfig.quantize_output_head=False``) |
| linear skip (``TFTConfig.linear_skip``) | float by default \
(``QATConfig.quantize_linear_skip=False``) |
| network output (B, tau, Q) | observed always (its scale defines the "output quantization \
step" of :meth:`to_int8`); fake-quantized only with the head |

Biases, LayerNorm, the per-variable input embeddings (an element-wise ``w_j x_j + b_j``, not a
matmul), the gates' nonlinearities and the softmax stay in float, as in PyTorch's eager-mode QAT
and NVIDIA ModelOpt. The head is left in float by default because it is a tiny ``d x Q`` matmul
(quantizing it saves nothing) whose output is the forecast itself: 256 output levels would put a
floor under the pinball loss, and ModelOpt leaves output heads in float for the same reason.

Phases
------
``torch.ao.quantization.FakeQuantize`` semantics, driven by ``QATConfig.calibration_batches``:

1. calibration (the state after :meth:`from_float`, or :meth:`enable_calibration`): observers
   on, fake quantization off -- the forward pass is exactly the float model's;
2. QAT (:meth:`disable_calibration`, called automatically at the first forward after
   ``calibration_batches`` calibration forwards): observers and fake quantization on;
3. frozen (:meth:`freeze_observers`, or automatically with
   ``QATConfig.freeze_observers_after_calibration``): fake quantization with fixed qparams.

Training step
-------------
:meth:`~nbqat.nn.quantize.QATModel.train_step` (:func:`nbqat.nn.train_step`) runs forward ->
quantile (pinball) loss -> backward (every FakeQuantize applies its straight-through-estimator
mask, so out-of-range weights and activations get zero gradient) -> the total 2-norm of the flat
gradient buffer (``torch.nn.utils.clip_grad_norm_``'s norm) -> ONE fused optimizer update in
which the clipping coefficient ``min(max_norm / (total + 1e-6), 1)`` is folded into
``grad_scale`` (llm.c's trick: clipping costs only the norm pass; the gradient buffer itself is
not rescaled). With LSQ (``QATConfig.learnable_scales``) the scales and zero points are a
parameter group of the same optimizer, clipped together with the weights.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from nbqat._docs import BACKWARD_IO, FORECAST_IO, fill_doc
from nbqat.nn.phases import CALIBRATION
from nbqat.nn.qat_mappings import config_qconfig_mapping
from nbqat.nn.qat_state import saved_network
from nbqat.nn.quantize import QATModel, hooks_for
from nbqat.nn.step import check_step_args
from nbqat.npz_state import CheckpointError

__all__ = [
    "CheckpointError",
    "QATTemporalFusionTransformer",
    "check_step_args",
    "tft_qconfig_mapping",
]


def _clone_model(model: Any) -> Any:
    """A new TemporalFusionTransformer with ``model``'s config, dtype and exact weights."""
    new = type(model)(model.config, dtype=model.params.dtype)
    if new.params.shape != model.params.shape:  # pragma: no cover - defensive
        raise ValueError("cannot copy the model: its parameter layout is not reproducible")
    new.params[...] = model.params
    return new


def tft_qconfig_mapping(model: Any, config: Any) -> dict[str, None]:
    """The :func:`~nbqat.nn.prepare_qat` qconfig mapping of a TFT under ``config``.

    Parameters
    ----------
    model : TemporalFusionTransformer
    config : QATConfig
        ``quantize_output_head=False`` keeps ``output_layer`` in float;
        ``quantize_attention=False`` keeps every InterpretableMultiHeadAttention (its
        projections included) in float.

    Returns
    -------
    dict
        ``{module name: None}`` (float fallback): the one rule of every prepared model,
        :func:`nbqat.nn.qat_mappings.config_qconfig_mapping`.
    """
    return config_qconfig_mapping(model, config)


def _static_activations(qconfig: Any) -> bool:
    """Whether ``qconfig.activation`` builds per-tensor FakeQuantize / LSQ modules (or None)."""
    from nbqat.quantization.fake_quantize import FakeQuantize, LearnableFakeQuantize

    fac = qconfig.activation
    return fac is None or isinstance(fac(), (FakeQuantize, LearnableFakeQuantize))


def _output_quantizer(qconfig: Any) -> Any:
    """``qconfig.activation()``, or the default per-tensor quint8 quantizer where the qconfig's
    activations are float or dynamic (its scale is the output step of :meth:`to_int8`)."""
    from nbqat.quantization.fake_quantize import FakeQuantize, LearnableFakeQuantize
    from nbqat.quantization.qconfig import default_qat_qconfig

    fq = None if qconfig.activation is None else qconfig.activation()
    if not isinstance(fq, (FakeQuantize, LearnableFakeQuantize)):
        default: Any = default_qat_qconfig.activation
        fq = default()
    return fq


# ---------------------------------------------------------------------------------------------
# the QAT model
# ---------------------------------------------------------------------------------------------
class QATTemporalFusionTransformer(QATModel):
    """A TFT-like forecaster trained through fake quantization (see the module docstring).

    Build it with :meth:`from_float` (or the Rust original's name :meth:`new_from_fp32`);
    the constructor wraps ``model`` itself (no copy).

    Parameters
    ----------
    model : TemporalFusionTransformer
        A float model without quantizers (it receives them; not copied).
    qconfig : QConfig, optional
        Factories of the activation and weight quantizers; default ``config.qconfig``.
    config : QATConfig, optional
        Calibration length, ``max_norm``, LSQ, what to quantize; default ``QATConfig()``.

    Raises
    ------
    TypeError
        When ``config`` is not a QATConfig or ``qconfig`` lacks callable ``activation`` and
        ``weight`` factories.

    Attributes
    ----------
    model : TemporalFusionTransformer
        The wrapped network, quantizers in its hooks.
    config : QATConfig
    qconfig : QConfig
    fake_quants : dict[str, FakeQuantize]
        Every quantizer by ``"<layer>.<hook>"`` (``"output_fake_quant"`` for the network output).
    float_fallback : list of str
        The modules :func:`tft_qconfig_mapping` keeps in float (the head, the attention).
    output_fake_quant : FakeQuantize
        On the network output (B, tau, Q): observing always, fake-quantizing only with
        ``config.quantize_output_head``.
    phase : str
        ``"calibration"`` or ``"qat"``.
    observers_frozen : bool
    calibration_batches_seen : int
        Calibration forwards since the last :meth:`enable_calibration`.
    step : int
        Optimizer steps taken by :meth:`train_step`.
    optimizer : optimizer or None
        The optimizer of the last :meth:`train_step` (saved by :meth:`save` by default).
    """

    def __init__(self, model: Any, qconfig: Any = None, config: Any = None) -> None:
        from nbqat.quantization.qconfig import QATConfig

        if config is None:
            config = QATConfig()
        if not isinstance(config, QATConfig):
            raise TypeError(f"`config` must be a nbqat.QATConfig, got {type(config).__name__}")
        if qconfig is None:
            qconfig = config.qconfig
        for attr in ("activation", "weight"):
            fac = getattr(qconfig, attr, None)
            if not callable(fac) and not (attr == "activation" and fac is None):
                raise TypeError(
                    "`qconfig` must be a nbqat.QConfig with callable `activation` and `weight` "
                    f"factories, got {type(qconfig).__name__}"
                )
        mapping: dict[Any, Any] = {}  # QATModel adds QATConfig's float fallback
        if not _static_activations(qconfig):  # per-token / float8: static per-tensor probs
            from nbqat.nn.layers import InterpretableMultiHeadAttention
            from nbqat.quantization.qconfig import QConfig, default_qat_qconfig

            act: Any = default_qat_qconfig.activation
            static = QConfig(act, qconfig.weight, getattr(qconfig, "weight_fallback", None))
            mapping.setdefault(InterpretableMultiHeadAttention, static)
        QATModel.__init__(self, model, qconfig, mapping, config, getattr(model, "buffer", None))
        self._out_ctx: Any = None
        self.output_fake_quant = _output_quantizer(qconfig)
        self.fake_quants["output_fake_quant"] = self.output_fake_quant
        self.quantizer_kinds["output_fake_quant"] = "activation"
        if not config.quantize_output_head:
            self._observe_only.add("output_fake_quant")
        self._apply_flags()

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_float(
        cls, model: Any, qconfig: Any = None, config: Any = None, *, inplace: bool = False
    ) -> QATTemporalFusionTransformer:
        """Prepare a float :class:`~nbqat.nn.TemporalFusionTransformer` for QAT.

        Parameters
        ----------
        model : TemporalFusionTransformer
            The float model (trained or freshly initialised); float32 or float64.
        qconfig : QConfig, optional
            Factories of the activation and weight quantizers; default ``config.qconfig``
            (:data:`nbqat.default_qat_qconfig`).
        config : QATConfig, optional
            Calibration length, default ``max_norm``, LSQ, what to quantize; default
            ``QATConfig()``.
        inplace : bool, default False
            Put the quantizers into ``model`` itself instead of into a copy.

        Returns
        -------
        QATTemporalFusionTransformer
            In the calibration phase; its weights equal ``model``'s bit for bit.

        Raises
        ------
        TypeError
            When ``model`` is not a nbqat TemporalFusionTransformer, or ``config`` / ``qconfig``
            have the wrong types.
        ValueError
            When a layer of ``model`` already holds a quantizer.
        """
        from nbqat.nn.tft import TemporalFusionTransformer

        if not isinstance(model, TemporalFusionTransformer):
            raise TypeError(
                f"`model` must be a nbqat.nn.TemporalFusionTransformer, got {type(model).__name__}"
            )
        for name, mod in model.named_modules():
            for hook in hooks_for(mod) or ():
                if getattr(mod, hook, None) is not None:
                    raise ValueError(
                        f"`model` already has a quantizer at {name or '<root>'}.{hook}: "
                        "from_float expects a float model (build a fresh one)"
                    )
        if not inplace:
            model = _clone_model(model)
        return cls(model, qconfig=qconfig, config=config)

    #: The Rust original's name for :meth:`from_float` (``new_from_fp32``).
    new_from_fp32 = from_float

    # ``params`` / ``grads``: QATModel's, the buffer of :attr:`model` (passed to it above).

    # ------------------------------------------------------------------ forward / backward
    @fill_doc(forecast_io=FORECAST_IO.format(cast="cast to the model's dtype", out=""))
    def forward(self, static: np.ndarray, historical: np.ndarray, future: np.ndarray) -> np.ndarray:
        """Quantile forecasts through the fake-quantized network.

        {forecast_io}
            The forecast quantiles (through the output quantizer), in the model's dtype.

        Notes
        -----
        In the calibration phase each call counts as one calibration batch; the first call
        after ``config.calibration_batches`` of them switches to the QAT phase before running.
        """
        if (
            self.phase == CALIBRATION
            and self.calibration_batches_seen >= self.config.calibration_batches
        ):
            self.disable_calibration()
        out = self.model.forward(static, historical, future)  # (B, tau, Q)
        self._caches_from_predict = False
        ofq = self.output_fake_quant
        out = ofq.forward(out)
        self._out_ctx = ofq.ctx
        if self.phase == CALIBRATION:
            self._count_calibration_batch()
        return out

    __call__ = forward

    @fill_doc(forecast_io=FORECAST_IO.format(cast="cast to the model's dtype", out=""))
    def predict(self, static: np.ndarray, historical: np.ndarray, future: np.ndarray) -> np.ndarray:
        """:meth:`forward` without updating any observer or the calibration count (evaluation).

        {forecast_io}
            The forecast quantiles with the current qparams and phase, in the model's dtype.
        """
        return QATModel.predict(self, static, historical, future)

    def _network_forward(self, *inputs: Any) -> Any:
        """The network, then the output quantizer (what :meth:`predict` runs, observers off)."""
        return self.output_fake_quant.forward(self.model.forward(*inputs))

    @fill_doc(backward_io=BACKWARD_IO.format(cast=""))
    def backward(self, grad_out: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Backpropagate ``grad_out`` (B, tau, Q) through every STE mask into :attr:`grads`.

        {backward_io}
        """
        self._check_backward()
        g = self.output_fake_quant.backward(np.asarray(grad_out), self._out_ctx)
        return self.model.backward(np.asarray(g, dtype=self.model.dtype))

    # ------------------------------------------------------------------ int8
    def to_int8(self) -> Any:
        """Convert to an integer-arithmetic model (``Int8TemporalFusionTransformer``).

        Every quantized matmul becomes int8 weights (per-channel scales) x uint8 activation codes
        with int32 accumulation and a float requantization; its outputs match this model's
        (with observers frozen, i.e. the qparams as they are now) within one output
        quantization step (``output_fake_quant.scale``). This model is not changed.

        Raises
        ------
        UncalibratedError
            When a quantizer has never observed data (calibrate first; a RuntimeError).
        """
        from nbqat.nn.int8_tft import Int8TemporalFusionTransformer

        return Int8TemporalFusionTransformer.from_qat(self)

    @classmethod
    def from_checkpoint(
        cls, path: str | os.PathLike, qconfig: Any = None, config: Any = None
    ) -> QATTemporalFusionTransformer:
        """Rebuild a QAT model from a checkpoint alone (network config, weights, quantizers).

        The optimizer state is restored separately: build the optimizer over the new model's
        :attr:`params`, then call :meth:`load` with it.

        Parameters
        ----------
        path : str or os.PathLike
            A checkpoint written by :meth:`save`.
        qconfig : QConfig, optional
            Quantizer factories; default ``config.qconfig``. Must build the same set of
            quantizers as the saved model's.
        config : QATConfig, optional
            Default: the saved QATConfig's scalar fields with the default qconfig.

        Returns
        -------
        QATTemporalFusionTransformer
            With the saved weights, quantizer states, phase and step (no optimizer).

        Raises
        ------
        FileNotFoundError
            When ``path`` does not exist.
        CheckpointError
            For a corrupt, truncated or foreign file or another format version.
        """
        from nbqat.nn.tft import TemporalFusionTransformer, TFTConfig

        tcfg, dtype, config = saved_network(path, TFTConfig, config)
        model = TemporalFusionTransformer(tcfg, dtype=dtype)
        qat = cls(model, qconfig=qconfig, config=config)
        qat.load(path)
        return qat
