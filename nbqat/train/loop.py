"""The main job's training phases: float training, calibration and QAT (:class:`Run`).

Every training step is :func:`nbqat.distributed.data_parallel_step` (with one process:
:func:`nbqat.nn.train_step`): forward -> pinball loss -> backward -> gradient hook ->
``clip_grad_norm_`` -> fused optimizer update.
"""

from __future__ import annotations

import math
import signal
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from nbqat.data import SplitWindows, Windows
from nbqat.train.config import TrainConfig, TrainingInterrupted
from nbqat.train.metrics import pinball_loss, q_risk
from nbqat.train.model import make_optimizer, set_dropout_mode, to_host
from nbqat.train.parallel import Parallel
from nbqat.train.recipe import lr_at, swap_average

__all__ = ["Interrupt", "Run", "RunState"]

#: Phase ids of the seeded window orders and dropout masks: (seed, phase id, epoch or step).
FLOAT, CALIBRATION, QAT = 1, 2, 3


class Interrupt:
    """SIGINT -> a flag checked after each whole training step (second Ctrl-C aborts).

    Parameters
    ----------
    stop_after_steps : int or None
        Set the flag after this many steps (tests, ``--stop-after-steps``).
    agree : callable bool -> bool, optional
        Makes the flag the same on every rank (:meth:`Parallel.agree`).
    """

    def __init__(
        self, stop_after_steps: int | None, agree: Callable[[bool], bool] | None = None
    ) -> None:
        self.flag = False
        self.stop_after = stop_after_steps
        self.steps = 0
        self.agree = agree
        self._old: Any = None

    def __enter__(self) -> Interrupt:
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
        """Count a finished step; True when the run must stop now (on every rank)."""
        self.steps += 1
        if self.stop_after is not None and self.steps >= self.stop_after:
            self.flag = True
        if self.agree is not None:
            self.flag = self.agree(self.flag)
        return self.flag


@dataclass
class RunState:
    """Everything a checkpoint restores besides the arrays (JSON)."""

    phase: str = "float"  # float -> calibrate -> qat -> qat_noclip -> evaluate -> done
    epoch: int = 0
    batch_pos: int = 0
    epoch_loss_sum: float = 0.0
    best_val: float = math.inf
    best_epoch: int = -1  # -1: the start (with ``best_val`` finite) or none yet
    bad_epochs: int = 0
    stopped_early: bool = False
    lr_factor: float = 1.0  # the learning rate's factor: --plateau-factor after the plateau
    plateau_epoch: int = -1  # the epoch that ended on the plateau (-1: none yet)
    curves: dict = field(default_factory=dict)  # phase -> {"train": [...], "val": [...]}
    step_losses: dict = field(default_factory=dict)  # phase -> [...]
    grad_norms: dict = field(default_factory=dict)  # phase -> [...]
    timings: dict = field(default_factory=dict)  # phase -> seconds (summed over resumes)


