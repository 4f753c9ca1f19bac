"""The main job, ``nbqat train``: float training, calibration, QAT, int8 conversion, evaluation.

Phases (each timed, see ``timings.json``):

1. **data** -- load the shipped NREL TMY3 dataset (or ``--csv``) and build TFT windows
   (:mod:`nbqat.data`); compute the seasonal-naive baseline.
2. **float** -- train :class:`nbqat.nn.TemporalFusionTransformer` with Adam on the quantile
   (pinball) loss, gradients clipped with ``clip_grad_norm_`` semantics (the clip coefficient is
   folded into the fused optimizer update), early stopping on the validation loss (patience);
   the best-validation weights are kept.
3. **calibration** -- :class:`nbqat.nn.qat.QATTemporalFusionTransformer` built from the float
   model; observers on and fake quantization off for ``QATConfig.calibration_batches`` batches.
4. **qat** -- fine-tuning through fake quantization: ``train_step`` = forward -> loss ->
   backward (STE masks) -> ``clip_grad_norm_`` -> optimizer step.
5. **int8** -- ``to_int8()``: int8 weights and an integer-arithmetic inference path.
6. **evaluate** -- P10/P50/P90 q-risk on the test split (unscaled target) for the
   seasonal-naive baseline, the float model, the fake-quant QAT model and the int8 model;
   plots.

Outputs in ``--out``: ``metrics.json`` (deterministic: the same ``--seed`` on the same machine
gives the same bytes; no wall times in it), ``timings.json`` (wall time per phase, not
deterministic), ``checkpoint/`` (everything needed by ``--resume``), the PNG plots and
``summary.txt`` (the table printed at the end).

Ctrl-C finishes the current training step, writes ``checkpoint/`` and exits with status 130;
``nbqat train --resume OUT/checkpoint`` continues from there and, because the shuffling order is
derived from ``(seed, phase, epoch)`` and the whole optimizer/observer state is saved, gives the
same metrics.json as an uninterrupted run. A second Ctrl-C aborts at once.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, fields
from dataclasses import replace as dataclass_replace
from pathlib import Path
from typing import Any, cast

import numpy as np

from nbqat import checkpoint as ckpt
from nbqat import preflight
from nbqat.baselines import RidgeBaseline, seasonal_naive_forecast
from nbqat.data import SplitWindows, Windows, load_csv, load_tmy3, make_windows, tmy3_path
from nbqat.nn.step import train_step
from nbqat.recipe import lr_at, swap_average

__all__ = [
    "TrainConfig",
    "TrainingInterrupted",
    "pinball_loss",
    "q_risk",
    "run",
]

QUANTILES = (0.1, 0.5, 0.9)
#: The default history (steps) when the seasonal-naive period is shorter (``--history``).
MIN_HISTORY = 24
#: Derived known inputs used by default (see ``--calendar``).
DEFAULT_CALENDAR = "hour,dow"
CHECKPOINT_VERSION = ckpt.CHECKPOINT_VERSION
#: QAT states kept beside the checkpoint by --compare-clipping (copied into checkpoint/).
SIDE_FILES = ("qat_start.npz", "qat_clipped.npz")
#: Options that do not change any result, left out of metrics.json so that two runs with the
#: same seed in different folders give the same file.
NOT_IN_METRICS = ("out", "progress", "stop_after_steps", "overwrite")


class TrainingInterrupted(Exception):
    """Raised after Ctrl-C once the checkpoint is written (the CLI exits with status 130)."""


# ------------------------------------------------------------------------------------- config


@dataclass
class TrainConfig:
    """All options of a training run (``nbqat train --help`` documents each).

    ``None`` means "the default of the mode": :meth:`resolved` fills in the full-run defaults or,
    with ``quick=True``, the quick ones.
    """

    epochs: int | None = None
    qat_epochs: int | None = None
    batch_size: int | None = None
    hidden_dim: int | None = None
    heads: int | None = None
    lr: float | None = None
    qat_lr: float | None = None
    max_norm: float | None = 1.0
    patience: int | None = None
    calibration_batches: int | None = None
    windows_per_epoch: int | None = None
    seed: int = 0
    device: str = "cpu"
    compare_clipping: bool = False
    quick: bool = False
    progress: bool = True
    plots: bool = True
    out: str = "nbqat-run"
    csv: str | None = None
    time_col: str | None = None
    target_col: str | None = None
    entity_col: str | None = None
    known_cols: str | None = None
    static_cols: str | None = None
    observed_cols: str | None = None
    fill_gaps: bool = False
    history: int | None = None
    horizon: int | None = None
    eval_stride: int | None = None
    calendar: str = DEFAULT_CALENDAR
    threads: int | None = None
    stop_after_steps: int | None = None
    linear_skip: bool = True  # the ridge-started linear skip (--no-linear-skip)
    weight_decay: float | None = None
    warmup_steps: int | None = None
    skip_lr_scale: float | None = None
    qat_skip_lr_scale: float | None = None
    dropout: float | None = None
    ema_decay: float | None = None  # EMA of the float weights, evaluated and kept (0: off)
    overwrite: bool = False
    observer: str = "minmax"  # activation observer (nbqat.report.OBSERVERS, or "all")
    sensitivity: bool = False
    float_fallback: int = 0

    FULL = {
        "epochs": 20,
        "qat_epochs": 2,
        "batch_size": 64,
        "hidden_dim": 16,
        "heads": 4,
        "lr": 3e-3,
        "patience": 5,
        "calibration_batches": 100,
        "windows_per_epoch": 4096,
        "history": None,  # auto: max(24, the seasonal-naive period), see _load_data
        "horizon": 24,
        "eval_stride": 6,
        "weight_decay": 0.3,
        "warmup_steps": 100,
        "skip_lr_scale": 0.1,
        "qat_skip_lr_scale": 0.1,
        "dropout": 0.1,
        "ema_decay": 0.0,
    }
    QUICK = {
        "epochs": 4,
        "qat_epochs": 1,
        "batch_size": 64,
        "hidden_dim": 16,
        "heads": 4,
        "lr": 3e-3,
        "patience": 2,
        "calibration_batches": 10,
        "windows_per_epoch": 1024,
        "history": None,  # auto: max(24, the seasonal-naive period), see _load_data
        "horizon": 24,
        "eval_stride": 24,
        "weight_decay": 0.1,
        "warmup_steps": 10,
        "skip_lr_scale": 0.1,
        "qat_skip_lr_scale": 0.1,
        "dropout": 0.1,
        "ema_decay": 0.0,
    }

    @classmethod
    def from_args(cls, args: Any) -> TrainConfig:
        """Build from parsed ``nbqat train`` arguments (argparse.Namespace)."""
        kw = {
            f.name: getattr(args, f.name)
            for f in fields(cls)
            if hasattr(args, f.name) and (getattr(args, f.name) is not None or f.name == "max_norm")
        }
        kw["progress"] = not getattr(args, "no_progress", False)
        kw["plots"] = not getattr(args, "no_plots", False)
        return cls(**kw)

    def resolved(self) -> TrainConfig:
        """A copy with every ``None`` option replaced by the mode's default, validated."""
        base = self.QUICK if self.quick else self.FULL
        kw = asdict(self)
        for k, v in base.items():
            if kw[k] is None:
                kw[k] = v
        if kw["qat_lr"] is None:
            kw["qat_lr"] = kw["lr"] / 10.0
        cfg = TrainConfig(**kw)
        cfg.validate()
        return cfg

    def validate(self) -> None:
        """Raise ValueError naming the option for an inconsistent configuration."""
        if self.hidden_dim % self.heads:  # type: ignore[operator]
            raise ValueError(
                f"--heads {self.heads} must divide --hidden-dim {self.hidden_dim} "
                "(each head gets hidden_dim / heads features)"
            )
        if not 0.0 <= self.dropout < 1.0:  # type: ignore[operator]
            raise ValueError(f"--dropout must be in [0, 1), got {self.dropout!r}")
        if not 0.0 <= self.ema_decay < 1.0:  # type: ignore[operator]
            raise ValueError(f"--ema-decay must be in [0, 1) (0: off), got {self.ema_decay!r}")
        if self.device not in ("cpu", "cuda"):
            raise ValueError(f"--device must be 'cpu' or 'cuda', got {self.device!r}")
        if self.max_norm is not None and not self.max_norm > 0:
            raise ValueError(f"--max-norm must be positive or 'none', got {self.max_norm!r}")
        if self.compare_clipping and self.max_norm is None:
            raise ValueError("--compare-clipping needs a --max-norm (the clipped run)")
        if self.observer not in ("minmax", "histogram", "percentile", "mse", "all"):
            raise ValueError(
                f"--observer must be minmax|histogram|percentile|mse|all, got {self.observer!r}"
            )

    def to_json(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}


