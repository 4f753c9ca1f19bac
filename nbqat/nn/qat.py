"""Quantization-aware training (QAT) of the TFT-like forecaster.

:class:`QATTemporalFusionTransformer` wraps a :class:`~nbqat.nn.TemporalFusionTransformer`
(a copy of it: the float model is left untouched and its weights carry over bit for bit) and
plugs :class:`~nbqat.FakeQuantize` objects into the layers' quantization hooks.

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
:meth:`train_step` runs forward -> quantile (pinball) loss -> backward (every FakeQuantize
applies its straight-through-estimator mask, so out-of-range weights and activations get zero
gradient) -> the total 2-norm of the flat gradient buffer (``torch.nn.utils.clip_grad_norm_``'s
norm) -> ONE fused optimizer update in which the clipping coefficient
``min(max_norm / (total + 1e-6), 1)`` is folded into ``grad_scale`` (llm.c's trick: clipping
costs only the norm pass; the gradient buffer itself is not rescaled).
"""

from __future__ import annotations

import json
import math
import os
import zipfile
from dataclasses import asdict, is_dataclass
from typing import Any

import numpy as np

from nbqat._io import atomic_open
from nbqat.clip import get_total_norm
from nbqat.nn.phases import CALIBRATION, QAT, QATPhases, is_learnable, lsq_step

__all__ = ["CheckpointError", "QATTemporalFusionTransformer"]


#: Hook attributes of nbqat's layers that hold quantizers (the CONTRACTS layer-graph section).
_HOOKS = (
    "weight_fake_quant",
    "input_fake_quant",
    "weight_ih_fake_quant",
    "weight_hh_fake_quant",
    "hidden_fake_quant",
    "attention_fake_quant",
)

_FORMAT = "nbqat.qat"
_VERSION = 1
_MANIFEST_KEY = "__nbqat_manifest__"


# ---------------------------------------------------------------------------------------------
# checkpoint files: atomic, validated .npz of a nested state (no pickles)
# ---------------------------------------------------------------------------------------------
class CheckpointError(ValueError):
    """A checkpoint is unreadable, corrupt, foreign, or does not fit the model loading it."""


def _encode(obj: Any, key: str, arrays: dict[str, np.ndarray]) -> Any:
    """Nested state -> JSON tree; arrays and NumPy scalars go to ``arrays``."""
    if isinstance(obj, dict):
        out = {}
        for k, v in obj.items():
            if not isinstance(k, str):
                raise TypeError(f"checkpoint state keys must be str, got {k!r} at {key!r}")
            out[k] = _encode(v, f"{key}/{k}", arrays)
        return {"__dict__": out}
    if isinstance(obj, np.ndarray | np.generic):
        arr = np.asarray(obj)
        if arr.dtype.hasobject:
            raise TypeError(f"object arrays cannot be checkpointed (at {key!r})")
        name = f"a{len(arrays)}"
        arrays[name] = np.array(arr, order="C", copy=True)
        return {"__array__": name, "scalar": isinstance(obj, np.generic)}
    if isinstance(obj, tuple):
        return {"__tuple__": [_encode(v, f"{key}/{i}", arrays) for i, v in enumerate(obj)]}
    if isinstance(obj, list):
        return {"__list__": [_encode(v, f"{key}/{i}", arrays) for i, v in enumerate(obj)]}
    if obj is None or isinstance(obj, bool | int | float | str):
        return {"__value__": obj}
    raise TypeError(
        f"cannot checkpoint a {type(obj).__name__} at {key!r}: only dicts, arrays, NumPy and "
        "Python scalars, strings, None, lists and tuples are stored (no pickles)"
    )


def _decode(node: Any, arrays: dict[str, np.ndarray]) -> Any:
    if not isinstance(node, dict) or not node:
        raise CheckpointError("corrupt checkpoint manifest (unexpected node)")
    if "__dict__" in node:
        return {k: _decode(v, arrays) for k, v in node["__dict__"].items()}
    if "__array__" in node:
        name = node["__array__"]
        if name not in arrays:
            raise CheckpointError(f"corrupt checkpoint: array member {name!r} is missing")
        arr = arrays[name]
        return arr[()] if node.get("scalar") else arr
    if "__tuple__" in node:
        return tuple(_decode(v, arrays) for v in node["__tuple__"])
    if "__list__" in node:
        return [_decode(v, arrays) for v in node["__list__"]]
    if "__value__" in node:
        return node["__value__"]
    raise CheckpointError("corrupt checkpoint manifest (unknown node kind)")


