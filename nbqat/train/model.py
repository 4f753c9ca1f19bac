"""The few places where the main job touches the nn / data APIs: the data, the model, the
optimizer (:class:`DeviceAdam` for ``--device cuda``) and the dropout mode."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from nbqat.data import TMY3_COLUMNS, Windows, load_csv, load_tmy3, make_windows
from nbqat.data._scaling import constant_calendar
from nbqat.optim_groups import inner_attribute
from nbqat.train import preflight
from nbqat.train.config import MIN_HISTORY, QUANTILES
from nbqat.train.option_table import DEFAULT_CALENDAR
from nbqat.train.window_norm import choose_window_norm


def build_model(cfg: Any, w: Windows) -> Any:
    """A fresh float32 forecaster (``cfg.model``: ``"tft"`` or ``"lstm"``) for the run's windows.

    Parameters
    ----------
    cfg : TrainConfig (resolved)
    w : Windows
        Its feature counts, history, horizon and quantiles size the model.

    Returns
    -------
    TemporalFusionTransformer or LSTMForecaster
        Initialised from ``cfg.seed`` (:func:`nbqat.nn.build_forecaster`).

    Raises
    ------
    ValueError
        When its parameters do not fit in memory (naming ``--hidden-dim``).
    """
    from nbqat.nn.forecasters import build_forecaster

    name = getattr(cfg, "model", "tft")
    try:
        return build_forecaster(name, cfg, w, seed=cfg.seed)
    except MemoryError as e:  # --hidden-dim 100000: a traceback from NumPy before
        raise ValueError(
            f"--model {name} with --hidden-dim {cfg.hidden_dim} does not fit in memory ({e}); "
            "choose a smaller --hidden-dim"
        ) from None


def make_optimizer(model: Any, lr: float, cfg: Any, qat: bool = False):
    """AdamW in two groups (body, linear skip), see :class:`nbqat.train.recipe.GroupedAdamW`.

    ``qat=True``: the QAT phase's (and the equally fine-tuned float model's) optimizer, whose
    skip group moves at ``qat_skip_lr_scale`` times the QAT rate.

    Parameters
    ----------
    model : forecaster
        The optimizer updates ``model.params``.
    lr : float
    cfg : TrainConfig (resolved)
        ``weight_decay``, the skip groups' learning-rate scales and ``device``.
    qat : bool, default False

    Returns
    -------
    GroupedAdamW or DeviceAdam
        Wrapped in :class:`nbqat.train.recipe.AveragedOptimizer` for the float phase when
        ``cfg.ema_decay > 0``.
    """
    from nbqat.train.recipe import AveragedOptimizer, GroupedAdamW, skip_offset

    kw = dict(
        lr=lr,
        offset=skip_offset(model),
        weight_decay=cfg.weight_decay,
        skip_lr_scale=cfg.qat_skip_lr_scale if qat else cfg.skip_lr_scale,
    )
    if cfg.device == "cuda":
        opt: Any = DeviceAdam(model.params, **kw)
    else:
        opt = GroupedAdamW(model.params, **kw)
    return opt if qat or not cfg.ema_decay else AveragedOptimizer(opt, cfg.ema_decay)


class DeviceAdam:
    """Adam whose fused update runs on a CUDA device copy of a host parameter buffer.

    ``--device cuda`` uses it (the two AdamW groups of :class:`nbqat.train.recipe.GroupedAdamW`):
    nbqat.nn's forward and backward passes run on the CPU (the
    layer graph keeps its activations in NumPy), so each step uploads the flat gradient buffer
    (and the parameters), runs :class:`nbqat.Adam`'s CUDA kernel there with the clipping
    coefficient folded in, and downloads the parameters. It presents the host optimizer
    interface (``params`` is the host buffer), so ``QATTemporalFusionTransformer.train_step``
    and ``save``/``load`` accept it.
    """

    def __init__(self, params: np.ndarray, lr: float, **group_kw: Any) -> None:
        from nbqat import _cuda
        from nbqat.train.recipe import GroupedAdamW

        _cuda.require_cuda("--device cuda")
        self.params = params
        self._d_params = _cuda.cuda.to_device(params)
        self._d_grads = _cuda.cuda.to_device(np.zeros_like(params))
        self.inner = GroupedAdamW(self._d_params, lr=lr, **group_kw)

    lr = inner_attribute("lr")

    def upload_grads(self, grads: np.ndarray) -> Any:
        """Copy ``grads`` to the device buffer and return it."""
        self._d_grads.copy_to_device(np.ascontiguousarray(grads))
        return self._d_grads

    def step(self, grads: np.ndarray, grad_scale: float = 1.0, *, uploaded: bool = False) -> None:
        self._d_params.copy_to_device(self.params)  # the host buffer may have been reloaded
        d_grads = self._d_grads if uploaded else self.upload_grads(grads)
        self.inner.step(d_grads, grad_scale=grad_scale)
        self._d_params.copy_to_host(self.params)

    def state_dict(self) -> dict:
        return self.inner.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.inner.load_state_dict(state)


def set_dropout_mode(model: Any, training: bool, seed: Any = None) -> None:
    """Every dropout layer of ``model`` to training (masks from ``seed``) or evaluation mode.

    Parameters
    ----------
    model : Module
    training : bool
    seed : tuple of int, optional
        ``(run seed, phase, step)``: the masks of the next forwards.
    """
    from nbqat.nn.layers.dropout import set_dropout as _set

    _set(model, training, seed)


def to_host(x: Any) -> np.ndarray:
    """A NumPy view or copy of ``x`` (a CUDA device array is copied to the host)."""
    return x.copy_to_host() if hasattr(x, "copy_to_host") else np.asarray(x)


def check_device(device: str) -> None:
    """Raise a RuntimeError (a user error: the CLI prints it) for ``cuda`` without CUDA.

    Parameters
    ----------
    device : {"cpu", "cuda"}
    """
    if device == "cuda":
        from nbqat import _cuda

        if not _cuda.cuda_available():
            err = RuntimeError(
                "--device cuda: CUDA is not available. Install the CUDA extra "
                "(pip install 'nbqat[cuda]') on a machine with an NVIDIA GPU and driver, or "
                "run with --device cpu."
            )
            err.nbqat_user_error = True  # type: ignore[attr-defined]
            raise err


#: The options that name a ``--csv`` file's columns (``load_csv``'s keywords).
CSV_COLUMN_OPTIONS = (
    "time_col",
    "target_col",
    "entity_col",
    "known_cols",
    "static_cols",
    "observed_cols",
)


def column_roles(opts: Mapping[str, Any]) -> dict[str, Any]:
    """:func:`nbqat.data.load_csv`'s column keywords for a run: its ``--csv`` column options,
    or the shipped dataset's (:data:`nbqat.data.TMY3_COLUMNS`) when it has no ``csv``.

    Parameters
    ----------
    opts : mapping
        The run's options (``TrainConfig`` fields, as a dict: a checkpoint's ``config``).

    Returns
    -------
    dict
    """
    if opts.get("csv") is None:
        return dict(TMY3_COLUMNS)
    return {k: opts.get(k) for k in CSV_COLUMN_OPTIONS}


def load_data(cfg: Any) -> Windows:
    """The run's windows: ``--csv`` (or the shipped TMY3 dataset) cut into TFT windows.

    Parameters
    ----------
    cfg : TrainConfig (resolved)
        ``cfg.history`` None is set here: ``max(MIN_HISTORY, the seasonal-naive period)``;
        ``"auto"`` is set to the history chosen on the validation split
        (:func:`nbqat.train.history_auto.choose_history`, from the default one), and the
        windows' ``history_choice`` holds its record. ``cfg.skip_history`` ``"auto"`` is set
        to the linear skip's history (``skip_history_choice``); with a skip history the
        windows are cut with it (it is never shorter than ``cfg.history``). ``cfg.window_norm``
        sets the windows' ``scaling.window_norm`` first (:func:`choose_window_norm`;
        ``window_norm`` holds its record), so the auto choices tune the ridge on the windows
        the run uses.

    Returns
    -------
    Windows

    Raises
    ------
    DataError, ValueError
        Bad data, or windows that do not fit the options
        (:func:`nbqat.train.preflight.check_windows`).
    """
    if cfg.csv is not None:
        data = load_csv(cfg.csv, fill_gaps=cfg.fill_gaps, **column_roles(vars(cfg)))
    else:
        data = load_tmy3()
    constant = constant_calendar(data)
    if cfg.calendar == DEFAULT_CALENDAR and "dow" in constant:  # months, weeks: no hour or
        cfg.calendar = "doy" if "doy" not in constant else "time_index"  # weekday; years: no
        # time of year either, the trend is what varies
    auto = cfg.history == "auto"
    if cfg.history is None or auto:  # one day of hours, and at least one season (the naive
        from nbqat.data._calendar import default_season  # reads it)

        cfg.history = max(MIN_HISTORY, default_season(data, cfg.horizon))
    w = make_windows(
        data,
        history=cfg.history,
        horizon=cfg.horizon,
        eval_stride=cfg.eval_stride,
        quantiles=QUANTILES,
        calendar=[c.strip() for c in cfg.calendar.split(",") if c.strip()],
    )
    preflight.check_targets(w)  # before any q-risk: the auto choices read validation's
    # the normalisation first: the auto choices below tune the ridge on the run's windows
    norm_record = choose_window_norm(cfg.window_norm, w)  # sets the shared scaling's mode
    record = None
    if auto:
        from nbqat.train.history_auto import choose_history

        cfg.history, record = choose_history(w)
        if cfg.history != w.history:
            w = w.with_history(cfg.history)  # the same split bounds, cut again
    skip_record = _resolve_skip_history(cfg, w)
    if cfg.skip_history is not None and cfg.skip_history != w.history:
        try:  # the skip's longer windows; the body reads the last cfg.history steps of each
            w = w.with_history(cfg.skip_history)
        except ValueError as e:
            raise ValueError(f"--skip-history {cfg.skip_history}: {e}") from None
    if record is not None:
        w.history_choice = record  # type: ignore[attr-defined]
    if skip_record is not None:
        w.skip_history_choice = skip_record  # type: ignore[attr-defined]
    w.window_norm = norm_record  # type: ignore[attr-defined]
    preflight.check_windows(cfg, w)
    return w


def _resolve_skip_history(cfg: Any, w: Windows) -> dict | None:
    """Resolve ``cfg.skip_history`` against the windows ``w`` cut with ``cfg.history``.

    ``"auto"`` becomes ``max(cfg.history, the tuned ridge's history)``
    (:func:`nbqat.train.baselines.tune_ridge` on ``w``: validation only) and returns its
    record (``option``, ``skip_history``, ``history``, ``ridge_history``, ``ridge_lambda``,
    ``criterion``); an integer is checked against ``cfg.history``; None stays None.

    Raises
    ------
    ValueError
        An integer below ``--history``.
    """
    k_s = cfg.skip_history
    if k_s is None:
        return None
    if k_s == "auto":
        from nbqat.train.baselines import tune_ridge

        tuned = tune_ridge(w)
        cfg.skip_history = max(int(cfg.history), int(tuned.history))
        return {
            "option": "auto",
            "skip_history": cfg.skip_history,
            "history": int(cfg.history),
            "ridge_history": int(tuned.history),
            "ridge_lambda": float(tuned.lam),
            "criterion": tuned.criterion,
        }
    if k_s < cfg.history:
        raise ValueError(
            f"--skip-history {k_s} is shorter than --history {cfg.history}: the skip reads at "
            f"least the body's history; use --skip-history {cfg.history} or more (or 'auto')"
        )
    return None


__all__ = [
    "DeviceAdam",
    "CSV_COLUMN_OPTIONS",
    "build_model",
    "check_device",
    "column_roles",
    "load_data",
    "make_optimizer",
    "set_dropout_mode",
    "to_host",
]
