"""The main job's evaluation: q-risk of every model on the test split, the fair rows, and the
content of ``metrics.json``.

The predictions are streamed in batches (:meth:`~nbqat.train.loop.Run.predict`; under MPI the
batches are split over the ranks and gathered in order). Every rank runs this module's code in
the same order (its collectives match); only rank 0 writes the quantization report, the plots
and ``model.onnx``.
"""

from __future__ import annotations

import math
import time
from dataclasses import replace as dataclass_replace
from typing import Any

import numpy as np

from nbqat.train.baselines import seasonal_naive_forecast, tune_ridge
from nbqat.train.config import NOT_IN_METRICS, NOT_IN_METRICS_AT_DEFAULT
from nbqat.train.loop import Run
from nbqat.train.metrics import diebold_mariano, grad_stats, loss_stats, q_risk
from nbqat.train.model import build_model, make_optimizer, to_host

__all__ = ["evaluate", "fair_rows"]

#: metrics.json's explanation of the fair quality table.
QUALITY_NOTE = (
    "P10/P50/P90 q-risk on the test split. float: the early-stopped float model; "
    "float_finetuned: it trained on for the QAT phase's steps (same batches, "
    "optimizer, schedule and clipping, no quantization); ptq_int8: calibrated on "
    "the calibration batches and converted, no QAT; qat_int8: the main job's int8 "
    "model. Keyed by the activation observer of the run (--observer)."
)
#: QUALITY_NOTE's addition in a run whose weights are not int8.
QUALITY_NOTE_FORMAT = (
    " A run in another weight format (--weight-bits 4, --weight-dtype) adds its ptq_<format> "
    "/ qat_<format> rows; its ptq_int8 / qat_int8 are then the int8 run's, replayed from the "
    "same float weights (nbqat.train.int8_rows)."
)
#: metrics.json's ``weight_format.note`` in a run whose weights are not int8.
FORMAT_NOTE = (
    "q_risk_test: int8 and qat_fake_quant are this run's QAT model (the reference engine's "
    "and the fake-quant forward), ptq_<format> its PTQ, ptq_int8 / qat_int8 the int8 run's "
    "rows replayed from the same float weights; comparisons, significance and targets keep "
    "their role names (int8: this run's engine model, ptq_int8: its PTQ)"
)
BASELINE_NOTE = (
    "seasonal naive: P_q = y[t - k season] + r_q,k at a step k seasons after the last observed "
    "one (k = 1 unless the horizon is longer than a season), r_q,k the empirical q-quantile of "
    "the residual y[t] - y[t - k season] on each entity's training rows"
)
RIDGE_NOTE = (
    "ridge: the tuned linear baseline every comparison, target and Diebold-Mariano test uses: "
    "ridge (unpenalised intercept, closed form) from the flattened window [historical, future, "
    "static] to the tau standardised targets, fitted on every training window of its history; "
    "its history (whole seasons up to the longest the data allows, and the model's) and lambda "
    "chosen by the P50 q-risk on the validation split (ridge_tuning); forecast on the model's "
    "test windows; P_q = yhat_h + the q-quantile of its training residuals at step h; with "
    "window_norm 'last' it reads the model's windows, relative to their last history value"
)
RIDGE_FIXED_NOTE = (
    "ridge_fixed: the former ridge row, kept for continuity: the same regression with the "
    "windows' history (--skip-history, else --history) and lambda 1 (also the start of the "
    "TFT's linear skip)"
)


def fair_rows(r: Run) -> dict:
    """q-risk of the float model fine-tuned like QAT and of post-training quantization
    (:func:`nbqat.train.recipe.fair_rows`, on the CPU).

    Parameters
    ----------
    r : Run
        After QAT.

    Returns
    -------
    dict
        ``{"float_finetuned": q-risks, "ptq_int8": q-risks}``.
    """
    from nbqat.train.recipe import fair_rows as recipe_fair_rows

    cpu_cfg = dataclass_replace(r.cfg, device="cpu")
    return recipe_fair_rows(
        r,
        lambda: build_model(r.cfg, r.w),
        lambda model: make_optimizer(model, r.cfg.qat_lr, cpu_cfg, qat=True),
    )


