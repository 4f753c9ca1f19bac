"""The table printed at the end of ``nbqat train`` (and written to ``summary.txt``)."""

from __future__ import annotations

__all__ = ["q_text", "summary_table"]


def _small_sample(tests: list) -> str:
    """The summary's warning when a Diebold-Mariano test had too few windows for its lags."""
    t = next((t for t in tests if t.get("small_sample") and t.get("n")), None)
    if t is None:
        return ""
    return (
        f"; n = {t['n']} test origins is too few for a reliable test with {t['lags']} "
        f"lag{'s' if t['lags'] != 1 else ''} "
        "(p-values indicative only)"
    )


def _versus(what: str, improvement: float, other: str) -> str:
    """'<what> 23.3% better than <other>' (or 'worse') from a relative improvement."""
    word = "better" if improvement >= 0 else "worse"
    return f"{what} {100 * abs(improvement):.1f}% {word} than {other}"


def _float_training(fl: dict) -> str:
    """'float training: N epochs, best validation P50 after epoch B; ...' (metrics' float)."""
    best = fl["best_epoch"]
    n = fl["epochs_run"]
    line = f"float training: {n} epoch{'s' if n != 1 else ''}, best validation P50 " + (
        f"after epoch {best}" if best else "at the start (the initial weights kept)"
    )
    if fl.get("plateau_epoch"):
        line += (
            f"; plateau after epoch {fl['plateau_epoch']}: back to the best weights at "
            f"{fl['lr_factor_after_plateau']:g} x the learning rate"
        )
    return line


def _ridge_tuning(t: dict) -> str:
    """'ridge (tuned): history 24 (1 season), lambda 10, chosen on the validation split
    (val_P50 0.1610; ...)' from metrics.json's ``ridge_tuning``."""
    best = next(g for g in t["grid"] if g["history"] == t["history"] and g["lambda"] == t["lambda"])
    seasons = t["history_seasons"]
    return (
        f"ridge (tuned): history {t['history']} ({seasons:g} season{'s' if seasons != 1 else ''})"
        f", lambda {t['lambda']:g}, chosen on the validation split ({t['criterion']} "
        f"{best[t['criterion']]:.4f}; ridge (fixed): the windows' history, lambda 1)"
    )


def _format_line(wf: dict, qr: dict) -> str:
    """A non-int8 run's line: the recovered fraction, QAT int8 beside it, the 8-bit layers."""
    fmt, ff = wf["name"], qr["float_finetuned"]["P50"]
    rec = wf.get("qat_recovered_fraction_of_ptq_loss")
    line = (
        f"{fmt}: QAT recovers "
        + ("-" if rec is None else f"{100 * rec:.0f}%")
        + f" of PTQ's P50 loss; QAT int8 {100 * (qr['qat_int8']['P50'] / ff - 1):+.1f}% vs "
        "the equally fine-tuned float"
    )
    kept = wf.get("per_channel_fallback")
    return line + (f"; per channel at 8 bits (width not a multiple of the group): "
                   f"{', '.join(kept)}" if kept else "")  # fmt: skip


def q_text(v: float, width: int = 0) -> str:
    """A q-risk as the summaries print it: 4 decimals, or 3 significant digits below 1e-3
    (q-risk divides by sum |y|: a series far from zero, 1e7 +- 8, has q-risks near 1e-7,
    which 4 decimals print as 0.0000)."""
    return f"{v:>{width}.4f}" if v == 0 or not abs(v) < 1e-3 else f"{v:>{width}.2e}"


def _q_risk_lines(qr: dict, fmt: str) -> list[str]:
    """The q-risk table: a row per model (P10, P50, P90), the baselines first."""
    rows = [
        ("seasonal naive", qr["seasonal_naive"]),
        ("ridge (tuned)", qr["ridge"]),
        *([("ridge (fixed)", qr["ridge_fixed"])] if "ridge_fixed" in qr else []),
        ("float", qr["float"]),
        ("float fine-tuned", qr["float_finetuned"]),
        *([("PTQ int8", qr["ptq_int8"]), ("QAT int8", qr["qat_int8"])] if "qat_int8" in qr else []),
        (f"PTQ {fmt}", qr.get(f"ptq_{fmt}", qr["ptq_int8"])),
        ("QAT (fake quant)", qr["qat_fake_quant"]),
        (f"QAT {fmt}", qr["int8"]),
    ]
    lines = [
        "",
        "q-risk on the test split (lower is better)",
        f"{'model':<18}{'P10':>9}{'P50':>9}{'P90':>9}",
    ]
    for name, v in rows:
        lines.append(f"{name:<18}" + "".join(q_text(v[k], 9) for k in ("P10", "P50", "P90")))
    return lines


