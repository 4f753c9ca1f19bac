"""The main job's validation pass: everything knowable before training is checked first.

:func:`check_out` checks the output folder (without creating it); :func:`check_targets` (an
all-zero validation or test target) and :func:`check_windows` check the options against the
data and the degenerate cases that would otherwise fail after training (a seasonal-naive error
of zero). :func:`finite_metrics` makes metrics.json strict JSON.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

import numpy as np

from nbqat.data import DataError, Windows

__all__ = [
    "FORECAST_NAMES",
    "OUTPUT_NAMES",
    "check_out",
    "check_targets",
    "check_windows",
    "drop_set_aside",
    "finite_metrics",
    "restore_outputs",
    "set_aside_outputs",
]

#: The files and folders a run writes into ``--out`` (a folder holding one of them holds a run).
OUTPUT_NAMES = (
    "metrics.json",
    "timings.json",
    "summary.txt",
    "checkpoint",
    "checkpoint.tmp",
    "checkpoint.old",
    "qat_start.npz",
    "qat_clipped.npz",
    "loss_curves.png",
    "forecast_int8.png",
    "forecast_float.png",
    "variable_importance.png",
    "attention.png",
    "clipping_comparison.png",
    "model.onnx",
    "quant_report.json",
    "quant_report.png",
)
#: ``nbqat predict`` / ``backtest``'s default outputs in a run folder: forecasts of the run's
#: model, removed with it by ``--overwrite`` (a run folder without them is still a run).
FORECAST_NAMES = ("forecasts.csv", "backtest.csv")


def check_out(out: str | Path, overwrite: bool, resume: bool = False) -> Path:
    """Check ``--out`` before anything is written; return it as a Path.

    Parameters
    ----------
    out : str or Path
        The output folder (need not exist).
    overwrite : bool
        ``--overwrite``: a folder holding a previous run is accepted.
    resume : bool, default False
        A resumed run writes into its own folder.

    Returns
    -------
    Path

    Raises
    ------
    ValueError
        When ``out`` is a file (or under one), a run's checkpoint folder (or inside one),
        its nearest existing folder is not writable,
        or it holds a previous run (any of :data:`OUTPUT_NAMES`) and neither ``overwrite``
        nor ``resume`` is set.
    """
    p = Path(out)
    for q in (p, *p.parents):
        if q.exists() and not q.is_dir():
            raise ValueError(f"--out {str(out)!r}: {str(q)!r} is a file, not a folder")
    a = Path(os.path.abspath(p))
    ck = next((q for q in (a, *a.parents) if _is_checkpoint(q)), None)
    if ck is not None:  # its next checkpoint write moves the folder aside, this run with it
        raise ValueError(
            f"--out {str(out)!r} is inside the checkpoint folder {str(ck)!r} of the run in "
            f"{str(ck.parent)!r}; choose another --out"
        )
    base = next(q for q in (p, *p.parents, Path(".")) if q.exists())
    if not os.access(base, os.W_OK | os.X_OK):
        raise ValueError(f"--out {str(out)!r}: {str(base)!r} is not writable; choose another --out")
    if p.is_dir() and not (overwrite or resume):
        old = sorted(n for n in OUTPUT_NAMES if (p / n).exists())
        if old:
            raise ValueError(
                f"--out {str(out)!r} holds a previous run ({', '.join(old[:4])}"
                f"{', ...' if len(old) > 4 else ''}); choose another --out, pass --overwrite "
                "to replace it, or --resume its checkpoint (a Forecaster: out=, overwrite=True)"
            )
    return p


def _is_checkpoint(q: Path) -> bool:
    """A run's checkpoint folder (or its staging / previous copy)."""
    names = ("checkpoint", "checkpoint.tmp", "checkpoint.old")
    return q.name in names and (q / "state.json").is_file()


def set_aside_outputs(out: Path) -> Path | None:
    """Move a previous run's outputs in ``out`` (``--overwrite``) and the forecasts made with
    its model (:data:`FORECAST_NAMES`) into a hidden folder of ``out``; other files stay.

    The new run removes the folder when it finishes (:func:`drop_set_aside`) and a failed one
    moves the outputs back (:func:`restore_outputs`), so a failed ``--overwrite`` loses nothing.

    Parameters
    ----------
    out : Path
        The output folder.

    Returns
    -------
    Path or None
        The hidden folder (None when there was nothing to set aside).
    """
    import tempfile

    names = [n for n in OUTPUT_NAMES + FORECAST_NAMES if (out / n).exists()]
    if not names:
        return None
    aside = Path(tempfile.mkdtemp(prefix=".nbqat-overwritten-", dir=out))
    for n in names:
        (out / n).rename(aside / n)
    return aside