class Run:
    """One ``nbqat train`` run: its configuration, data, models, optimizers and progress.

    Parameters
    ----------
    cfg : TrainConfig
        Resolved (no ``None`` option left).
    out : Path
        The run folder.
    w : Windows
        The run's windows.
    par : Parallel, optional
        The process group (default: one process).
    """

    def __init__(self, cfg: TrainConfig, out: Path, w: Windows, par: Parallel | None = None):
        from nbqat import distributed as dist

        self.cfg: Any = cfg
        self.out = out
        self.w = w
        self.par = par if par is not None else Parallel(dist.ProcessGroup())
        self.st = RunState()
        self.model: Any = None
        self.opt: Any = None
        self.best_params: np.ndarray | None = None
        self.qat: Any = None
        self.qat_opt: Any = None
        self.ridge: Any = None
        self.data_fp: dict = {}

    # ------------------------------------------------------------------ helpers
    def tick(self, phase: str, t0: float) -> None:
        """Add the wall time since ``t0`` to ``phase``'s (``timings.json``)."""
        self.st.timings[phase] = self.st.timings.get(phase, 0.0) + time.perf_counter() - t0

    def epoch_order(self, phase_id: int, epoch: int) -> np.ndarray:
        """Training-window order of an epoch, (batches, batch_size): from (seed, phase, epoch).

        Parameters
        ----------
        phase_id : int
            1 float, 2 calibration, 3 QAT.
        epoch : int

        Returns
        -------
        ndarray int64 (n_batches, batch_size)
            The last partial batch is dropped.
        """
        n = len(self.w.train)
        rng = np.random.default_rng([self.cfg.seed, phase_id, epoch])
        perm = rng.permutation(n)
        k = self.cfg.windows_per_epoch
        if k and k < n:
            perm = perm[:k]
        nb = len(perm) // self.cfg.batch_size
        return perm[: nb * self.cfg.batch_size].reshape(nb, self.cfg.batch_size)

    def steps_per_epoch(self) -> int:
        """Training steps per epoch."""
        return len(self.epoch_order(FLOAT, 0))

    def progress(self) -> bool:
        """Whether this rank shows progress (``--progress``, rank 0 only)."""
        return bool(self.cfg.progress) and self.par.root

    def predict(self, fwd: Callable, split: SplitWindows, bs: int = 256) -> np.ndarray:
        """Forecasts (float64) of every window of ``split``, streamed in batches of ``bs``.

        Under MPI the batches are split over the ranks and gathered in order (the same
        batches as one process, so the same bits), and every rank gets the whole result.

        Parameters
        ----------
        fwd : callable (static, historical, future) -> (B, tau, Q)
        split : SplitWindows
        bs : int, default 256

        Returns
        -------
        ndarray float64 (len(split), tau, Q)
        """
        from tqdm import tqdm

        n_batches = -(-len(split) // bs)
        quiet = not self.progress() or n_batches < 8
        bar = tqdm(total=n_batches, desc=f"predict {split.name}", disable=quiet, leave=False,
                   file=sys.stderr)  # fmt: skip

        def one(i: int) -> np.ndarray:
            s, h, f, _ = split.batch(np.arange(i * bs, min((i + 1) * bs, len(split))))
            bar.update(1)
            return to_host(fwd(s, h, f)).astype(np.float64)

        outs = self.par.predict_batches(n_batches, one)
        bar.close()
        return np.concatenate(outs)

    def q_risk(self, fwd: Callable, split: SplitWindows) -> dict[str, float]:
        """q-risks (``{"P10": ..., "P50": ..., "P90": ...}``) of ``fwd``'s forecasts of
        ``split`` (:meth:`predict`), unscaled to the target's units, against its raw target.

        Parameters
        ----------
        fwd : callable (static, historical, future) -> (B, tau, Q)
        split : SplitWindows

        Returns
        -------
        dict
        """
        pred = split.unscale(self.predict(fwd, split))
        return q_risk(pred, split.target_raw(), self.w.quantiles, split.scored())

    def val_loss(self, fwd: Callable) -> tuple[float, float]:
        """(mean pinball loss, P50 q-risk on the unscaled target) of the validation split, over
        its observed steps (:meth:`~nbqat.data.SplitWindows.scored`)."""
        val = self.w.val
        pred = self.predict(fwd, val)
        y = val.target()  # the target only: no (N, k, m) input arrays gathered
        keep = val.scored()  # None: every step observed (no fill_gaps repair)
        fit, y = (pred, y) if keep is None or keep.all() else (pred[keep], y[keep])
        loss, _ = pinball_loss(fit, y.astype(np.float64), self.w.quantiles)
        return loss, q_risk(val.unscale(pred), val.target_raw(), self.w.quantiles, keep)["P50"]

    def interrupted(self) -> TrainingInterrupted:
        """The exception of an interrupted run (its checkpoint is written by the caller)."""
        ck = self.out / "checkpoint"
        return TrainingInterrupted(
            f"interrupted: checkpoint saved to {ck}; continue with `nbqat train --resume {ck}`"
        )

    # ------------------------------------------------------------------ models
    def qat_config(self) -> Any:
        """The QATConfig of the QAT phase (and of the PTQ row): ``--observer``'s qconfig."""
        from nbqat.quantization.qconfig import QATConfig

        return QATConfig(
            calibration_batches=self.cfg.calibration_batches, max_norm=self.cfg.max_norm,
            qconfig=self.cfg.qconfig(),
            freeze_observers_after_calibration=self.observer_name() != "minmax",
        )  # fmt: skip

    def observer_name(self) -> str:
        """The activation observer of the main QAT run (``all`` runs min/max there)."""
        return self.cfg.qat_observer()

    def activation_quantizers(self) -> dict:
        """The QAT model's quantizers that observe activations (the ones to sync over ranks).

        A weight quantizer (``*.weight*_fake_quant``) observes the same weights on every rank,
        so its statistics need no collective: it stays on the fused single-call path.
        """
        return {
            name: fq
            for name, fq in self.qat.fake_quants.items()
            if not name.rsplit(".", 1)[-1].startswith("weight")
        }

    def sync_observers(self) -> None:
        """Attach the activation quantizers to the run's process group."""
        from nbqat import distributed as dist

        dist.sync_observers(self.activation_quantizers(), self.par.group)

    def new_qat(self) -> None:
        """A fresh QAT model from the float model, its observers synced over the ranks."""
        from nbqat.nn.forecasters import prepare_forecaster

        self.qat = prepare_forecaster(self.model, self.qat_config())  # --model tft | lstm
        self.sync_observers()

    def new_qat_optimizer(self) -> None:
        """The QAT phase's optimizer over the QAT model."""
        self.qat_opt = make_optimizer(self.qat.model, self.cfg.qat_lr, self.cfg, qat=True)

    def reset_qat(self, path: Path) -> None:
        """Load a saved QAT state (model, observers, optimizer) into a fresh QAT model.

        The observers stay synced over the ranks (the checkpoint holds no per-rank state).
        """
        self.new_qat()
        self.new_qat_optimizer()
        self.qat.load(path, optimizer=self.qat_opt)
        self.sync_observers()

    # ------------------------------------------------------------------ batches
    def calibration_batches(self, progress: bool = False) -> Iterator[tuple]:
        """The (global) training batches of the calibration phase (the same for QAT and PTQ)."""
        from tqdm import tqdm

        n = self.cfg.calibration_batches
        done = 0
        ep = 0
        bar = tqdm(total=n, desc="calibration", disable=not progress, leave=False, file=sys.stderr)
        while done < n:
            order = self.epoch_order(CALIBRATION, ep)
            for b in range(min(len(order), n - done)):
                yield self.w.train.batch(order[b])
                done += 1
                bar.update(1)
            ep += 1
            if len(order) == 0:
                break
        bar.close()

    def train_batch(self, idx: np.ndarray) -> tuple:
        """The training windows ``idx`` as :func:`nbqat.nn.train_step` takes them: the batch,
        plus the mask of its observed target steps where ``fill_gaps`` invented some (no
        weight in the loss: :meth:`~nbqat.data.SplitWindows.scored`); no mask without."""
        batch, keep = self.w.train.batch(idx), self.w.train.scored(idx)
        return batch if keep is None else (*batch, keep)

    def qat_batches(self) -> Iterator[tuple]:
        """The (global) training batches of the (clipped) QAT phase, in order."""
        for ep in range(self.cfg.qat_epochs):
            for idx in self.epoch_order(QAT, ep):
                yield self.train_batch(idx)

    # ------------------------------------------------------------------ phases
    def _epoch(self, intr: Interrupt, phase: str, phase_id: int, n_epochs: int, train: Any):
        """Train the batches of epoch ``st.epoch`` from ``st.batch_pos``; returns the mean loss.

        ``train = (model, dropout_model, optimizer, lr_fn, max_norm)``.
        """
        from tqdm import tqdm

        st, (model, drop_model, opt, lr_fn, max_norm) = self.st, train
        order = self.epoch_order(phase_id, st.epoch)
        bar = tqdm(total=len(order), initial=st.batch_pos, disable=not self.progress(),
                   desc=f"{phase} {st.epoch + 1}/{n_epochs}", leave=False,
                   file=sys.stderr)  # fmt: skip
        for b in range(st.batch_pos, len(order)):
            batch = self.train_batch(order[b])
            step = len(st.step_losses[phase])
            opt.lr = lr_fn(step)
            set_dropout_mode(drop_model, True, (self.cfg.seed, phase_id, step))
            loss, total = self.par.step(model, drop_model, batch, opt, max_norm)
            st.grad_norms[phase].append(total)
            st.step_losses[phase].append(loss)
            st.epoch_loss_sum += loss
            st.batch_pos = b + 1
            bar.update(1)
            bar.set_postfix(loss=f"{loss:.4f}", gnorm=f"{total:.3f}", refresh=False)
            if intr.step_done():
                bar.close()
                raise self.interrupted()
        bar.close()
        set_dropout_mode(drop_model, False)
        return st.epoch_loss_sum / max(1, len(order))

    def _curves(self, phase: str) -> dict:
        st = self.st
        st.grad_norms.setdefault(phase, [])
        st.step_losses.setdefault(phase, [])
        return st.curves.setdefault(phase, {"train": [], "val": []})

    def _next_epoch(self) -> None:
        self.st.epoch += 1
        self.st.batch_pos = 0
        self.st.epoch_loss_sum = 0.0

    def float_phase(self, intr: Interrupt) -> None:
        """Float training with early stopping on the validation P50 q-risk (patience).

        The start (the ridge forecast, with the linear skip) is the first candidate, so the
        kept model is never worse on validation than where it began. At the first plateau
        (``patience`` epochs without a better validation P50) training goes back to the best
        weights and goes on at ``plateau_factor`` times the scheduled rate (like torch's
        ``ReduceLROnPlateau(factor=...)`` with the best weights restored, but torch reduces after
        more than ``patience`` bad epochs and counts an improvement only past its relative
        ``threshold`` 1e-4, where any lower P50 counts here); the second plateau stops.
        """
        cfg, st, model = self.cfg, self.st, self.model
        curves = self._curves("float")
        n_steps = cfg.epochs * self.steps_per_epoch()  # the schedule's length (early stop aside)
        train = (model, model, self.opt,
                 lambda i: lr_at(i, n_steps, cfg.lr, cfg.warmup_steps) * self.st.lr_factor,
                 cfg.max_norm)  # fmt: skip
        if st.epoch == 0 and st.batch_pos == 0 and self.best_params is None:
            _, val = self.val_loss(model.forward)  # epoch 0: the start
            curves["start_val_q_risk_P50"] = [val]
            st.best_val, st.best_epoch = val, -1
            self.best_params = to_host(model.params).copy()
        while st.epoch < cfg.epochs and not st.stopped_early:
            train_loss = self._epoch(intr, "float", FLOAT, cfg.epochs, train)
            swap_average(self.opt)  # --ema-decay: the averaged weights are evaluated and kept
            val_loss, val = self.val_loss(model.forward)  # early stopping on the P50 q-risk
            curves["train"].append(train_loss)
            curves["val"].append(val_loss)
            curves.setdefault("val_q_risk_P50", []).append(val)
            if not all(math.isfinite(x) for x in (train_loss, val_loss, val)):
                # no plateau to go back from: NaN curves fit no checkpoint nor metrics.json
                raise ValueError(
                    f"the float training diverged: epoch {st.epoch + 1}'s validation loss is "
                    f"{val_loss} (curve {curves['val']}); lower --lr"
                    + (" or set a --max-norm" if cfg.max_norm is None else "")
                )
            plateau = False
            if val < st.best_val:
                st.best_val, st.best_epoch, st.bad_epochs = val, st.epoch, 0
                self.best_params = to_host(model.params).copy()
            else:
                st.bad_epochs += 1
                plateau = self.par.agree(st.bad_epochs >= cfg.patience)
            swap_average(self.opt)  # training continues from its own weights
            more = st.epoch + 1 < cfg.epochs  # a plateau after the last epoch just stops
            if plateau and cfg.plateau_factor > 0 and st.plateau_epoch < 0 and more:
                st.plateau_epoch, st.lr_factor, st.bad_epochs = st.epoch, cfg.plateau_factor, 0
                self.restore_best()
            else:
                st.stopped_early = plateau
            if self.progress():
                print(
                    f"float epoch {st.epoch + 1}: train {train_loss:.4f}  val {val_loss:.4f}  "
                    f"val q-risk P50 {val:.4f}"
                    + (f"; plateau: back to epoch {st.best_epoch + 1}'s weights, learning "
                       f"rate x {cfg.plateau_factor:g}" if st.plateau_epoch == st.epoch else ""),
                    file=sys.stderr,
                )  # fmt: skip
            self._next_epoch()
        model.params[...] = self.best_params
        set_dropout_mode(model, False)  # calibration and everything after: evaluation mode
        st.phase, st.epoch, st.batch_pos = "calibrate", 0, 0

    def restore_best(self) -> None:
        """The model (and an EMA optimizer's average) back to the best validation weights."""
        self.model.params[...] = self.best_params
        avg = getattr(self.opt, "average", None)
        if avg is not None:
            avg[...] = self.best_params

    def calibrate_phase(self) -> None:
        """Observers on, fake quantization off, over the calibration batches (sharded)."""
        from nbqat import distributed as dist

        self.new_qat()
        quantizers = self.activation_quantizers()
        batches = self.calibration_batches(self.progress())
        dist.calibrate(self.qat, batches, self.par.group, quantizers=quantizers)
        set_dropout_mode(self.qat.model, False)
        self.new_qat_optimizer()
        self.st.phase = "qat"
        if self.cfg.compare_clipping:
            self.qat.save(self.out / "qat_start.npz", optimizer=self.qat_opt)

    def qat_phase(self, intr: Interrupt, phase: str) -> None:
        """QAT fine-tuning (``phase`` "qat", or "qat_noclip" for --compare-clipping): clipped at
        the QAT model's ``QATConfig.max_norm`` (``--max-norm``), unclipped in "qat_noclip"."""
        cfg, st = self.cfg, self.st
        max_norm = self.qat.config.max_norm if phase == "qat" else None
        curves = self._curves(phase)
        n_steps = cfg.qat_epochs * self.steps_per_epoch()
        train = (self.qat, self.qat.model, self.qat_opt,
                 lambda i: lr_at(i, n_steps, cfg.qat_lr), max_norm)  # fmt: skip
        while st.epoch < cfg.qat_epochs:  # the same order for clipped and unclipped runs
            train_loss = self._epoch(intr, phase, QAT, cfg.qat_epochs, train)
            val, val_qr = self.val_loss(self.qat.predict)  # predict: no observer update
            curves["train"].append(train_loss)
            curves["val"].append(val)
            curves.setdefault("val_q_risk_P50", []).append(val_qr)
            if self.progress():
                print(
                    f"{phase} epoch {st.epoch + 1}: train {train_loss:.4f}  val {val:.4f}",
                    file=sys.stderr,
                )
            self._next_epoch()
        st.epoch, st.batch_pos = 0, 0
