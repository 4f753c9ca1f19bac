"""The main job's training recipe: learning-rate schedule, parameter groups, the linear skip's
ridge initialisation, and the fair float / PTQ / QAT comparison rows.

* :func:`lr_at` -- linear warm-up, then cosine decay (Loshchilov & Hutter, "SGDR", 2017;
  Goyal et al. 2017 for the warm-up), a pure function of the global step, so a resumed run
  continues the schedule exactly.
* :class:`GroupedAdamW` -- ``torch.optim.AdamW`` with two parameter groups over one flat
  buffer: the network body, and the linear skip (the last parameters of the buffer) at a
  learning rate ``skip_lr_scale`` times smaller. Adam's step is invariant to the gradient's
  scale, so a 1950-input skip moved at the body's rate would undo its ridge start within a few
  steps; a group learning rate is torch's answer (``param_groups``). The main job's default
  ``skip_lr_scale`` is 0.1 (validation P50 q-risk on the shipped data, seed 0: 0.1536 at 1/300,
  0.1515 at 0.1, 0.1565 at 0.3, 0.1656 at 1): slow enough to keep the ridge start, fast enough
  that the skip's Q output rows, which start equal, become a linear quantile regression
  trained with the body on the pinball loss.
* :func:`init_linear_skip_from_ridge` -- the skip starts as the ridge baseline
  (:class:`nbqat.train.baselines.RidgeBaseline`), the output layer at zero, so the TFT starts
  exactly
  at the linear forecast and learns what it misses (a residual hybrid, as in TiDE / DLinear).
* :class:`AveragedOptimizer` and :func:`swap_average` -- an exponential moving average
  (Polyak averaging) of the float weights, kept by the optimizer (so the checkpoint carries
  it) and evaluated, early-stopped and kept as the model (one set of weights: it stays
  quantizable).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from nbqat._jit import threads_for
from nbqat._validate import check_int
from nbqat.kernels.optim_cpu import lerp_
from nbqat.optim_groups import inner_attribute, load_together

__all__ = [
    "AveragedOptimizer",
    "GroupedAdamW",
    "baseline_comparisons",
    "fair_rows",
    "finetune_float",
    "init_linear_skip_from_ridge",
    "lr_at",
    "skip_offset",
    "swap_average",
]


def lr_at(step: int, total: int, base_lr: float, warmup: int = 0) -> float:
    """The learning rate of optimizer step ``step`` (0-based) of ``total``.

    ``base_lr * (step + 1) / warmup`` for ``step < warmup``, then
    ``base_lr * (1 + cos(pi * (step - warmup) / (total - warmup))) / 2`` (cosine decay to 0
    at ``step = total``).

    Parameters
    ----------
    step, total, warmup : int
        ``0 <= warmup``; ``total >= 1``; a step past ``total`` gets the final (smallest) rate.
    base_lr : float
        The peak rate.

    Returns
    -------
    float
    """
    if step < warmup:
        return base_lr * (step + 1) / warmup
    span = max(1, total - warmup)
    frac = min(1.0, (step - warmup) / span)
    return base_lr * 0.5 * (1.0 + math.cos(math.pi * frac))


def skip_offset(model: Any) -> int:
    """Index in the flat buffer where the linear skip's parameters start (its size if none).

    Raises
    ------
    ValueError
        When the skip's parameters are not the contiguous tail of the buffer.
    """
    n = int(model.params.size)
    skip = getattr(model, "linear_skip", None)
    if skip is None:
        return n
    size = skip.weight.size + (skip.bias.size if skip.has_bias else 0)
    off = n - size
    params = np.asarray(model.params) if isinstance(model.params, np.ndarray) else None
    if params is not None and not np.shares_memory(params[off:], skip.weight):
        raise ValueError("the linear skip's parameters are not the tail of the flat buffer")
    return off


class GroupedAdamW:
    """AdamW over a flat buffer in two groups: ``params[:offset]`` and ``params[offset:]``.

    Parameters
    ----------
    params : (n,) float array (NumPy or CUDA)
        The flat parameter buffer (updated in place).
    lr : float
        The body's learning rate; the second group's is ``lr * skip_lr_scale``. Assigning
        :attr:`lr` sets both (the schedule).
    offset : int
        Start of the second group (``n`` for no second group).
    weight_decay : float, default 0
        Decoupled weight decay of the body (the skip group has none: it starts at the ridge
        solution, which already carries its own penalty).
    skip_lr_scale : float, default 1.0

    Notes
    -----
    Each group is a :class:`nbqat.optim.AdamW` over a view of the buffer; ``step(grads,
    grad_scale)`` passes the matching view of ``grads`` and the same clip coefficient to each,
    which is exactly torch's AdamW with two ``param_groups`` after one ``clip_grad_norm_`` over
    all parameters.
    """

    def __init__(
        self,
        params: Any,
        lr: float,
        offset: int,
        weight_decay: float = 0.0,
        skip_lr_scale: float = 1.0,
    ) -> None:
        from nbqat.optim import AdamW

        n = int(params.shape[0])
        if not 0 < offset <= n:
            raise ValueError(f"offset must be in (0, {n}], got {offset}")
        if not skip_lr_scale > 0:
            raise ValueError(f"skip_lr_scale must be > 0, got {skip_lr_scale!r}")
        self.params = params
        self.offset = int(offset)
        self.skip_lr_scale = float(skip_lr_scale)
        self.body = AdamW(params[:offset], lr=lr, weight_decay=weight_decay)
        self.skip = (
            AdamW(params[offset:], lr=lr * skip_lr_scale, weight_decay=0.0) if offset < n else None
        )
        self._lr = float(lr)

    @property
    def lr(self) -> float:
        return self._lr

    @lr.setter
    def lr(self, value: float) -> None:
        self._lr = float(value)
        self.body.lr = self._lr
        if self.skip is not None:
            self.skip.lr = self._lr * self.skip_lr_scale

    @property
    def step_count(self) -> int:
        return self.body.step_count

    def check_step(self, grads: Any, grad_scale: float = 1.0) -> list:
        """Both groups' :meth:`nbqat.optim.AdamW.check_step`; returns ``[(AdamW, grads view)]``
        (ValueError / TypeError as :meth:`nbqat.optim.AdamW.step`)."""
        n = tuple(self.params.shape)
        if tuple(getattr(grads, "shape", ())) != n:
            raise ValueError(f"grads must have the parameters' shape {n}, got {np.shape(grads)}")
        parts = [(opt, grads[: self.offset] if k == "body" else grads[self.offset :])
                 for k, opt in self._groups().items()]  # fmt: skip
        for opt, g in parts:
            opt.check_step(g, grad_scale)
        return parts

    def step(self, grads: Any, grad_scale: float = 1.0) -> None:
        """One update of both groups with the gradient views of ``grads`` (n,), both checked
        (:meth:`check_step`) before either is updated."""
        for opt, g in self.check_step(grads, grad_scale):
            opt.step(g, grad_scale=grad_scale)

    def _groups(self) -> dict[str, Any]:
        """The AdamW of each group by its state key: ``body``, then ``skip`` when there is one."""
        return {"body": self.body, **({} if self.skip is None else {"skip": self.skip})}

    def state_dict(self) -> dict:
        """``{"body": ..., "skip": ...}`` (each an AdamW state_dict) and the current lr."""
        return {**{k: opt.state_dict() for k, opt in self._groups().items()}, "lr": self._lr}

    def load_state_dict(self, state: dict) -> None:
        """Restore what :meth:`state_dict` returned: both groups and lr, or none (ValueError)."""
        parts = {k: (opt, state.get(k)) for k, opt in self._groups().items()}
        load_together(parts, "GroupedAdamW state_dict", lambda: setattr(self, "lr", state["lr"]))


def init_linear_skip_from_ridge(model: Any, ridge: Any) -> None:
    """Start ``model``'s linear skip as the ridge baseline and its output layer at zero.

    ``linear_skip.weight[t * Q + j] = coef[:, t]`` and ``linear_skip.bias[t * Q + j] =
    intercept[t] + residual_quantiles[t, j]``, so the skip alone outputs the ridge quantile
    forecast (B, tau, Q); with ``output_layer`` zeroed the model's output is exactly that.

    Parameters
    ----------
    model : TemporalFusionTransformer
        With ``config.linear_skip``.
    ridge : RidgeBaseline
        Fitted on the same window layout.

    Raises
    ------
    ValueError
        When the model has no linear skip or the sizes differ.
    """
    skip = getattr(model, "linear_skip", None)
    if skip is None:
        raise ValueError("the model has no linear skip (TFTConfig.linear_skip=False)")
    if ridge.coef is None or ridge.coef.shape[0] != skip.in_features:
        raise ValueError("the ridge baseline is unfitted or was fitted on another window layout")
    nq = model.config.num_quantiles
    if ridge.residual_quantiles.shape[1] != nq:
        raise ValueError("the ridge baseline has another number of quantiles than the model")
    skip.weight[...] = np.repeat(ridge.coef.T, nq, axis=0)
    skip.bias[...] = (ridge.intercept[:, None] + ridge.residual_quantiles).reshape(-1)
    model.output_layer.weight[...] = 0
    model.output_layer.bias[...] = 0


def finetune_float(
    model: Any,
    optimizer: Any,
    batches: Any,
    quantiles: Any,
    max_norm: float | None,
    lr_fn: Any,
    dropout_seed: Any = None,
) -> int:
    """Train a float model over ``batches`` exactly as QAT trains (the ``float_finetuned`` row).

    Each step is :func:`nbqat.nn.train_step` (``zero_grad``, forward, quantile loss, backward,
    ``clip_grad_norm_``'s coefficient ``min(max_norm / (norm + 1e-6), 1)`` folded into the
    update) with ``optimizer.lr = lr_fn(step)`` -- the QAT phase's loop without the fake
    quantization, so that QAT int8 is compared with a float model trained equally long.

    Parameters
    ----------
    model : TemporalFusionTransformer
    optimizer : GroupedAdamW or an nbqat optimizer over ``model.params``
    batches : iterable of (static, historical, future, target[, mask])
    quantiles : sequence of float
        Must be the model's own (``model.config.quantiles``).
    max_norm : float or None
        None: no clipping.
    lr_fn : callable int -> float
    dropout_seed : callable int -> tuple of int, optional
        The dropout mask seed of each step (training mode); None leaves the dropout mode as
        it is.

    Returns
    -------
    int
        The number of steps taken.
    """
    from nbqat.nn import set_dropout
    from nbqat.nn.step import train_step

    if tuple(quantiles) != tuple(model.config.quantiles):
        raise ValueError(
            f"quantiles {tuple(quantiles)} are not the model's {tuple(model.config.quantiles)}"
        )
    steps = 0
    for batch in batches:
        optimizer.lr = lr_fn(steps)
        if dropout_seed is not None:
            set_dropout(model, True, dropout_seed(steps))
        train_step(model, tuple(batch), optimizer, max_norm=max_norm)  # the main job's step
        steps += 1
    return steps


def fair_rows(run: Any, build_model: Any, make_optimizer: Any) -> dict:
    """The ``float_finetuned`` and ``ptq_int8`` rows of the main job's fair quality table.

    * ``float_finetuned``: the best float weights trained on for exactly the QAT phase's steps
      (its batches ``run.qat_batches()``, its cosine schedule from ``qat_lr``, its dropout
      masks ``(seed, 3, step)``, its clipping) by :func:`finetune_float`, with no quantization;
    * ``ptq_int8``: the best float weights calibrated on the calibration phase's batches with
      the run's QAT configuration (``run.qat_config()``: its observer) and converted
      (``to_int8()``) without any QAT step.

    Parameters
    ----------
    run : nbqat.train.loop.Run
        The finished run (``cfg``, ``w``, ``best_params``, the batch generators, ``q_risk``).
    build_model : callable () -> TemporalFusionTransformer
        A fresh model of the run's configuration.
    make_optimizer : callable model -> optimizer
        The QAT phase's optimizer over a model.

    Returns
    -------
    dict
        ``{"float_finetuned": q-risks, "ptq_int8": q-risks}`` (P10/P50/P90 on the test split).
    """
    from nbqat.nn import set_dropout

    cfg, w, test = run.cfg, run.w, run.w.test
    out = {}
    ft = build_model()
    ft.params[...] = run.best_params
    total = cfg.qat_epochs * run.steps_per_epoch()
    finetune_float(
        ft,
        make_optimizer(ft),
        run.qat_batches(),
        w.quantiles,
        cfg.max_norm,
        lambda i: lr_at(i, total, cfg.qat_lr),
        dropout_seed=lambda i: (cfg.seed, 3, i),  # the QAT phase's masks
    )
    set_dropout(ft, False)
    out["float_finetuned"] = run.q_risk(ft.forward, test)
    out["ptq_int8"] = ptq_row(run, build_model)
    return out


def ptq_row(run: Any, build_model: Any) -> dict:
    """q-risks (test split) of the best float weights calibrated on the calibration batches
    with ``run.qat_config()`` and converted (``to_int8()``) without any QAT step.

    Parameters
    ----------
    run : nbqat.train.loop.Run
    build_model : callable () -> forecaster

    Returns
    -------
    dict
        P10/P50/P90.
    """
    from nbqat.nn.forecasters import prepare_forecaster

    test = run.w.test
    base = build_model()
    base.params[...] = run.best_params
    ptq = prepare_forecaster(base, run.qat_config(), inplace=True)  # the TFT's or the LSTM's
    ptq.enable_calibration()
    for s, h, f, _ in run.calibration_batches():
        ptq.forward(s, h, f)
    ptq.disable_calibration()
    int8 = ptq.to_int8()
    return run.q_risk(int8.forward, test)


def baseline_comparisons(p50: dict) -> dict:
    """Relative P50 improvements of each model over both baselines, and the fair-table diffs.

    Parameters
    ----------
    p50 : dict
        P50 q-risk by row name (``seasonal_naive``, ``ridge``, ``float``, ``float_finetuned``,
        ``qat_fake_quant``, ``int8``, ``ptq_int8``).

    Returns
    -------
    dict
        ``<model>_vs_<naive|ridge>_P50_improvement`` = ``1 - model / baseline`` (positive:
        better; ``float_vs_naive`` is left to the caller's legacy key),
        ``qat_int8_vs_float_finetuned_P50_relative_diff``,
        ``ptq_int8_vs_float_finetuned_P50_relative_diff`` (``model / float_finetuned - 1``) and
        ``qat_recovers_over_ptq_P50`` (``1 - qat_int8 / ptq_int8``).
    """
    out = {}
    for m in ("float", "float_finetuned", "qat_fake_quant", "int8", "ptq_int8"):
        for b in ("seasonal_naive", "ridge"):
            key = "naive" if b == "seasonal_naive" else b
            if not (m == "float" and b == "seasonal_naive"):  # that one has its legacy name
                out[f"{m}_vs_{key}_P50_improvement"] = 1.0 - p50[m] / p50[b]
    out["qat_int8_vs_float_finetuned_P50_relative_diff"] = p50["int8"] / p50["float_finetuned"] - 1
    out["ptq_int8_vs_float_finetuned_P50_relative_diff"] = (
        p50["ptq_int8"] / p50["float_finetuned"] - 1
    )
    out["qat_recovers_over_ptq_P50"] = 1.0 - p50["int8"] / p50["ptq_int8"]
    return out


class AveragedOptimizer:
    """An optimizer that also keeps an exponential moving average (EMA) of its parameters.

    After every step of ``optimizer``: ``average = params`` on the first update, then
    ``average = lerp(average, params, 1 - decay)`` (torch's ``lerp_``: one rounding) -- exactly
    ``torch.optim.swa_utils.AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(decay))``
    with ``update_parameters(model)`` after each ``optimizer.step()`` (Polyak & Juditsky,
    "Acceleration of stochastic approximation by averaging", 1992; the EMA form of Tarvainen &
    Valpola 2017). The average is part of :meth:`state_dict`, so a resumed run continues it
    exactly; :func:`swap_average` exchanges it with the live parameters for evaluation.

    Parameters
    ----------
    optimizer : GroupedAdamW, nbqat.optim.AdamW, ... (``params``, ``lr``, ``step``,
        ``state_dict``, ``load_state_dict``)
        Its ``params`` must be a host (NumPy) float buffer, updated in place by ``step``.
    decay : float
        In [0, 1): the weight of the old average (0 keeps the last parameters).

    Raises
    ------
    ValueError
        On a ``decay`` outside [0, 1) or an optimizer whose ``params`` is not a NumPy array.

    Attributes
    ----------
    average : ndarray (n,) or None
        The EMA (``params``' dtype), None before the first step.
    n_averaged : int
        The number of updates so far (torch's ``AveragedModel.n_averaged``).
    """

    def __init__(self, optimizer: Any, decay: float) -> None:
        decay = float(decay)
        if not 0.0 <= decay < 1.0:
            raise ValueError(f"decay must be in [0, 1), got {decay!r} (e.g. --ema-decay 0.995)")
        if not isinstance(getattr(optimizer, "params", None), np.ndarray):
            raise ValueError("AveragedOptimizer needs an optimizer over a NumPy parameter buffer")
        self.inner = optimizer
        self.decay = decay
        self.average: np.ndarray | None = None
        self.n_averaged = 0

    @property
    def params(self) -> np.ndarray:
        return self.inner.params

    lr = inner_attribute("lr")

    def __getattr__(self, name: str) -> Any:  # step_count, upload_grads, ... of the inner one
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)

    def step(self, grads: Any, grad_scale: float = 1.0, **kw: Any) -> None:
        """``optimizer.step(grads, grad_scale, **kw)``, then one EMA update."""
        self.inner.step(grads, grad_scale=grad_scale, **kw)
        self.update()

    def update(self) -> None:
        """One EMA update from the current ``params`` (torch's ``update_parameters``)."""
        p = self.inner.params
        if self.average is None:
            self.average = p.copy()
        else:
            w = p.dtype.type(1.0 - self.decay)  # torch's lerp weight, in the params' dtype
            with threads_for(p.shape[0]):  # average.lerp_(p, w): one rounding, as torch's
                lerp_(self.average, p, w, p.dtype.type(1.0) - w)
        self.n_averaged += 1

    def state_dict(self) -> dict:
        """``{"inner": optimizer.state_dict(), "n_averaged": n, "average": (n,) array}``."""
        out: dict[str, Any] = {"inner": self.inner.state_dict(), "n_averaged": self.n_averaged}
        if self.average is not None:
            out["average"] = self.average.copy()
        return out

    def load_state_dict(self, state: dict) -> None:
        """Restore :meth:`state_dict`; a plain optimizer state (no ``"inner"``) restarts the EMA.

        Raises
        ------
        ValueError, TypeError
            A saved average of another size than the buffer; no integer ``n_averaged``.
        """
        if "inner" not in state:  # a checkpoint written without the average
            self.inner.load_state_dict(state)
            self.average, self.n_averaged = None, 0
            return
        avg = state.get("average")
        p = self.inner.params
        if avg is not None and np.shape(avg) != p.shape:
            raise ValueError(f"the saved average has shape {np.shape(avg)}, params {p.shape}")
        n = check_int(state.get("n_averaged"), "AveragedOptimizer state's n_averaged")
        self.inner.load_state_dict(state["inner"])  # checked before it changes anything
        self.average = None if avg is None else np.array(avg, dtype=p.dtype)
        self.n_averaged = n


def swap_average(optimizer: Any) -> bool:
    """Exchange an :class:`AveragedOptimizer`'s average with its live parameters, in place.

    Called before an evaluation (the model then holds the averaged weights) and once more
    after it (training continues from its own weights); the exchange is exact. A no-op
    (returns False) for any other optimizer or before the first update.
    """
    avg = getattr(optimizer, "average", None) if isinstance(optimizer, AveragedOptimizer) else None
    if avg is None:
        return False
    p = optimizer.params
    tmp = p.copy()
    p[...] = avg
    avg[...] = tmp
    return True