# ------------------------------------------------------------------------------------ metrics


def pinball_loss(
    pred: np.ndarray, target: np.ndarray, quantiles: Sequence[float]
) -> tuple[float, np.ndarray]:
    """Mean quantile (pinball) loss and its gradient with respect to ``pred``.

    ``QL(y, yhat, q) = q * max(y - yhat, 0) + (1 - q) * max(yhat - y, 0)`` averaged over all
    ``B * tau * Q`` entries (Lim et al. 2021, eq. 24, up to the normalisation).

    Parameters
    ----------
    pred : ndarray float (B, tau, Q)
    target : ndarray float (B, tau)
    quantiles : sequence of float (Q,)

    Returns
    -------
    loss : float
    grad : ndarray (B, tau, Q), dtype of ``pred``
        ``-q / n`` where ``y > yhat``, ``(1 - q) / n`` where ``y < yhat``, and ``0`` on a tie
        (a subgradient), ``n = B * tau * Q``.
    """
    from nbqat.nn import quantile_loss, quantile_loss_grad

    t = target.astype(pred.dtype, copy=False)
    return quantile_loss(pred, t, quantiles), quantile_loss_grad(pred, t, quantiles)


def q_risk(pred: np.ndarray, target: np.ndarray, quantiles: Sequence[float]) -> dict[str, float]:
    """Normalised quantile loss ("q-risk") per quantile on the unscaled target.

    ``q-risk_q = 2 * sum QL(y, yhat_q, q) / sum |y|`` over all windows and forecast steps
    (Lim et al. 2021, Section 7), computed in float64.

    Parameters
    ----------
    pred : ndarray (n, tau, Q)
        Unscaled quantile forecasts.
    target : ndarray (n, tau)
        Unscaled actual values.
    quantiles : sequence of float

    Returns
    -------
    dict
        ``{"P10": ..., "P50": ..., "P90": ...}`` (keys ``P<round(100 q)>``).
    """
    p = np.asarray(pred, dtype=np.float64)
    y = np.asarray(target, dtype=np.float64)
    denom = np.abs(y).sum()
    if denom == 0:
        raise ValueError("q-risk is undefined: the target is zero everywhere")
    out = {}
    for j, q in enumerate(quantiles):
        e = y - p[..., j]
        ql = np.maximum(q * e, (q - 1) * e).sum()
        out[f"P{round(100 * q)}"] = float(2.0 * ql / denom)
    return out


def _grad_stats(norms: Sequence[float], max_norm: float | None) -> dict:
    a = np.asarray(norms, dtype=np.float64)
    if len(a) == 0:
        return {"steps": 0}
    fired = int(np.sum(a > max_norm)) if max_norm is not None else 0
    return {
        "steps": len(a),
        "mean": float(a.mean()),
        "std": float(a.std()),
        "min": float(a.min()),
        "median": float(np.median(a)),
        "p95": float(np.quantile(a, 0.95)),
        "max": float(a.max()),
        "max_norm": max_norm,
        "clipped_steps": fired,
        "clipped_fraction": fired / len(a),
    }


def _loss_stats(losses: Sequence[float]) -> dict:
    a = np.asarray(losses, dtype=np.float64)
    if len(a) == 0:
        return {"steps": 0}
    return {
        "steps": len(a),
        "mean": float(a.mean()),
        "std": float(a.std()),
        "final": float(a[-1]),
        "finite": bool(np.all(np.isfinite(a))),
    }


# ----------------------------------------------------------------------------- model adapters
# The few places that touch the nn / qat APIs.


def _build_model(cfg: Any, w: Windows) -> Any:
    from nbqat.nn import TemporalFusionTransformer, TFTConfig

    tcfg = TFTConfig(
        num_static_features=w.static.shape[1],
        num_known_features=w.future_features.shape[1],
        num_unknown_features=w.hist_features.shape[1],
        hidden_dim=cfg.hidden_dim,
        sequence_length=w.history,
        prediction_horizon=w.horizon,
        quantiles=w.quantiles,
        num_heads=cfg.heads,
        linear_skip=bool(cfg.linear_skip),
        dropout=cfg.dropout,
    )
    return TemporalFusionTransformer(tcfg, seed=cfg.seed, dtype=np.float32)


