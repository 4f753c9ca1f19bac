"""The main job's files in ``--out``: plots, ``metrics.json``, ``timings.json`` and
``summary.txt`` (rank 0 alone writes them, each one atomically)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from nbqat._io import atomic_open
from nbqat.data import SplitWindows
from nbqat.train.loop import Run
from nbqat.train.summary import summary_table

__all__ = ["interpretation", "plots", "write_outputs"]


def _fans(r: Run, test: SplitWindows, y: np.ndarray, naive_point: Any, preds: dict,
          ridge_p50: Any) -> list:  # fmt: skip
    """One forecast fan per model over a few test windows spread over entities and time."""
    from nbqat.train import plots as pl

    w, n = r.w, len(test)
    pick = np.unique(np.linspace(0, n - 1, 4).round().astype(np.int64))
    titles = [
        f"{w.entity_names[test.entity[i]]} from {str(test.times(np.array([i]))[0, 0])[:16]}"
        for i in pick
    ]
    unit, ylabel = pl.step_unit(w.step), pl.target_label(w.target_name, w.source)
    files = []
    for key, (label, pred) in preds.items():
        files.append(
            pl.plot_forecast_fan(
                test.history_raw(pick), y[pick], pred[pick], w.quantiles,
                r.out / f"forecast_{key}.png", titles=titles, naive=naive_point[pick],
                ridge=None if ridge_p50 is None else ridge_p50[pick], ylabel=ylabel,
                xlabel=f"{unit} relative to forecast start", model=label,
            )
        )  # fmt: skip
    return files


def plots(r: Run, y: np.ndarray, naive_point: Any, pred_float: np.ndarray,
          pred_int8: np.ndarray, ridge_p50: Any = None) -> list[str]:  # fmt: skip
    """Write the run's PNG plots into ``r.out``; returns their file names.

    Parameters
    ----------
    r : Run
        After evaluation (``r.model`` holds the best float weights).
    y : ndarray (n, tau)
        The test split's unscaled target.
    naive_point : ndarray (n, tau)
        The seasonal-naive point forecast.
    pred_float, pred_int8 : ndarray (n, tau, Q)
        Unscaled forecasts.
    ridge_p50 : ndarray (n, tau), optional

    Returns
    -------
    list of str
    """
    from nbqat.train import plots as pl

    w, st, out, test = r.w, r.st, r.out, r.w.test
    curves = {ph: st.curves[ph] for ph in ("float", "qat", "qat_noclip") if ph in st.curves}
    events = {"best epoch": st.best_epoch + 1}
    if st.plateau_epoch >= 0:
        events[f"plateau: lr x {r.cfg.plateau_factor:g}"] = st.plateau_epoch + 1
    files = [pl.plot_loss_curves(curves, out / "loss_curves.png", {"float": events})]
    preds = {"int8": ("int8 model", pred_int8), "float": ("float model", pred_float)}
    files += _fans(r, test, y, naive_point, preds, ridge_p50)
    if r.cfg.model == "tft":  # the TFT's interpretation (the LSTM has none)
        groups, attn = interpretation(r, test)
        files.append(pl.plot_variable_importance(groups, out / "variable_importance.png"))
        unit = pl.step_unit(w.step)
        files.append(
            pl.plot_attention(attn, out / "attention.png", history=int(r.cfg.history), unit=unit)
        )
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
        path = out / "clipping_comparison.png"
        files.append(pl.plot_clipping_comparison(runs, path, max_norm=r.cfg.max_norm))
    return [Path(f).name for f in files]


def interpretation(r: Run, test: SplitWindows) -> tuple[dict, np.ndarray]:
    """Mean variable-selection weights and attention over (up to 512) test windows.

    Parameters
    ----------
    r : Run
    test : SplitWindows

    Returns
    -------
    groups : dict
        ``{"static" | "encoder" | "decoder": (names, mean weights)}``.
    attn : ndarray float64 (tau, T)
        The mean attention weights.
    """
    m, w = r.model, r.w
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


def write_outputs(r: Run, metrics: dict, timings: dict) -> None:
    """Write ``timings.json``, ``metrics.json`` and ``summary.txt`` (the CLI prints the summary;
    :meth:`nbqat.Forecaster.fit` prints nothing).

    Parameters
    ----------
    r : Run
    metrics : dict
        Strict JSON (finite numbers only).
    timings : dict
    """
    out = r.out
    with atomic_open(out / "timings.json", "w") as fh:
        fh.write(json.dumps(timings, indent=1, allow_nan=False) + "\n")
    text = json.dumps(metrics, indent=1, sort_keys=False, allow_nan=False)
    with atomic_open(out / "metrics.json", "w") as fh:
        fh.write(text + "\n")
    table = summary_table(metrics, timings)
    with atomic_open(out / "summary.txt", "w") as fh:
        fh.write(table + "\n")