def _predictions(r: Run) -> dict:
    """Every model's (unscaled) test forecasts, the int8 model, the quantization report."""
    from nbqat import distributed as dist
    from nbqat.train.report import from_run

    t0 = time.perf_counter()
    test = r.w.test
    dist.sync_observers(r.qat.fake_quants, None)  # evaluation observes nothing: no collectives
    p: dict[str, Any] = {}
    p["naive"], p["naive_point"] = seasonal_naive_forecast(test)
    t1 = time.perf_counter()
    tuned = tune_ridge(r.w)  # every rank: deterministic NumPy, no collectives
    p["ridge"], p["ridge_tuning"] = tuned.predict_split(test), tuned.summary()
    p["ridge_fixed"] = r.ridge.predict_split(test)
    r.tick("baselines", t1)
    t0 += time.perf_counter() - t1  # not counted twice
    # The QAT model may share or have changed the float model's buffer: evaluate a fresh float
    # model holding the best float weights.
    r.model = build_model(r.cfg, r.w)
    r.model.params[...] = r.best_params
    p["float"] = test.unscale(r.predict(r.model.forward, test))
    p["qat"] = test.unscale(r.predict(r.qat.predict, test))
    p["quant_report"] = None
    if r.par.root:  # it writes OUT/quant_report.*: rank 0 alone, its predictions local
        with r.par.alone():
            p["quant_report"] = from_run(r, test)
    r.tick("evaluate", t0)
    t0 = time.perf_counter()
    p["int8_model"] = r.qat.to_int8()
    r.tick("int8", t0)
    return p


def _history_choice(w: Any) -> dict:
    """``{"history_choice": record}`` for a ``--history auto`` run,
    ``{"skip_history_choice": record}`` for a ``--skip-history auto`` one (both may be) and
    ``{"window_norm": record}`` (:func:`nbqat.train.window_norm.choose_window_norm`)."""
    names = ("history_choice", "skip_history_choice", "window_norm")
    return {n: getattr(w, n) for n in names if getattr(w, n, None) is not None}


def _comparisons(p50: dict, pred_int8: np.ndarray, pred_qat: np.ndarray) -> dict:
    from nbqat.train.recipe import baseline_comparisons

    return {
        "float_vs_naive_P50_improvement": 1.0 - p50["float"] / p50["seasonal_naive"],
        "int8_vs_float_P50_relative_diff": p50["int8"] / p50["float"] - 1.0,
        "qat_vs_float_P50_relative_diff": p50["qat_fake_quant"] / p50["float"] - 1.0,
        "int8_vs_qat_P50_relative_diff": p50["int8"] / p50["qat_fake_quant"] - 1.0,
        "int8_vs_qat_max_abs_output_diff": float(np.max(np.abs(pred_int8 - pred_qat))),
        **baseline_comparisons(p50),  # against the tuned ridge
        "float_vs_ridge_fixed_P50_improvement": 1.0 - p50["float"] / p50["ridge_fixed"],
    }


def _per_origin(loss: dict, w: Any, steps: np.ndarray | None = None) -> tuple[dict, int]:
    """The per-window losses averaged over the entities that share a forecast origin, in time
    order (one value per origin: the test's lags then pair consecutive origins, never one
    entity's last window with the next entity's first), and how many consecutive origins share
    a forecast step (``ceil(horizon / gap)``, the gap the closest origins' distance in steps:
    ``eval_stride`` on the split's grid). ``steps``: each window's scored steps (fill_gaps),
    its weight; an origin without one is left out."""
    origins, which = np.unique(w.test.times()[:, 0], return_inverse=True)
    count = np.bincount(which, weights=steps)
    means = {k: np.bincount(which, weights=v if steps is None else np.where(steps > 0, v, 0.0)
                            * steps) / count for k, v in loss.items()}  # fmt: skip
    if steps is not None:
        means = {k: v[count > 0] for k, v in means.items()}
    gap = float(np.min(np.diff(origins)) / w.step) if len(origins) > 1 else w.eval_stride
    return means, math.ceil(w.horizon / gap)