def _make_optimizer(model: Any, lr: float, cfg: Any, qat: bool = False):
    """AdamW in two groups (body, linear skip), see :class:`nbqat.recipe.GroupedAdamW`.

    ``qat=True``: the QAT phase's (and the equally fine-tuned float model's) optimizer, whose
    skip group moves faster (``qat_skip_lr_scale``) so that the skip's int8 weights can adapt.
    """
    from nbqat.recipe import AveragedOptimizer, GroupedAdamW, skip_offset

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

    ``--device cuda`` uses it (the two AdamW groups of :class:`nbqat.recipe.GroupedAdamW`):
    nbqat.nn's forward and backward passes run on the CPU (the
    layer graph keeps its activations in NumPy), so each step uploads the flat gradient buffer
    (and the parameters), runs :class:`nbqat.Adam`'s CUDA kernel there with the clipping
    coefficient folded in, and downloads the parameters. It presents the host optimizer
    interface (``params`` is the host buffer), so ``QATTemporalFusionTransformer.train_step``
    and ``save``/``load`` accept it.
    """

    def __init__(self, params: np.ndarray, lr: float, **group_kw: Any) -> None:
        from nbqat import _cuda
        from nbqat.recipe import GroupedAdamW

        _cuda.require_cuda("--device cuda")
        self.params = params
        self._d_params = _cuda.cuda.to_device(params)
        self._d_grads = _cuda.cuda.to_device(np.zeros_like(params))
        self.inner = GroupedAdamW(self._d_params, lr=lr, **group_kw)

    @property
    def lr(self) -> float:
        return self.inner.lr

    @lr.setter
    def lr(self, value: float) -> None:
        self.inner.lr = value

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


def _set_dropout_mode(model: Any, training: bool, seed: Any = None) -> None:
    from nbqat.nn.layers.dropout import set_dropout as _set

    _set(model, training, seed)


def _clip_coef(total: float, max_norm: float | None) -> float:
    if max_norm is None:
        return 1.0
    return min(max_norm / (total + 1e-6), 1.0)


def _total_norm(grads: Any) -> float:
    from nbqat.clip import get_total_norm

    return float(get_total_norm(grads))


def _to_host(x: Any) -> np.ndarray:
    return x.copy_to_host() if hasattr(x, "copy_to_host") else np.asarray(x)


class _Interrupt:
    """SIGINT -> a flag checked after each whole training step (second Ctrl-C aborts)."""

    def __init__(self, stop_after_steps: int | None) -> None:
        self.flag = False
        self.stop_after = stop_after_steps
        self.steps = 0
        self._old: Any = None

    def __enter__(self) -> _Interrupt:
        try:
            self._old = signal.signal(signal.SIGINT, self._handler)
        except ValueError:  # not the main thread: Ctrl-C handling stays Python's default
            self._old = None
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._old is not None:
            signal.signal(signal.SIGINT, self._old)

    def _handler(self, signum: int, frame: Any) -> None:
        if self.flag:
            raise KeyboardInterrupt
        self.flag = True

    def step_done(self) -> bool:
        self.steps += 1
        if self.stop_after is not None and self.steps >= self.stop_after:
            self.flag = True
        return self.flag


# ----------------------------------------------------------------------------------- the run


@dataclass
class _State:
    """Everything a checkpoint restores besides the arrays (JSON)."""

    phase: str = "float"  # float -> calibrate -> qat -> qat_noclip -> evaluate -> done
    epoch: int = 0
    batch_pos: int = 0
    epoch_loss_sum: float = 0.0
    best_val: float = math.inf
    best_epoch: int = -1
    bad_epochs: int = 0
    stopped_early: bool = False
    curves: dict = field(default_factory=dict)  # phase -> {"train": [...], "val": [...]}
    step_losses: dict = field(default_factory=dict)  # phase -> [...]
    grad_norms: dict = field(default_factory=dict)  # phase -> [...]
    timings: dict = field(default_factory=dict)  # phase -> seconds (summed over resumes)


class _Run:
    def __init__(self, cfg: TrainConfig, out: Path, w: Windows) -> None:
        self.cfg: Any = cfg  # resolved: no None options left
        self.out = out
        self.st = _State()
        self.model: Any = None
        self.opt: Any = None
        self.best_params: np.ndarray | None = None
        self.qat: Any = None
        self.qat_opt: Any = None
        self.ridge: Any = None
        self.w = w
        self.data_fp: dict = {}

    # ------------------------------------------------------------------ helpers
    def _tick(self, phase: str, t0: float) -> None:
        self.st.timings[phase] = self.st.timings.get(phase, 0.0) + time.perf_counter() - t0

    def _epoch_order(self, phase_id: int, epoch: int) -> np.ndarray:
        """Training-window order of an epoch: derived from (seed, phase, epoch) only."""
        n = len(self.w.train)
        rng = np.random.default_rng([self.cfg.seed, phase_id, epoch])
        perm = rng.permutation(n)
        k = self.cfg.windows_per_epoch
        if k and k < n:
            perm = perm[:k]
        nb = len(perm) // self.cfg.batch_size  # the last partial batch is dropped
        return perm[: nb * self.cfg.batch_size].reshape(nb, self.cfg.batch_size)

    def _predict(self, fwd, split: SplitWindows, bs: int = 256) -> np.ndarray:
        """Forecasts of every window of ``split``, streamed in batches of ``bs`` windows."""
        from tqdm import tqdm

        outs = []
        n_batches = -(-len(split) // bs)
        quiet = not self.cfg.progress or n_batches < 8
        for i in tqdm(
            range(0, len(split), bs),
            total=n_batches,
            desc=f"predict {split.name}",
            disable=quiet,
            leave=False,
            file=sys.stderr,
        ):
            idx = np.arange(i, min(i + bs, len(split)))
            s, h, f, _ = split.batch(idx)
            outs.append(_to_host(fwd(s, h, f)).astype(np.float64))
        return np.concatenate(outs)

    def _val_loss(self, fwd) -> tuple[float, float]:
        """(mean pinball loss, P50 q-risk on the unscaled target) of the validation split."""
        val = self.w.val
        pred = self._predict(fwd, val)
        y = val.target()  # the target only: no (N, k, m) input arrays gathered
        loss, _ = pinball_loss(pred, y.astype(np.float64), self.w.quantiles)
        return loss, q_risk(val.unscale(pred), val.target_raw(), self.w.quantiles)["P50"]

    def _steps_per_epoch(self) -> int:
        return len(self._epoch_order(1, 0))

    # ------------------------------------------------------------------ checkpoint
    def save_checkpoint(self) -> Path:
        ck = self.out / "checkpoint"
        tmp = self.out / "checkpoint.tmp"
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir(parents=True)
        arrays: dict[str, np.ndarray] = {"params": _to_host(self.model.params)}
        if self.best_params is not None:
            arrays["best_params"] = self.best_params
        if self.opt is not None:
            for k, v in _flatten(self.opt.state_dict()).items():
                arrays["opt." + k] = v
        np.savez(tmp / "float.npz", **arrays)  # type: ignore[arg-type]
        if self.qat is not None and self.st.phase in ("qat", "qat_noclip", "evaluate", "done"):
            self.qat.save(tmp / "qat.npz", optimizer=self.qat_opt)
        for side in SIDE_FILES:
            if (self.out / side).exists():
                shutil.copyfile(self.out / side, tmp / side)
        text = ckpt.state_json(self.cfg.to_json(), asdict(self.st), self.data_fp)
        (tmp / "state.json").write_text(text)
        old = self.out / "checkpoint.old"
        if ck.exists():
            if old.exists():
                shutil.rmtree(old)
            os.replace(ck, old)
        os.replace(tmp, ck)
        if old.exists():
            shutil.rmtree(old)
        return ck

    def load_checkpoint(self, ck: Path, meta: dict) -> None:
        """Restore from a validated checkpoint (:mod:`nbqat.checkpoint`); never writes to it."""
        st = _State(**meta["state"])
        nb = len(self._epoch_order(1, 0))
        if st.batch_pos > nb:
            raise ckpt.CheckpointError(
                f"{ck / 'state.json'}: field 'state.batch_pos': {st.batch_pos} exceeds the "
                f"{nb} batches of an epoch of this data and configuration"
            )
        z = ckpt.read_float_arrays(ck, int(_to_host(self.model.params).size), meta["state"])
        opt_state = _unflatten({k[4:]: v for k, v in z.items() if k.startswith("opt.")})
        try:
            if opt_state:
                self.opt.load_state_dict(opt_state)
        except (KeyError, TypeError, ValueError, IndexError) as e:
            raise ckpt.CheckpointError(f"{ck / 'float.npz'}: field 'opt': {e}") from None
        if (ck / "qat.npz").exists():
            self._new_qat()
            self.qat_opt = _make_optimizer(self.qat.model, self.cfg.qat_lr, self.cfg, qat=True)
            self.qat.load(ck / "qat.npz", optimizer=self.qat_opt)
        elif st.phase in ("qat", "qat_noclip", "evaluate", "done"):
            raise ckpt.CheckpointError(f"{ck / 'qat.npz'}: missing for phase {st.phase!r}")
        self.model.params[...] = z["params"]
        if "best_params" in z:
            self.best_params = z["best_params"].copy()
        self.st = st
        for side in SIDE_FILES:
            if (ck / side).exists() and (ck / side).resolve() != (self.out / side).resolve():
                shutil.copyfile(ck / side, self.out / side)

    def _interrupted(self) -> TrainingInterrupted:
        ck = self.out / "checkpoint"  # written by _run once the phase's time is counted
        return TrainingInterrupted(
            f"interrupted: checkpoint saved to {ck}; continue with `nbqat train --resume {ck}`"
        )

    # ------------------------------------------------------------------ phases
    def qat_config(self) -> Any:
        """The QATConfig of the QAT phase (and of the PTQ row): ``--observer``'s qconfig."""
        from nbqat.qconfig import QATConfig
        from nbqat.report import activation_qconfig

        obs = self.observer_name()
        return QATConfig(
            calibration_batches=self.cfg.calibration_batches, max_norm=self.cfg.max_norm,
            qconfig=activation_qconfig(obs), freeze_observers_after_calibration=obs != "minmax",
        )  # fmt: skip

    def observer_name(self) -> str:
        """The activation observer of the main QAT run (``all`` runs min/max there)."""
        return self.cfg.observer if self.cfg.observer != "all" else "minmax"

    def _new_qat(self) -> None:
        from nbqat.nn.qat import QATTemporalFusionTransformer

        self.qat = QATTemporalFusionTransformer.from_float(self.model, config=self.qat_config())

    def float_phase(self, intr: _Interrupt) -> None:
        from tqdm import tqdm

        cfg, st, w = self.cfg, self.st, self.w
        st.curves.setdefault("float", {"train": [], "val": []})
        st.grad_norms.setdefault("float", [])
        st.step_losses.setdefault("float", [])
        model, opt = self.model, self.opt
        n_steps = cfg.epochs * self._steps_per_epoch()  # the schedule's length (early stop aside)
        while st.epoch < cfg.epochs and not st.stopped_early:
            order = self._epoch_order(1, st.epoch)
            bar = tqdm(
                total=len(order),
                initial=st.batch_pos,
                disable=not cfg.progress,
                desc=f"float {st.epoch + 1}/{cfg.epochs}",
                leave=False,
                file=sys.stderr,
            )
            for b in range(st.batch_pos, len(order)):
                s, h, f, y = w.train.batch(order[b])
                step = len(st.step_losses["float"])
                opt.lr = lr_at(step, n_steps, cfg.lr, cfg.warmup_steps)
                _set_dropout_mode(
                    model, True, (cfg.seed, 1, step)
                )  # masks from (seed, phase, step)
                if isinstance(opt, DeviceAdam):  # norm and update on the device
                    model.zero_grad()
                    pred = model.forward(s, h, f)
                    loss, grad = pinball_loss(pred, y, w.quantiles)
                    model.backward(grad)
                    total = _total_norm(opt.upload_grads(model.grads))
                    opt.step(model.grads, _clip_coef(total, cfg.max_norm), uploaded=True)
                else:  # the library's step (nbqat.nn.train_step), as the QAT phase's
                    loss, total = train_step(model, (s, h, f, y), opt, max_norm=cfg.max_norm)
                st.grad_norms["float"].append(total)
                st.step_losses["float"].append(loss)
                st.epoch_loss_sum += loss
                st.batch_pos = b + 1
                bar.update(1)
                bar.set_postfix(loss=f"{loss:.4f}", gnorm=f"{total:.3f}", refresh=False)
                if intr.step_done():
                    bar.close()
                    raise self._interrupted()
            bar.close()
            train_loss = st.epoch_loss_sum / max(1, len(order))
            _set_dropout_mode(model, False)
            swap_average(opt)  # --ema-decay: the averaged weights are evaluated and kept
            val_loss, val = self._val_loss(model.forward)  # early stopping on the P50 q-risk
            st.curves["float"]["train"].append(train_loss)
            st.curves["float"]["val"].append(val_loss)
            st.curves["float"].setdefault("val_q_risk_P50", []).append(val)
            if val < st.best_val:
                st.best_val, st.best_epoch, st.bad_epochs = val, st.epoch, 0
                self.best_params = _to_host(model.params).copy()
            else:
                st.bad_epochs += 1
                if st.bad_epochs >= cfg.patience:
                    st.stopped_early = True
            swap_average(opt)  # training continues from its own weights
            if cfg.progress:
                print(
                    f"float epoch {st.epoch + 1}: train {train_loss:.4f}  val {val_loss:.4f}  "
                    f"val q-risk P50 {val:.4f}",
                    file=sys.stderr,
                )
            st.epoch += 1
            st.batch_pos = 0
            st.epoch_loss_sum = 0.0
        model.params[...] = self.best_params
        _set_dropout_mode(model, False)  # calibration and everything after: evaluation mode
        st.phase, st.epoch, st.batch_pos = "calibrate", 0, 0

    def calibration_batches(self, progress: bool = False):
        """The training batches of the calibration phase (the same for QAT and PTQ)."""
        from tqdm import tqdm

        n = self.cfg.calibration_batches
        done = 0
        ep = 0
        bar = tqdm(total=n, desc="calibration", disable=not progress, leave=False, file=sys.stderr)
        while done < n:
            order = self._epoch_order(2, ep)
            for b in range(min(len(order), n - done)):
                yield self.w.train.batch(order[b])
                done += 1
                bar.update(1)
            ep += 1
            if len(order) == 0:
                break
        bar.close()

    def qat_batches(self):
        """The training batches of the (clipped) QAT phase, in order."""
        for ep in range(self.cfg.qat_epochs):
            for idx in self._epoch_order(3, ep):
                yield self.w.train.batch(idx)

    def calibrate_phase(self) -> None:
        cfg = self.cfg
        self._new_qat()
        self.qat.enable_calibration()
        for s, h, f, _ in self.calibration_batches(progress=cfg.progress):
            self.qat.forward(s, h, f)
        self.qat.disable_calibration()
        _set_dropout_mode(self.qat.model, False)
        self.qat_opt = _make_optimizer(self.qat.model, cfg.qat_lr, cfg, qat=True)
        self.st.phase = "qat"
        if cfg.compare_clipping:
            self.qat.save(self.out / "qat_start.npz", optimizer=self.qat_opt)

    def qat_phase(self, intr: _Interrupt, phase: str, max_norm: float | None) -> None:
        from tqdm import tqdm

        cfg, st, w = self.cfg, self.st, self.w
        st.curves.setdefault(phase, {"train": [], "val": []})
        st.grad_norms.setdefault(phase, [])
        st.step_losses.setdefault(phase, [])
        n_steps = cfg.qat_epochs * self._steps_per_epoch()
        while st.epoch < cfg.qat_epochs:
            order = self._epoch_order(3, st.epoch)  # same order for clipped and unclipped runs
            bar = tqdm(
                total=len(order),
                initial=st.batch_pos,
                disable=not cfg.progress,
                desc=f"{phase} {st.epoch + 1}/{cfg.qat_epochs}",
                leave=False,
                file=sys.stderr,
            )
            for b in range(st.batch_pos, len(order)):
                batch = w.train.batch(order[b])
                step = len(st.step_losses[phase])
                self.qat_opt.lr = lr_at(step, n_steps, cfg.qat_lr)
                _set_dropout_mode(self.qat.model, True, (cfg.seed, 3, step))
                loss, gnorm = self.qat.train_step(batch, self.qat_opt, max_norm=max_norm)
                loss, gnorm = float(loss), float(gnorm)
                st.grad_norms[phase].append(gnorm)
                st.step_losses[phase].append(loss)
                st.epoch_loss_sum += loss
                st.batch_pos = b + 1
                bar.update(1)
                bar.set_postfix(loss=f"{loss:.4f}", gnorm=f"{gnorm:.3f}", refresh=False)
                if intr.step_done():
                    bar.close()
                    raise self._interrupted()
            bar.close()
            train_loss = st.epoch_loss_sum / max(1, len(order))
            _set_dropout_mode(self.qat.model, False)
            val, val_qr = self._val_loss(self.qat.predict)  # predict: no observer update
            st.curves[phase]["train"].append(train_loss)
            st.curves[phase]["val"].append(val)
            st.curves[phase].setdefault("val_q_risk_P50", []).append(val_qr)
            if cfg.progress:
                print(
                    f"{phase} epoch {st.epoch + 1}: train {train_loss:.4f}  val {val:.4f}",
                    file=sys.stderr,
                )
            st.epoch += 1
            st.batch_pos = 0
            st.epoch_loss_sum = 0.0
        st.epoch, st.batch_pos = 0, 0

    def reset_qat(self, path: Path) -> None:
        """Load a saved QAT state (model, observers, optimizer) into a fresh QAT model."""
        self._new_qat()
        self.qat_opt = _make_optimizer(self.qat.model, self.cfg.qat_lr, self.cfg, qat=True)
        self.qat.load(path, optimizer=self.qat_opt)


