"""QAT for any model built from nbqat.nn layers: :func:`prepare_qat` and :func:`convert`.

PyTorch's eager-mode workflow (``torch.ao.quantization.prepare_qat`` / ``convert``) on nbqat's
layer graph::

    model = Sequential(Linear(6, 16), ELU(), Linear(16, 3))
    buf = ParameterBuffer(model, dtype=np.float32, seed=0)
    qat = prepare_qat(model)                    # weight + activation FakeQuantize modules
    qat.enable_calibration(); qat(x); qat.disable_calibration(); qat.freeze_observers()
    int8 = convert(qat); y8 = int8(x)

:data:`QAT_MODULE_MAPPINGS` maps each float layer type to its quantization hooks (attribute
name -> ``"weight"`` or ``"activation"``, the qconfig factory that builds the quantizer): a
``Linear`` gets a per-channel weight quantizer and a per-tensor input quantizer, an ``LSTM``
both weights, its input and its hidden state at every step, the attention its probabilities.
Layers that hold parameters but no matmul (LayerNorm, the variable embeddings) map to no hook
and stay in float by design. :func:`register_qat_module` adds a user's layer type. A module
that holds parameters of its own and has no mapping is an error (its weights would silently
stay float); a parameter-less module without a mapping (an activation, a user's composite)
passes through in float, and its children are prepared.

:func:`~nbqat.nn.convert.convert` (in :mod:`nbqat.nn.convert`) then builds the integer model.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

import numpy as np

from nbqat._docs import INT8_RESULT, fill_doc
from nbqat.nn.convert import convert_model
from nbqat.nn.layers.dropout import dropout_off
from nbqat.nn.params import Module, ParameterBuffer
from nbqat.nn.phases import CALIBRATION, QATPhases, is_learnable
from nbqat.nn.qat_mappings import (
    QAT_MODULE_MAPPINGS,
    check_bound,
    check_qconfig_mapping,
    config_qconfig_mapping,
    hooks_for,
    qconfig_for,
    register_qat_module,
)
from nbqat.nn.qat_state_dict import QATStateDict

__all__ = [
    "QAT_MODULE_MAPPINGS",
    "QATModel",
    "hooks_for",
    "prepare_qat",
    "register_qat_module",
]


_END = object()  # the end of calibrate's batches (a None batch is a TypeError)


def _copy_model(model: Module) -> tuple[Module, ParameterBuffer]:
    """A deep copy with a new flat buffer holding ``model``'s exact parameter values."""
    params = dict(model.named_parameters())
    dtype = next(iter(params.values())).dtype if params else np.dtype(np.float32)
    new = copy.deepcopy(model)
    buf = ParameterBuffer(new, dtype=dtype)
    for n, p in new.named_parameters():
        p[...] = params[n]
    if isinstance(getattr(new, "buffer", None), ParameterBuffer):  # a model owning its buffer
        object.__setattr__(new, "buffer", buf)
    return new, buf


def _check_modules(model: Module) -> None:
    """Every module's hooks exist and are empty; no parameter-holding module lacks a mapping."""
    for name, mod in model.named_modules():
        hooks = hooks_for(mod)
        for hook in hooks or ():
            if not hasattr(mod, hook):
                raise TypeError(
                    f"prepare_qat: module {name or '<root>'} ({type(mod).__name__}) has no hook "
                    f"attribute {hook!r} that its QAT mapping names: give the layer that "
                    "attribute (None in float) or fix the mapping (register_qat_module)"
                )
            if getattr(mod, hook, None) is not None:
                raise ValueError(
                    f"prepare_qat: {name or '<root>'}.{hook} already holds a quantizer: the "
                    "model is prepared already (prepare a fresh float model)"
                )
        own = [n for n, _ in mod.named_parameters(recurse=False)]
        if hooks is None and own:
            raise TypeError(
                f"prepare_qat: module {name or '<root>'} ({type(mod).__name__}) holds "
                f"parameters {sorted(own)} but has no QAT mapping; register one "
                f"with nbqat.nn.register_qat_module({type(mod).__name__}, "
                "{'weight_fake_quant': 'weight', 'input_fake_quant': 'activation'}), or {} "
                "to keep it in float"
            )