def _significance(p: dict, y: np.ndarray, w: Any) -> dict:
    """Diebold-Mariano tests of the float and int8 models against both baselines (P50; the
    tuned ridge), on the per-window P50 losses averaged per forecast origin."""
    qi = list(w.quantiles).index(0.5)
    keep = w.test.scored()  # the windows' observed steps (None: all of them)
    steps = None if keep is None else keep.sum(axis=1).astype(np.float64)

    def mean(e: np.ndarray) -> np.ndarray:
        return np.mean(e, axis=1) if keep is None else np.sum(e * keep, axis=1) / steps

    with np.errstate(invalid="ignore"):  # a window of repaired steps only: left out
        loss, overlap = _per_origin(
            {k: mean(np.abs(y - p[k][..., qi])) / 2 for k in ("float", "int8", "naive", "ridge")},
            w,
            steps,
        )
    n = len(loss["float"])

    def test(a: np.ndarray, b: np.ndarray) -> dict:
        if n < 2 or not np.all(np.isfinite(a - b)):  # one test origin: no variance to test
            # with; a non-finite forecast: metrics' finite check names it (dm, p_value null)
            return {"dm": None, "p_value": None, "dm_hln": None, "p_value_hln": None,
                    "mean_diff": float(np.mean(a - b)), "lags": 0, "n": n,
                    "small_sample": True}  # fmt: skip
        return diebold_mariano(a, b, overlap)

    return {
        "note": "Diebold-Mariano test on the per-window P50 pinball loss averaged over the "
        "entities at each forecast origin, in time order (n: the origins; long-run variance "
        "with the overlapping windows' lags at full weight, then a Bartlett taper; "
        "two-sided normal p-value; dm_hln / p_value_hln: Harvey-Leybourne-Newbold's "
        "small-sample correction against Student's t, what the summary reports); negative dm: "
        "the model's loss is smaller; null with fewer than 2 test origins; small_sample: fewer "
        "than 20 windows per estimated lag (+1), the p-values are indicative only",
        **{
            f"{m}_vs_{b}_P50": test(loss[m], loss[b])
            for m in ("float", "int8")
            for b in ("naive", "ridge")
        },
    }


def _targets(p50: dict) -> dict:
    return {
        "float_P50_at_least_20pct_better_than_naive": bool(
            p50["float"] <= 0.8 * p50["seasonal_naive"]
        ),
        # "within 2 %" read as "at most 2 % worse": QAT fine-tuning may also improve it
        "int8_P50_at_most_2pct_worse_than_float": bool(p50["int8"] <= 1.02 * p50["float"]),
        "float_P50_at_least_5pct_better_than_ridge": bool(p50["float"] <= 0.95 * p50["ridge"]),
        "qat_int8_P50_at_most_1pct_worse_than_float_finetuned": bool(
            p50["int8"] <= 1.01 * p50["float_finetuned"]
        ),
    }


def _weight_format(cfg: Any, p50: dict, qr: dict, fallback: Any = None) -> dict:
    """metrics.json's ``weight_format``: the run's weight format (``--weight-bits``,
    ``--group-size``, ``--weight-dtype``) and its float fine-tuned / PTQ / QAT rows by name,
    next to the int8 rows in another format, with the issue-30 goals; ``fallback``: the
    quantization report's fallback layers (``--weight-bits 4``)."""
    fmt = cfg.weight_format()
    name = fmt["name"]
    ff, ptq, qat = p50["float_finetuned"], p50[f"ptq_{name}"], p50["int8"]
    lost = ptq - ff
    recovered = (ptq - qat) / lost if lost > 0 else None
    int8 = {} if name == "int8" else {k: qr[k] for k in ("ptq_int8", "qat_int8")}
    extra = {} if name == "int8" else {"note": FORMAT_NOTE}
    for k in ("per_channel_fallback", "fallback_rule"):  # --weight-bits 4 (report summary)
        if k in (fallback or {}):
            extra[k] = fallback[k]
    return {
        **fmt,
        **extra,
        "rows": {
            "float_finetuned": qr["float_finetuned"],
            **int8,
            f"ptq_{name}": qr[f"ptq_{name}"],
            f"qat_{name}": qr["int8"],
        },  # fmt: skip
        f"qat_{name}_vs_float_finetuned_P50_relative_diff": qat / ff - 1.0,
        "qat_recovered_fraction_of_ptq_loss": recovered,
        "targets": {
            f"qat_{name}_P50_at_most_2pct_worse_than_float_finetuned": bool(qat <= 1.02 * ff),
            "qat_recovers_at_least_half_of_ptq_loss": bool(recovered is None or recovered >= 0.5),
        },
    }


def _quality_rows(qr: dict, name: str) -> dict:
    """The fair quality table's rows: float, float fine-tuned, PTQ / QAT int8 and, for
    another weight format ``name``, its PTQ / QAT rows."""
    rows = {k: qr[k] for k in ("float", "float_finetuned", "ptq_int8")}
    rows["qat_int8"] = qr["int8" if name == "int8" else "qat_int8"]
    if name != "int8":
        rows.update({f"ptq_{name}": qr[f"ptq_{name}"], f"qat_{name}": qr["int8"]})
    return rows