def _flatten(d: Any, prefix: str = "") -> dict[str, np.ndarray]:
    out: dict[str, np.ndarray] = {}
    if isinstance(d, dict):
        for k, v in d.items():
            out.update(_flatten(v, f"{prefix}{k}/"))
    elif isinstance(d, (list, tuple)):
        out[prefix + "__list__"] = np.asarray(len(d))
        for i, v in enumerate(d):
            out.update(_flatten(v, f"{prefix}{i}/"))
    else:
        out[prefix.rstrip("/")] = np.asarray(_to_host(d) if not np.isscalar(d) else d)
    return out


def _unflatten(flat: dict[str, np.ndarray]) -> dict:
    root: dict = {}
    for key, v in flat.items():
        parts = key.split("/")
        node = root
        for p in parts[:-1]:
            node = node.setdefault(p, {})
        node[parts[-1]] = v

    def fix(node: Any) -> Any:
        if not isinstance(node, dict):
            return node.item() if node.ndim == 0 else node
        if "__list__" in node:
            n = int(node["__list__"])
            return [fix(node[str(i)]) for i in range(n)]
        return {k: fix(v) for k, v in node.items()}

    return fix(root)


# ----------------------------------------------------------------------------------- run()


def _check_device(device: str) -> None:
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


def _load_data(cfg: Any) -> Windows:
    if cfg.csv is not None:
        data = load_csv(
            cfg.csv,
            time_col=cfg.time_col,  # type: ignore[arg-type]
            target_col=cfg.target_col,  # type: ignore[arg-type]
            entity_col=cfg.entity_col,
            known_cols=cfg.known_cols,
            static_cols=cfg.static_cols,
            observed_cols=cfg.observed_cols,
            fill_gaps=cfg.fill_gaps,
        )
    else:
        data = load_tmy3()
    if cfg.history is None:  # one day of hours, and at least one season (the naive reads it)
        from nbqat.data._calendar import default_season

        cfg.history = max(MIN_HISTORY, default_season(data, cfg.horizon))
    w = make_windows(
        data,
        history=cfg.history,
        horizon=cfg.horizon,
        eval_stride=cfg.eval_stride,
        quantiles=QUANTILES,
        calendar=[c.strip() for c in cfg.calendar.split(",") if c.strip()],
    )
    preflight.check_windows(cfg, w)
    return w


