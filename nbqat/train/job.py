"""``nbqat train``'s entry point :func:`run`: validate, load, train, evaluate, write."""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import Any, cast

import numpy as np

from nbqat.data import tmy3_path
from nbqat.train import checkpoint_schema as ckpt
from nbqat.train import preflight
from nbqat.train.baselines import RidgeBaseline
from nbqat.train.checkpointing import (
    load_checkpoint,
    nonfinite_field,
    read_run_state,
    restore_side_files,
    save_checkpoint,
)
from nbqat.train.config import TrainConfig, TrainingInterrupted
from nbqat.train.evaluate import evaluate
from nbqat.train.loop import Interrupt, Run
from nbqat.train.model import build_model, check_device, load_data, make_optimizer
from nbqat.train.outputs import write_outputs
from nbqat.train.parallel import Parallel

__all__ = ["run"]


def run(
    cfg: TrainConfig,
    resume: str | Path | None = None,
    *,
    check_only: bool = False,
    group: Any = None,
) -> dict:
    """Run ``nbqat train`` with ``cfg`` (or continue the checkpoint ``resume``).

    The BLAS library (OpenBLAS under NumPy's wheels) is limited to one thread for the run
    (threadpoolctl): the network's matmuls are small, Numba's kernels supply the parallelism,
    and OpenBLAS's spinning threads otherwise starve Numba's (measured on 2 cores: a float step
    of 26-34 ms with one BLAS thread against 150-1400 ms with two while another job ran).

    Under ``mpiexec -n N`` (N > 1) the run is data-parallel (:mod:`nbqat.train.parallel`):
    the same global batches, each rank trains on its slice, one gradient allreduce per step,
    observers in sync; rank 0 alone writes the outputs and checkpoints. Any error on one rank
    then ends every rank (``nbqat: rank R of N failed: ...``, exit status 1).

    Parameters
    ----------
    cfg : TrainConfig
        The run's configuration.
    resume : str or Path, optional
        A previous run's ``checkpoint/`` folder to continue (the run folder is its parent);
        written by any number of processes, continued by any number.
    check_only : bool, default False
        Only the validation pass (output folder, data, options, checkpoint): nothing is
        written; returns ``{"data": ..., "config": ...}``.
    group : nbqat.distributed.ProcessGroup, optional
        Default :func:`nbqat.distributed.init_process_group` (MPI under ``mpiexec``).

    Returns
    -------
    dict
        The content of metrics.json (on ranks other than 0 without the quantization report,
        plot and ONNX summaries, which only rank 0 computes).

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

    from nbqat import distributed as dist

    par = Parallel(group if group is not None else dist.init_process_group())
    with threadpool_limits(limits=1, user_api="blas"), par.guard():
        return _run(cfg, resume, check_only, par)


def _config(cfg: TrainConfig, resume: str | Path | None, par: Parallel) -> tuple:
    """The resolved configuration (the checkpoint's on --resume) and the checkpoint's meta."""
    meta: dict | None = None
    if resume is not None:
        meta = read_run_state(resume)
        if meta["state"]["phase"] == "done":
            raise ValueError(
                f"--resume {str(resume)!r}: that run is finished; its outputs are in "
                f"{meta['config']['out']} (summary.txt, metrics.json). Nothing to resume: "
                "start a new run with another --out, or --overwrite it"
            )
        saved = dict(meta["config"])
        saved["csv"] = _run_data(saved.get("csv"), Path(saved["out"]))
        saved["progress"] = cfg.progress
        saved["stop_after_steps"] = cfg.stop_after_steps
        cfg = TrainConfig(**saved)
    if resume is None and cfg.csv is not None:
        if not isinstance(cfg.csv, (str, Path)):
            raise TypeError(
                f"TrainConfig.csv must be a path, got {type(cfg.csv).__name__}: to train on a "
                "DataFrame use nbqat.Forecaster(...).fit(df, time_col=..., target_col=...)"
            )
        cfg.csv = str(Path(cfg.csv).resolve())
    cfg = cfg.resolved()
    if par.distributed and cfg.compare_clipping:
        raise ValueError(
            f"--compare-clipping runs on one process only (this run has {par.size}): "
            "drop it, or run without mpiexec"
        )
    if par.distributed and cast(int, cfg.batch_size) < par.size:
        raise ValueError(
            f"--batch-size {cfg.batch_size} is smaller than the {par.size} processes (each "
            "takes a slice of every batch): raise --batch-size or start fewer processes"
        )
    check_device(cfg.device)
    _threads(cfg.threads, par)
    return cfg, meta


def _run_data(csv: str | None, run: Path) -> str | None:
    """The data file of a checkpoint in the run folder ``run``: a Forecaster's
    ``data.parquet``, stored inside the run folder, moves with it (the stored path names the
    folder the run started in, so a moved run could not be resumed); its content is checked
    against the checkpoint's fingerprint as any data file's."""
    if csv is None or Path(csv).is_file() or Path(csv).name != "data.parquet":
        return csv
    moved = run / "data.parquet"
    return str(moved) if moved.is_file() else csv


def _threads(threads: int | None, par: Parallel) -> None:
    import numba

    n = threads if threads is not None else par.default_threads()
    if n is None:
        return
    n_max = int(numba.config.NUMBA_NUM_THREADS)  # type: ignore[attr-defined]
    if n > n_max:
        raise ValueError(
            f"--threads {n} exceeds the {n_max} threads "
            "Numba started with (set NUMBA_NUM_THREADS to raise it)"
        )
    numba.set_num_threads(n)


def _run(cfg: TrainConfig, resume: str | Path | None, check_only: bool, par: Parallel) -> dict:
    t_start = time.perf_counter()
    cfg, meta = _config(cfg, resume, par)
    # The validation pass: the output folder, the data and the options, before anything is
    # written (a failure leaves no folder behind).
    out = preflight.check_out(cfg.out, cfg.overwrite, resume=meta is not None)
    t0 = time.perf_counter()
    w = load_data(cfg)
    data_fp = ckpt.data_fingerprint(cfg.csv if cfg.csv is not None else tmy3_path())
    if meta is not None:
        ckpt.check_data(meta, data_fp)
    r = Run(cfg, out, w, par)
    r.data_fp = data_fp
    r.model = build_model(cfg, w)
    r.opt = make_optimizer(r.model, cast(float, cfg.lr), cfg)
    if meta is not None:
        load_checkpoint(r, Path(meta["folder"]), meta)
    if check_only:
        return {"data": w.summary(), "config": cfg.to_json()}
    if meta is not None:
        restore_side_files(r, Path(meta["folder"]))
    r.ridge = RidgeBaseline(lam=1.0, quantiles=w.quantiles).fit_split(w.train)
    if meta is None and cfg.linear_skip and getattr(r.model, "linear_skip", None) is not None:
        from nbqat.train.recipe import init_linear_skip_from_ridge

        init_linear_skip_from_ridge(r.model, r.ridge)
    par.barrier()  # every rank validated its inputs before rank 0 creates or clears anything
    new_dir = aside = None  # the top-most folder this run creates; the previous run's outputs
    if par.root:
        if cfg.overwrite and meta is None:  # kept until this run finishes (restored on failure)
            aside = preflight.set_aside_outputs(out)
        new_dir = next((d for d in (*reversed(out.parents), out) if not d.exists()), None)
        try:
            out.mkdir(parents=True, exist_ok=True)
        except OSError as e:  # a folder the OS refuses (/proc/..., a read-only mount)
            preflight.restore_outputs(out, aside)
            raise ValueError(f"--out {str(out)!r}: cannot create it ({e.strerror})") from None
    r.tick("data", t0)
    try:
        try:
            _phases(r)
        except TrainingInterrupted as e:
            raise _checkpoint_interrupted(r, e) from None
        save_checkpoint(r)  # phase "evaluate": a Ctrl-C in the evaluation loses no training
        try:
            metrics = _finish(r, t_start)
        except KeyboardInterrupt:
            if par.distributed:
                raise  # the guard ends every rank; the checkpoint resumes the evaluation
            raise r.interrupted() from None
        preflight.drop_set_aside(aside)
        return metrics
    except TrainingInterrupted:
        preflight.drop_set_aside(aside)  # the new run's checkpoint resumes it
        raise
    except Exception:
        if new_dir is not None:  # a failed run leaves no folder behind (README)
            shutil.rmtree(new_dir, ignore_errors=True)
        preflight.restore_outputs(out, aside)  # and a failed --overwrite the previous run
        raise


def _checkpoint_interrupted(r: Run, e: TrainingInterrupted) -> TrainingInterrupted:
    """Ctrl-C: write the checkpoint (after the interrupted phase's time was counted) and
    return ``e``. A progress that strict JSON cannot hold (a NaN step loss or gradient norm:
    the training diverged, nothing to resume) writes none, keeps an earlier one, and the
    returned exception says why (the CLI still exits with 130)."""
    bad = nonfinite_field(r.st)
    if bad is None:
        save_checkpoint(r)
    r.par.barrier()  # no rank exits before the checkpoint is complete
    if bad is None:
        return e
    ck = r.out / "checkpoint"
    kept = f"; the earlier checkpoint {ck} is kept" if ck.exists() else ""
    return TrainingInterrupted(
        f"interrupted: no checkpoint written: state.{bad} is not finite (the training "
        f"diverged; lower --lr or set a --max-norm){kept}"
    )


def _timed(r: Run, name: str, fn: Any, *args: Any) -> None:
    t0 = time.perf_counter()
    try:
        fn(*args)
    finally:
        r.tick(name, t0)


def _phases(r: Run) -> None:
    cfg, st, out = r.cfg, r.st, r.out
    with Interrupt(cfg.stop_after_steps, r.par.agree if r.par.distributed else None) as intr:
        if st.phase == "float":
            _timed(r, "float", r.float_phase, intr)
            if r.best_params is None or not np.all(np.isfinite(r.best_params)):
                raise ValueError(
                    "the float training diverged: no epoch had a finite validation loss "
                    f"(curve {r.st.curves['float']['val']}); lower --lr"
                    + (" or set a --max-norm" if cfg.max_norm is None else "")
                )
        if st.phase == "calibrate":
            _timed(r, "calibration", r.calibrate_phase)
        if st.phase == "qat":
            _timed(r, "qat", r.qat_phase, intr, "qat")
            if cfg.compare_clipping:
                # keep the clipped result, restart from the calibrated state without clipping
                r.qat.save(out / "qat_clipped.npz", optimizer=r.qat_opt)
                r.reset_qat(out / "qat_start.npz")
                st.phase = "qat_noclip"
            else:
                st.phase = "evaluate"
        if st.phase == "qat_noclip":
            _timed(r, "qat_noclip", r.qat_phase, intr, "qat_noclip")
            r.reset_qat(out / "qat_clipped.npz")  # the clipped model is the one evaluated
            st.phase = "evaluate"


def _finish(r: Run, t_start: float) -> dict:
    st = r.st
    metrics = evaluate(r)
    preflight.finite_metrics(metrics)  # strict JSON: a NaN or inf is an error with its cause
    st.phase = "done"
    save_checkpoint(r)
    st.timings["total"] = sum(v for k, v in st.timings.items() if k != "total")
    timings = {
        "note": "wall-clock seconds per phase (summed over resumed sessions); not deterministic",
        "phases_s": {k: round(v, 3) for k, v in st.timings.items()},
        "this_session_s": round(time.perf_counter() - t_start, 3),
    }
    if r.par.root:
        write_outputs(r, metrics, timings)
    return metrics