def _training(r: Run) -> dict:
    """metrics.json's ``float``, ``qat`` and ``grad_norm`` sections."""
    cfg, st = r.cfg, r.st
    return {
        "float": {
            "epochs_run": len(st.curves.get("float", {}).get("val", [])),
            "best_epoch": st.best_epoch + 1,  # 0: the start (the ridge forecast) was kept
            "best_val_loss": st.best_val,
            "early_stopped": st.stopped_early,
            "plateau_epoch": st.plateau_epoch + 1 if st.plateau_epoch >= 0 else None,
            "lr_factor_after_plateau": cfg.plateau_factor if st.plateau_epoch >= 0 else None,
            "curves": st.curves.get("float"),
        },
        "qat": {
            "epochs": cfg.qat_epochs,
            "calibration_batches": cfg.calibration_batches,
            "curves": st.curves.get("qat"),
            "loss": loss_stats(st.step_losses.get("qat", [])),
        },
        "grad_norm": {
            ph: grad_stats(st.grad_norms.get(ph, []), cfg.max_norm if ph != "qat_noclip" else None)
            for ph in ("float", "qat")
        },
    }


def _compare_clipping(r: Run) -> dict:
    st, runs = r.st, {}
    for ph, label, mn in (("qat", "clipped", r.cfg.max_norm), ("qat_noclip", "unclipped", None)):
        g = np.asarray(st.grad_norms.get(ph, []))
        runs[label] = {
            "max_norm": mn,
            "loss": loss_stats(st.step_losses.get(ph, [])),
            "largest_grad_norm": float(g.max()) if len(g) else None,
            "clipped_steps": int(np.sum(g > mn)) if mn is not None else 0,
            "val_curve": st.curves.get(ph, {}).get("val"),
        }
    return runs


def _metrics_config(cfg: Any) -> dict:
    """The run's options in metrics.json (without NOT_IN_METRICS, and without the options of
    NOT_IN_METRICS_AT_DEFAULT at their default)."""
    return {
        k: v
        for k, v in cfg.to_json().items()
        if k not in NOT_IN_METRICS
        and not (k in NOT_IN_METRICS_AT_DEFAULT and NOT_IN_METRICS_AT_DEFAULT[k] == v)
    }


def _model_summary(r: Run) -> dict:
    """metrics.json's ``model`` block (the TFT's as before; ``name`` for another forecaster)."""
    cfg = r.cfg
    out: dict[str, Any] = {
        "num_parameters": int(to_host(r.model.params).size),
        "hidden_dim": cfg.hidden_dim,
        "heads": cfg.heads,
        "quantiles": list(r.w.quantiles),
    }
    if cfg.model != "tft":
        out = {"name": cfg.model, **out}
        del out["heads"]
    return out


def environment() -> dict[str, Any]:
    """metrics.json's ``environment`` block: what the figures depend on beyond the seed.

    The float results go through NumPy's matmul (the BLAS library and the kernel it picked for
    the CPU: OpenBLAS's ``OPENBLAS_CORETYPE``), Numba's compiled code and libm, and the ONNX
    parity through onnxruntime, so two machines with the same seed agree to rounding only
    (README, "Results across machines").

    Returns
    -------
    dict
        ``python``, ``numpy``, ``numba``, ``onnxruntime`` (None when absent) versions, and
        ``blas``: NumPy's BLAS library as loaded (threadpoolctl's ``internal_api``,
        ``version``, ``architecture`` i.e. the core type in use, ``threading_layer``; every
        BLAS loaded, sorted, when none matches NumPy's build), with ``OPENBLAS_CORETYPE`` as
        set in the environment (None when unset).
    """
    import os
    import platform
    from importlib import metadata

    from threadpoolctl import threadpool_info

    def version(dist: str) -> str | None:
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            return None

    import numpy

    # NumPy's own BLAS (the one its matmul calls), by the version NumPy was built with; other
    # BLAS copies (scipy's) are loaded or not, in either order, depending on what ran before
    show: Any = numpy.show_config  # mode="dicts" since NumPy 1.26; NumPy 2.0's stub lacks it
    built = (show(mode="dicts") or {}).get("Build Dependencies", {}).get("blas", {})
    keys = ("internal_api", "version", "architecture", "threading_layer")
    libs = [lib for lib in threadpool_info() if lib.get("user_api") == "blas"]
    mine = [lib for lib in libs if lib.get("version") == built.get("version")] or libs
    blas = sorted(({k: lib.get(k) for k in keys} for lib in mine), key=lambda d: str(d))
    return {
        "python": platform.python_version(),
        "numpy": version("numpy"),
        "numba": version("numba"),
        "onnxruntime": version("onnxruntime"),
        "blas": blas,
        "OPENBLAS_CORETYPE": os.environ.get("OPENBLAS_CORETYPE"),
    }