def run(cfg: TrainConfig, resume: str | Path | None = None, *, check_only: bool = False) -> dict:
    """Run ``nbqat train`` with ``cfg`` (or continue the checkpoint ``resume``).

    The BLAS library (OpenBLAS under NumPy's wheels) is limited to one thread for the run
    (threadpoolctl): the network's matmuls are small, Numba's kernels supply the parallelism,
    and OpenBLAS's spinning threads otherwise starve Numba's (measured on 2 cores: a float step
    of 26-34 ms with one BLAS thread against 150-1400 ms with two while another job ran).

    Parameters
    ----------
    cfg : TrainConfig
        The run's configuration.
    resume : str or Path, optional
        A previous run's ``checkpoint/`` folder to continue (the run folder is its parent).
    check_only : bool, default False
        Only the validation pass (output folder, data, options, checkpoint): nothing is
        written; returns ``{"data": ..., "config": ...}``.

    Returns
    -------
    dict
        The content of metrics.json.

    Raises
    ------
    TrainingInterrupted
        After Ctrl-C (or ``stop_after_steps``), once the checkpoint is written.
    DataError, ValueError
        For bad data or options (before any training; nothing is written).
    CheckpointError
        For an invalid or inconsistent checkpoint, or data changed since it was written
        (a ValueError naming the file and field; the checkpoint is not modified).
    """
    from threadpoolctl import threadpool_limits

    with threadpool_limits(limits=1, user_api="blas"):
        return _run(cfg, resume, check_only)