def prepare_qat(
    model: Module,
    qconfig: Any = None,
    *,
    qconfig_mapping: Mapping[Any, Any] | None = None,
    config: Any = None,
    inplace: bool = False,
) -> QATModel:
    """Attach weight and activation quantizers to every mapped layer of ``model``.

    Parameters
    ----------
    model : Module
        A float model of nbqat.nn layers (a :class:`~nbqat.nn.Sequential`, a user's own
        composite Module, ...) whose parameters are bound (a :class:`ParameterBuffer` exists).
    qconfig : QConfig, optional
        The default quantizer factories (default ``config.qconfig``, i.e.
        :data:`nbqat.default_qat_qconfig`: per-channel symmetric qint8 weights, per-tensor
        affine quint8 activations, moving-average min/max observers).
    qconfig_mapping : mapping, optional
        ``{module name or layer type: QConfig or None}``; a name covers its descendants, a
        type its subclasses (the nearest in the MRO; torch's: the exact type), a name wins
        over a type; None keeps those modules in float (float fallback).
    config : QATConfig, optional
        Calibration, freezing, LSQ (``learnable_scales``); ``quantize_output_head=False`` keeps
        the model's ``output_head`` in float, ``quantize_attention=False`` the attention
        (:func:`~nbqat.nn.qat_mappings.config_qconfig_mapping`; ``qconfig_mapping`` wins).
    inplace : bool, default False
        Put the quantizers into ``model`` itself (its parameters stay where they are) instead
        of into a copy with its own flat buffer. A model that owns its buffer
        (``model.buffer``, as the forecasters do) lends it to ``qat.params`` / ``qat.grads``.

    Returns
    -------
    QATModel
        In the calibration phase, training mode.

    Raises
    ------
    TypeError
        ``model`` is not a Module; a module holds parameters and its type has no mapping (the
        message names its path, its class and :func:`register_qat_module`), or lacks a hook
        attribute its mapping names; ``qconfig`` or a
        ``qconfig_mapping`` value is not a QConfig (or None), a key neither a str nor a type.
    ValueError
        ``model`` already holds a quantizer (prepared twice); unbound parameters; a
        ``qconfig_mapping`` name that is no module of ``model``.
    """
    from nbqat.quantization.qconfig import QATConfig

    if isinstance(model, QATModel) or not isinstance(model, Module):
        what = "already prepared" if isinstance(model, QATModel) else type(model).__name__
        raise (ValueError if isinstance(model, QATModel) else TypeError)(
            f"prepare_qat: model must be a float nbqat.nn Module, got {what}"
        )
    config = QATConfig() if config is None else config
    if not isinstance(config, QATConfig):
        raise TypeError(f"`config` must be a nbqat.QATConfig, got {type(config).__name__}")
    qconfig = config.qconfig if qconfig is None else qconfig
    mapping = check_qconfig_mapping(model, qconfig, qconfig_mapping)
    _check_modules(model)
    check_bound(model)  # inplace too: its quantizers would go in, its forward fail on None
    buf = getattr(model, "buffer", None)  # inplace: a model that owns its buffer keeps it
    buf = buf if isinstance(buf, ParameterBuffer) else None
    if not inplace:
        model, buf = _copy_model(model)
    return QATModel(model, qconfig, mapping, config, buf)


def _new_quantizer(qc: Any, kind: str, config: Any, weight: Any = None) -> Any:
    """``qc.<kind>()``, as a LearnableFakeQuantize (LSQ) with ``config.learnable_scales``;
    a weight that a grouped quantizer cannot split gets ``qc.weight_fallback()``."""
    factory = getattr(qc, kind)
    if factory is None:  # weight-only qconfig: this hook stays float
        return None
    fq = factory()
    if kind == "weight" and hasattr(qc, "weight_quantizer"):
        fb = qc.weight_quantizer(fq, weight)
        factory, fq = (factory, fq) if fb is fq else (qc.weight_fallback, fb)
    if getattr(config, "learnable_scales", False) and getattr(fq, "supports_lsq", True) is False:
        raise ValueError(
            f"QATConfig.learnable_scales: {type(fq).__name__} has no LSQ variant (use "
            "learnable_scales=False with low-bit qconfigs)"
        )
    if getattr(config, "learnable_scales", False) and not is_learnable(fq):
        fq = _to_learnable(factory, kind)
    return fq