def evaluate(r: Run) -> dict:
    """Evaluate every model on the test split; returns metrics.json's content.

    Rank 0 also writes the quantization report, the plots and ``model.onnx`` (and its
    metrics hold their summaries); the other ranks return the same metrics without them.

    Parameters
    ----------
    r : Run
        After QAT (phase ``evaluate``).

    Returns
    -------
    dict
    """
    from nbqat._version import __version__

    cfg, w = r.cfg, r.w
    p = _predictions(r)
    t0 = time.perf_counter()
    y, keep = w.test.target_raw(), w.test.scored()  # keep: fill_gaps' repairs not scored
    p["int8"] = w.test.unscale(r.predict(p["int8_model"].forward, w.test))
    fair = fair_rows(r)
    name = cfg.weight_format()["name"]  # "int8" by default: the keys as they always were
    qr = {
        "seasonal_naive": q_risk(p["naive"], y, w.quantiles, keep),
        "ridge": q_risk(p["ridge"], y, w.quantiles, keep),
        "ridge_fixed": q_risk(p["ridge_fixed"], y, w.quantiles, keep),
        "float": q_risk(p["float"], y, w.quantiles, keep),
        "float_finetuned": fair["float_finetuned"],
        f"ptq_{name}": fair["ptq_int8"],
        "qat_fake_quant": q_risk(p["qat"], y, w.quantiles, keep),
        "int8": q_risk(p["int8"], y, w.quantiles, keep),
    }
    if name != "int8":
        from nbqat.train.int8_rows import int8_reference_rows

        qr.update(int8_reference_rows(r))
    p50 = {k: v["P50"] for k, v in qr.items()}
    roles = {**p50, "ptq_int8": p50[f"ptq_{name}"]}  # comparisons/targets: the run's format
    metrics: dict[str, Any] = {
        "nbqat_version": __version__,
        "environment": environment(),
        "config": _metrics_config(cfg),
        "data": w.summary(),
        "model": _model_summary(r),
        "q_risk_test": qr,
        "comparisons": _comparisons(roles, p["int8"], p["qat"]),
        "significance": _significance(p, y, w),
        "quality_table": {
            "note": QUALITY_NOTE + ("" if name == "int8" else QUALITY_NOTE_FORMAT),
            r.observer_name(): _quality_rows(qr, name),
        },
        "targets": _targets(roles),
        "weight_format": _weight_format(cfg, p50, qr, p["quant_report"]),
        "baseline": BASELINE_NOTE,
        "ridge": RIDGE_NOTE,
        "ridge_fixed": RIDGE_FIXED_NOTE,
        "ridge_tuning": p["ridge_tuning"],
        **_history_choice(r.w),
        **_training(r),
        "timings_file": "timings.json",
        "quant_report": p["quant_report"],
    }
    if cfg.compare_clipping:
        metrics["compare_clipping"] = _compare_clipping(r)
    if r.par.distributed:
        metrics["world_size"] = r.par.size
    if r.par.root:
        _rank0_outputs(r, metrics, p, y, qr, t0)
    else:
        r.tick("evaluate", t0)
    return metrics


def _rank0_outputs(r: Run, metrics: dict, p: dict, y: np.ndarray, qr: dict, t0: float) -> None:
    """The plots and ``OUT/model.onnx`` (with its parity check): rank 0 alone, after the
    metrics so far are found finite (a non-finite q-risk is named with its cause, as
    ``metrics.json``'s check names it, before the model file's strict-JSON metadata)."""
    from nbqat.export import export_run, run_metadata  # OUT/model.onnx + parity (docs/export.md)
    from nbqat.train.outputs import plots
    from nbqat.train.preflight import finite_metrics

    finite_metrics(metrics)
    w = r.w
    if r.cfg.plots:
        q = list(w.quantiles)
        ridge_p50 = p["ridge"][..., q.index(0.5)] if 0.5 in w.quantiles else None
        metrics["plots"] = plots(r, y, p["naive_point"], p["float"], p["int8"], ridge_p50)
    r.tick("evaluate", t0)
    t0 = time.perf_counter()
    meta = run_metadata(w, qr, r.cfg)
    metrics["onnx_parity"] = export_run(r.qat, p["int8_model"], w.test, r.out, metadata=meta)
    r.tick("onnx", t0)
