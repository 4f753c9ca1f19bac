"""The main job's checkpoint: write (rank 0, atomically) and restore
(:mod:`nbqat.train.checkpoint_schema`
validates the files against the schema handed to it, :func:`config_schema`; this module maps
them onto a :class:`~nbqat.train.loop.Run`)."""

from __future__ import annotations

import math
import os
import shutil
from dataclasses import asdict
from pathlib import Path
from typing import Any

from nbqat._io import atomic_open
from nbqat.train import checkpoint_schema as ckpt
from nbqat.train.config import SIDE_FILES, TrainConfig
from nbqat.train.loop import FLOAT, Run, RunState
from nbqat.train.model import to_host
from nbqat.train.options import config_checks, legacy_values

__all__ = [
    "config_schema",
    "load_checkpoint",
    "nonfinite_field",
    "read_run_config",
    "read_run_state",
    "restore_side_files",
    "save_checkpoint",
]

#: Phases whose checkpoint holds the QAT model (qat.npz).
QAT_PHASES = ("qat", "qat_noclip", "evaluate", "done")


def save_checkpoint(r: Run) -> Path:
    """Write ``OUT/checkpoint/`` (a complete folder replaces the old one); rank 0 only.

    The files are written into ``checkpoint.tmp/`` (each one flushed and fsynced by
    :func:`nbqat._io.atomic_open`), then the folder is renamed over ``checkpoint/``: a reader
    finds the old checkpoint or the new one, never a half-written one. The checkpoint holds no
    per-rank state (every rank holds the same model, optimizer and observers), so it resumes
    under any number of processes.

    Parameters
    ----------
    r : Run

    Returns
    -------
    Path
        The checkpoint folder (also on the ranks that write nothing).
    """
    ck = r.out / "checkpoint"
    if not r.par.root:
        return ck
    tmp = r.out / "checkpoint.tmp"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    opt = None if r.opt is None else r.opt.state_dict()
    ckpt.write_float_arrays(tmp / "float.npz", to_host(r.model.params), r.best_params, opt)
    if r.qat is not None and r.st.phase in QAT_PHASES:
        r.qat.save(tmp / "qat.npz", optimizer=r.qat_opt)
    for side in SIDE_FILES:
        if (r.out / side).exists():
            shutil.copyfile(r.out / side, tmp / side)
    text = ckpt.state_json(r.cfg.to_json(), asdict(r.st), r.data_fp)
    with atomic_open(tmp / "state.json", "w") as fh:
        fh.write(text)
    old = r.out / "checkpoint.old"
    if ck.exists():
        if old.exists():
            shutil.rmtree(old)
        os.replace(ck, old)
    os.replace(tmp, ck)
    if old.exists():
        shutil.rmtree(old)
    return ck


def nonfinite_field(st: Any) -> str | None:
    """The first field of the run state holding NaN or +-Inf (``"step_losses.qat"``), or
    None: ``state.json`` is strict JSON and its reader accepts finite numbers only.

    Parameters
    ----------
    st : RunState

    Returns
    -------
    str or None
    """
    for name in ("step_losses", "grad_norms", "curves"):
        for ph, v in getattr(st, name).items():
            for key, lst in v.items() if isinstance(v, dict) else [("", v)]:
                if not all(math.isfinite(x) for x in lst):
                    return f"{name}.{ph}" + (f".{key}" if key else "")
    return None if math.isfinite(st.epoch_loss_sum) else "epoch_loss_sum"