def _comparison_lines(metrics: dict, fmt: str) -> list[str]:
    """Float and QAT against the baselines (with the Diebold-Mariano p-values), and QAT / PTQ
    against the equally fine-tuned float."""
    c = metrics["comparisons"]
    sig = metrics.get("significance", {})
    lines = []
    for what, key in (("float", "float"), (f"QAT {fmt}", "int8")):
        naive_key = "float_vs_naive" if key == "float" else f"{key}_vs_naive"
        tests = [sig.get(f"{key}_vs_{b}_P50", {}) for b in ("naive", "ridge")]
        dm = [t.get("p_value_hln") for t in tests]  # HLN-corrected (small samples)
        lines.append(
            _versus(f"{what} P50", c[f"{naive_key}_P50_improvement"], "the seasonal naive")
            + ", "
            + _versus("", c[f"{key}_vs_ridge_P50_improvement"], "the ridge baseline").strip()
            + ("" if None in dm else f" (Diebold-Mariano p {dm[0]:.2g} and {dm[1]:.2g})")
            + _small_sample(tests)
        )
    lines.append(
        _versus(f"QAT {fmt} P50", -c["qat_int8_vs_float_finetuned_P50_relative_diff"], "")
        + "the equally fine-tuned float; "
        + _versus(f"PTQ {fmt}", -c["ptq_int8_vs_float_finetuned_P50_relative_diff"], "it")
        + f"; {fmt} vs float (early-stopped): "
        + f"{100 * c['int8_vs_float_P50_relative_diff']:+.1f}%"
    )
    return lines


def _training_lines(metrics: dict) -> list[str]:
    """Gradient norms of each phase and the --compare-clipping rows."""
    lines = []
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
    return lines


def _data_and_report_lines(metrics: dict) -> list[str]:
    """The data's repairs (--fill-gaps), the window normalisation where it is on, and the
    quantization report's most sensitive modules."""
    lines = []
    filled = metrics["data"].get("filled") or {}
    if filled:
        parts = [
            f"{e}: " + ", ".join(f"{c} {n}" for c, n in cols.items()) for e, cols in filled.items()
        ]
        lines.append("filled by --fill-gaps (cells): " + "; ".join(parts))
    top = (metrics.get("quant_report") or {}).get("sensitivity_top")
    if top:
        lines.append(
            "most sensitive modules (test P50 with only it quantized, float "
            f"{top[0]['float_P50']:.4f}): "
            + ", ".join(f"{t['module']} {t['only_P50']:.4f}" for t in top)
        )
    wn = metrics.get("window_norm") or {}
    if wn.get("choice") == "last":
        why = " (the validation targets left the training range)" if wn["option"] == "auto" else ""
        lines.append(
            f"--window-norm {wn['option']}: each window's target relative to its last history "
            f"value{why}; the baselines read the same windows"
        )
    carried = metrics["data"].get("carried_not_interpolated") or {}
    if carried:
        parts = [f"{e}: {', '.join(cols)}" for e, cols in carried.items()]
        lines.append(
            "flag / level columns repaired by carrying the last value (not interpolated): "
            + "; ".join(parts)
        )
    return lines


def summary_table(metrics: dict, timings: dict) -> str:
    """The q-risk table, the comparisons, gradient-norm and timing lines of a finished run.

    Parameters
    ----------
    metrics : dict
        metrics.json's content.
    timings : dict
        timings.json's content (``phases_s``).

    Returns
    -------
    str
    """
    qr = metrics["q_risk_test"]
    fmt = metrics.get("weight_format", {}).get("name", "int8")  # --weight-bits / --weight-dtype
    lines = _q_risk_lines(qr, fmt)
    if "ridge_tuning" in metrics:
        lines.append(_ridge_tuning(metrics["ridge_tuning"]))
    lines.append(_float_training(metrics["float"]))
    lines += _comparison_lines(metrics, fmt)
    if "qat_int8" in qr:
        lines.append(_format_line(metrics["weight_format"], qr))
    lines += _training_lines(metrics)
    lines += _data_and_report_lines(metrics)
    if "onnx_parity" in metrics:
        from nbqat.export import summary_lines

        lines += summary_lines(metrics["onnx_parity"])
    if "world_size" in metrics:
        lines.append(f"data-parallel over {metrics['world_size']} processes (MPI)")
    ph = timings["phases_s"]
    lines.append("time (s): " + ", ".join(f"{k} {v:.1f}" for k, v in ph.items()))
    return "\n".join(lines)
