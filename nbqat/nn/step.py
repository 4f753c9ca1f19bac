"""One training step for the forecasters: forward, quantile loss, backward, hook, clip, update.

:func:`train_step` is the one step of a float forecaster
(:class:`~nbqat.nn.TemporalFusionTransformer`,
:class:`~nbqat.nn.LSTMForecaster`) and of every QAT model
(:class:`~nbqat.nn.qat.QATTemporalFusionTransformer`, a :func:`~nbqat.nn.prepare_qat` model):
in a QAT model the backward pass applies the STE masks, and its LSQ scales / zero points (if
any) are a parameter group of the same optimizer
(:meth:`~nbqat.nn.phases.QATPhases.quantizer_param_group`; added with the optimizer's
hyper-parameters when missing). Between
backward and the gradient norm it calls ``grad_hook(grads)`` with the flat gradient buffer
first: the place where a data-parallel run sums the gradients over its processes
(:func:`nbqat.distributed.allreduce_gradients`), so that ``clip_grad_norm_`` sees the global
gradient.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from nbqat.clip import clip_coef, get_total_norm
from nbqat.nn.loss import quantile_loss, quantile_loss_grad
from nbqat.nn.phases import QATPhases

__all__ = ["check_step_args", "float_network", "loss_weight", "train_step"]


def train_step(
    model: Any,
    batch: Sequence[np.ndarray],
    optimizer: Any,
    *,
    max_norm: float | None = None,
    grad_hook: Callable[[list[np.ndarray]], None] | None = None,
) -> tuple[float, float]:
    """forward -> pinball loss -> backward -> ``grad_hook`` -> ``clip_grad_norm_`` -> update.

    Parameters
    ----------
    model : forecaster
        A :class:`~nbqat.nn.TemporalFusionTransformer`, an
        :class:`~nbqat.nn.LSTMForecaster`, their :func:`~nbqat.nn.prepare_qat` models, or a
        :class:`~nbqat.nn.qat.QATTemporalFusionTransformer`:
        ``forward(static, historical, future) -> (B, tau, Q)``, ``backward``, ``params``,
        ``grads``, ``zero_grad`` and ``config`` (``quantiles``, ``prediction_horizon``). A QAT
        model counts the step (:meth:`~nbqat.nn.phases.QATPhases.count_step`).
    batch : (static (B, m_s), historical (B, k, m_z), future (B, tau, m_x), target (B, tau)[,
        mask (B, tau) bool])
        With a fifth item, the target entries the loss and its gradient count (False: no
        weight, e.g. a step ``fill_gaps`` invented: :meth:`nbqat.data.SplitWindows.scored`);
        the mean runs over the kept ones (:func:`nbqat.nn.quantile_loss`).
    optimizer : nbqat.SGD, nbqat.Adam or nbqat.AdamW
        Built over ``model.params``.
    max_norm : float or None, default None
        Clip the total 2-norm of the gradients (after ``grad_hook``) to ``max_norm``; None does
        not clip. ``math.inf`` is torch's ``clip_grad_norm_(max_norm=inf)``: no change for a
        finite norm, NaN updates for a NaN / Inf one (None leaves such gradients as they are).
    grad_hook : callable, optional
        ``grad_hook(grads)``, called with ``[model.grads, *LSQ gradients]`` after backward and
        before the norm; it may change the arrays in place (e.g. an allreduce).

    Returns
    -------
    (loss, total_norm) : (float, float)
        The batch's mean pinball loss (before the update) and the 2-norm of the gradients
        before clipping (``torch.nn.utils.clip_grad_norm_``'s return value).

    Raises
    ------
    ValueError
        A malformed batch, a NaN / Inf in the batch, a negative or NaN ``max_norm``, an
        optimizer over other parameters or one its ``check_step`` refuses (``opt.lr =
        float("inf")``, read-only parameters); raised before any state changes.

    Notes
    -----
    The update folds torch's coefficient ``min(max_norm / (total + 1e-6), 1)``
    (:func:`nbqat.clip.clip_coef`, in the gradients' dtype) into the fused optimizer step.
    """
    static, historical, future, target, max_norm = check_step_args(
        model, batch, optimizer, max_norm
    )
    q = float_network(model).config.quantiles
    learn = _lsq_group(model, optimizer)
    model.zero_grad()
    mask = batch[4] if len(batch) == 5 else None  # checked by check_step_args
    out = model.forward(static, historical, future)
    loss = quantile_loss(out, target, q, mask)
    model.backward(quantile_loss_grad(out, target, q, mask))
    grads = [model.grads] + [g for fq in learn for g in (fq.grad_scale, fq.grad_zero_point)]
    if grad_hook is not None:
        grad_hook(grads)
    total = float(get_total_norm(grads if learn else model.grads))
    coef = 1.0  # max_norm=inf: 1 for a finite norm, NaN for a non-finite one (torch's inf / inf)
    if max_norm is not None:
        coef = float(clip_coef(total, max_norm, model.grads.dtype))
    optimizer.step(model.grads, grad_scale=coef)  # every parameter group, one coefficient
    if isinstance(model, QATPhases):  # a QAT model: its step count and optimizer (checkpoints)
        model.count_step(optimizer)
    return float(loss), total


def loss_weight(batch: Sequence[Any]) -> int:
    """What :func:`train_step`'s mean loss of ``batch`` averages over, per quantile and step:
    its rows, or with a mask (a fifth item) its True entries; a data-parallel step weights each
    rank's gradient by its share (:func:`nbqat.distributed.data_parallel_step`).

    Parameters
    ----------
    batch : (static, historical, future, target[, mask])

    Returns
    -------
    int
        ``len(static)`` rows (every step of a row counts), or ``mask.sum()``.
    """
    if len(batch) == 5:
        return int(np.count_nonzero(batch[4]))
    return int(np.shape(batch[0])[0])


def float_network(model: Any) -> Any:
    """The float forecaster of ``model``: ``model`` itself, or the one a QAT model wraps.

    Parameters
    ----------
    model : forecaster or QAT model

    Returns
    -------
    forecaster
        Its ``config`` holds ``quantiles`` and ``prediction_horizon``.
    """
    return model.model if isinstance(model, QATPhases) else model


def _lsq_group(model: Any, optimizer: Any) -> list[Any]:
    """The learnable quantizers of ``model``; their parameter group added to ``optimizer``
    (with its own hyper-parameters) when it has none yet."""
    learn = model.learnable_quantizers() if isinstance(model, QATPhases) else []
    if learn:
        src = model.quantizer_parameters()
        if not callable(getattr(optimizer, "add_param_group", None)):
            raise ValueError(
                "learnable quantizers (LSQ) need an nbqat optimizer with parameter groups "
                f"(nbqat.SGD/Adam/AdamW), got {type(optimizer).__name__}"
            )
        if not optimizer.has_param_group(src):
            optimizer.add_param_group({"params": src})
    return learn


def _check_batch(batch: Any) -> tuple[Any, Any, Any, np.ndarray]:
    if not isinstance(batch, tuple | list) or len(batch) not in (4, 5):
        raise ValueError(
            "batch must be a tuple (static, historical, future, target[, mask]) with target "
            f"(and mask) of shape (B, prediction_horizon), got {type(batch).__name__}"
            + (f" of length {len(batch)}" if isinstance(batch, tuple | list) else "")
        )
    static, historical, future, target = batch[:4]
    if not isinstance(target, np.ndarray) or target.dtype.kind not in "fiu":
        raise ValueError("batch target must be a real NumPy array of shape (B, tau)")
    mask = batch[4] if len(batch) == 5 else None
    if mask is not None and (
        not isinstance(mask, np.ndarray) or mask.dtype != bool or mask.shape != target.shape
    ):
        raise ValueError(
            f"batch mask must be a bool NumPy array of the target's shape {target.shape}, got "
            f"{getattr(mask, 'dtype', type(mask).__name__)} {getattr(mask, 'shape', '')}; "
            "e.g. SplitWindows.scored(idx)"
        )
    return static, historical, future, target


def check_step_args(model: Any, batch: Any, optimizer: Any, max_norm: Any) -> tuple:
    """Validate a forecaster training step's batch, optimizer and ``max_norm``.

    Parameters
    ----------
    model : TemporalFusionTransformer or QATTemporalFusionTransformer
    batch : (static (B, m_s), historical, future, target (B, prediction_horizon)[, mask])
        ``mask``: bool, the target's shape (see :func:`train_step`).
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
        an optimizer over other parameters; what the optimizer's ``check_step`` refuses (a
        hyper-parameter set to an invalid value, read-only parameters).
    """
    static, historical, future, target = _check_batch(batch)
    cfg = float_network(model).config
    nb = np.shape(static)[0] if np.ndim(static) >= 1 else -1
    if target.shape != (nb, cfg.prediction_horizon):
        raise ValueError(
            f"batch target must have shape (B, prediction_horizon) = "
            f"({nb}, {cfg.prediction_horizon}), got {target.shape}"
        )
    for label, arr in zip(("static", "historical", "future", "target"), batch[:4]):
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
        name = "qat" if isinstance(model, QATPhases) else "model"
        raise ValueError(
            f"optimizer does not update this model's parameters: build it over {name}.params "
            f"(e.g. nbqat.Adam({name}.params, lr=1e-3))"
        )
    check = getattr(optimizer, "check_step", None)
    if callable(check):  # its hyper-parameters (opt.lr = ...), params, grads: before the forward
        check(model.grads)  # pass updates a QAT model's observers
    return static, historical, future, target, max_norm
