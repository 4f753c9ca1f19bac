"""One training step for the forecasters: forward, quantile loss, backward, hook, clip, update.

:func:`train_step` is the step of a float :class:`~nbqat.nn.TemporalFusionTransformer` and of a
:class:`~nbqat.nn.qat.QATTemporalFusionTransformer` alike (the QAT model's own
:meth:`~nbqat.nn.qat.QATTemporalFusionTransformer.train_step` adds the STE masks and the LSQ
parameters). Between backward and the gradient norm it calls ``grad_hook(grads)`` with the
flat gradient buffer first: the place where a data-parallel run sums the gradients over its
processes (:func:`nbqat.distributed.allreduce_gradients`), so that ``clip_grad_norm_`` sees the
global gradient.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

__all__ = ["train_step"]


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
        :class:`~nbqat.nn.qat.QATTemporalFusionTransformer` (its own :meth:`train_step`):
        ``forward(static, historical, future) -> (B, tau, Q)``, ``backward``, ``params``,
        ``grads``, ``zero_grad`` and ``config`` (``quantiles``, ``prediction_horizon``).
    batch : (static (B, m_s), historical (B, k, m_z), future (B, tau, m_x), target (B, tau))
    optimizer : nbqat.SGD, nbqat.Adam or nbqat.AdamW
        Built over ``model.params``.
    max_norm : float or None, default None
        Clip the total 2-norm of the gradients (after ``grad_hook``) to ``max_norm``; None does
        not clip.
    grad_hook : callable, optional
        ``grad_hook(grads)``, called with ``[model.grads, *extra]`` after backward and before
        the norm; it may change the arrays in place (e.g. an allreduce).

    Returns
    -------
    (loss, total_norm) : (float, float)
        The batch's mean pinball loss (before the update) and the 2-norm of the gradients
        before clipping (``torch.nn.utils.clip_grad_norm_``'s return value).

    Raises
    ------
    ValueError
        A malformed batch, a NaN / Inf in the batch, a negative or NaN ``max_norm``, or an
        optimizer over other parameters; raised before any state changes.

    Notes
    -----
    The update folds torch's coefficient ``min(max_norm / (total + 1e-6), 1)``
    (:func:`nbqat.clip.clip_coef`, in the gradients' dtype) into the fused optimizer step.
    """
    if hasattr(model, "train_step"):  # the TFT's QAT model (its output quantizer, its checks)
        return model.train_step(batch, optimizer, max_norm, grad_hook=grad_hook)
    from nbqat.clip import clip_coef, get_total_norm
    from nbqat.nn.loss import quantile_loss, quantile_loss_grad
    from nbqat.nn.phases import lsq_step
    from nbqat.nn.qat import check_step_args

    static, historical, future, target, max_norm = check_step_args(
        model, batch, optimizer, max_norm
    )
    q = getattr(model, "model", model).config.quantiles  # a prepared model wraps the float one
    model.zero_grad()
    out = model.forward(static, historical, future)
    loss = quantile_loss(out, target, q)
    model.backward(quantile_loss_grad(out, target, q))
    learn = model.learnable_quantizers() if hasattr(model, "learnable_quantizers") else []
    grads = [model.grads] + [g for fq in learn for g in (fq.grad_scale, fq.grad_zero_point)]
    if grad_hook is not None:
        grad_hook(grads)
    total = float(get_total_norm(grads if learn else model.grads))
    coef = 1.0
    if max_norm is not None and not math.isinf(max_norm):
        coef = float(clip_coef(total, max_norm, model.grads.dtype))
    optimizer.step(model.grads, grad_scale=coef)
    if learn:
        lsq_step(learn, optimizer, coef)
    return float(loss), total
