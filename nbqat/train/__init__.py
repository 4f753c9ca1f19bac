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

``mpiexec -n N nbqat train`` runs the same job data-parallel over N processes
(:mod:`nbqat.train.parallel`, docs/distributed.md): it equals the 1-process run to
reduction-order rounding; rank 0 alone writes, and ``metrics.json`` gains ``world_size``.

The package, one concern per module: :mod:`~nbqat.train.options` (the one registry of the
options, from which the parser, :class:`TrainConfig`, ``Forecaster`` and the checkpoint checks
are built), :mod:`~nbqat.train.config` (:class:`TrainConfig`, constants),
:mod:`~nbqat.train.metrics` (q-risk, loss and gradient statistics), :mod:`~nbqat.train.model`
(data, model, optimizer), :mod:`~nbqat.train.loop` (the training phases),
:mod:`~nbqat.train.parallel` (the process group), :mod:`~nbqat.train.checkpointing`,
:mod:`~nbqat.train.evaluate` (test q-risk, metrics.json), :mod:`~nbqat.train.outputs` (plots and
files), :mod:`~nbqat.train.summary` (the final table) and :mod:`~nbqat.train.job` (:func:`run`).
"""

from __future__ import annotations

from nbqat.train.checkpointing import read_run_config
from nbqat.train.config import QUANTILES, TrainConfig, TrainingInterrupted
from nbqat.train.job import run
from nbqat.train.metrics import pinball_loss, q_risk
from nbqat.train.model import load_data

#: The old private name (tests and nbqat.train.recipe's callers use it).
_load_data = load_data

__all__ = [
    "QUANTILES",
    "TrainConfig",
    "TrainingInterrupted",
    "load_data",
    "pinball_loss",
    "q_risk",
    "read_run_config",
    "run",
]