def _run(cfg: TrainConfig, resume: str | Path | None, check_only: bool = False) -> dict:
    t_start = time.perf_counter()
    meta: dict | None = None
    if resume is not None:
        defaults = {f.name: f.default for f in fields(TrainConfig)}
        meta = ckpt.read_state(resume, defaults)
        saved = dict(meta["config"])
        saved["progress"] = cfg.progress
        saved["stop_after_steps"] = cfg.stop_after_steps
        cfg = TrainConfig(**saved)
    elif cfg.csv is not None:
        cfg.csv = str(Path(cfg.csv).resolve())
    cfg = cfg.resolved()
    _check_device(cfg.device)
    if cfg.threads is not None:
        import numba

        n_max = int(numba.config.NUMBA_NUM_THREADS)  # type: ignore[attr-defined]
        if cfg.threads > n_max:
            raise ValueError(
                f"--threads {cfg.threads} exceeds the {n_max} threads "
                "Numba started with (set NUMBA_NUM_THREADS to raise it)"
            )
        numba.set_num_threads(cfg.threads)
    # The validation pass: the output folder, the data and the options, before anything is
    # written (a failure leaves no folder behind).
    out = preflight.check_out(cfg.out, cfg.overwrite, resume=meta is not None)
    t0 = time.perf_counter()
    w = _load_data(cfg)
    data_fp = ckpt.data_fingerprint(cfg.csv if cfg.csv is not None else tmy3_path())
    if meta is not None:
        ckpt.check_data(meta, data_fp)
    r = _Run(cfg, out, w)
    r.data_fp = data_fp
    r.model = _build_model(cfg, w)
    r.opt = _make_optimizer(r.model, cast(float, cfg.lr), cfg)
    if meta is not None:
        r.load_checkpoint(Path(meta["folder"]), meta)
    if check_only:
        return {"data": w.summary(), "config": cfg.to_json()}
    r.ridge = RidgeBaseline(lam=1.0, quantiles=w.quantiles).fit_split(w.train)
    if meta is None and cfg.linear_skip:
        from nbqat.recipe import init_linear_skip_from_ridge

        init_linear_skip_from_ridge(r.model, r.ridge)
    if cfg.overwrite and meta is None:
        preflight.clear_outputs(out)
    out.mkdir(parents=True, exist_ok=True)
    r._tick("data", t0)
    try:
        _phases(r)
    except TrainingInterrupted:
        r.save_checkpoint()  # after the interrupted phase's time was counted
        raise
    return _finish(r, t_start)


def _phases(r: _Run) -> None:
    cfg, st, out = r.cfg, r.st, r.out
    with _Interrupt(cfg.stop_after_steps) as intr:
        if st.phase == "float":
            t0 = time.perf_counter()
            try:
                r.float_phase(intr)
            finally:
                r._tick("float", t0)
            if r.best_params is None or not np.all(np.isfinite(r.best_params)):
                raise ValueError(
                    "the float training diverged: no epoch had a finite validation loss "
                    f"(curve {r.st.curves['float']['val']}); lower --lr or set a --max-norm"
                )
        if st.phase == "calibrate":
            t0 = time.perf_counter()
            r.calibrate_phase()
            r._tick("calibration", t0)
        if st.phase == "qat":
            t0 = time.perf_counter()
            try:
                r.qat_phase(intr, "qat", cfg.max_norm)
            finally:
                r._tick("qat", t0)
            if cfg.compare_clipping:
                # keep the clipped result, restart from the calibrated state without clipping
                r.qat.save(out / "qat_clipped.npz", optimizer=r.qat_opt)
                r.reset_qat(out / "qat_start.npz")
                st.phase = "qat_noclip"
            else:
                st.phase = "evaluate"
        if st.phase == "qat_noclip":
            t0 = time.perf_counter()
            try:
                r.qat_phase(intr, "qat_noclip", None)
            finally:
                r._tick("qat_noclip", t0)
            r.reset_qat(out / "qat_clipped.npz")  # the clipped model is the one evaluated
            st.phase = "evaluate"


def _finish(r: _Run, t_start: float) -> dict:
    st, out = r.st, r.out
    metrics = _evaluate(r)
    preflight.finite_metrics(metrics)  # strict JSON: a NaN or inf is an error with its cause
    st.phase = "done"
    r.save_checkpoint()
    st.timings["total"] = sum(v for k, v in st.timings.items() if k != "total")
    timings = {
        "note": "wall-clock seconds per phase (summed over resumed sessions); not deterministic",
        "phases_s": {k: round(v, 3) for k, v in st.timings.items()},
        "this_session_s": round(time.perf_counter() - t_start, 3),
    }
    (out / "timings.json").write_text(json.dumps(timings, indent=1, allow_nan=False) + "\n")
    text = json.dumps(metrics, indent=1, sort_keys=False, allow_nan=False)
    (out / "metrics.json").write_text(text + "\n")
    table = _summary_table(metrics, timings)
    (out / "summary.txt").write_text(table + "\n")
    print(table)
    print(
        f"outputs in {out.resolve()}: metrics.json, summary.txt, timings.json, checkpoint/"
        + (", *.png" if r.cfg.plots else "")
    )
    return metrics