def _to_learnable(factory: Any, kind: str) -> Any:
    """A LearnableFakeQuantize with the observer and range of a FakeQuantize factory."""
    from nbqat.quantization.fake_quantize import LearnableFakeQuantize

    kw = getattr(getattr(factory, "p", None), "keywords", None)
    if kw is None:
        raise TypeError(
            f"QATConfig.learnable_scales needs the qconfig's {kind} factory to be made with "
            "FakeQuantize.with_args(...) (or to build LearnableFakeQuantize modules)"
        )
    return LearnableFakeQuantize(**dict(kw))


class QATModel(QATStateDict, QATPhases):
    """A float model with quantizers in its layers' hooks (what :func:`prepare_qat` returns).

    Parameters
    ----------
    model : Module
        The network to prepare (already copied by :func:`prepare_qat` unless ``inplace``).
    qconfig : QConfig
        The default quantizer factories.
    mapping : dict
        ``{module name or layer type: QConfig or None}`` (see :func:`prepare_qat`).
    config : QATConfig
    buf : ParameterBuffer or None
        The copy's flat buffer (None with ``inplace``).

    Attributes
    ----------
    model : Module
        The prepared network (quantizers in its hooks).
    fake_quants : dict[str, FakeQuantize]
        Every quantizer by ``"<module path>.<hook>"``.
    float_fallback : list of str
        Modules left in float by a None qconfig.
    config : QATConfig
    phase : str
        ``"calibration"`` or ``"qat"``.
    observers_frozen, training : bool
    calibration_batches_seen : int
    params, grads : ndarray
        The flat buffers (of the copy, or of the caller's ParameterBuffer with ``inplace``).
    step : int
        Optimizer steps taken by :meth:`train_step`.
    optimizer : optimizer or None
        The optimizer of the last :meth:`train_step` (saved by :meth:`save` by default).
    num_inputs : int or None
        The inputs of ``forward`` in a :meth:`calibrate` batch: 3 for a forecaster (a model
        whose config has a ``prediction_horizon``: static, historical, future; the target
        after them is ignored), None (the whole batch) otherwise.
    """

    def __init__(self, model: Module, qconfig: Any, mapping: dict, config: Any, buf: Any):
        mapping = {**config_qconfig_mapping(model, config), **mapping}  # QATConfig's switches
        self.model = model
        self.config = config
        self.qconfig = qconfig
        self.buffer = buf
        self.fake_quants: dict[str, Any] = {}
        self._observe_only: set[str] = set()
        self.quantizer_kinds: dict[str, str] = {}  # name -> "weight" | "activation"
        self.float_fallback: list[str] = []
        placed = []  # every quantizer is built before any goes in (inplace: no half-prepared model)
        for name, mod in model.named_modules():
            hooks = hooks_for(mod)
            if not hooks:
                continue
            qc = qconfig_for(name, mod, qconfig, mapping)
            if qc is None:
                self.float_fallback.append(name)
                continue
            for hook, kind in hooks.items():
                weight = getattr(mod, hook.removesuffix("_fake_quant"), None)  # weight_ih...
                fq = _new_quantizer(qc, kind, config, weight)
                if fq is not None:
                    placed.append((mod, hook, fq))
                    key = f"{name}.{hook}" if name else hook
                    self.fake_quants[key], self.quantizer_kinds[key] = fq, kind
        for mod, hook, fq in placed:
            setattr(mod, hook, fq)
        self._init_phases()
        self.step = 0
        self.optimizer: Any = None
        forecaster = hasattr(getattr(model, "config", None), "prediction_horizon")
        self.num_inputs: int | None = 3 if forecaster else None
        self._apply_flags()

    def _flat(self, which: str) -> np.ndarray:
        """``self.buffer.<which>``; AttributeError naming the fix when there is no buffer."""
        if self.buffer is None:
            raise AttributeError(
                "this QATModel was prepared inplace from a model without its own `buffer`: use "
                f"the ParameterBuffer you built for it (buf.{which}), or prepare_qat(model)"
            )
        return getattr(self.buffer, which)

    @property
    def params(self) -> np.ndarray:
        """The flat parameter buffer (the float "shadow" weights), shared with :attr:`model`."""
        return self._flat("params")

    @property
    def grads(self) -> np.ndarray:
        """The flat gradient buffer (STE-masked gradients after :meth:`backward`)."""
        return self._flat("grads")

    def zero_grad(self) -> None:
        """Clear the flat gradient buffer (with ``inplace``: every parameter gradient of the
        model, i.e. the caller's buffer) and the LSQ gradients."""
        if self.buffer is not None:
            self.buffer.zero_grad()
        else:
            for _, g in self.model.named_grads():
                g[...] = 0
        for fq in self._learnable():
            fq.zero_grad()

    def forward(self, *inputs: Any) -> Any:
        """``model.forward(*inputs)`` through the quantizers.

        Parameters
        ----------
        *inputs : ndarray
            The model's inputs.

        Returns
        -------
        The model's output. In the calibration phase (training mode) each call counts as one
        calibration batch; the phase ends by itself after ``config.calibration_batches``.
        """
        if (
            self.phase == CALIBRATION
            and self.calibration_batches_seen >= self.config.calibration_batches
        ):
            self.disable_calibration()
        out = self.model.forward(*inputs)
        self._caches_from_predict = False
        if self.phase == CALIBRATION and self.training:
            self._count_calibration_batch()
        return out

    __call__ = forward

    def backward(self, grad: Any, *more: Any) -> Any:
        """``model.backward(grad, *more)``: every quantizer applies its STE mask.

        Parameters
        ----------
        grad : ndarray
            Gradient w.r.t. the last forward's output; parameter gradients accumulate into
            :attr:`grads`.
        *more : ndarray or None
            The model's further backward arguments, as its ``backward`` takes them (an
            ``LSTM``'s ``dh_n, dc_n``: the gradients w.r.t. its final state).

        Returns
        -------
        The gradient w.r.t. the input(s).

        Raises
        ------
        RuntimeError
            After :meth:`predict`, whose forward replaced the caches (run forward again).
        """
        self._check_backward()
        return self.model.backward(grad, *more)

    def calibrate(self, batches: Any) -> int:
        """Run calibration forwards over ``batches`` until :attr:`is_calibrated`, then end the
        calibration phase.

        Parameters
        ----------
        batches : iterable of tuples (or of arrays, for a model that is not a forecaster)
            Each holds the model's inputs first; items after :attr:`num_inputs` (a target)
            are ignored. An array is one batch of the model's single input.

        Returns
        -------
        int
            The number of batches run: ``config.calibration_batches``, plus any that came
            before the first observed data (a batch of no rows counts for nothing).

        Raises
        ------
        TypeError
            A batch that is neither a tuple / list nor, for a model that is not a forecaster,
            an array (before its forward runs; a bad first batch before the phase changes).
        ValueError
            In evaluation mode, where no observer updates (call :meth:`train` first); nothing
            changes.
        """
        if not self.training:
            raise ValueError(
                "calibrate: this QAT model is in evaluation mode, where no observer updates "
                "(calibration would observe nothing): call qat.train() first"
            )
        used, n = 0, self.config.calibration_batches
        it = iter(batches)
        first = next(it, _END)  # checked before the phase (and the batch count) is reset
        inputs = None if first is _END else self._calibration_inputs(first, 0)
        if self.phase != CALIBRATION:
            self.enable_calibration()
        while inputs is not None and self.calibration_batches_seen < n:
            self.forward(*inputs)
            used += 1
            batch = next(it, _END) if self.calibration_batches_seen < n else _END
            inputs = None if batch is _END else self._calibration_inputs(batch, used)
        self.disable_calibration()
        return used

    def _calibration_inputs(self, batch: Any, i: int) -> Any:
        """The model's inputs in calibration batch ``i``, or a TypeError naming the fix."""
        if isinstance(batch, np.ndarray) and self.num_inputs is None:
            return (batch,)  # the array is the input, not a tuple to unpack
        if not isinstance(batch, tuple | list):
            raise TypeError(
                f"calibrate: batch {i} is a {type(batch).__name__}; pass tuples of the "
                "model's inputs, e.g. [(x0,), (x1,)], or [(static, historical, future), "
                "...] for a forecaster"
            )
        return batch[: self.num_inputs]

    def predict(self, *inputs: Any) -> Any:
        """:meth:`forward` without updating any observer or the calibration count (evaluation
        with the current qparams and phase; every Dropout is the identity, whatever the mode).

        Parameters
        ----------
        *inputs : ndarray
            The model's inputs.

        Returns
        -------
        The model's output.
        """
        saved = [(fq, fq.observer_enabled) for fq in self.fake_quants.values()]
        self._caches_from_predict = True
        try:
            for fq, _ in saved:
                fq.enable_observer(False)
            with dropout_off(self.model):
                return self._network_forward(*inputs)
        finally:
            for fq, flag in saved:
                fq.enable_observer(bool(flag))

    def _network_forward(self, *inputs: Any) -> Any:
        return self.model.forward(*inputs)

    @fill_doc(int8_result=INT8_RESULT)
    def to_int8(self) -> Any:
        """The integer model (:func:`nbqat.nn.convert`; this model is not changed).

        {int8_result}
        """
        return convert_model(self)

    def train_step(
        self, batch: Any, optimizer: Any, max_norm: float | None = None, *, grad_hook: Any = None
    ) -> tuple[float, float]:
        """One QAT step of a forecaster: forward, pinball loss, backward (STE), clipping, update.

        Parameters
        ----------
        batch : tuple
            ``(static (B, m_s), historical (B, k, m_z), future (B, tau, m_x), target (B, tau))``,
            optionally a bool ``mask (B, tau)``: the target entries the loss counts
            (:func:`nbqat.nn.train_step`).
        optimizer : nbqat.SGD, nbqat.Adam or nbqat.AdamW
            Built over :attr:`params` (``Adam(qat.params, lr=...)``). With LSQ quantizers
            (``config.learnable_scales``) their scales and zero points are a parameter group of
            it: :meth:`quantizer_param_group` (added with its own hyper-parameters if missing).
        max_norm : float or None, default None
            Clip the total 2-norm of the gradients to ``max_norm`` (pass ``qat.config.max_norm``
            for the configured value); None does not clip (``math.inf``: as torch, NaN updates
            for a non-finite norm). The norm is computed and returned either way.
        grad_hook : callable, optional
            ``grad_hook(grads)`` with ``[qat.grads, *LSQ scale/zero-point gradients]``, called
            after backward and before the norm (a data-parallel run's allreduce,
            :func:`nbqat.distributed.allreduce_gradients`); it may change them in place.

        Returns
        -------
        (loss, total_norm) : (float, float)
            The mean pinball loss of this batch (before the update) and the 2-norm of all
            gradients before clipping (``torch.nn.utils.clip_grad_norm_``'s return value).

        Raises
        ------
        ValueError
            On a malformed batch, a negative or NaN ``max_norm``, or an optimizer that does not
            update :attr:`params`; raised before any state changes.

        Notes
        -----
        :func:`nbqat.nn.train_step`: STE gradients first, then the norm over the STE-masked
        gradients (the LSQ gradients included), then the update of every parameter group with
        ``grad_scale = min(max_norm / (total + 1e-6), 1)`` folded in (torch's coefficient,
        always applied: a NaN norm gives NaN updates, as torch's clipping gives NaN grads). The
        gradient buffer keeps the unclipped gradients.
        """
        from nbqat.nn.step import train_step

        return train_step(self, batch, optimizer, max_norm=max_norm, grad_hook=grad_hook)