def load_checkpoint(r: Run, ck: Path, meta: dict) -> None:
    """Restore ``r`` from a validated checkpoint (:func:`nbqat.train.checkpoint_schema.read_state`).

    Parameters
    ----------
    r : Run
        Built with the checkpoint's configuration (model and optimizer created).
    ck : Path
        The checkpoint folder (never written to).
    meta : dict
        :func:`nbqat.train.checkpoint_schema.read_state`'s result.

    Raises
    ------
    CheckpointError
        A field or file that does not fit this data and configuration.
    """
    st = RunState(**meta["state"])
    nb = len(r.epoch_order(FLOAT, 0))
    if st.batch_pos > nb:
        raise ckpt.CheckpointError(
            f"{ck / 'state.json'}: field 'state.batch_pos': {st.batch_pos} exceeds the "
            f"{nb} batches of an epoch of this data and configuration"
        )
    z = ckpt.read_float_arrays(ck, int(to_host(r.model.params).size), meta["state"])
    opt_state = z.get("opt")
    try:
        if opt_state:
            r.opt.load_state_dict(opt_state)
    except (KeyError, TypeError, ValueError, IndexError) as e:
        raise ckpt.CheckpointError(f"{ck / 'float.npz'}: field 'opt': {e}") from None
    _check_side_file(r, ck, st.phase)
    if (ck / "qat.npz").exists():
        r.reset_qat(ck / "qat.npz")
    elif st.phase in QAT_PHASES:
        raise ckpt.CheckpointError(f"{ck / 'qat.npz'}: missing for phase {st.phase!r}")
    r.model.params[...] = z["params"]
    if "best_params" in z:
        r.best_params = z["best_params"].copy()
    r.st = st


def restore_side_files(r: Run, ck: Path) -> None:
    """Copy the checkpoint's --compare-clipping states into the run folder (where the phases
    read them); after :func:`load_checkpoint`, once the run goes on (``--check`` writes
    nothing).

    Parameters
    ----------
    r : Run
    ck : Path
        The checkpoint folder.
    """
    for side in SIDE_FILES:
        if (ck / side).exists() and (ck / side).resolve() != (r.out / side).resolve():
            shutil.copyfile(ck / side, r.out / side)


#: The --compare-clipping state a phase loads when it ends (``phase -> file``): the calibrated
#: start (the unclipped run's) and the clipped result (the model evaluated).
_SIDE_NEEDED = {"qat": "qat_start.npz", "qat_noclip": "qat_clipped.npz"}


def _check_side_file(r: Run, ck: Path, phase: str) -> None:
    """Load the --compare-clipping state that ``phase`` needs at its end from ``ck`` once: a
    missing or damaged one is a CheckpointError now, not after the phase's training (the
    caller then loads ``qat.npz``, the model's state)."""
    need = _SIDE_NEEDED.get(phase) if r.cfg.compare_clipping else None
    if need is None:
        return
    if not (ck / need).is_file():
        raise ckpt.CheckpointError(
            f"{ck / need}: missing for phase {phase!r} (--compare-clipping loads it after "
            "that phase)"
        )
    r.reset_qat(ck / need)


def config_schema() -> dict[str, Any]:
    """The schema of a checkpoint's ``config``: ``{option: check}`` of every
    :class:`~nbqat.train.TrainConfig` field, from the options registry
    (:func:`nbqat.train.options.config_checks`; handed to
    :func:`nbqat.train.checkpoint_schema.read_state`).

    Returns
    -------
    dict
        ``check(value)`` returns what is wrong with ``value`` ("expected ..., got ...") or None.
    """
    return config_checks()


def read_run_state(ck: str | Path) -> dict:
    """:func:`nbqat.train.checkpoint_schema.read_state` of ``ck`` under this job's
    :func:`config_schema`.

    Parameters
    ----------
    ck : str or Path
        The checkpoint folder (or a file inside it).

    Returns
    -------
    dict
        ``{"version", "config", "state", "data", "folder"}`` (see ``read_state``).

    Raises
    ------
    FileNotFoundError, CheckpointError
        As :func:`nbqat.train.checkpoint_schema.read_state`.
    """
    return ckpt.read_state(ck, config_schema(), legacy_values())


def read_run_config(ck: str | Path) -> TrainConfig:
    """The validated options of the run whose checkpoint folder is ``ck``.

    Parameters
    ----------
    ck : str or Path
        A run's ``checkpoint/`` folder (``OUT/checkpoint``).

    Returns
    -------
    nbqat.train.TrainConfig
        Resolved options; ``out`` is the checkpoint's parent folder and ``csv`` the absolute
        data path (``None``: the shipped dataset). ``nbqat.train.load_data(cfg)`` rebuilds
        the run's windows (scaling, column names) from it.

    Raises
    ------
    FileNotFoundError, CheckpointError
        As :func:`nbqat.train.checkpoint_schema.read_state`.
    """
    return TrainConfig(**read_run_state(ck)["config"])