def _evaluate(r: _Run) -> dict:
    from nbqat import __version__
    from nbqat.recipe import baseline_comparisons

    cfg, st, w = r.cfg, r.st, r.w
    t0 = time.perf_counter()
    test = w.test
    y = test.target_raw()
    naive, naive_point = seasonal_naive_forecast(test)
    pred_ridge = r.ridge.predict_split(test)
    # The QAT model may share or have changed the float model's buffer: evaluate a fresh float
    # model holding the best float weights.
    r.model = _build_model(cfg, w)
    r.model.params[...] = r.best_params
    pred_float = test.unscale(r._predict(r.model.forward, test))
    pred_qat = test.unscale(r._predict(r.qat.predict, test))
    from nbqat.report import from_run

    quant_report = from_run(r, test)
    r._tick("evaluate", t0)
    t0 = time.perf_counter()
    int8 = r.qat.to_int8()
    r._tick("int8", t0)
    t0 = time.perf_counter()
    pred_int8 = test.unscale(r._predict(int8.forward, test))
    fair = _fair_rows(r)
    qr = {
        "seasonal_naive": q_risk(naive, y, w.quantiles),
        "ridge": q_risk(pred_ridge, y, w.quantiles),
        "float": q_risk(pred_float, y, w.quantiles),
        "float_finetuned": fair["float_finetuned"],
        "ptq_int8": fair["ptq_int8"],
        "qat_fake_quant": q_risk(pred_qat, y, w.quantiles),
        "int8": q_risk(pred_int8, y, w.quantiles),
    }
    p50 = {k: v["P50"] for k, v in qr.items()}
    metrics: dict[str, Any] = {
        "nbqat_version": __version__,
        "config": {k: v for k, v in cfg.to_json().items() if k not in NOT_IN_METRICS},
        "data": w.summary(),
        "model": {
            "num_parameters": int(_to_host(r.model.params).size),
            "hidden_dim": cfg.hidden_dim,
            "heads": cfg.heads,
            "quantiles": list(w.quantiles),
        },
        "q_risk_test": qr,
        "comparisons": {
            "float_vs_naive_P50_improvement": 1.0 - p50["float"] / p50["seasonal_naive"],
            "int8_vs_float_P50_relative_diff": p50["int8"] / p50["float"] - 1.0,
            "qat_vs_float_P50_relative_diff": p50["qat_fake_quant"] / p50["float"] - 1.0,
            "int8_vs_qat_P50_relative_diff": p50["int8"] / p50["qat_fake_quant"] - 1.0,
            "int8_vs_qat_max_abs_output_diff": float(np.max(np.abs(pred_int8 - pred_qat))),
            **baseline_comparisons(p50),
        },
        "quality_table": {
            "note": (
                "P10/P50/P90 q-risk on the test split. float: the early-stopped float model; "
                "float_finetuned: it trained on for the QAT phase's steps (same batches, "
                "optimizer, schedule and clipping, no quantization); ptq_int8: calibrated on "
                "the calibration batches and converted, no QAT; qat_int8: the main job's int8 "
                "model. Keyed by the activation observer of the run (--observer)."
            ),
            r.observer_name(): {
                "float": qr["float"],
                "float_finetuned": qr["float_finetuned"],
                "ptq_int8": qr["ptq_int8"],
                "qat_int8": qr["int8"],
            },
        },
        "targets": {
            "float_P50_at_least_20pct_better_than_naive": bool(
                p50["float"] <= 0.8 * p50["seasonal_naive"]
            ),
            # "within 2 %" read as "at most 2 % worse": QAT fine-tuning may also improve it
            "int8_P50_at_most_2pct_worse_than_float": bool(p50["int8"] <= 1.02 * p50["float"]),
            "float_P50_at_least_5pct_better_than_ridge": bool(p50["float"] <= 0.95 * p50["ridge"]),
            "qat_int8_P50_at_most_1pct_worse_than_float_finetuned": bool(
                p50["int8"] <= 1.01 * p50["float_finetuned"]
            ),
        },
        "baseline": (
            "seasonal naive: P_q = y[t - season] + r_q, r_q the empirical q-quantile of the "
            "residual y[t] - y[t - season] on each entity's training rows"
        ),
        "ridge": (
            "ridge (lambda 1, unpenalised intercept, closed form) from the flattened window "
            "[historical, future, static] to the tau standardised targets, fitted on every "
            "training window; P_q = yhat_h + the q-quantile of its training residuals at step h"
        ),
        "float": {
            "epochs_run": len(st.curves.get("float", {}).get("val", [])),
            "best_epoch": st.best_epoch + 1,
            "best_val_loss": st.best_val,
            "early_stopped": st.stopped_early,
            "curves": st.curves.get("float"),
        },
        "qat": {
            "epochs": cfg.qat_epochs,
            "calibration_batches": cfg.calibration_batches,
            "curves": st.curves.get("qat"),
            "loss": _loss_stats(st.step_losses.get("qat", [])),
        },
        "grad_norm": {
            ph: _grad_stats(st.grad_norms.get(ph, []), cfg.max_norm if ph != "qat_noclip" else None)
            for ph in ("float", "qat")
        },
        "timings_file": "timings.json",
        "quant_report": quant_report,
    }
    if cfg.compare_clipping:
        runs = {}
        for ph, label, mn in (("qat", "clipped", cfg.max_norm), ("qat_noclip", "unclipped", None)):
            g = np.asarray(st.grad_norms.get(ph, []))
            runs[label] = {
                "max_norm": mn,
                "loss": _loss_stats(st.step_losses.get(ph, [])),
                "largest_grad_norm": float(g.max()) if len(g) else None,
                "clipped_steps": int(np.sum(g > mn)) if mn is not None else 0,
                "val_curve": st.curves.get(ph, {}).get("val"),
            }
        metrics["compare_clipping"] = runs
    if cfg.plots:
        ridge_p50 = pred_ridge[..., list(w.quantiles).index(0.5)] if 0.5 in w.quantiles else None
        metrics["plots"] = _plots(r, test, y, naive_point, pred_float, pred_int8, ridge_p50)
    r._tick("evaluate", t0)
    t0 = time.perf_counter()
    from nbqat.export import export_run, run_metadata  # OUT/model.onnx + parity (docs/export.md)

    metrics["onnx_parity"] = export_run(r.qat, int8, test, r.out, metadata=run_metadata(w, qr))
    r._tick("onnx", t0)
    return metrics


def _fair_rows(r: _Run) -> dict:
    """q-risk of the float model fine-tuned like QAT and of post-training quantization."""
    from nbqat.recipe import fair_rows

    cpu_cfg = dataclass_replace(r.cfg, device="cpu")
    return fair_rows(
        r,
        lambda: _build_model(r.cfg, r.w),
        lambda model: _make_optimizer(model, r.cfg.qat_lr, cpu_cfg, qat=True),
    )