def _save_npz_atomic(path: str, state: dict) -> None:
    """Write ``state`` to ``path`` (exactly that name) via a temporary file and a rename."""
    arrays: dict[str, np.ndarray] = {}
    tree = _encode(state, "", arrays)
    manifest = json.dumps({"format": _FORMAT, "version": _VERSION, "state": tree})
    members = dict(arrays)
    members[_MANIFEST_KEY] = np.frombuffer(manifest.encode("utf-8"), dtype=np.uint8)
    with atomic_open(path, "wb", prefix=".nbqat-ckpt-") as f:
        np.savez(f, **members)  # type: ignore[arg-type]


def _load_npz(path: str) -> dict:
    """Read every member (zip CRCs are checked) and validate the manifest."""
    if not os.path.exists(path):
        raise FileNotFoundError(f"checkpoint {path!r} does not exist")
    try:
        with np.load(path, allow_pickle=False) as npz:
            members = {name: npz[name] for name in npz.files}
    except (zipfile.BadZipFile, EOFError, OSError, ValueError, KeyError) as e:
        raise CheckpointError(
            f"{path!r} is not a readable nbqat checkpoint (a corrupt or truncated file, or not "
            f"an .npz archive): {type(e).__name__}: {e}"
        ) from e
    if _MANIFEST_KEY not in members:
        raise CheckpointError(
            f"{path!r} is an .npz archive but not an nbqat checkpoint (no {_MANIFEST_KEY!r} "
            "member): a foreign file"
        )
    try:
        manifest = json.loads(members.pop(_MANIFEST_KEY).tobytes().decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{path!r} has a corrupt manifest: {e}") from e
    fmt = manifest.get("format") if isinstance(manifest, dict) else None
    if fmt != _FORMAT:
        raise CheckpointError(f"{path!r} is a {fmt!r} file, not a {_FORMAT!r} checkpoint")
    if manifest.get("version") != _VERSION:
        raise CheckpointError(
            f"{path!r} has checkpoint format version {manifest.get('version')!r}; this nbqat "
            f"reads version {_VERSION}"
        )
    return _decode(manifest.get("state"), members)


# ---------------------------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------------------------
def _clone_model(model: Any) -> Any:
    """A new TemporalFusionTransformer with ``model``'s config, dtype and exact weights."""
    new = type(model)(model.config, dtype=model.params.dtype)
    if new.params.shape != model.params.shape:  # pragma: no cover - defensive
        raise ValueError("cannot copy the model: its parameter layout is not reproducible")
    new.params[...] = model.params
    return new


def _clip_coef(total: float, max_norm: float, dtype: Any) -> float:
    """torch's coefficient ``min(max_norm / (total + 1e-6), 1)``, computed as torch does in the
    gradients' dtype (:func:`nbqat.clip.clip_coef`)."""
    from nbqat.clip import clip_coef

    return float(clip_coef(total, max_norm, dtype))


def _check_batch(batch: Any) -> tuple[Any, Any, Any, np.ndarray]:
    if not isinstance(batch, tuple | list) or len(batch) != 4:
        raise ValueError(
            "batch must be a tuple (static, historical, future, target) with target of shape "
            f"(B, prediction_horizon), got {type(batch).__name__}"
            + (f" of length {len(batch)}" if isinstance(batch, tuple | list) else "")
        )
    static, historical, future, target = batch
    if not isinstance(target, np.ndarray) or target.dtype.kind not in "fiu":
        raise ValueError("batch target must be a real NumPy array of shape (B, tau)")
    return static, historical, future, target


def check_step_args(model: Any, batch: Any, optimizer: Any, max_norm: Any) -> tuple:
    """Validate a forecaster training step's batch, optimizer and ``max_norm``.

    Parameters
    ----------
    model : TemporalFusionTransformer or QATTemporalFusionTransformer
    batch : (static (B, m_s), historical, future, target (B, prediction_horizon))
    optimizer : nbqat optimizer
        Must update ``model.params``.
    max_norm : float or None

    Returns
    -------
    (static, historical, future, target, max_norm)
        ``max_norm`` as a float (or None).

    Raises
    ------
    ValueError
        A malformed batch or target, a NaN / Inf in the batch, a negative or NaN ``max_norm``,
        an optimizer over other parameters.
    """
    static, historical, future, target = _check_batch(batch)
    cfg = getattr(model, "model", model).config
    nb = np.shape(static)[0] if np.ndim(static) >= 1 else -1
    if target.shape != (nb, cfg.prediction_horizon):
        raise ValueError(
            f"batch target must have shape (B, prediction_horizon) = "
            f"({nb}, {cfg.prediction_horizon}), got {target.shape}"
        )
    for label, arr in zip(("static", "historical", "future", "target"), batch):
        a = np.asarray(arr)
        if a.dtype.kind == "f" and not np.isfinite(a).all():
            raise ValueError(
                f"batch {label} holds {int(np.count_nonzero(~np.isfinite(a)))} NaN/Inf "
                "value(s): one would turn every parameter into NaN; fix or drop those windows"
            )
    if max_norm is not None:
        max_norm = float(max_norm)
        if not max_norm >= 0:
            raise ValueError(f"max_norm must be >= 0 (or None), got {max_norm}")
    if not callable(getattr(optimizer, "step", None)):
        raise ValueError(f"optimizer must be an nbqat optimizer, got {type(optimizer)}")
    p = getattr(optimizer, "params", None)
    if isinstance(p, np.ndarray) and not np.shares_memory(p, model.params):
        name = "qat" if hasattr(model, "fake_quants") else "model"
        raise ValueError(
            f"optimizer does not update this model's parameters: build it over {name}.params "
            f"(e.g. nbqat.Adam({name}.params, lr=1e-3))"
        )
    return static, historical, future, target, max_norm


# ---------------------------------------------------------------------------------------------
# the QAT model
# ---------------------------------------------------------------------------------------------
class QATTemporalFusionTransformer(QATPhases):
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
        from nbqat.qconfig import QATConfig

        if config is None:
            config = QATConfig()
        if not isinstance(config, QATConfig):
            raise TypeError(f"`config` must be a nbqat.QATConfig, got {type(config).__name__}")
        if qconfig is None:
            qconfig = config.qconfig
        for attr in ("activation", "weight"):
            if not callable(getattr(qconfig, attr, None)):
                raise TypeError(
                    "`qconfig` must be a nbqat.QConfig with callable `activation` and `weight` "
                    f"factories, got {type(qconfig).__name__}"
                )
        self.model = model
        self.config = config
        self.qconfig = qconfig
        self.fake_quants: dict[str, Any] = {}
        self._observe_only: set[str] = set()
        self._out_ctx: Any = None
        self._init_phases()
        self.step = 0
        self.optimizer: Any = None
        self._attach()
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
            for hook in _HOOKS:
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

    def _new_quantizer(self, kind: str) -> Any:
        factory = getattr(self.qconfig, kind)
        fq = factory()
        if self.config.learnable_scales and not is_learnable(fq):
            fq = _to_learnable(factory, kind)
        return fq

    def _attach(self) -> None:
        from nbqat.nn.layers import LSTM, InterpretableMultiHeadAttention, Linear

        head = self.model.output_layer
        skip: set[int] = {id(head)} if not self.config.quantize_output_head else set()
        if not self.config.quantize_attention:
            for _, mod in self.model.named_modules():
                if isinstance(mod, InterpretableMultiHeadAttention):
                    skip.update(id(m) for _, m in mod.named_modules())
        for name, mod in self.model.named_modules():
            if id(mod) in skip:
                continue
            if isinstance(mod, Linear):
                self._put(name, mod, "weight_fake_quant", self._new_quantizer("weight"))
                self._put(name, mod, "input_fake_quant", self._new_quantizer("activation"))
            elif isinstance(mod, LSTM):
                self._put(name, mod, "weight_ih_fake_quant", self._new_quantizer("weight"))
                self._put(name, mod, "weight_hh_fake_quant", self._new_quantizer("weight"))
                self._put(name, mod, "input_fake_quant", self._new_quantizer("activation"))
                self._put(name, mod, "hidden_fake_quant", self._new_quantizer("activation"))
            elif isinstance(mod, InterpretableMultiHeadAttention):
                self._put(name, mod, "attention_fake_quant", self._new_quantizer("activation"))
        self.output_fake_quant = self.qconfig.activation()
        self.fake_quants["output_fake_quant"] = self.output_fake_quant
        if not self.config.quantize_output_head:
            self._observe_only.add("output_fake_quant")

    def _put(self, name: str, mod: Any, hook: str, fq: Any) -> None:
        setattr(mod, hook, fq)
        self.fake_quants[f"{name}.{hook}"] = fq

    # ------------------------------------------------------------------ phases
    def calibrate(self, batches: Any) -> int:
        """Run calibration forwards over ``batches`` until :attr:`is_calibrated`, then end the
        calibration phase.

        Parameters
        ----------
        batches : iterable of tuples
            ``(static, historical, future, ...)``; extra items (a target) are ignored.

        Returns
        -------
        int
            The number of batches used (at most ``config.calibration_batches``).
        """
        if self.phase != CALIBRATION:
            self.enable_calibration()
        used = 0
        for batch in batches:
            if self.calibration_batches_seen >= self.config.calibration_batches:
                break
            self.forward(batch[0], batch[1], batch[2])
            used += 1
        self.disable_calibration()
        return used

    # ------------------------------------------------------------------ buffers
    @property
    def params(self) -> np.ndarray:
        """The flat parameter buffer (the float "shadow" weights), shared with :attr:`model`."""
        return self.model.params

    @property
    def grads(self) -> np.ndarray:
        """The flat gradient buffer (STE-masked gradients after :meth:`backward`)."""
        return self.model.grads

    def zero_grad(self) -> None:
        """Clear the flat gradient buffer (and the LSQ scale/zero-point gradients)."""
        self.model.zero_grad()
        for fq in self._learnable():
            fq.zero_grad()

    # ------------------------------------------------------------------ forward / backward
    def forward(self, static: np.ndarray, historical: np.ndarray, future: np.ndarray) -> np.ndarray:
        """Quantile forecasts through the fake-quantized network.

        Parameters
        ----------
        static : ndarray (B, num_static_features)
            Static inputs, float32 or float64 (cast to the model's dtype).
        historical : ndarray (B, sequence_length, num_unknown_features)
            Observed past inputs of the encoder steps.
        future : ndarray (B, prediction_horizon, num_known_features)
            Known future inputs of the decoder steps.

        Returns
        -------
        ndarray (B, prediction_horizon, num_quantiles)
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
        ofq = self.output_fake_quant
        out = ofq.forward(out)
        self._out_ctx = ofq.ctx
        if self.phase == CALIBRATION:
            self.calibration_batches_seen += 1
        return out

    __call__ = forward

    def predict(self, static: np.ndarray, historical: np.ndarray, future: np.ndarray) -> np.ndarray:
        """:meth:`forward` without updating any observer or the calibration count (evaluation).

        Parameters
        ----------
        static : ndarray (B, num_static_features)
            Static inputs, float32 or float64 (cast to the model's dtype).
        historical : ndarray (B, sequence_length, num_unknown_features)
            Observed past inputs of the encoder steps.
        future : ndarray (B, prediction_horizon, num_known_features)
            Known future inputs of the decoder steps.

        Returns
        -------
        ndarray (B, prediction_horizon, num_quantiles)
            The forecast quantiles with the current qparams and phase, in the model's dtype.
        """
        saved = [(fq, fq.observer_enabled) for fq in self.fake_quants.values()]
        try:
            for fq, _ in saved:
                fq.enable_observer(False)
            out = self.model.forward(static, historical, future)
            return self.output_fake_quant.forward(out)
        finally:
            for fq, flag in saved:
                fq.enable_observer(bool(flag))

    def backward(self, grad_out: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Backpropagate ``grad_out`` (B, tau, Q) through every STE mask into :attr:`grads`.

        Gradients are added (``+=``) to the flat buffer; call :meth:`zero_grad` first.

        Parameters
        ----------
        grad_out : ndarray (B, prediction_horizon, num_quantiles)
            Gradient w.r.t. the output of the last :meth:`forward` (e.g.
            :func:`~nbqat.nn.quantile_loss_grad`).

        Returns
        -------
        dstatic : ndarray (B, num_static_features)
            Gradient w.r.t. ``static``.
        dhistorical : ndarray (B, sequence_length, num_unknown_features)
            Gradient w.r.t. ``historical``.
        dfuture : ndarray (B, prediction_horizon, num_known_features)
            Gradient w.r.t. ``future``. All three in the model's dtype.
        """
        g = self.output_fake_quant.backward(np.asarray(grad_out), self._out_ctx)
        return self.model.backward(np.asarray(g, dtype=self.model.dtype))

    # ------------------------------------------------------------------ training
    def train_step(
        self,
        batch: Any,
        optimizer: Any,
        max_norm: float | None = None,
        *,
        grad_hook: Any = None,
    ) -> tuple[float, float]:
        """One QAT step: forward, pinball loss, backward (STE), clipping, fused update.

        Parameters
        ----------
        batch : tuple
            ``(static (B, m_s), historical (B, k, m_z), future (B, tau, m_x), target (B, tau))``.
        optimizer : nbqat.SGD, nbqat.Adam or nbqat.AdamW
            Built over :attr:`params` (``Adam(qat.params, lr=...)``).
        max_norm : float or None, default None
            Clip the total 2-norm of the gradients to ``max_norm`` (pass ``qat.config.max_norm``
            for the configured value); None (or ``math.inf``) does not clip. The norm is
            computed and returned either way.
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
        The order is the one the Rust original could not implement: STE gradients first, then
        the norm over the STE-masked gradients, then the update with
        ``grad_scale = min(max_norm / (total + 1e-6), 1)`` folded in (torch's coefficient,
        always applied: a NaN norm gives NaN updates, as torch's clipping gives NaN grads). The
        gradient buffer keeps the unclipped gradients. With LSQ (``config.learnable_scales``)
        the scales and zero points are clipped together with the weights and updated by a
        plain SGD step with the optimizer's learning rate.
        """
        from nbqat.nn.loss import quantile_loss, quantile_loss_grad

        cfg = self.model.config
        static, historical, future, target, max_norm = check_step_args(
            self, batch, optimizer, max_norm
        )
        self.zero_grad()
        out = self.forward(static, historical, future)  # (B, tau, Q)
        q = cfg.quantiles
        loss = quantile_loss(out, target, q)
        self.backward(quantile_loss_grad(out, target, q))
        learn = self._learnable()
        grads = [self.grads] + [g for fq in learn for g in (fq.grad_scale, fq.grad_zero_point)]
        if grad_hook is not None:
            grad_hook(grads)
        total = float(get_total_norm(grads if learn else self.grads))
        if max_norm is None or math.isinf(max_norm):
            coef = 1.0
        else:
            coef = _clip_coef(total, max_norm, self.grads.dtype)
        optimizer.step(self.grads, grad_scale=coef)
        if learn:
            lsq_step(learn, optimizer, coef)
        self.step += 1
        self.optimizer = optimizer
        return float(loss), total

    # ------------------------------------------------------------------ int8
    def to_int8(self) -> Any:
        """Convert to an integer-arithmetic model (``Int8TemporalFusionTransformer``).

        Every quantized matmul becomes int8 weights (per-channel scales) x uint8 activation codes
        with int32 accumulation and a float requantization; its outputs match this model's
        (with observers frozen, i.e. the qparams as they are now) within one output
        quantization step (``output_fake_quant.scale``). This model is not changed.

        Raises
        ------
        RuntimeError
            When a quantizer has never observed data (calibrate first).
        """
        from nbqat.nn.int8 import Int8TemporalFusionTransformer

        return Int8TemporalFusionTransformer.from_qat(self)

    # ------------------------------------------------------------------ checkpoints
    def _state(self, optimizer: Any) -> dict:
        quantizers = {}
        for name, fq in self.fake_quants.items():
            quantizers[name] = {
                "state": dict(fq.state_dict()),
                "observer_enabled": bool(fq.observer_enabled),
                "fake_quant_enabled": bool(fq.fake_quant_enabled),
            }
        mcfg = self.model.config
        state: dict[str, Any] = {
            "model": {
                "params": self.params.copy(),
                "dtype": str(self.params.dtype),
                "config": asdict(mcfg)
                if is_dataclass(mcfg) and not isinstance(mcfg, type)
                else None,
            },
            "qat": {
                "phase": self.phase,
                "observers_frozen": bool(self.observers_frozen),
                "calibration_batches_seen": int(self.calibration_batches_seen),
                "calibration_ended": bool(self._calibration_ended),
                "step": int(self.step),
                "config": _config_scalars(self.config),
            },
            "quantizers": quantizers,
            "optimizer": None,
        }
        if optimizer is not None:
            state["optimizer"] = {
                "class": type(optimizer).__name__,
                "state": dict(optimizer.state_dict()),
            }
        return state

    def save(self, path: str | os.PathLike, optimizer: Any = None) -> None:
        """Write the whole QAT state to ``path`` as an ``.npz`` archive, atomically.

        Stored: the flat float weights, every quantizer's ``state_dict`` (observer statistics,
        scale, zero point) and flags, the phase, calibration count and step, and the optimizer's
        ``state_dict`` (step count, moment buffers, hyper-parameters). No pickles.

        Parameters
        ----------
        path : str or os.PathLike
            Destination, used exactly as given. The archive is written to a temporary file in
            the same directory, fsynced, then renamed over ``path`` (an interrupted save never
            leaves a partial file under that name).
        optimizer : optimizer, optional
            Default: the optimizer of the last :meth:`train_step` (None: no optimizer state).
        """
        opt = optimizer if optimizer is not None else self.optimizer
        _save_npz_atomic(os.fspath(path), self._state(opt))

    def load(self, path: str | os.PathLike, optimizer: Any = None) -> None:
        """Restore a state written by :meth:`save` into this model (and ``optimizer``).

        After ``load``, the next :meth:`train_step` is bit for bit the one the saved model
        would have taken.

        Parameters
        ----------
        path : str or os.PathLike
            A checkpoint written by :meth:`save`.
        optimizer : optimizer, optional
            Receives the saved optimizer state (default: the optimizer of the last
            :meth:`train_step`, if any). Must be of the saved class and over :attr:`params`.

        Raises
        ------
        FileNotFoundError
            When ``path`` does not exist.
        CheckpointError
            (a ValueError) for a corrupt, truncated or foreign file, another format version, or
            a checkpoint of a different network (config, parameter count or dtype, quantizer
            set) or optimizer class. Nothing is changed then.
        """
        path = os.fspath(path)
        st = _load_npz(path)
        try:
            model_st, qat_st, quant_st = st["model"], st["qat"], st["quantizers"]
            params = model_st["params"]
            opt_st = st.get("optimizer")
        except (KeyError, TypeError) as e:
            raise CheckpointError(f"{path!r}: corrupt checkpoint (missing {e})") from e
        mcfg = self.model.config
        own_cfg = asdict(mcfg) if is_dataclass(mcfg) and not isinstance(mcfg, type) else None
        if own_cfg is not None and model_st.get("config") is not None:
            saved_cfg = model_st["config"]
            diff = {
                k: (saved_cfg.get(k), v)
                for k, v in own_cfg.items()
                if _norm(saved_cfg.get(k)) != _norm(v)
            }
            if diff:
                raise CheckpointError(
                    f"{path!r} holds a different network: (saved, this model) = {diff}"
                )
        if (
            not isinstance(params, np.ndarray)
            or params.shape != self.params.shape
            or params.dtype != self.params.dtype
        ):
            raise CheckpointError(
                f"{path!r}: parameters {getattr(params, 'dtype', '?')}"
                f"{getattr(params, 'shape', '?')} do not fit this model's "
                f"{self.params.dtype}{self.params.shape}"
            )
        if set(quant_st) != set(self.fake_quants):
            missing = sorted(set(self.fake_quants) - set(quant_st))
            extra = sorted(set(quant_st) - set(self.fake_quants))
            raise CheckpointError(
                f"{path!r} has another set of quantizers (QATConfig differs?): missing "
                f"{missing[:5]}, unexpected {extra[:5]}"
            )
        opt = optimizer if optimizer is not None else self.optimizer
        if opt is not None and opt_st is not None and opt_st.get("class") != type(opt).__name__:
            raise CheckpointError(
                f"{path!r} holds {opt_st.get('class')} state, the optimizer given is a "
                f"{type(opt).__name__}"
            )
        snapshot = _copy_state(self._state(opt))
        try:
            self._restore(params, qat_st, quant_st, opt, opt_st)
        except Exception as e:
            self._restore(
                snapshot["model"]["params"],
                snapshot["qat"],
                snapshot["quantizers"],
                opt,
                snapshot["optimizer"],
            )
            raise CheckpointError(f"{path!r} does not fit this model: {e}") from e
        if opt is not None:
            self.optimizer = opt

    def _restore(self, params: Any, qat_st: dict, quant_st: dict, opt: Any, opt_st: Any) -> None:
        self.params[...] = params
        for name, fq in self.fake_quants.items():
            entry = quant_st[name]
            fq.load_state_dict(entry["state"])
            fq.enable_observer(bool(entry["observer_enabled"]))
            fq.enable_fake_quant(bool(entry["fake_quant_enabled"]))
        phase = qat_st["phase"]
        if phase not in (CALIBRATION, QAT):
            raise CheckpointError(f"unknown phase {phase!r}")
        self.phase = phase
        self.observers_frozen = bool(qat_st["observers_frozen"])
        self.calibration_batches_seen = int(qat_st["calibration_batches_seen"])
        self._calibration_ended = bool(qat_st["calibration_ended"])
        self.step = int(qat_st["step"])
        if opt is not None and opt_st is not None:
            opt.load_state_dict(opt_st["state"])

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
        from nbqat.qconfig import QATConfig

        path = os.fspath(path)
        st = _load_npz(path)
        try:
            mcfg = dict(st["model"]["config"])
            dtype = np.dtype(st["model"]["dtype"])
            saved = dict(st["qat"]["config"])
        except (KeyError, TypeError, ValueError) as e:
            raise CheckpointError(f"{path!r}: corrupt checkpoint ({e})") from e
        if "quantiles" in mcfg:
            mcfg["quantiles"] = tuple(mcfg["quantiles"])
        model = TemporalFusionTransformer(TFTConfig(**mcfg), dtype=dtype)
        if config is None:
            config = QATConfig(**saved)
        qat = cls(model, qconfig=qconfig, config=config)
        qat.load(path)
        return qat


def _norm(v: Any) -> Any:
    return list(v) if isinstance(v, tuple | list) else v


def _config_scalars(config: Any) -> dict:
    """The JSON-able fields of a QATConfig (everything but the qconfig factories)."""
    out = {}
    for k, v in vars(config).items():
        if v is None or isinstance(v, bool | int | float | str):
            out[k] = v
    return out


def _copy_state(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {k: _copy_state(v) for k, v in obj.items()}
    if isinstance(obj, np.ndarray):
        return obj.copy()
    if isinstance(obj, list):
        return [_copy_state(v) for v in obj]
    if isinstance(obj, tuple):
        return tuple(_copy_state(v) for v in obj)
    return obj


def _to_learnable(factory: Any, kind: str) -> Any:
    """A LearnableFakeQuantize with the observer and range of a FakeQuantize factory."""
    from nbqat.fake_quantize import LearnableFakeQuantize

    kw = getattr(getattr(factory, "p", None), "keywords", None)
    if kw is None:
        raise TypeError(
            f"QATConfig.learnable_scales needs the qconfig's {kind} factory to be made with "
            "FakeQuantize.with_args(...) (or to build LearnableFakeQuantize modules)"
        )
    return LearnableFakeQuantize(**dict(kw))