def restore_outputs(out: Path, aside: Path | None) -> None:
    """Remove a failed run's outputs from ``out``, put back those :func:`set_aside_outputs`
    moved, and remove the hidden folder: ``out`` is as it was before the run.

    Parameters
    ----------
    out : Path
        The output folder.
    aside : Path or None
        :func:`set_aside_outputs`'s folder (None: nothing to do).
    """
    import shutil

    if aside is None:
        return
    for n in OUTPUT_NAMES + FORECAST_NAMES:
        q = out / n
        if q.is_dir():
            shutil.rmtree(q)
        elif q.exists():
            q.unlink()
    for q in aside.iterdir():
        q.rename(out / q.name)
    shutil.rmtree(aside, ignore_errors=True)


def drop_set_aside(aside: Path | None) -> None:
    """Remove the previous run's outputs that :func:`set_aside_outputs` kept.

    Parameters
    ----------
    aside : Path or None
        :func:`set_aside_outputs`'s folder (None: nothing to do).
    """
    import shutil

    if aside is not None:
        shutil.rmtree(aside, ignore_errors=True)


def check_targets(w: Windows) -> None:
    """Refuse a validation or test split whose target is 0 on every window: the q-risk
    (normalised by sum |y|) that early stopping, the ridge's tuning and ``--history auto``
    read on validation, and every row reads on test, is undefined there (a zero validation
    target was found only by the first of them, as ``q_risk``'s bare "undefined").

    Parameters
    ----------
    w : Windows
        The windows as cut (their validation and test forecast starts are those of the run).

    Raises
    ------
    DataError
        Naming the split.
    """
    for split, name in ((w.val, "validation"), (w.test, "test")):
        if not np.nansum(np.abs(split.actual())) > 0:  # the scored steps (fill_gaps)
            raise DataError(
                f"the target {w.target_name!r} is zero on every {name} window: the q-risk "
                "(normalised by sum |y|) is undefined; use other data or split fractions"
            )


def check_windows(cfg: Any, w: Windows) -> None:
    """Options against the data, and the degenerate data found only after training otherwise.

    Parameters
    ----------
    cfg : nbqat.train.TrainConfig
        The resolved options.
    w : Windows
        The run's windows.

    Raises
    ------
    DataError
        Fewer training windows than ``--batch-size``; a seasonal-naive forecast without error
        on the test split (the comparison against it is undefined).
    ValueError
        ``--windows-per-epoch`` below ``--batch-size`` (an epoch without a batch).
    """
    from nbqat.nn.loss import q_risk_table as q_risk
    from nbqat.train.baselines import seasonal_naive_forecast

    if len(w.train) < cfg.batch_size:
        raise DataError(
            f"the training split has {len(w.train)} windows, fewer than --batch-size "
            f"{cfg.batch_size}; use a longer series or a smaller --batch-size"
        )
    if cfg.windows_per_epoch and cfg.windows_per_epoch < cfg.batch_size:
        raise ValueError(
            f"--windows-per-epoch {cfg.windows_per_epoch} is below --batch-size "
            f"{cfg.batch_size}: an epoch would have no batch; raise --windows-per-epoch (0 = "
            "all windows) or lower --batch-size"
        )
    test = w.test
    y = test.target_raw()
    qr = q_risk(seasonal_naive_forecast(test)[0], y, w.quantiles, test.scored())
    if qr.get("P50", 1.0) == 0.0:
        raise DataError(
            f"the seasonal-naive forecast (the value {w.season} steps earlier) is exact on the "
            f"test split: {w.target_name!r} repeats with period {w.season}, so the models' "
            "comparison against it is undefined; this data needs no forecaster"
        )
    bad = {k: v for k, v in qr.items() if not math.isfinite(v)}
    if bad:
        raise DataError(f"the seasonal-naive q-risk is not finite ({bad}): check the target")


def finite_metrics(node: Any, path: str = "") -> None:
    """Raise ValueError naming the first NaN or infinite number in ``node`` (metrics.json).

    The message says the likely cause: a diverged training (a loss or gradient norm) or
    non-finite predictions (a q-risk or comparison).

    Parameters
    ----------
    node : dict, list or scalar
        The metrics (walked recursively).
    path : str, default ""
        The dotted path of ``node`` (for the message).

    Raises
    ------
    ValueError
        At the first NaN or infinite float.
    """
    if isinstance(node, dict):
        for k, v in node.items():
            finite_metrics(v, f"{path}.{k}" if path else str(k))
    elif isinstance(node, (list, tuple)):
        for i, v in enumerate(node):
            finite_metrics(v, f"{path}[{i}]")
    elif isinstance(node, float) and not math.isfinite(node):
        if any(s in path for s in ("loss", "curves", "grad_norm", "best_val")):
            cause = "the training diverged; try a smaller --lr or --qat-lr, or a --max-norm"
        else:
            cause = "the predictions are not finite (a diverged model or extreme data)"
        raise ValueError(f"metrics.json: {path} is {node} ({cause}); nothing was written")