def _plots(
    r: _Run, test: SplitWindows, y, naive_point, pred_float, pred_int8, ridge_p50=None
) -> list[str]:
    from nbqat import plots

    w, st, out = r.w, r.st, r.out
    files = []
    curves = {ph: st.curves[ph] for ph in ("float", "qat", "qat_noclip") if ph in st.curves}
    files.append(plots.plot_loss_curves(curves, out / "loss_curves.png"))
    # a few test windows spread over entities and time
    n = len(test)
    pick = np.unique(np.linspace(0, n - 1, 4).round().astype(np.int64))
    titles = [
        f"{w.entity_names[test.entity[i]]} from {str(test.times(np.array([i]))[0, 0])[:16]}"
        for i in pick
    ]
    unit, ylabel = plots.step_unit(w.step), plots.target_label(w.target_name, w.source)
    xlabel = f"{unit} relative to forecast start"
    files.append(
        plots.plot_forecast_fan(
            test.history_raw(pick),
            y[pick],
            pred_int8[pick],
            w.quantiles,
            out / "forecast_int8.png",
            titles=titles,
            naive=naive_point[pick],
            ridge=None if ridge_p50 is None else ridge_p50[pick],
            ylabel=ylabel,
            xlabel=xlabel,
            model="int8 model",
        )
    )
    files.append(
        plots.plot_forecast_fan(
            test.history_raw(pick),
            y[pick],
            pred_float[pick],
            w.quantiles,
            out / "forecast_float.png",
            titles=titles,
            naive=naive_point[pick],
            ridge=None if ridge_p50 is None else ridge_p50[pick],
            ylabel=ylabel,
            xlabel=xlabel,
            model="float model",
        )
    )
    groups, attn = _interpretation(r, test)
    files.append(plots.plot_variable_importance(groups, out / "variable_importance.png"))
    files.append(plots.plot_attention(attn, out / "attention.png", history=w.history, unit=unit))
    if "qat_noclip" in st.grad_norms:
        runs = {
            f"clipped (max_norm={r.cfg.max_norm})": {
                "loss": st.step_losses["qat"],
                "grad_norm": st.grad_norms["qat"],
            },
            "unclipped": {
                "loss": st.step_losses["qat_noclip"],
                "grad_norm": st.grad_norms["qat_noclip"],
            },
        }
        files.append(
            plots.plot_clipping_comparison(
                runs, out / "clipping_comparison.png", max_norm=r.cfg.max_norm
            )
        )
    return [Path(f).name for f in files]


def _interpretation(r: _Run, test: SplitWindows):
    """Mean variable-selection weights and attention over (up to 512) test windows."""
    m = r.model
    w = r.w
    idx = np.arange(min(len(test), 512))
    s, h, f, _ = test.batch(idx)
    m.forward(s, h, f)
    attn = np.asarray(m.attention_weights, dtype=np.float64).mean(axis=0)  # (tau, T)
    groups = {
        "static": (w.static_names, m.static_weights),
        "encoder": (w.historical_names, m.encoder_weights),
        "decoder": (w.future_names, m.decoder_weights),
    }
    for key, (names, weights) in groups.items():
        a = np.asarray(weights, dtype=np.float64)
        groups[key] = (names, a.reshape(-1, a.shape[-1]).mean(axis=0))
    return groups, attn


def _versus(what: str, improvement: float, other: str) -> str:
    """'<what> 23.3% better than <other>' (or 'worse') from a relative improvement."""
    word = "better" if improvement >= 0 else "worse"
    return f"{what} {100 * abs(improvement):.1f}% {word} than {other}"


def _summary_table(metrics: dict, timings: dict) -> str:
    qr = metrics["q_risk_test"]
    rows = [
        ("seasonal naive", qr["seasonal_naive"]),
        ("ridge (window)", qr["ridge"]),
        ("float", qr["float"]),
        ("float fine-tuned", qr["float_finetuned"]),
        ("PTQ int8", qr["ptq_int8"]),
        ("QAT (fake quant)", qr["qat_fake_quant"]),
        ("QAT int8", qr["int8"]),
    ]
    lines = [
        "",
        "q-risk on the test split (lower is better)",
        f"{'model':<18}{'P10':>9}{'P50':>9}{'P90':>9}",
    ]
    for name, v in rows:
        lines.append(f"{name:<18}{v['P10']:>9.4f}{v['P50']:>9.4f}{v['P90']:>9.4f}")
    c = metrics["comparisons"]
    for what, key in (("float", "float"), ("QAT int8", "int8")):
        naive_key = "float_vs_naive" if key == "float" else f"{key}_vs_naive"
        lines.append(
            _versus(f"{what} P50", c[f"{naive_key}_P50_improvement"], "the seasonal naive")
            + ", "
            + _versus("", c[f"{key}_vs_ridge_P50_improvement"], "the ridge baseline").strip()
        )
    lines.append(
        _versus("QAT int8 P50", -c["qat_int8_vs_float_finetuned_P50_relative_diff"], "")
        + "the equally fine-tuned float; "
        + _versus("PTQ int8", -c["ptq_int8_vs_float_finetuned_P50_relative_diff"], "it")
        + "; int8 vs float (early-stopped): "
        + f"{100 * c['int8_vs_float_P50_relative_diff']:+.1f}%"
    )
    g = metrics["grad_norm"]
    for ph in ("float", "qat"):
        if g[ph].get("steps"):
            lines.append(
                f"grad norm {ph}: mean {g[ph]['mean']:.3f}, max {g[ph]['max']:.3f}, clipped "
                f"{g[ph]['clipped_steps']}/{g[ph]['steps']} steps"
            )
    if "compare_clipping" in metrics:
        for label, v in metrics["compare_clipping"].items():
            lines.append(
                f"QAT {label:<9}: loss mean {v['loss']['mean']:.4f} std {v['loss']['std']:.4f} "
                f"final {v['loss']['final']:.4f}; largest grad norm {v['largest_grad_norm']:.3f}"
            )
    filled = metrics["data"].get("filled") or {}
    if filled:
        parts = [
            f"{e}: " + ", ".join(f"{c} {n}" for c, n in cols.items()) for e, cols in filled.items()
        ]
        lines.append("filled by --fill-gaps (cells): " + "; ".join(parts))
    if "onnx_parity" in metrics:
        from nbqat.export import summary_lines

        lines += summary_lines(metrics["onnx_parity"])
    ph = timings["phases_s"]
    lines.append("time (s): " + ", ".join(f"{k} {v:.1f}" for k, v in ph.items()))
    return "\n".join(lines)
